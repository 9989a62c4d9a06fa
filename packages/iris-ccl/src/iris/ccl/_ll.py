"""The ``ll`` variant ("low latency") of all_reduce, all_gather, reduce_scatter and
all_to_all: no barrier at all, for small messages.

Like ``boxed``, every member's staging buffer ``"ll"`` holds two banks (launch parity) of
``G`` boxes, box ``i`` receiving member ``i``'s data, and program ``p`` of a launch first
sends its tiles ``p, p + P, ...`` of what member ``j`` needs into box ``ME`` of member
``j``, then combines the same tiles locally. What replaces the barrier: every 8-byte word
that crosses the link is 4 bytes of data and a 4-byte flag, the launch's number, stored
together by one 8-byte store. A receiver polls its own box (volatile loads) until every
word of the tile carries this launch's flag; the data beside a flag is then that launch's
data, so nothing has to be ordered or acknowledged. The link carries twice the bytes, which
is why it serves small messages, where a barrier's acknowledgement wait and flag are most of
the time (``boxed``, one barrier per launch, 3.5-4.5 us at 8 KiB on H200 against 2.6 us).

Launch numbers: a launch counter (int64, the buffer's first word) that every launch adds
exactly ``2**20`` to, split among its programs, as in ``boxed``; ``launch = counter >> 20``
is the same for every program of a launch, and its bit 0 picks the bank. The flag is
``launch % (2**15 - 1) + 1`` (never 0, the value of a fresh buffer) in its high 16 bits and
the low 16 bits of the call's signature (:func:`iris.mem.runtime.call_signature`) in its
low 16 bits. A receiver that finds a word of this launch with another signature stops
waiting and records a call mismatch (the members called with different element counts,
dtypes, reductions or variants). A box word keeps the flag of the last launch that wrote
it, two or more launches back in the same bank; a stale word could pass for a fresh one
only if nothing had rewritten it for ``2**15 - 1`` launches of its bank, and a receiver
only polls words that its sender writes in the same launch unless the calls differ. As
with ``boxed``, a member is never more than one launch ahead of a peer that still reads
its boxes: the next launch's words in my boxes need every peer to have finished this one
first.

Element types of 1, 2, 4 or 8 bytes are packed into 32-bit words (a tile of ``BLOCK``
words holds ``BLOCK * 4 / itemsize`` elements; the last tile of a member's data is padded),
so inputs and outputs may be any tensors with any alignment, as for ``boxed``.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from iris.mem.triton.group import enter_group
from iris.mem.utils import global_timer, keep_waiting, record_mismatch

from . import _host
from ._plan import Plan
from .triton.accumulate import average, convert
from .triton.sync import advance_launch_counter, combine, enter_launch, record_timeout
from .variants import Variant

#: Bytes before the boxes in the staging buffer: the launch counter.
_HEADER = 256
#: What every launch adds to the launch counter (see the module docstring).
_LAUNCH_UNIT: tl.constexpr = tl.constexpr(1 << 20)
#: Launch numbers in flags run through 1 .. 2**15 - 1 (the high 16 bits of the flag).
_FLAG_PERIOD: tl.constexpr = tl.constexpr((1 << 15) - 1)


@triton.jit
def _pair(x, WIDE: tl.constexpr):
    """``x[2i]`` and ``x[2i + 1]`` (integers) as the low and high half of one ``WIDE`` integer."""
    BITS: tl.constexpr = x.dtype.primitive_bitwidth
    a, b = tl.split(tl.reshape(x, [x.shape[0] // 2, 2]))
    return (a.to(WIDE) & ((1 << BITS) - 1)) | (b.to(WIDE) << BITS)


@triton.jit
def _unpair(w, NARROW: tl.constexpr):
    """Inverse of :func:`_pair`: each integer of ``w`` as its low then its high half."""
    BITS: tl.constexpr = NARROW.primitive_bitwidth
    lo = w.to(NARROW)
    hi = (w >> BITS).to(NARROW)
    return tl.reshape(tl.join(lo, hi), [w.shape[0] * 2])


@constexpr_function
def _int_type(bits):
    """The signed integer type of ``bits`` bits."""
    return {8: tl.int8, 16: tl.int16, 32: tl.int32, 64: tl.int64}[int(bits)]


@triton.jit
def _to_words(x):
    """The bytes of ``x`` (1, 2, 4 or 8-byte elements) as int32 words, in memory order:
    narrower elements paired (bytes twice), 8-byte ones split."""
    BITS: tl.constexpr = x.dtype.primitive_bitwidth
    v = x.to(_int_type(BITS), bitcast=True)
    if BITS == 8:
        v = _pair(v, tl.int16)
    if BITS <= 16:
        v = _pair(v, tl.int32)
    elif BITS == 64:
        v = _unpair(v, tl.int32)
    return v


@triton.jit
def _from_words(words, ELEM: tl.constexpr):
    """Inverse of :func:`_to_words`: int32 words as elements of type ``ELEM``."""
    BITS: tl.constexpr = ELEM.primitive_bitwidth
    # 8 bytes: two words make one element; 1 and 2 bytes: a word splits into halves, each
    # half into bytes for 1-byte elements; 4 bytes: a word is an element
    HALVES: tl.constexpr = BITS <= 16
    BYTES: tl.constexpr = BITS == 8
    v = _pair(words, tl.int64) if BITS == 64 else words
    v = _unpair(v, tl.int16) if HALVES else v
    v = _unpair(v, tl.int8) if BYTES else v
    return v.to(ELEM, bitcast=True)


@triton.jit
def _receive(box, flag, ctx, group, peer: tl.constexpr, BLOCK: tl.constexpr):
    """The ``BLOCK`` words at ``box`` (this rank's memory) once every one of them carries
    ``flag`` in its high 32 bits: volatile loads of the whole tile (all in
    flight at once) until it has, for at most ``budget`` ns (then the timeout is recorded for
    the host and the words are used as they are). A word of this launch whose signature half
    differs from the flag's is a call mismatch: recorded, and the wait ends. Measured on 2 x
    H200, per-thread spinning on each word (inline PTX, no barrier per poll) was slower from
    512 KiB up (1 MiB all_reduce 16.2 against 11.3 us): a thread's words are then waited for
    one after another."""
    words = tl.load(box + tl.arange(0, BLOCK), volatile=True)
    start = global_timer()
    flags = words >> 32
    missing = tl.sum((flags != flag).to(tl.int32))
    # A sender's words of one launch all carry its signature: the largest flag is this
    # launch's (older launches have smaller numbers, but at the wrap of the launch numbers).
    newest = tl.max(flags)
    other = ((newest >> 16) == (flag >> 16)) & (newest != flag)  # this launch, another call
    sender = group.rank(peer)
    while (missing > 0) & (other == 0) & keep_waiting(start, group.budget, group.status, sender):
        words = tl.load(box + tl.arange(0, BLOCK), volatile=True)
        flags = words >> 32
        missing = tl.sum((flags != flag).to(tl.int32))
        newest = tl.max(flags)
        other = ((newest >> 16) == (flag >> 16)) & (newest != flag)
    if other:
        record_mismatch(group.status, ctx.rank, sender, group.sig, newest & 0xFFFF)
    elif missing > 0:
        record_timeout(group.status, ctx.rank, sender, box)
    return words


@triton.jit
def _received(box, flag, ctx, group, peer: tl.constexpr, BLOCK: tl.constexpr, ELEM: tl.constexpr):
    """The tile member ``peer`` stored at ``box`` (elements of ``ELEM``), once it has arrived."""
    return _from_words(_receive(box, flag, ctx, group, peer, BLOCK).to(tl.int32), ELEM)


@triton.jit
def _ll_kernel(
    context, members, flags, epochs, status, budget, src, dst, boxes, launches, n, src_stride, dst_stride,
    box_stride,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    MODE: tl.constexpr, OP: tl.constexpr, ACC_FP32: tl.constexpr, PDL: tl.constexpr = False,
    SIG=0,
):  # fmt: skip
    """Member ``j`` is sent ``src[j * src_stride + e]``, ``e < n`` (``src_stride`` 0: the
    same data to everyone); member ``i``'s data ends in ``dst[i * dst_stride + e]``
    (reductions: ``dst[e]``). A tile is ``BLOCK`` words whose low 32 bits hold ``TILE``
    consecutive elements."""
    enter_launch(PDL)
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    ELEM: tl.constexpr = src.dtype.element_ty
    TILE: tl.constexpr = BLOCK * 32 // ELEM.primitive_bitwidth
    ntiles = tl.cdiv(n, TILE)
    launch = tl.load(launches) >> 20
    flag = ((launch % _FLAG_PERIOD + 1) << 16) | (tl.cast(SIG, tl.int64) & 0xFFFF)
    bank = boxes + (launch & 1) * GROUP * box_stride
    t = pid
    while t < ntiles:
        words = t * BLOCK + tl.arange(0, BLOCK)
        for k in tl.static_range(1, GROUP):
            j = (ME + k) % GROUP
            offs = t * TILE + tl.arange(0, TILE)
            x = tl.load(src + tl.cast(j, tl.int64) * src_stride + offs, mask=offs < n)
            line = (_to_words(x).to(tl.int64) & 0xFFFFFFFF) | (flag.to(tl.int64) << 32)
            ctx.store(bank + ME * box_stride + words, line, group.rank(j), hint=16)
        t += tl.num_programs(0)
    own = src + tl.cast(ME, tl.int64) * src_stride
    t = pid
    while t < ntiles:
        first = t * BLOCK
        offs = t * TILE + tl.arange(0, TILE)
        mask = offs < n
        if MODE == "all_reduce" or MODE == "reduce_scatter":
            if ME == 0:
                acc = tl.load(own + offs, mask=mask, other=0.0)
            else:
                acc = _received(bank + first, flag, ctx, group, 0, BLOCK, ELEM)
            if ACC_FP32:
                acc = convert(acc, tl.float32)
            for i in tl.static_range(1, GROUP):
                if i == ME:
                    x = tl.load(own + offs, mask=mask, other=0.0)
                else:
                    x = _received(bank + i * box_stride + first, flag, ctx, group, i, BLOCK, ELEM)
                if ACC_FP32:
                    x = convert(x, tl.float32)
                acc = combine(acc, x, OP)
            if OP == "avg":
                acc = average(acc, GROUP)
            tl.store(dst + offs, convert(acc, dst.dtype.element_ty), mask=mask)
        else:
            for i in tl.static_range(GROUP):
                if i == ME:
                    x = tl.load(own + offs, mask=mask)
                else:
                    x = _received(bank + i * box_stride + first, flag, ctx, group, i, BLOCK, ELEM)
                tl.store(dst + tl.cast(i, tl.int64) * dst_stride + offs, x, mask=mask)
        t += tl.num_programs(0)
    advance_launch_counter(launches, _LAUNCH_UNIT)  # this launch's 2**20 (module docstring)


def run(plan: Plan) -> None:
    """Run ``plan`` over ``plan.count`` elements per member: ``plan.src`` and ``plan.dst`` are
    flat, contiguous and may be any tensors (``dst`` may be ``src`` for an all-reduce).
    ``cfg.block_size`` is the tile in 8-byte words."""
    comm, cfg, src_all, dst_all, mode = plan.comm, plan.cfg, plan.src, plan.dst, plan.collective
    itemsize = src_all.element_size()
    region = comm.staging("ll", 0, zero=True)
    launches = region[:8].view(torch.int64)
    # Two banks of G boxes of whole tiles (8 bytes per word on the link); smaller tiles
    # when a box (IRIS_CCL_STAGING_BYTES) holds less than one.
    capacity = (region.numel() - _HEADER) // (2 * comm.size * 8)
    block = cfg.block_size
    while block > capacity and block > 16:
        block //= 2
    if block > capacity:
        raise RuntimeError(
            f"iris.ccl: variant {cfg.variant!r} needs staging buffers of at least "
            f"{_HEADER + 2 * comm.size * 8 * 16} bytes for {comm.size} ranks; "
            f"IRIS_CCL_STAGING_BYTES gives {region.numel()}"
        )
    if block != cfg.block_size:
        cfg = dataclasses.replace(cfg, block_size=block)
    per_tile = block * 4 // itemsize  # elements per tile
    box_stride = capacity // block * block
    boxes = region[_HEADER : _HEADER + 2 * comm.size * box_stride * 8].view(torch.int64)
    src_stride = plan.count if mode in ("reduce_scatter", "all_to_all") else 0
    dst_stride = plan.count if mode in ("all_gather", "all_to_all") else 0
    meta = {"MODE": mode, "OP": plan.op_value, "ACC_FP32": _host.acc_fp32(src_all.dtype)}
    per_launch = box_stride // block * per_tile
    if cfg.chunk_elements:
        per_launch = min(per_launch, max(cfg.chunk_elements // per_tile, 1) * per_tile)
    for start, length in _host.chunks(plan.count, per_launch):
        src, dst = src_all[start:], dst_all[start:]
        grid = _host.persistent_grid(comm, cfg, _host.cdiv(length, per_tile) * block)
        _host.launch(
            _ll_kernel, grid, comm, cfg, src, dst, boxes, launches, length, src_stride, dst_stride,
            box_stride, **meta,
        )  # fmt: skip


REGISTERED = tuple(
    Variant(collective=mode, name="ll", run=run, staged=True)
    for mode in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
)
