"""Uneven ``all_to_all`` (split sizes given, ``torch.distributed.all_to_all_single``
semantics): rank ``i`` sends rows ``input_split_sizes[j]`` of its input to rank ``j``,
which stores what it receives from every rank in rank order, ``output_split_sizes[i]``
rows from rank ``i``.

Why one launch with decisions on the device: a rank knows its own split sizes (what it
sends to each peer and receives from each), never the others'. Nothing that depends on
sizes can be decided on the host the same way on every rank without a host exchange (a
synchronisation): not the variant, not the number of launches, not the grid. So every
uneven call is one launch of :func:`_uneven_kernel` on iris.ccl's own heap for the group,
with ``resident_programs`` programs, and what must agree is decided in the kernel from what
the ranks tell each other:

1. **Headers.** Program 0 stores a header into box ``ME`` of every peer ``j`` (the ``ll``
   staging buffer, flags in the data as in :mod:`iris.ccl._ll`): where ``j``'s data lands
   in this rank's output (or, for a pull, where this rank's data for ``j`` starts in its
   input), how many bulk rounds this rank needs as a sender, the heap offset of that
   output (input), so that heap tensors need not sit at the same offset on every rank
   (with uneven sizes they seldom do), and the pair's row count as this rank sees it, which
   bounds a direct transfer where split sizes disagree. Every program polls the headers of
   every peer (a header from a peer also proves that the peer has entered the call, so its
   output may be written). A header that does not come (a peer that failed, is later than
   the wait budget, or makes another call) is never read: the buffer holds words of earlier
   calls there; the call moves no bulk pair and the host raises what the wait recorded.
2. **Small pairs, flags in data.** A pair (sender ``i``, receiver ``j``) whose count is at
   most ``ll_limit`` elements (both ends know the pair's count, so both classify it the
   same way) goes the ``ll`` way at once, without waiting for any header: its tiles, data
   beside this launch's flag in every 8-byte word, into box ``i`` on ``j``; ``j`` polls
   and copies them into its output. With only small pairs a call costs one trip over the
   link and no barrier.
3. **Bulk pairs.** Larger pairs move after the headers, in one of two ways (the same on
   every rank: decided by the variant and by whether the tensors are on a heap, which every
   rank passes alike): *direct*, the sender stores them into the receiver's output on the
   caller's heap (push; or the receiver loads them from the sender's input, pull), then
   one barrier; or *rounds* (tensors anywhere), box-sized pieces of every bulk pair stored
   into box ``i`` of the receiver's ``push`` staging buffer, a barrier, and the receiver
   copies its boxes into its output, as many rounds as the largest pair needs (the maximum
   of the headers: the same on every rank). Remote accesses of the bulk path are tiled on
   the remote side's alignment, so whole tiles move as 16-byte vectors.

Every flag carries the launch number and the low 16 bits of the call's signature (dtype,
row size, variant, whether bulk pairs move directly), as the ``ll`` variant's words do: a
rank that finds a word of this launch from another call records a mismatch, and every
rank raises :class:`~iris.mem.CallMismatchError`. Split sizes are not signed: they differ
between ranks by design. The ``ll`` buffer keeps the discipline of :mod:`iris.ccl._ll` (a
launch counter, two banks by launch parity, every member receiving a word from every
member in every launch); the rounds use the ``push`` buffer's banks so that the ``boxed``
launch after this one writes a bank this launch's last round did not use (see
:func:`_bulk_rounds`).

The kernel is written as named parts, one per step above (:func:`_send_headers`,
:func:`_send_small`, :func:`_receive_headers`, :func:`_receive_small`, :func:`_bulk_direct`,
:func:`_bulk_rounds`); the host side validates the call (:mod:`iris.ccl._split_sizes`),
plans it (:func:`plan`) and runs it (:func:`run`). The split sizes reach the kernel as a
small device tensor of row counts and offsets per member, made once per distinct set of
sizes (pinned host memory and an asynchronous copy where the device has streams, so nothing
waits on the host and the call can be captured in a CUDA graph; tables used while
capturing are kept alive for the graph's replays).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

import iris.mem
from iris.mem import SymmetricHeap
from iris.mem.triton import Context
from iris.mem.triton.group import enter_group

from . import _boxed, _comm, _host, _split_sizes
from ._ll import _FLAG_PERIOD, _LAUNCH_UNIT, _receive, _received
from ._ll import _HEADER as _LL_HEADER
from .config import Config, auto_variant
from .settings import table_path
from .triton import ll
from .triton.sync import advance_launch_counter, enter_launch
from .work import Work

#: 8-byte words at the start of each ``ll`` box that hold the header (16: 128-byte aligned tiles).
HEADER_WORDS = 16
_HDR: tl.constexpr = tl.constexpr(HEADER_WORDS)
#: Header words a rank sends every peer (8, of which 5 are used): where the peer's rows go
#: in (push) or come from (pull) its tensor, the bulk rounds it needs, the heap offset of
#: that tensor (two words: direct accesses need no tensor at the same heap offset on every
#: rank) and the pair's rows as it sees them (a direct transfer never goes past them, even
#: where split sizes disagree).
_WORDS: tl.constexpr = tl.constexpr(8)
#: What ``Config(variant=...)`` means for an uneven call: which pairs go the ``ll`` way
#: ("table": up to the tuning table's ``ll`` size per pair, "box": every pair that fits an
#: ``ll`` box, "none": no pair) and how bulk pairs move ("push"/"pull": directly where the
#: output/input is on a heap spanning the group, else in rounds; "rounds": always in rounds).
MODES = {
    "auto": ("table", "push"),
    "ll": ("box", "push"),
    "boxed": ("none", "rounds"),
    "push": ("none", "push"),
    "pull": ("none", "pull"),
    # copies need every destination address on the host, which is another rank's split sizes
    "copy_engine": ("none", "push"),
}


@triton.jit
def _lead(start, VEC: tl.constexpr):
    """``start`` modulo ``VEC``, in ``[0, VEC)`` also for a negative ``start`` (integer ``%``
    truncates towards zero)."""
    return (start % VEC + VEC) % VEC


@triton.jit
def _span(start, n, t, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """Tile ``t`` of the span ``[start, start + n)`` in tiles that begin at ``start`` rounded
    down to ``VEC`` elements (16 bytes; ``start`` may be negative: a peer's tensor before
    this rank's in the heap): its offsets, its mask and whether it is whole (no mask
    needed, so its accesses may be 16-byte vectors)."""
    first = tl.multiple_of(start - _lead(start, VEC), VEC) + t.to(tl.int64) * BLOCK
    offs = first + tl.arange(0, BLOCK)
    full = (first >= start) & (first + BLOCK <= start + n)
    return offs, (offs >= start) & (offs < start + n), full


@triton.jit
def _tiles(start, n, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """Tiles of :func:`_span` covering ``n`` elements from ``start`` (0 when ``n`` is 0)."""
    return tl.where(n > 0, tl.cdiv(_lead(start, VEC) + n, BLOCK), 0)


@triton.jit
def _move(ctx, src, dst, s, d, n, t, peer, PUSH: tl.constexpr, BLOCK: tl.constexpr, HINT: tl.constexpr):
    """Tile ``t`` of ``src[s : s + n]`` -> ``dst[d : d + n]`` with the remote side on rank
    ``peer`` (``dst`` when ``PUSH``, else ``src``), tiled on the remote side's alignment."""
    VEC: tl.constexpr = 128 // src.dtype.element_ty.primitive_bitwidth
    offs, mask, full = _span(d if PUSH else s, n, t, BLOCK, VEC)
    local = offs + (s - d if PUSH else d - s)
    if PUSH:
        if full:
            ctx.store(dst + offs, tl.load(src + local), peer, hint=HINT)
        else:
            ctx.store(dst + offs, tl.load(src + local, mask=mask), peer, mask=mask)
    else:
        if full:
            tl.store(dst + local, ctx.load(src + offs, peer, hint=HINT))
        else:
            tl.store(dst + local, ctx.load(src + offs, peer, mask=mask), mask=mask)


@triton.jit
def _copy(src, dst, n, t, BLOCK: tl.constexpr):
    """Local: tile ``t`` of ``src[:n]`` -> ``dst[:n]``."""
    offs = t.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _bulk_need(table, row, ll_limit, stride, GROUP: tl.constexpr, ME: tl.constexpr, DIRECT: tl.constexpr):
    """What this rank needs as a sender, for its header: the bulk rounds of its largest bulk
    pair (rows above ``ll_limit`` elements, in pieces of ``stride``), or with ``DIRECT`` 1
    (one end barrier) where it has any bulk pair; 0 where every pair goes the ``ll`` way."""
    need = tl.zeros([], tl.int64)
    for k in tl.static_range(1, GROUP):
        n = tl.load(table + GROUP + (ME + k) % GROUP) * row
        if DIRECT:
            pieces = tl.where(n > ll_limit, 1, 0)
        else:
            pieces = tl.where(n > ll_limit, tl.cdiv(n, stride), 0)
        need = tl.maximum(need, pieces)
    return need


@triton.jit
def _send_headers(
    ctx, group, bank, box_stride, table, need, far, flag,
    GROUP: tl.constexpr, ME: tl.constexpr, PUSH: tl.constexpr,
):  # fmt: skip
    """Store this rank's header into box ``ME`` of every peer ``j`` (module docstring):
    word 0 where ``j``'s rows go in this rank's output (pull: where this rank's rows for
    ``j`` start in its input), 1 ``need``, 2 and 3 the low and high half of ``far`` (the
    heap offset of that tensor), 4 the pair's rows as this rank sees them. Each word
    carries ``flag`` in its high half, as the ``ll`` tiles do: the header needs no barrier."""
    w = tl.arange(0, _WORDS)
    for k in tl.static_range(1, GROUP):
        j = (ME + k) % GROUP
        at = tl.load(table + (2 if PUSH else 0) * GROUP + j)
        rows = tl.load(table + (3 if PUSH else 1) * GROUP + j)
        payload = tl.where(w == 0, at, tl.where(w == 1, need, tl.where(w == 2, far, far >> 32)))
        payload = tl.where(w == 4, rows, payload)
        words = (payload & 0xFFFFFFFF) | (flag.to(tl.int64) << 32)
        # one 8-word store per peer: 64 bytes, aligned (boxes are 128-byte multiples)
        ctx.store(bank + ME * box_stride + w, words, group.rank(j), hint=16)


@triton.jit
def _send_small(
    ctx, group, bank, box_stride, src, table, row, ll_limit, flag, pid, programs,
    GROUP: tl.constexpr, ME: tl.constexpr, LL_BLOCK: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    """The small pairs this rank sends (at most ``ll_limit`` elements; the receiver
    classifies the pair alike from its own count), at once and without any header: tiles
    of ``TILE`` elements packed into ``LL_BLOCK`` flagged words after the header of box
    ``ME`` of the receiver. Program ``pid`` sends tiles ``pid, pid + programs, ...``."""
    for k in tl.static_range(1, GROUP):
        j = (ME + k) % GROUP
        n = tl.load(table + GROUP + j) * row
        first = tl.load(table + j) * row
        t = pid
        while t < tl.where(n <= ll_limit, tl.cdiv(n, TILE), 0):
            offs = t * TILE + tl.arange(0, TILE)
            x = tl.load(src + first + offs, mask=offs < n)
            words = _HDR + t * LL_BLOCK + tl.arange(0, LL_BLOCK)
            ctx.store(bank + ME * box_stride + words, ll.pack(x, flag), group.rank(j), hint=16)
            t += programs


@triton.jit
def _copy_own(
    src, dst, table, row, pid, programs, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr
):
    """This rank's rows for itself, a local copy (tiles ``pid, pid + programs, ...``)."""
    n = tl.load(table + GROUP + ME) * row
    t = pid
    while t < tl.cdiv(n, BLOCK):
        _copy(src + tl.load(table + ME) * row, dst + tl.load(table + 2 * GROUP + ME) * row, n, t, BLOCK)
        t += programs


@triton.jit
def _receive_headers(ctx, group, bank, box_stride, flag, need, GROUP: tl.constexpr, ME: tl.constexpr):
    """Wait for every peer's header (which also proves that the peer has entered this
    launch, so its output may be written) and return the bulk rounds of the call: the
    largest ``need`` of any member, the same on every rank; 0 where a header did not come.

    A header that did not come (its sender failed, is later than the budget, or made
    another call: the wait recorded it in the status words, or found them set already)
    leaves in its place whatever the buffer held, words of earlier calls (the ``ll``
    tiles of a small all_reduce, say): nothing may be read from it, neither the rounds nor
    the peer's offsets. The call then moves no bulk pair, and the host raises what was
    recorded."""
    w = tl.arange(0, _WORDS)
    rounds = need
    for k in tl.static_range(1, GROUP):
        i = (ME + GROUP - k) % GROUP
        # flags carry the call's signature: a peer making another call is recorded as a mismatch
        header = _receive(bank + i * box_stride, flag, ctx, group, i, _WORDS) & 0xFFFFFFFF
        rounds = tl.maximum(rounds, tl.sum(tl.where(w == 1, header, 0)))
    # volatile: written by this launch's waits (any program's), or by the host (an abort)
    failed = tl.load(group.status, volatile=True) != 0
    return tl.where(failed, 0, rounds)


@triton.jit
def _receive_small(
    ctx, group, bank, box_stride, dst, table, row, ll_limit, flag, pid, programs,
    GROUP: tl.constexpr, ME: tl.constexpr, LL_BLOCK: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    """The small pairs this rank receives: poll box ``i`` for each tile of peer ``i``'s
    rows (its words carry this launch's flag once they are there; a word of this launch
    with another call's signature is recorded as a mismatch) and unpack them into the
    output. After a wait that gave up the words are used as they are: the call has failed
    (the host raises), and they land only inside the output."""
    ELEM: tl.constexpr = dst.dtype.element_ty
    for k in tl.static_range(1, GROUP):
        i = (ME + GROUP - k) % GROUP
        m = tl.load(table + 3 * GROUP + i) * row
        at = tl.load(table + 2 * GROUP + i) * row
        t = pid
        while t < tl.where(m <= ll_limit, tl.cdiv(m, TILE), 0):
            x = _received(bank + i * box_stride + _HDR + t * LL_BLOCK, flag, ctx, group, i, LL_BLOCK, ELEM)
            offs = t * TILE + tl.arange(0, TILE)
            tl.store(dst + at + offs, x, mask=offs < m)
            t += programs


@triton.jit
def _bulk_direct(
    group, user, bank, box_stride, src, dst, table, row, ll_limit, far, pid, programs,
    GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr, PUSH: tl.constexpr, HINT: tl.constexpr,
):  # fmt: skip
    """Bulk pairs straight into each peer's output (``PUSH``) or out of its input, both on
    the caller's heap (``user``, its context): where they lie on the peer comes from the
    peer's header, which has arrived (:func:`_receive_headers`). The caller's barrier after
    it makes the moves visible (push) and keeps the inputs until every peer has read them
    (pull)."""
    ELEM: tl.constexpr = src.dtype.element_ty
    VEC: tl.constexpr = 128 // ELEM.primitive_bitwidth
    w = tl.arange(0, _WORDS)
    for k in tl.static_range(1, GROUP):
        j = (ME + k) % GROUP
        header = tl.load(bank + j * box_stride + w, volatile=True) & 0xFFFFFFFF  # arrived
        # the peer's offset, in this rank's coordinates of the tensor (heap offsets may differ)
        peer_far = tl.sum(tl.where(w == 2, header, 0)) | (tl.sum(tl.where(w == 3, header, 0)) << 32)
        there = tl.sum(tl.where(w == 0, header, 0)) * row
        there += (peer_far - far) // (ELEM.primitive_bitwidth // 8)
        n = tl.load(table + (1 if PUSH else 3) * GROUP + j) * row
        # never past the rows the peer expects (or sends): split sizes may disagree
        agreed = tl.sum(tl.where(w == 4, header, 0)) * row
        n = tl.where(n > ll_limit, tl.minimum(n, agreed), 0)
        here = tl.load(table + (0 if PUSH else 2) * GROUP + j) * row
        s = here if PUSH else there
        d = there if PUSH else here
        t = pid
        while t < _tiles(d if PUSH else s, n, BLOCK, VEC):
            _move(user, src, dst, s, d, n, t, group.rank(j), PUSH, BLOCK, HINT)
            t += programs


@triton.jit
def _bulk_rounds(
    ctx, group, src, dst, slots, counter, table, row, ll_limit, stride, rounds, pid, programs,
    GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr, HINT: tl.constexpr,
):  # fmt: skip
    """Bulk pairs in ``rounds`` rounds through the ``push`` buffer (tensors anywhere): in
    round ``r`` piece ``r`` (``stride`` elements) of every bulk pair goes into box ``ME``
    of the receiver, a barrier, and each rank copies its boxes out.

    Round ``r`` uses bank ``(B + rounds - r) & 1``, ``B`` the bank the next ``boxed``
    launch will use: the last round uses the other bank, and a rank finishes only after
    every peer has finished copying out the round before it (the barrier of the last
    round), so the next ``boxed`` launch, which writes bank ``B`` without a barrier, never
    overwrites a box still being read."""
    VEC: tl.constexpr = 128 // src.dtype.element_ty.primitive_bitwidth
    base = (tl.load(counter) >> 20) & 1
    origin = tl.zeros([], tl.int64)  # boxes start aligned
    r = tl.zeros([], tl.int64)
    while r < rounds:
        bulk = slots + ((base + rounds - r) & 1).to(tl.int64) * GROUP * stride
        for k in tl.static_range(1, GROUP):
            j = (ME + k) % GROUP
            n = tl.load(table + GROUP + j) * row
            part = tl.where(n > ll_limit, tl.minimum(tl.maximum(n - r * stride, 0), stride), 0)
            s = tl.load(table + j) * row + r * stride
            mine, t = bulk + ME * stride, pid
            while t < _tiles(origin, part, BLOCK, VEC):
                _move(ctx, src, mine, s, origin, part, t, group.rank(j), True, BLOCK, HINT)
                t += programs
        group.sync(ctx, pid)  # this round's pieces from every member have arrived
        for k in tl.static_range(1, GROUP):
            i = (ME + GROUP - k) % GROUP
            m = tl.load(table + 3 * GROUP + i) * row
            part = tl.where(m > ll_limit, tl.minimum(tl.maximum(m - r * stride, 0), stride), 0)
            at = tl.load(table + 2 * GROUP + i) * row + r * stride
            t = pid
            while t < tl.cdiv(part, BLOCK):
                _copy(bulk + i * stride, dst + at, part, t, BLOCK)
                t += programs
        r += 1


@triton.jit
def _uneven_kernel(
    context, members, flags, epochs, status, budget, user_context, src, dst, table, boxes, launches,
    slots, counter, row, ll_limit, box_stride, stride,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    LL_BLOCK: tl.constexpr, PUSH: tl.constexpr, DIRECT: tl.constexpr, HINT: tl.constexpr,
    PDL: tl.constexpr = False,
    SIG=0,
):  # fmt: skip
    """One uneven all_to_all (module docstring). ``table`` (int64 rows, ``[4, GROUP]``):
    send offsets, send counts, receive offsets, receive counts per member; ``row`` elements
    per row. ``src``/``dst`` are local (any memory), or with ``DIRECT`` the caller's
    tensors on the heap of ``user_context`` (``dst`` when ``PUSH``, else ``src``). ``boxes``
    and ``launches``: the ``ll`` buffer's two banks of ``GROUP`` boxes of ``box_stride``
    words and its launch counter; ``slots`` and ``counter``: the ``push`` buffer's two banks
    of ``GROUP`` boxes of ``stride`` elements and the ``boxed`` launch counter."""
    enter_launch(PDL)
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    TILE: tl.constexpr = LL_BLOCK * 32 // src.dtype.element_ty.primitive_bitwidth  # elements per ll tile
    programs = tl.num_programs(0)
    # the launch number: the same in every program (each adds its share only at the end)
    launch = tl.load(launches) >> 20
    # the flag of every word this launch sends: the launch number in its high 16 bits, the
    # low 16 bits of the call's signature in its low ones (as in the equal ll kernel), so
    # that ranks making different calls (dtype, row size, variant, direct or not) see it
    flag = ((launch % _FLAG_PERIOD + 1) << 16) | (tl.cast(SIG, tl.int64) & 0xFFFF)
    bank = boxes + (launch & 1) * GROUP * box_stride
    need = _bulk_need(table, row, ll_limit, stride, GROUP, ME, DIRECT)
    if DIRECT:  # the heap offset (bytes) of the tensor the peers access here
        user = Context.initialize(user_context, RANK, WORLD)
        far = (dst if PUSH else src).to(tl.int64, bitcast=True) - tl.load(user.heap_bases + RANK)
    else:
        far = tl.zeros([], tl.int64)
    if pid == 0:  # one program sends the headers
        _send_headers(ctx, group, bank, box_stride, table, need, far, flag, GROUP, ME, PUSH)
    _send_small(
        ctx, group, bank, box_stride, src, table, row, ll_limit, flag, pid, programs,
        GROUP, ME, LL_BLOCK, TILE,
    )  # fmt: skip
    _copy_own(src, dst, table, row, pid, programs, GROUP, ME, BLOCK)
    rounds = _receive_headers(ctx, group, bank, box_stride, flag, need, GROUP, ME)
    _receive_small(
        ctx, group, bank, box_stride, dst, table, row, ll_limit, flag, pid, programs,
        GROUP, ME, LL_BLOCK, TILE,
    )  # fmt: skip
    if rounds > 0:
        if DIRECT:
            _bulk_direct(
                group, user, bank, box_stride, src, dst, table, row, ll_limit, far, pid, programs,
                GROUP, ME, BLOCK, PUSH, HINT,
            )  # fmt: skip
            group.sync(ctx, pid)  # every bulk pair has landed
        else:
            _bulk_rounds(
                ctx, group, src, dst, slots, counter, table, row, ll_limit, stride, rounds, pid, programs,
                GROUP, ME, BLOCK, HINT,
            )  # fmt: skip
    advance_launch_counter(launches, _LAUNCH_UNIT)


# --------------------------------------------------------------------------- host side


@functools.cache
def _table_ll_bytes(size: int, path: str | None) -> int:
    """Bytes per pair that ``"auto"`` sends the ``ll`` way: the largest all_to_all message
    the tuning table gives to ``ll`` for ``size`` ranks, over the ranks it goes to."""
    largest = 0
    for shift in range(10, 41):
        if auto_variant("all_to_all", 1 << shift, size) == "ll":
            largest = 1 << shift
    return largest // size


def _tile_defaults(config: Config | None, caps) -> tuple[Config, int]:
    """The config with its tile, warps and programs filled in, and the ``ll`` tile in words.
    Nothing here depends on sizes: every rank resolves the same."""
    config = config or Config()
    config.check_variant("all_to_all")
    ll_words = 1024 if caps.interpreted else 256
    block = config.block_size
    if config.variant == "ll" and block:
        ll_words, block = block, 0  # for ll, Config.block_size counts words, as in the equal case
    block = block or (1024 if caps.interpreted else 4096)
    warps = config.num_warps or (4 if block <= 1024 else 8)
    cfg = Config(variant=config.variant, block_size=block, num_warps=warps, programs=config.programs)
    return cfg, ll_words


@dataclasses.dataclass(frozen=True)
class UnevenPlan:
    """One uneven call made ready for its launch (two members or more, rows of at least one
    element): the kernel's arguments beside the communicator's.

    Attributes:
        comm: iris.ccl's own communicator for the group (sync state, staging buffers).
        cfg: the resolved config (``BLOCK``, warps, programs; ``variant`` as asked).
        user: the caller's heap where bulk pairs move directly (``DIRECT``: the output, or
            for ``pull`` the input, on a heap spanning the group), else None.
        src, dst: the input and output, flat and contiguous.
        table: the split table (:meth:`~iris.ccl._split_sizes.Splits.table`).
        boxes, launches, box_stride, ll_words: the ``ll`` buffer's two banks of boxes (int64
            words), its launch counter, words per box, words per ``ll`` tile.
        slots, counter, stride: the ``push`` buffer's two banks of boxes (elements), the
            ``boxed`` launch counter, elements per box.
        row: elements per row; ll_limit: the largest pair (elements) that goes the ``ll`` way.
        push: bulk pairs pushed (else pulled, ``DIRECT`` only).
        hint: the vector hint of the remote side of bulk moves.
    """

    comm: _comm.Communicator
    cfg: Config
    user: SymmetricHeap | None
    src: torch.Tensor
    dst: torch.Tensor
    table: torch.Tensor
    boxes: torch.Tensor
    launches: torch.Tensor
    box_stride: int
    ll_words: int
    slots: torch.Tensor
    counter: torch.Tensor
    stride: int
    row: int
    ll_limit: int
    push: bool
    hint: int | None


def all_to_all(out, inp, output_split_sizes, input_split_sizes, group, async_op: bool, config) -> Work | None:
    """The uneven all_to_all (module docstring); arguments as :func:`iris.ccl.all_to_all`:
    validate, plan, run."""
    splits = _split_sizes.validate(out, inp, output_split_sizes, input_split_sizes, group, config)
    cfg, ll_words = _tile_defaults(config, iris.mem.capabilities(inp.device))
    src, dst = _host.contiguous_pair(inp, out)
    aliased = _host.overlaps(src, dst)
    if aliased:  # the output would overwrite input still to be sent
        src = src.clone()
    user = _direct_heap(cfg.variant, src, dst, group, aliased)
    # The first call over the group makes iris.ccl's state for it; the ranks agree on the
    # kind of tensors first (a ValueError on every rank if they differ). Later calls carry
    # the kind in their signature instead (no host exchange): see run().
    kind = _comm.STAGED if user is None else _comm.heap_kind(user)
    comm = _comm.own(group, inp.device, "all_to_all", kind)
    if splits.size == 1:
        dst.copy_(src)
    elif splits.row:  # rows of no elements: nothing to move on any rank (the row size is the same everywhere)
        run(plan(comm, cfg, ll_words, src, dst, splits, user))
    _host.copy_back(out, dst)
    return _host.finish(comm, async_op)


def _direct_heap(variant: str, src, dst, group, aliased: bool) -> SymmetricHeap | None:
    """The caller's heap that bulk pairs move on directly: the output's (push) or the input's
    (pull; not when the input is a copy) when it spans exactly the group, else None (bulk
    pairs go in rounds through iris.ccl's own heap). Only its context is needed: the call
    synchronises on iris.ccl's own state, so nothing is made on the caller's heap."""
    bulk = MODES[variant][1]
    if bulk == "push":
        return _comm.spanning_heap([dst], group)
    if bulk == "pull" and not aliased:
        return _comm.spanning_heap([src], group)
    return None


def _ll_boxes(comm: _comm.Communicator, ll_words: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``(boxes, launches, box_stride, ll_words)`` of the ``ll`` buffer: its launch counter,
    then two banks of ``G`` boxes, each a header, then tiles of ``ll_words`` words in its
    first half (the equal ``ll`` kernel's bank boundary moves with its tile size, and the
    ends of the boxes stay clear of it; the tile shrinks where a box is small)."""
    region = comm.staging("ll", 0, zero=True)
    box_stride = (region.numel() - _LL_HEADER) // (2 * comm.size * 8) // HEADER_WORDS * HEADER_WORDS
    if box_stride < HEADER_WORDS:
        raise RuntimeError(
            f"iris.ccl: all_to_all with split sizes needs staging buffers of at least "
            f"{_LL_HEADER + 2 * comm.size * 8 * HEADER_WORDS} bytes for {comm.size} ranks; "
            f"IRIS_CCL_STAGING_BYTES gives {region.numel()}"
        )
    while ll_words > 16 and HEADER_WORDS + ll_words > box_stride // 2:
        ll_words //= 2
    boxes = region[_LL_HEADER : _LL_HEADER + 2 * comm.size * box_stride * 8].view(torch.int64)
    return boxes, region[:8].view(torch.int64), box_stride, ll_words


def _round_boxes(comm: _comm.Communicator, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(slots, counter, stride)`` of the ``push`` buffer: the ``boxed`` launch counter, then
    two banks of ``G`` boxes of whole 64-element groups (16-byte aligned whatever the dtype)."""
    buf = comm.staging("push", 0, zero=True)
    stride = (buf.numel() - _boxed._HEADER) // (2 * comm.size * dtype.itemsize) // 64 * 64
    slots = buf[_boxed._HEADER : _boxed._HEADER + 2 * comm.size * stride * dtype.itemsize].view(dtype)
    return slots, buf[:8].view(torch.int32), stride


def plan(comm, cfg: Config, ll_words: int, src, dst, splits: _split_sizes.Splits, user) -> UnevenPlan:
    """The launch of a validated call: buffers, the ``ll`` tile and limit. Nothing here
    depends on another rank's sizes (every rank decides alike), only on the variant, the
    tensors' kind (``user``: :func:`_direct_heap`) and the group."""
    boxes, launches, box_stride, ll_words = _ll_boxes(comm, ll_words)
    slots, counter, stride = _round_boxes(comm, src.dtype)
    small, bulk = MODES[cfg.variant]
    tile = ll_words * 4 // src.element_size()  # elements per ll tile
    ll_limit = max(box_stride // 2 - HEADER_WORDS, 0) // ll_words * tile
    if small == "table":
        ll_limit = min(ll_limit, _table_ll_bytes(comm.size, table_path()) // src.element_size())
    elif small == "none":
        ll_limit = 0
    remote = (dst if bulk == "push" else src) if user is not None else slots
    return UnevenPlan(
        comm, cfg, user, src, dst, splits.table(src.device), boxes, launches, box_stride, ll_words, slots,
        counter, stride, splits.row, ll_limit, bulk != "pull", _host.vector_hint((remote,)),
    )  # fmt: skip


def run(p: UnevenPlan) -> None:
    """Launch the planned call: one launch of :func:`_uneven_kernel` with the resident
    programs. Split sizes differ between ranks by design; what must agree is signed (the
    headers, the ``ll`` tiles and the barriers carry it): the dtype, the row size, the
    variant and whether bulk pairs move directly (the kind of tensors: a rank with a heap
    output and one without would otherwise wait on different things)."""
    signature = {"dtype": p.src.dtype, "row": p.row, "variant": p.cfg.variant, "direct": p.user is not None}
    user_context = (p.user or p.comm.heap).get_device_context()
    with p.comm.signed("all_to_all (uneven splits)", **signature):
        _host.launch(
            _uneven_kernel, _host.resident_programs(p.comm, p.cfg), p.comm, p.cfg,
            user_context, p.src, p.dst, p.table, p.boxes, p.launches,
            p.slots, p.counter, p.row, p.ll_limit, p.box_stride, p.stride,
            LL_BLOCK=p.ll_words, PUSH=p.push, DIRECT=p.user is not None, HINT=p.hint,
        )  # fmt: skip
