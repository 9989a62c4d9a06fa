"""``all_reduce``: every rank ends with the reduction of every rank's input.

Variants (``Config.variant``):

* ``ll``: no barrier: every 8-byte word on the link carries a flag beside 32 bits of
  data, and the receiver polls its own memory until the
  flags of a tile are this launch's (:mod:`iris.ccl._ll`); for small messages. Any tensors.
* ``boxed``: one barrier per launch; each rank stores what a member needs into a box on
  it and combines the boxes it received locally (:mod:`iris.ccl._boxed`). Any tensors.
* ``one_shot``: after a start barrier each rank pulls its tiles from every member and
  reduces locally; one round of traffic, ``(G-1)`` reads per element per rank.
* ``two_shot``: tile ``t`` is owned by member ``t % G``, which pulls it from every member,
  reduces, and pushes the result to every member (reduce-scatter then all-gather).

Both are persistent kernels: ``Config.programs`` programs (one per SM by default) loop over
the tiles between one start and one end barrier (an in-place ``one_shot`` synchronises
per tile instead, since a peer may still read the tile it overwrites).
* ``two_shot_push``: the two-shot exchange with stores only on the link: chunk ``j`` of
  every input is stored into member ``j``'s output (used as scratch), member ``j`` reduces
  it and stores the result into every member's output. Remote stores keep more of the link
  than remote loads when both directions are busy, but on 2 x H200 the extra barriers and
  scratch pass cost as much (measured level with ``two_shot``). Needs an output that does not overlap
  the input (in place it runs ``two_shot``); a remainder of fewer than ``16 G`` elements
  goes through ``boxed``.
* ``copy_engine``: the two-shot exchange with the copy engines (DMA) moving the bytes and
  a local reduction kernel between them, pipelined in pieces (``Config.chunk_elements``
  elements of each chunk; default: two pieces); see :mod:`iris.ccl._copy_engine`. For
  large messages with the output on the heap, not overlapping the input (otherwise it runs
  ``two_shot``).
* ``ring``: ``2 (G-1)`` steps between neighbours only (reduce-scatter then all-gather).
* ``atomic``: every rank adds its input into every member's accumulator with atomics.
* ``spinlock``: like ``atomic``, but read-add-write under a per-tile lock on the target.

Floating types below fp32 (fp16, bf16 and the float8 formats) accumulate in fp32 in every
variant and are rounded once, when the result is stored (``ring`` keeps its partial sums in
an fp32 workspace, ``atomic`` and ``spinlock`` accumulate in an fp32 workspace); float8
results saturate to the format's finite range (see "Float8" in the collectives' docs).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from iris.mem.triton.group import enter_group

from . import _boxed, _comm, _copy_engine, _host, _plan, entry
from ._plan import Plan
from .config import Config
from .reduce_op import ReduceOp, from_accumulator
from .triton import tiles
from .triton.accumulate import convert
from .variants import Variant
from .work import Work

# Every collective kernel takes the communicator's leading arguments (context tensor,
# members, flags, epochs, status, wait budget in ns) and constexprs (RANK, WORLD, GROUP, ME,
# BLOCK); see _comm.Communicator.kernel_args / kernel_meta.


@triton.jit
def _one_shot_kernel(
    context, members, flags, epochs, status, budget, src, dst, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr, ALIASED: tl.constexpr, HINT: tl.constexpr,
    SIG=0,
):  # fmt: skip
    """Persistent: program ``p`` reduces tiles ``p, p + P, ...`` between one start and one
    end barrier. ``ALIASED`` (``dst`` overlaps ``src``): a barrier pair per tile instead,
    so no member overwrites a tile a peer may still be reading."""
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    if not ALIASED:
        group.sync(ctx, pid, False)
    t = pid
    ntiles = tl.cdiv(n, BLOCK)
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tiles.all_reduce_one_shot(ctx, group, src, dst, offs, offs < n, pid, OP, ACC_FP32, ALIASED, HINT)
        t += tl.num_programs(0)
    if not ALIASED:
        group.sync(ctx, pid, False)  # only loads went remote, their values already used


@triton.jit
def _two_shot_kernel(
    context, members, flags, epochs, status, budget, src, dst, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr, HINT: tl.constexpr,
    SIG=0,
):  # fmt: skip
    """Persistent: between one start and one end barrier, program ``p`` reduces and pushes
    the tiles this member owns (``t % GROUP == ME``), ``t = ME + GROUP (p + k P)``: every
    program has owned tiles whatever ``P`` (with ``t = p + k P`` and an even ``P``, half of
    the programs of each member would own none)."""
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, SIG=SIG
    )
    t = ME + pid * GROUP
    ntiles = tl.cdiv(n, BLOCK)
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tiles.all_reduce_two_shot(ctx, group, src, dst, offs, offs < n, pid, ME, OP, ACC_FP32, False, HINT)
        t += tl.num_programs(0) * GROUP
    group.sync(ctx, pid)  # orders the remote stores before it (CTA barrier + release)


@triton.jit
def _two_shot_push_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, chunk,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr, HINT: tl.constexpr,
    SIG=0,
):  # fmt: skip
    """Two-shot all-reduce in which only stores cross the link. ``src`` and ``dst`` hold
    ``GROUP`` chunks of ``chunk`` elements; member ``j`` owns chunk ``j``. Program ``p``
    works on tiles ``p, p + P, ...`` of a chunk, and the same tile on every member is
    always program ``p``'s, so per-program barriers order everything:

    1. (after a start barrier: every member's ``dst`` is free) store chunk ``j`` of the local
       ``src`` into member ``j``'s ``dst`` at chunk ``ME``: a peer's ``dst`` chunks other
       than its own are scratch for the members' contributions;
    2. barrier; reduce the own chunk: the local ``src`` chunk and the contributions in the
       local ``dst``, in member order, into the own chunk of the local ``dst``;
    3. barrier (every member has read its scratch); store the reduced chunk into every
       member's ``dst`` at chunk ``ME``; end barrier.

    ``src`` is read locally only (any memory); ``dst`` is on the heap and must not overlap
    ``src``."""
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    ntiles = tl.cdiv(chunk, BLOCK)
    mine = tl.cast(ME, tl.int64) * chunk
    group.sync(ctx, pid, False)
    t = pid
    while t < ntiles:
        lanes = t * BLOCK + tl.arange(0, BLOCK)
        tiles.store_chunks(ctx, group, src, chunk, dst + mine, lanes, lanes < chunk, ME, GROUP, HINT)
        t += tl.num_programs(0)
    group.sync(ctx, pid)  # orders the remote stores before it (CTA barrier + release)
    t = pid
    while t < ntiles:
        lanes = t * BLOCK + tl.arange(0, BLOCK)
        mask = lanes < chunk
        acc = tiles.reduce_slots(src + mine, dst, chunk, lanes, mask, ME, GROUP, OP, ACC_FP32)
        tl.store(dst + mine + lanes, convert(acc, dst.dtype.element_ty), mask=mask)
        t += tl.num_programs(0)
    group.sync(ctx, pid)
    t = pid
    while t < ntiles:
        lanes = t * BLOCK + tl.arange(0, BLOCK)
        mask = lanes < chunk
        x = tl.load(dst + mine + lanes, mask=mask)
        for k in tl.static_range(1, GROUP):
            ctx.store(dst + mine + lanes, x, group.rank((ME + k) % GROUP), mask=mask, hint=HINT)
        t += tl.num_programs(0)
    group.sync(ctx, pid)  # orders the remote stores before it (CTA barrier + release)


@triton.jit
def _ring_kernel(
    context, members, flags, epochs, status, budget, src, part, dst, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr,
    SIG=0,
):  # fmt: skip
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    programs = tl.num_programs(0)
    t = pid  # persistent: groups of GROUP tiles pid, pid + P, ... (the same program on every member)
    while t < tl.cdiv(n, GROUP * BLOCK):
        tiles.all_reduce_ring(ctx, group, src, part, dst, t * GROUP * BLOCK, n, pid, BLOCK, OP, ACC_FP32)
        t += programs


@triton.jit
def _atomic_kernel(
    context, members, flags, epochs, status, budget, src, acc, locks, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    LOCKED: tl.constexpr,
    SIG=0,
):  # fmt: skip
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    programs = tl.num_programs(0)
    ntiles = tl.cdiv(n, BLOCK)
    t = pid  # persistent: tiles pid, pid + P, ... (the same program on every member)
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        if LOCKED:
            tiles.all_reduce_spinlock(ctx, group, src, acc, offs, offs < n, locks + pid, pid)
        else:
            tiles.all_reduce_atomic(ctx, group, src, acc, offs, offs < n, pid)
        t += programs


def _pieces(plan: Plan):
    """``(src, dst)`` slices of each launch (8 bytes per element: fp32 partial sums of half
    types in the staging buffers)."""
    for start, length in plan.launches(8):
        yield plan.src[start : start + length], plan.dst[start : start + length]


def _reduction(plan: Plan) -> dict:
    return {"OP": plan.op_value, "ACC_FP32": _host.acc_fp32(plan.src.dtype)}


def _tiled(plan: Plan, launch, local_output: bool = False) -> None:
    """``launch(plan, src, dst)`` per launch: on the caller's tensors in place, else on
    copies in the staging buffers (``local_output``: the kernel writes its output only
    locally, so that may be any tensor)."""
    for src, dst in _pieces(plan):
        ksrc = src if plan.in_place else plan.comm.staged_copy("in", src)
        kdst = dst if plan.in_place or local_output else plan.comm.staging_like("out", dst)
        launch(plan, ksrc, kdst)
        if kdst is not dst:
            dst.copy_(kdst)


def _one_shot(plan: Plan, src: torch.Tensor, dst: torch.Tensor) -> None:
    meta = {**_reduction(plan), "HINT": _host.vector_hint((src, dst)), "ALIASED": _host.overlaps(src, dst)}
    grid = _host.persistent_grid(plan.comm, plan.cfg, dst.numel())
    _host.launch(_one_shot_kernel, grid, plan.comm, plan.cfg, src, dst, dst.numel(), **meta)


def _two_shot(plan: Plan, src: torch.Tensor, dst: torch.Tensor) -> None:
    # each member works on its own 1/G of the tiles
    grid = _host.persistent_grid(plan.comm, plan.cfg, _host.cdiv(dst.numel(), plan.comm.size))
    hint = _host.vector_hint((src, dst))
    _host.launch(
        _two_shot_kernel, grid, plan.comm, plan.cfg, src, dst, dst.numel(), HINT=hint, **_reduction(plan)
    )


def _ring(plan: Plan, src: torch.Tensor, dst: torch.Tensor) -> None:
    # partial sums: dst itself, or an fp32 buffer for half and float8 types
    part = plan.comm.staging_like("acc", dst, dtype=torch.float32) if _widens(dst.dtype) else dst
    grid = _host.persistent_grid(plan.comm, plan.cfg, _host.cdiv(dst.numel(), plan.comm.size))
    _host.launch(_ring_kernel, grid, plan.comm, plan.cfg, src, part, dst, dst.numel(), **_reduction(plan))


def _widens(dtype: torch.dtype) -> bool:
    """Whether partial sums of ``dtype`` need a wider type (fp32 for half and float8 types)."""
    return _host.acc_dtype(dtype) != dtype


def _atomic(plan: Plan, locked: bool) -> None:
    """``atomic`` and ``spinlock``: every member adds its input into every member's
    accumulator in the workspace; the input is read locally only."""
    comm, cfg = plan.comm, plan.cfg
    for src, dst in _pieces(plan):
        acc = comm.staging_like("acc", dst, dtype=_host.acc_dtype(dst.dtype))
        grid = _host.persistent_grid(comm, cfg, dst.numel())
        locks = comm.staging("locks", grid * 4, zero=True).view(torch.int32)
        _host.launch(_atomic_kernel, grid, comm, cfg, src, acc, locks, dst.numel(), LOCKED=locked)
        dst.copy_(from_accumulator(acc / comm.size if plan.op is ReduceOp.AVG else acc, dst.dtype))


def _two_shot_push(plan: Plan) -> None:
    """The largest multiple of ``16 G`` elements through the kernel (chunks of whole
    16-element vectors), the few elements left through ``boxed``."""
    comm, cfg, size = plan.comm, plan.cfg, plan.comm.size
    unit = 16 * size
    main = plan.count - plan.count % unit
    meta = _reduction(plan)
    per_launch = max(_host.max_elements(cfg, 8, not plan.in_place, comm) // unit * unit, unit)
    for start, length in _host.chunks(main, per_launch):
        src, dst = plan.src[start : start + length], plan.dst[start : start + length]
        kdst = dst if plan.in_place else comm.staging_like("out", dst)  # peers write it: on the heap
        chunk = length // size
        meta["HINT"] = _host.vector_hint((src, kdst), (chunk * src.element_size(),))
        grid = _host.persistent_grid(comm, cfg, chunk)
        _host.launch(_two_shot_push_kernel, grid, comm, cfg, src, kdst, length, chunk, **meta)
        if kdst is not dst:
            dst.copy_(kdst)
    _boxed_rest(plan, main)


def _copy_engine_run(plan: Plan) -> None:
    done = _copy_engine.all_reduce(plan.comm, plan.cfg, plan.src, plan.dst, plan.op_value)
    _boxed_rest(plan, done)  # fewer than G elements: not worth the copy engines


def _boxed_rest(plan: Plan, done: int) -> None:
    """The elements from ``done`` on through ``boxed`` on iris.ccl's own heap."""
    if done < plan.count:
        comm = _comm.own(plan.group, plan.dst.device)
        rest = {"src": plan.src[done:], "dst": plan.dst[done:], "count": plan.count - done}
        _boxed.run(dataclasses.replace(plan, comm=comm, in_place=False, **rest))


_variant = functools.partial(Variant, collective="all_reduce")
_SUM_AVG = {"ops": (ReduceOp.SUM, ReduceOp.AVG), "other_ops": "use one_shot, two_shot or ring"}
REGISTERED = (
    _variant(name="one_shot", run=functools.partial(_tiled, launch=_one_shot, local_output=True)),
    _variant(name="two_shot", run=functools.partial(_tiled, launch=_two_shot), default=True),
    # peers use the output as scratch while the input is still being read
    _variant(name="two_shot_push", run=_two_shot_push, disjoint=True, fallback="two_shot"),
    # the copies need the output on the heap; staging would add a local pass each way
    _variant(name="copy_engine", run=_copy_engine_run, in_place=True, disjoint=True, fallback="two_shot"),
    # ring keeps partial sums of half and float8 types in an fp32 workspace
    _variant(name="ring", run=functools.partial(_tiled, launch=_ring), workspace=_widens),
    # atomic and spinlock accumulate in a workspace of their own
    _variant(name="atomic", run=functools.partial(_atomic, locked=False), workspace=True, **_SUM_AVG),
    _variant(name="spinlock", run=functools.partial(_atomic, locked=True), workspace=True, **_SUM_AVG),
)


def _check(out: torch.Tensor, inp: torch.Tensor, *, group, config, **_) -> None:
    _plan.validate("all_reduce", out, inp, group, config, lambda size: inp.numel())
    if out.shape != inp.shape:
        raise ValueError(f"all_reduce: out has shape {list(out.shape)} but inp has {list(inp.shape)}")


@entry.op("all_reduce", tensors=("out", "inp"), outputs=("out",), device="inp", validate=_check)
def all_reduce(
    out: torch.Tensor, inp: torch.Tensor, *, op: ReduceOp | str = ReduceOp.SUM, group=None,
    async_op: bool = False, config: Config | None = None,
) -> Work | None:  # fmt: skip
    """Reduce ``inp`` over the ranks of ``group`` into ``out`` on every rank.

    :param out: result, same shape, dtype and device as ``inp``; may be ``inp`` (or a view of
        the same memory). An ``out`` that overlaps ``inp`` only in part is allowed too: the
        input is copied first (through iris.ccl's own heap).
    :param inp: this rank's contribution; any shape, contiguous or not.
    :param op: SUM, AVG (floating types), MAX, MIN or PRODUCT.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config`; None picks by size.

    Tensors on a symmetric heap spanning exactly ``group`` are used in place; others are
    copied through the collective's staging buffers (one extra local copy each way).
    """
    # every variant takes the output in the input's own memory (out is inp, say) or falls
    # back; an output overlapping the input in part is written over input a peer (or a later
    # tile) still reads, so that input is copied first
    return _plan.run(
        "all_reduce", out, inp, inp.numel(), group=group, config=config, async_op=async_op, op=op,
        overlap_ok=_same_memory,
    )  # fmt: skip


def _same_memory(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether the flat ``src`` and ``dst`` (same element count and dtype) are one memory."""
    return src.data_ptr() == dst.data_ptr()
