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
   output may be written).
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

The ``ll`` buffer keeps the discipline of :mod:`iris.ccl._ll` (a launch counter, two banks
by launch parity, every member receiving a word from every member in every launch); the
rounds use the ``push`` buffer's banks so that the ``boxed`` launch after this one writes
a bank this launch's last round did not use (see :func:`_uneven_kernel`).

The split sizes reach the kernel as a small device tensor of row counts and offsets per
member, made once per distinct set of sizes (pinned host memory and an asynchronous copy
where the device has streams, so nothing waits on the host and the call can be captured in
a CUDA graph; tables used while capturing are kept alive for the graph's replays).
"""

from __future__ import annotations

import functools
import math
import operator
from collections import OrderedDict
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

import iris.mem
from iris.mem import runtime
from iris.mem.triton import Context
from iris.mem.triton.group import enter_group

from . import _boxed, _comm, _host
from ._ll import _FLAG_PERIOD, _LAUNCH_UNIT
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
#: Split rows and header payloads travel as 32-bit numbers.
MAX_ROWS = (1 << 31) - 1
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
    of ``GROUP`` boxes of ``stride`` elements and the ``boxed`` launch counter.

    Rounds use bank ``(B + W - r) & 1`` (``B`` the bank the next ``boxed`` launch will
    use): the last round uses the other bank, and a rank finishes only after every peer
    has finished copying out the round before it, so the next ``boxed`` launch, which
    writes bank ``B`` without a barrier, never overwrites a box still being read."""
    enter_launch(PDL)
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    ELEM: tl.constexpr = src.dtype.element_ty
    TILE: tl.constexpr = LL_BLOCK * 32 // ELEM.primitive_bitwidth  # elements per ll tile
    VEC: tl.constexpr = 128 // ELEM.primitive_bitwidth
    programs = tl.num_programs(0)
    launch = tl.load(launches) >> 20
    flag = launch % _FLAG_PERIOD + 1
    bank = boxes + (launch & 1) * GROUP * box_stride
    # What this rank needs as a sender: bulk rounds (or, direct, one end barrier).
    need = tl.zeros([], tl.int64)
    for k in tl.static_range(1, GROUP):
        n = tl.load(table + GROUP + (ME + k) % GROUP) * row
        if DIRECT:
            pieces = tl.where(n > ll_limit, 1, 0)
        else:
            pieces = tl.where(n > ll_limit, tl.cdiv(n, stride), 0)
        need = tl.maximum(need, pieces)
    if DIRECT:  # the heap offset (bytes) of the tensor the peers access here
        user = Context.initialize(user_context, RANK, WORLD)
        far = (dst if PUSH else src).to(tl.int64, bitcast=True) - tl.load(user.heap_bases + RANK)
    else:
        far = tl.zeros([], tl.int64)
    w = tl.arange(0, _WORDS)
    if pid == 0:  # headers: where the peer's data goes here (pull: where its data starts here)
        for k in tl.static_range(1, GROUP):
            j = (ME + k) % GROUP
            at = tl.load(table + (2 if PUSH else 0) * GROUP + j)
            rows = tl.load(table + (3 if PUSH else 1) * GROUP + j)
            payload = tl.where(w == 0, at, tl.where(w == 1, need, tl.where(w == 2, far, far >> 32)))
            payload = tl.where(w == 4, rows, payload)
            words = (payload & 0xFFFFFFFF) | (flag.to(tl.int64) << 32)
            ctx.store(bank + ME * box_stride + w, words, group.rank(j), hint=16)
    for k in tl.static_range(1, GROUP):  # small pairs: tiles with flags, at once
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
    n = tl.load(table + GROUP + ME) * row  # this rank's own rows
    t = pid
    while t < tl.cdiv(n, BLOCK):
        _copy(src + tl.load(table + ME) * row, dst + tl.load(table + 2 * GROUP + ME) * row, n, t, BLOCK)
        t += programs
    rounds = need  # the most any member needs: the same on every rank
    for k in tl.static_range(1, GROUP):  # every peer's header (it has entered this launch)
        i = (ME + GROUP - k) % GROUP
        header = ll.receive(ctx, group, bank + i * box_stride, w, w < _WORDS, flag, i) & 0xFFFFFFFF
        rounds = tl.maximum(rounds, tl.sum(tl.where(w == 1, header, 0)))
    for k in tl.static_range(1, GROUP):  # small pairs received
        i = (ME + GROUP - k) % GROUP
        m = tl.load(table + 3 * GROUP + i) * row
        at = tl.load(table + 2 * GROUP + i) * row
        t = pid
        while t < tl.where(m <= ll_limit, tl.cdiv(m, TILE), 0):
            box = bank + i * box_stride + _HDR + t * LL_BLOCK
            lines = ll.receive(ctx, group, box, tl.arange(0, LL_BLOCK), tl.arange(0, LL_BLOCK) >= 0, flag, i)
            offs = t * TILE + tl.arange(0, TILE)
            tl.store(dst + at + offs, ll.unpack(lines, ELEM), mask=offs < m)
            t += programs
    if rounds > 0:
        if DIRECT:  # bulk pairs straight into the peer's output (push) or out of its input (pull)
            for k in tl.static_range(1, GROUP):
                j = (ME + k) % GROUP
                header = tl.load(bank + j * box_stride + w, volatile=True) & 0xFFFFFFFF  # arrived
                # the peer's offset, in this rank's coordinates of the tensor (heap offsets may differ)
                peer_far = tl.sum(tl.where(w == 2, header, 0)) | (tl.sum(tl.where(w == 3, header, 0)) << 32)
                there = tl.sum(tl.where(w == 0, header, 0)) * row
                there += (peer_far - far) // (ELEM.primitive_bitwidth // 8)
                n = tl.load(table + (1 if PUSH else 3) * GROUP + j) * row
                agreed = tl.sum(tl.where(w == 4, header, 0)) * row
                n = tl.where(n > ll_limit, tl.minimum(n, agreed), 0)
                here = tl.load(table + (0 if PUSH else 2) * GROUP + j) * row
                s = here if PUSH else there
                d = there if PUSH else here
                t = pid
                while t < _tiles(d if PUSH else s, n, BLOCK, VEC):
                    _move(user, src, dst, s, d, n, t, group.rank(j), PUSH, BLOCK, HINT)
                    t += programs
            group.sync(ctx, pid)  # every bulk pair has landed
        else:  # bulk pairs in rounds of one box through the push buffer
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
    advance_launch_counter(launches, _LAUNCH_UNIT)


# --------------------------------------------------------------------------- host side


def _split_rows(sizes, name: str, t: torch.Tensor, tname: str, size: int) -> list[int]:
    """``sizes`` as a list of ``size`` non-negative ints summing to ``t.shape[0]`` (None:
    equal splits of dim 0), or a clear TypeError / ValueError naming ``name``."""
    rows = t.shape[0]
    if sizes is None:
        if rows % size:
            raise ValueError(
                f"all_to_all: {name} is None (equal splits) but {tname} has {rows} rows (shape "
                f"{list(t.shape)}), which {size} ranks do not divide; pass {name} explicitly"
            )
        return [rows // size] * size
    if isinstance(sizes, torch.Tensor):
        if sizes.device.type != "cpu" or sizes.dim() != 1 or sizes.dtype.is_floating_point:
            raise TypeError(
                f"all_to_all: {name} must be a list of ints or a 1-d integer tensor on the CPU, got a "
                f"{sizes.dtype} tensor of shape {list(sizes.shape)} on {sizes.device} (sizes on a GPU "
                "would need a host synchronisation to read: call .tolist() where that is acceptable)"
            )
        sizes = sizes.tolist()
    elif not isinstance(sizes, (list, tuple)) and callable(getattr(sizes, "tolist", None)):
        sizes = sizes.tolist()  # a numpy array
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise TypeError(f"all_to_all: {name} must be a list of ints or None, got {type(sizes).__name__}")
    bad = [s for s in sizes if isinstance(s, bool) or not hasattr(type(s), "__index__")]
    if bad:
        raise TypeError(f"all_to_all: {name} must hold ints (rows of dim 0), got {bad[0]!r} in {list(sizes)}")
    sizes = [operator.index(s) for s in sizes]
    if len(sizes) != size:
        raise ValueError(
            f"all_to_all: {name} has {len(sizes)} entries, the group has {size} ranks: give one size per rank"
        )
    if any(s < 0 for s in sizes):
        raise ValueError(f"all_to_all: {name} has a negative size: {list(sizes)}")
    if sum(sizes) != rows:
        raise ValueError(
            f"all_to_all: {name} sums to {sum(sizes)} rows but {tname} has {rows} rows (shape "
            f"{list(t.shape)}); the sizes count rows of dim 0 and must add up to it"
        )
    return sizes


def _check_shapes(out: torch.Tensor, inp: torch.Tensor) -> int:
    """Elements per row of dim 0, the same for ``out`` and ``inp``."""
    for t, name in ((out, "out"), (inp, "inp")):
        if t.dim() == 0:
            raise ValueError(f"all_to_all: {name} is a scalar; split sizes count rows of dim 0: give it one")
    row = math.prod(inp.shape[1:])
    if math.prod(out.shape[1:]) != row:
        raise ValueError(
            f"all_to_all: out (shape {list(out.shape)}) and inp (shape {list(inp.shape)}) have rows of "
            f"{math.prod(out.shape[1:])} and {row} elements; the rows of dim 0 must have the same size"
        )
    if max(out.shape[0], inp.shape[0]) > MAX_ROWS:
        raise ValueError(f"all_to_all with split sizes moves at most {MAX_ROWS} rows per rank")
    return row


def _validate(out, inp, output_split_sizes, input_split_sizes, group, config):
    """``(size, index, in_rows, out_rows, row)``: local checks, then in debug mode the
    comparison of every rank's call (a rank whose sizes are wrong makes every rank raise)."""
    _host.check_tensor(out, "out")
    _host.check_tensor(inp, "inp")
    _host.check_config(config)
    size, index = _host.group_position(group)
    _host.check_pair(out, inp, "all_to_all", out.numel())  # dtypes and devices
    problem = None
    try:
        row = _check_shapes(out, inp)
        in_rows = _split_rows(input_split_sizes, "input_split_sizes", inp, "inp", size)
        out_rows = _split_rows(output_split_sizes, "output_split_sizes", out, "out", size)
        if in_rows[index] != out_rows[index]:
            raise ValueError(
                f"all_to_all: this rank (index {index} of the group) sends itself {in_rows[index]} rows "
                f"(input_split_sizes[{index}]) but expects {out_rows[index]} (output_split_sizes[{index}]); "
                "they must be equal"
            )
    except (TypeError, ValueError) as e:
        problem = e
    if iris.mem.debug_enabled():
        _host.check_consistent(
            "all_to_all", group, shapes=[list(out.shape[1:]), list(inp.shape[1:])],
            dtypes=[str(out.dtype), str(inp.dtype)], op=None,
            variant=config.variant if isinstance(config, Config) else "auto", root=None,
            split_sizes="given", problem=None if problem is None else str(problem),
        )  # fmt: skip
    if problem is not None:
        raise problem
    if iris.mem.debug_enabled():
        _check_pairs(group, in_rows, out_rows)
    return size, index, in_rows, out_rows, row


def _check_pairs(group, in_rows: list[int], out_rows: list[int]) -> None:
    """Debug mode: rank ``i``'s ``input_split_sizes[j]`` equals rank ``j``'s
    ``output_split_sizes[i]`` for every pair, else the same ValueError on every rank."""
    ranks = runtime.group_ranks(group)
    sizes = (in_rows, out_rows)
    everyone = runtime.exchange(group, "iris.ccl all_to_all split sizes", sizes, ValueError, ranks)
    wrong = [
        f"rank {ranks[i]} sends {everyone[i][0][j]} rows to rank {ranks[j]} (its input_split_sizes[{j}]) "
        f"but rank {ranks[j]} expects {everyone[j][1][i]} (its output_split_sizes[{i}])"
        for i in range(len(ranks))
        for j in range(len(ranks))
        if everyone[i][0][j] != everyone[j][1][i]
    ]
    if wrong:
        raise ValueError(
            "all_to_all (IRIS_DEBUG): the split sizes of the ranks do not match: "
            + "; ".join(wrong[:8])
            + (f"; and {len(wrong) - 8} more" if len(wrong) > 8 else "")
            + ". Rank i's input_split_sizes[j] must equal rank j's output_split_sizes[i]"
        )


def _offsets(rows: list[int]) -> list[int]:
    return [sum(rows[:k]) for k in range(len(rows))]


#: Split tables by (device, values), most recent last; at most this many besides those
#: captured in CUDA graphs (kept for the graphs' replays).
_TABLES: OrderedDict = OrderedDict()
_CAPTURED: dict = {}
_MAX_TABLES = 64


def split_table(device: torch.device, values: list[int]) -> torch.Tensor:
    """The int64 tensor of ``values`` on ``device``: made once per distinct ``values``
    (pinned memory and an asynchronous copy where the device has streams: no host wait,
    capturable in a CUDA graph)."""
    key = (device, tuple(values))
    table = _CAPTURED.get(key)
    if table is None:
        table = _TABLES.pop(key, None)
    if table is None:
        host = torch.tensor(values, dtype=torch.int64)
        if iris.mem.capabilities(device).streams:
            host = host.pin_memory()
            table = (torch.empty(len(values), dtype=torch.int64, device=device), host)
            table[0].copy_(host, non_blocking=True)
        else:
            table = (host.to(device), host)
    if iris.mem.capturing(device):
        _CAPTURED[key] = table
    elif key not in _CAPTURED:
        _TABLES[key] = table
        while len(_TABLES) > _MAX_TABLES:
            _TABLES.popitem(last=False)
    return table[0]


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


def all_to_all(out, inp, output_split_sizes, input_split_sizes, group, async_op: bool, config) -> Work | None:
    """The uneven all_to_all (module docstring); arguments as :func:`iris.ccl.all_to_all`."""
    size, index, in_rows, out_rows, row = _validate(
        out, inp, output_split_sizes, input_split_sizes, group, config
    )
    caps = iris.mem.capabilities(inp.device)
    cfg, ll_words = _tile_defaults(config, caps)
    src, dst = _host.contiguous_pair(inp, out)
    aliased = _host.overlaps(src, dst)
    if aliased:  # the output would overwrite input still to be sent
        src = src.clone()
    comm = _comm.own(group, inp.device, "all_to_all")
    if size == 1:
        dst.copy_(src)
    elif row:  # rows of no elements: nothing to move on any rank (the rows' size is the same everywhere)
        _launch(comm, cfg, ll_words, src, dst, in_rows, out_rows, row, group, aliased)
    _host.copy_back(out, dst)
    return _host.finish(comm, async_op)


def _launch(comm, cfg: Config, ll_words: int, src, dst, in_rows, out_rows, row, group, aliased) -> None:
    itemsize = src.element_size()
    # the ll buffer: counter, two banks of G boxes (a header, then tiles of ll_words words in
    # the first half: the equal ll kernel's bank boundary moves with its tile size, and the
    # ends of the boxes stay clear of it)
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
    # the push buffer: the boxed counter, two banks of G boxes of whole 16-byte groups
    buf = comm.staging("push", 0, zero=True)
    stride = (buf.numel() - _boxed._HEADER) // (2 * comm.size * itemsize) // 64 * 64
    slots = buf[_boxed._HEADER : _boxed._HEADER + 2 * comm.size * stride * itemsize].view(src.dtype)
    small, bulk = MODES[cfg.variant]
    tile = ll_words * 4 // itemsize  # elements per ll tile
    ll_limit = max(box_stride // 2 - HEADER_WORDS, 0) // ll_words * tile
    if small == "table":
        ll_limit = min(ll_limit, _table_ll_bytes(comm.size, table_path()) // itemsize)
    elif small == "none":
        ll_limit = 0
    user = None
    if bulk == "push":
        user = _comm.in_place([dst], group, "all_to_all")
    elif bulk == "pull" and not aliased:
        user = _comm.in_place([src], group, "all_to_all")
    remote = (dst if bulk == "push" else src) if user is not None else slots
    table = split_table(
        src.device, [*_offsets(in_rows), *in_rows, *_offsets(out_rows), *out_rows]
    )  # fmt: skip
    # Split sizes differ between ranks by design; what must agree is signed.
    with comm.signed("all_to_all (uneven splits)", dtype=src.dtype, row=row, variant=cfg.variant):
        _host.launch(
            _uneven_kernel, _host.resident_programs(comm, cfg), comm, cfg,
            (user or comm).heap.get_device_context(), src, dst, table, boxes, region[:8].view(torch.int64),
            slots, buf[:8].view(torch.int32), row, ll_limit, box_stride, stride,
            LL_BLOCK=ll_words, PUSH=bulk != "pull", DIRECT=user is not None,
            HINT=_host.vector_hint((remote,)),
        )  # fmt: skip
