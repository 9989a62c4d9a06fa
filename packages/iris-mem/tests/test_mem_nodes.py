"""Nodes: how ranks fall onto nodes (iris.mem.node_layout) and the node-local heap.

A world of 3 processes on this machine split into nodes {0} and {1, 2} by ``IRIS_NODE_ID``
(what a launcher other than torchrun sets): the layout, a heap over each node's ranks
(node-local rank and size, its global ranks), a kernel storing into the node peer's heap,
and a group's layout. Torchrun agents as nodes are tested in iris-ccl's test_ccl_multinode.py.
"""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

import iris.mem
from iris.mem.testing import run_world
from iris.mem.triton import Context


@triton.jit
def _store_right_kernel(context, buf, n, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.arange(0, BLOCK)
    ctx.store(buf + offs, tl.full([BLOCK], RANK + 1, tl.float32), (RANK + 1) % WORLD, mask=offs < n)


def _body(rank: int, world_size: int) -> tuple:
    import torch.distributed as dist

    os.environ["IRIS_NODE_ID"] = "a" if rank == 0 else "b"
    layout = iris.mem.node_layout()
    heap = iris.mem.init(1 << 20)
    buf = heap.zeros(37, dtype=torch.float32)
    heap.barrier()
    _store_right_kernel[(1,)](heap.get_device_context(), buf, 37, heap.rank, heap.world_size, BLOCK=64)
    heap.barrier()
    stored = buf[0].item()
    sub = dist.new_group([0, 2])
    sub_layout = iris.mem.node_layout(sub) if rank in (0, 2) else None
    result = (
        layout.nodes, layout.node, layout.local_ranks, layout.local_index, layout.uniform,
        heap.rank, heap.world_size, heap.global_ranks, stored,
        None if sub_layout is None else (sub_layout.nodes, sub_layout.multi_node),
    )  # fmt: skip
    heap.close()
    return result


def test_layout_and_node_local_heap():
    results = run_world(_body, 3, timeout=120)
    nodes = ((0,), (1, 2))
    # rank 0: a node of its own (heap of one: it stores into itself)
    assert results[0] == (nodes, 0, (0,), 0, False, 0, 1, [0], 1.0, (((0,), (2,)), True))
    assert results[1] == (nodes, 1, (1, 2), 0, False, 0, 2, [1, 2], 2.0, None)
    assert results[2] == (nodes, 1, (1, 2), 1, False, 1, 2, [1, 2], 1.0, (((0,), (2,)), True))


def test_one_process_is_one_node():
    heap = iris.mem.init(1 << 16)
    try:
        layout = iris.mem.node_layout()
        assert layout.nodes == ((0,),) and not layout.multi_node and layout.local_ranks == (0,)
        assert heap.global_ranks == [0] and heap.world_size == 1
        with pytest.raises(ValueError, match="not a member"):
            layout.node_of(5)
    finally:
        heap.close()
