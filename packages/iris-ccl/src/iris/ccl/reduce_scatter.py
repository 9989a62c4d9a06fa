"""``reduce_scatter``: rank ``i`` ends with the reduction over the group of every rank's
chunk ``i`` of the input (like ``torch.distributed.reduce_scatter_tensor``).

Variants (``Config.variant``):

* ``ll``: no barrier: every 8-byte word on the link carries a flag beside 32 bits of
  data, and the receiver polls its own memory until the
  flags of a tile are this launch's (:mod:`iris.ccl._ll`); for small messages. Any tensors.
* ``boxed``: one barrier per launch; each rank stores what a member needs into a box on
  it and combines the boxes it received locally (:mod:`iris.ccl._boxed`). Any tensors.
* ``pull``: after a start barrier each rank loads its chunk from every member's input and
  reduces it; an end barrier keeps the inputs unchanged until every member has read them,
  then the result is stored locally. Needs the input on the heap.
* ``push``: after a start barrier (every member's workspace is free) each rank stores its
  chunk ``j`` into member ``j``'s workspace at the slot of this rank; after a second
  barrier each rank reduces the slots of its own workspace. Input and output are accessed
  locally only, so push always runs on iris.ccl's own heap, whose staging buffer is the
  workspace.

Both reduce in member order (bitwise the same result on every variant), accumulating
floating types in fp32; AVG divides by the group size. A message larger than one launch
covers is split into the same sub-range of every chunk per launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from iris.mem.triton.group import enter_group

from . import _host, _plan, entry
from ._plan import Plan
from .config import Config
from .reduce_op import ReduceOp
from .triton import tiles
from .triton.sync import enter_tiles
from .variants import Variant
from .work import Work


@triton.jit
def _pull_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, n_per_rank,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr, HINT: tl.constexpr,
    SIG=0,
):  # fmt: skip
    """Persistent: program ``p`` reduces tiles ``p, p + P, ...`` of this rank's chunk
    between one start and one end barrier."""
    ctx, group, pid, ntiles = enter_tiles(
        context, members, flags, epochs, status, budget, n, RANK, WORLD, GROUP, ME, BLOCK, SIG
    )
    t = pid
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tiles.reduce_scatter_pull(
            ctx, group, src, dst, offs, offs < n, n_per_rank, pid, OP, ACC_FP32, False, HINT
        )
        t += tl.num_programs(0)
    group.sync(ctx, pid, False)  # only loads went remote, their values already used


@triton.jit
def _push_kernel(
    context, members, flags, epochs, status, budget, src, dst, ws, n, n_per_rank,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr, HINT: tl.constexpr,
    SIG=0,
):  # fmt: skip
    """Persistent: program ``p`` pushes its tiles ``p, p + P, ...`` into the members'
    workspaces, then (after a barrier) reduces the same tiles of its own workspace."""
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    ntiles = tl.cdiv(n, BLOCK)
    group.sync(ctx, pid, False)
    t = pid
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tiles.reduce_scatter_push_send(ctx, group, src, ws, offs, offs < n, n_per_rank, n, HINT)
        t += tl.num_programs(0)
    group.sync(ctx, pid)  # orders the remote stores before it (CTA barrier + release)
    t = pid
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tiles.reduce_scatter_push_reduce(group, dst, ws, offs, offs < n, n, OP, ACC_FP32)
        t += tl.num_programs(0)


def _exchange(plan: Plan, push: bool) -> None:
    """``push`` (members store chunk ``j`` into member ``j``'s workspace, then reduce their
    own) or ``pull`` (members load their chunk from every member's input: in place, or from
    copies in the staging buffers)."""
    comm, cfg, src_all, m = plan.comm, plan.cfg, plan.src, plan.count
    itemsize = src_all.element_size()
    meta = {"OP": plan.op_value, "ACC_FP32": _host.acc_fp32(src_all.dtype)}
    # Staged, one launch covers `length` elements of every member's chunk in the staging
    # buffer (pull: size * length inputs; push: size * length workspace slots).
    for start, length in plan.launches(itemsize * comm.size):
        grid = _host.persistent_grid(comm, cfg, length)
        dst = plan.dst[start : start + length]
        if push:
            ws = comm.staging("out", comm.size * length * itemsize)[: comm.size * length * itemsize]
            ws = ws.view(src_all.dtype)
            hint = _host.vector_hint((src_all[start:], ws), (m * itemsize, length * itemsize))
            _host.launch(
                _push_kernel, grid, comm, cfg, src_all[start:], dst, ws, length, m, HINT=hint, **meta
            )
        elif plan.in_place:
            hint = _host.vector_hint((src_all[start:],), (m * itemsize,))
            _host.launch(_pull_kernel, grid, comm, cfg, src_all[start:], dst, length, m, HINT=hint, **meta)
        else:
            nbytes = comm.size * length * itemsize
            ksrc = comm.staging("in", nbytes)[:nbytes].view(src_all.dtype).view(comm.size, length)
            ksrc.copy_(src_all.view(comm.size, m)[:, start : start + length])
            hint = _host.vector_hint((ksrc,), (length * itemsize,))
            _host.launch(_pull_kernel, grid, comm, cfg, ksrc, dst, length, length, HINT=hint, **meta)


_variant = functools.partial(Variant, collective="reduce_scatter")
REGISTERED = (
    # push touches only its workspace remotely, which lives on iris.ccl's own heap (so it
    # never spends the caller's heap on it)
    _variant(name="push", run=functools.partial(_exchange, push=True), staged=True, default=True),
    _variant(name="pull", run=functools.partial(_exchange, push=False)),
)


def _check(out: torch.Tensor, inp: torch.Tensor, *, group, config, **_) -> None:
    def chunk(size: int) -> int:
        if inp.numel() % size:
            raise ValueError(
                f"reduce_scatter: inp has {inp.numel()} elements (shape {list(inp.shape)}), which the group "
                f"of {size} ranks does not divide into equal chunks; out (shape {list(out.shape)}) must hold "
                "inp.numel() / group size elements"
            )
        return inp.numel() // size

    _plan.validate("reduce_scatter", out, inp, group, config, chunk)


@entry.op("reduce_scatter", tensors=("out", "inp"), outputs=("out",), device="inp", validate=_check)
def reduce_scatter(
    out: torch.Tensor, inp: torch.Tensor, *, op: ReduceOp | str = ReduceOp.SUM, group=None,
    async_op: bool = False, config: Config | None = None,
) -> Work | None:  # fmt: skip
    """Reduce ``inp`` over the ranks of ``group`` and give rank ``i`` chunk ``i`` in ``out``.

    :param out: result with ``inp.numel() / G`` elements (G: the group's size), same dtype
        and device as ``inp``; any shape. It may be this rank's chunk of ``inp``.
    :param inp: this rank's contribution, ``G`` equal chunks viewed flat (its element
        count must be divisible by G); any shape, contiguous or not.
    :param op: SUM, AVG (floating types), MAX, MIN or PRODUCT.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config` (variants: ``iris.ccl.VARIANTS["reduce_scatter"]``, described
        above); None picks by size.

    Tensors on a symmetric heap spanning exactly ``group`` are used in place by ``pull``;
    others are copied through the collective's staging buffers.
    """
    _, index = _host.group_position(group)
    own_chunk = index * out.numel() * inp.element_size()
    # An output overlapping the input anywhere but at this rank's chunk would overwrite
    # input still needed by a later launch: reduce from a copy of the input.
    return _plan.run(
        "reduce_scatter", out, inp, out.numel(), group=group, config=config, async_op=async_op, op=op,
        overlap_ok=lambda src, dst: dst.data_ptr() == src.data_ptr() + own_chunk,
    )  # fmt: skip
