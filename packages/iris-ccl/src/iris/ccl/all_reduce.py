"""``all_reduce``: every rank ends with the reduction of every rank's input.

Variants (``Config.variant``):

* ``one_shot``: after a start barrier each rank pulls its tile from every member and
  reduces locally; one round of traffic, ``(G-1)`` reads per element per rank.
* ``two_shot``: tile ``t`` is owned by member ``t % G``, which pulls it from every member,
  reduces, and pushes the result to every member (reduce-scatter then all-gather).
* ``ring``: ``2 (G-1)`` steps between neighbours only (reduce-scatter then all-gather).
* ``atomic``: every rank adds its input into every member's accumulator with atomics.
* ``spinlock``: like ``atomic``, but read-add-write under a per-tile lock on the target.

Half types accumulate in fp32 in every variant (``atomic`` and ``spinlock`` through an
fp32 accumulator in the workspace).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.mem.triton import Context

from . import _host
from .config import Config
from .reduce_op import ReduceOp
from .triton.sync import combine, group_sync, record_timeout
from .work import Work


@triton.jit
def _reduce_tile(
    ctx, src, offs, mask, members, GROUP: tl.constexpr, OP: tl.constexpr, ACC_FP32: tl.constexpr
):
    """Reduction over members of ``src[offs]`` (pulled from each member's heap), in member
    order so every rank gets bitwise the same result."""
    acc = ctx.load(src + offs, tl.load(members), mask=mask, other=0)
    if ACC_FP32:
        acc = acc.to(tl.float32)
    for i in tl.static_range(1, GROUP):
        x = ctx.load(src + offs, tl.load(members + i), mask=mask, other=0)
        if ACC_FP32:
            x = x.to(tl.float32)
        acc = combine(acc, x, OP)
    if OP == "avg":
        acc = acc / GROUP
    return acc


@triton.jit
def _one_shot_kernel(
    context, members, flags, epochs, status, budget, src, dst, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr,
):  # fmt: skip
    """Program p: start barrier, pull and reduce tile p, end barrier, store locally (after
    the end barrier, so ``dst`` may be ``src``). ``dst`` need not be on the heap."""
    ctx = Context.initialize(context, RANK, WORLD)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)
    acc = _reduce_tile(ctx, src, offs, mask, members, GROUP, OP, ACC_FP32)
    group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)
    tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _two_shot_kernel(
    context, members, flags, epochs, status, budget, src, dst, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr,
):  # fmt: skip
    """Program p: the owner of tile p (member p % GROUP) reduces it and pushes the result
    into every member's ``dst``; the barriers bracket the exchange."""
    ctx = Context.initialize(context, RANK, WORLD)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)
    if pid % GROUP == ME:
        acc = _reduce_tile(ctx, src, offs, mask, members, GROUP, OP, ACC_FP32).to(dst.dtype.element_ty)
        for i in tl.static_range(GROUP):
            ctx.store(dst + offs, acc, tl.load(members + ((ME + i) % GROUP)), mask=mask)
    group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)


@triton.jit
def _ring_kernel(
    context, members, flags, epochs, status, budget, src, dst, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr,
):  # fmt: skip
    """Program p owns GROUP consecutive tiles ("chunks"). Reduce-scatter: at step s each
    rank pulls the left neighbour's partial of chunk (ME-1-s) mod G, adds its own input and
    keeps the partial in ``dst``. All-gather: at step s it copies the left neighbour's
    finished chunk (ME-s) mod G. A barrier separates the steps."""
    ctx = Context.initialize(context, RANK, WORLD)
    pid = tl.program_id(0)
    left = tl.load(members + (ME + GROUP - 1) % GROUP)
    lanes = tl.arange(0, BLOCK)
    group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)
    for s in tl.static_range(GROUP - 1):
        chunk = (ME + 2 * GROUP - 1 - s) % GROUP
        offs = (pid * GROUP + chunk) * BLOCK + lanes
        mask = offs < n
        if s == 0:
            theirs = ctx.load(src + offs, left, mask=mask, other=0)
        else:
            theirs = ctx.load(dst + offs, left, mask=mask, other=0)
        mine = tl.load(src + offs, mask=mask, other=0)
        if ACC_FP32:
            partial = combine(theirs.to(tl.float32), mine.to(tl.float32), OP)
        else:
            partial = combine(theirs, mine, OP)
        if s == GROUP - 2:
            if OP == "avg":
                partial = partial / GROUP
        tl.store(dst + offs, partial.to(dst.dtype.element_ty), mask=mask)
        group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)
    for s in tl.static_range(GROUP - 1):
        chunk = (ME + GROUP - s) % GROUP
        offs = (pid * GROUP + chunk) * BLOCK + lanes
        mask = offs < n
        tl.store(dst + offs, ctx.load(dst + offs, left, mask=mask, other=0), mask=mask)
        group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)


@triton.jit
def _atomic_kernel(
    context, members, flags, epochs, status, budget, src, acc, locks, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, LOCKED: tl.constexpr,
):  # fmt: skip
    """SUM only. Program p: zero the local accumulator tile, barrier, add the input tile
    into every member's accumulator (atomics, or read-add-write under the target's tile
    lock), barrier. ``acc`` has the accumulation dtype."""
    ctx = Context.initialize(context, RANK, WORLD)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src + offs, mask=mask, other=0).to(acc.dtype.element_ty)
    tl.store(acc + offs, tl.zeros([BLOCK], acc.dtype.element_ty), mask=mask)
    group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)
    for i in tl.static_range(GROUP):
        peer = tl.load(members + (ME + i) % GROUP)  # rotate the start to spread contention
        if LOCKED:
            lock = locks + pid
            spins = pid * 0
            while (ctx.atomic_cas(lock, 0, 1, peer, sem="acquire", scope="sys") != 0) & (spins < budget):
                spins += 1
            if spins < budget:
                tl.debug_barrier()
                old = ctx.load(acc + offs, peer, mask=mask, other=0, volatile=True)
                ctx.store(acc + offs, old + x, peer, mask=mask)
                tl.debug_barrier()
                ctx.atomic_xchg(lock, 0, peer, sem="release", scope="sys")
            else:
                record_timeout(status, RANK, peer, ctx.translate(lock, peer))
        else:
            ctx.atomic_add(acc + offs, x, peer, mask=mask, sem="relaxed", scope="sys")
    group_sync(ctx, members, flags, epochs, status, budget, pid, GROUP, ME)


_KERNELS = {"one_shot": _one_shot_kernel, "two_shot": _two_shot_kernel, "ring": _ring_kernel}


def all_reduce(
    out: torch.Tensor,
    inp: torch.Tensor,
    *,
    op: ReduceOp | str = ReduceOp.SUM,
    group=None,
    async_op: bool = False,
    config: Config | None = None,
) -> Work | None:
    """Reduce ``inp`` over the ranks of ``group`` into ``out`` on every rank.

    :param out: result, same shape, dtype and device as ``inp``; may be ``inp``.
    :param inp: this rank's contribution; any shape, contiguous or not.
    :param op: SUM, AVG (floating types), MAX or MIN.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config`; None picks by size.

    Tensors on a symmetric heap spanning exactly ``group`` are used in place; others are
    copied through the collective's staging buffers (one extra local copy each way).
    """
    _host.check_pair(out, inp, "all_reduce", inp.numel())
    if out.shape != inp.shape:
        raise ValueError(f"all_reduce: out has shape {list(out.shape)} but inp has {list(inp.shape)}")
    rop = ReduceOp.parse(op)
    _host.check_op(rop, inp.dtype)
    n = inp.numel()
    variant = (config or Config()).variant
    stage = variant in ("atomic", "spinlock")  # they accumulate in a workspace of their own
    comm, in_place, cfg = _host.setup("all_reduce", [out, inp], group, config, n * inp.element_size(), stage)
    if cfg.variant in ("atomic", "spinlock") and rop not in (ReduceOp.SUM, ReduceOp.AVG):
        raise ValueError(
            f"all_reduce variant {cfg.variant!r} supports SUM and AVG only; use one_shot, two_shot or ring"
        )
    if n == 0:
        return _host.finish(comm, async_op)
    src_all, dst_all = _host.contiguous_pair(inp, out)
    if comm.size == 1:
        dst_all.copy_(src_all)
        _host.copy_back(out, dst_all)
        return _host.finish(comm, async_op)
    ring = cfg.variant == "ring"
    per_launch = _host.max_elements(cfg, 8, not in_place, comm, comm.size if ring else 1)
    for start, length in _host.chunks(n, per_launch):
        src, dst = src_all[start : start + length], dst_all[start : start + length]
        grid = _host.cdiv(length, cfg.block_size * (comm.size if ring else 1))
        if cfg.variant in _KERNELS:
            ksrc = src if in_place else comm.staged_copy("in", src)
            # one_shot writes only locally, so its output may be any tensor.
            kdst = dst if in_place or cfg.variant == "one_shot" else comm.staging_like("out", dst)
            _host.launch(
                _KERNELS[cfg.variant], grid, comm, cfg, ksrc, kdst, length,
                OP=rop.value, ACC_FP32=_host.acc_fp32(inp.dtype),
            )  # fmt: skip
            if kdst is not dst:
                dst.copy_(kdst)
        else:
            acc = comm.staging_like("acc", dst, dtype=_host.acc_dtype(dst.dtype))
            locks = comm.staging("locks", grid * 4, zero=True).view(torch.int32)
            _host.launch(
                _atomic_kernel, grid, comm, cfg, src, acc, locks, length,
                OP="sum", LOCKED=cfg.variant == "spinlock",
            )  # fmt: skip
            dst.copy_(acc / comm.size if rop is ReduceOp.AVG else acc)
    _host.copy_back(out, dst_all)
    return _host.finish(comm, async_op)
