"""Debug mode (IRIS_DEBUG=1): in-kernel heap bounds checks and allocation-sequence checks.

Only the host-side allocation-sequence tests run on GPUs too (``gpu`` mark): there a failed
in-kernel check traps and takes the CUDA context down, so the pointer tests are CPU-only.
"""

import pytest
import torch
import triton
import triton.language as tl
from mem_testutils import HEAP, MULTI_WORLD, require_world

import iris.mem
from iris.mem.testing import run_world
from iris.mem.triton import Context

pytestmark = pytest.mark.timeout(300)
DEBUG = {"IRIS_DEBUG": "1"}


@triton.jit
def _store_at_kernel(context, base, offset, n, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Store ones at ``base + offset + [0, n)`` on the next rank."""
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.arange(0, BLOCK)
    ctx.store(base + offset + offs, tl.full([BLOCK], 1.0, tl.float32), (RANK + 1) % WORLD, mask=offs < n)


def out_of_heap_body(rank, world_size, case):
    with iris.mem.init(HEAP) as heap:
        buf = heap.zeros(64, dtype=torch.float32)
        outside = torch.zeros(64, dtype=torch.float32)
        target = {"in_heap": buf, "past_end": buf, "masked_past_end": buf, "not_heap": outside}[case]
        offset = {"in_heap": 0, "past_end": HEAP // 4, "masked_past_end": HEAP // 4, "not_heap": 0}[case]
        n = 0 if case == "masked_past_end" else 64
        heap.barrier()
        try:
            _store_at_kernel[(1,)](
                heap.get_device_context(), target, offset, n, RANK=rank, WORLD=world_size, BLOCK=64
            )
            error = None
        except Exception as e:  # noqa: BLE001 - the interpreter wraps the kernel's exception
            error = f"{type(e).__name__}: {e}"
        heap.barrier()
        return error, buf.sum().item()


@pytest.mark.parametrize("case", ["past_end", "not_heap"])
def test_out_of_heap_pointer_stops_the_kernel_with_rank_peer_and_offset(case):
    results = run_world(out_of_heap_body, 2, case, timeout=120, env=DEBUG)
    for rank, (error, total) in enumerate(results):
        assert error is not None, "the out-of-heap store was not caught"
        assert "HeapPointerError" in error
        assert f"rank {rank} translated a pointer to rank {(rank + 1) % 2}" in error
        assert "byte offset" in error
        assert total == 0, "nothing may be written once the check fails"


def test_in_heap_and_masked_lanes_pass_the_check():
    for case in ("in_heap", "masked_past_end"):
        results = run_world(out_of_heap_body, 2, case, timeout=120, env=DEBUG)
        expected = 64.0 if case == "in_heap" else 0.0
        assert results == [(None, expected), (None, expected)], case


def debug_flag_body(rank, world_size):
    from iris.mem.triton import ops

    return bool(ops._DEBUG)


def test_debug_checks_are_a_compile_time_switch():
    assert run_world(debug_flag_body, 1, timeout=60, env=DEBUG) == [True]
    assert run_world(debug_flag_body, 1, timeout=60, env={"IRIS_DEBUG": "0"}) == [False]


def sequence_body(rank, world_size):
    with iris.mem.init(HEAP) as heap:
        heap.zeros(16)
        try:
            heap.zeros(16 + rank)  # rank-dependent: a broken program
        except iris.mem.HeapMismatchError as e:
            return str(e)
    return None


@pytest.mark.gpu
def test_mismatched_allocation_sequence_raises_on_every_rank():
    world = MULTI_WORLD
    require_world(world)
    for message in run_world(sequence_body, world, timeout=120, env=DEBUG):
        assert message is not None
        assert "allocation #1" in message
        assert "rank 0:" in message and f"rank {world - 1}:" in message
        assert f"shape [{16 + world - 1}]" in message


@pytest.mark.gpu
def test_mismatched_sequence_is_not_checked_without_debug():
    require_world(2)
    assert run_world(sequence_body, 2, timeout=120, env={"IRIS_DEBUG": "0"}) == [None, None]
