"""``all_reduce_rmsnorm``: the all-reduce that ends a tensor-parallel layer, fused with the
residual add and the RMSNorm that follow it.

With ``s = sum over the group of inp (+ residual)``, row by row:
``residual_out = s`` and ``out = s * rsqrt(mean(s**2) + eps) * weight``, in fp32 from the
inputs to the final rounding. Two forms, each one kernel per call:

``"ll"`` (decode sizes). Every rank stores its input into a box of every peer as 8-byte
lines of 4 data bytes and a 4-byte flag that numbers the launch (the flag-in-data exchange
of iris.ccl's ``ll`` variant, through :mod:`iris.ccl.triton.ll`). A program then polls the
lines of its rows in its own boxes until each carries this launch's flag, sums the members'
rows in member order in registers, adds the residual and normalises. No barrier and no
flag round trip: a call costs one link latency plus the bytes, twice the input's on the
link. The boxes alternate between two banks (the launch number's parity): a rank can run at
most one call ahead of a peer still reading its boxes, because its next call needs that
peer's lines of the call in between. Where programs run concurrently (compiled kernels),
the pushes are spread over every program in pieces, so that one token's row leaves
through many SMs; the interpreter runs programs one after another, so there each program
pushes exactly the rows it receives.

``"rs_ag"`` (large token counts). Row ``t`` belongs to rank ``t // ceil(T / G)``. Each
rank stores its rows of the other ranks' shares into their workspaces and raises a flag per
row; each owner waits for the flags of its rows, sums and normalises them, stores the
result (and ``residual_out``) into its own outputs and into every peer's (their outputs,
when on a heap spanning the group, else their workspace, copied after), and raises a flag
per row there; each rank then waits for its peers' rows. The bytes on the link are those of
a reduce-scatter and an all-gather, without the ll form's doubling. Program ``p`` handles
rows ``p, p + P, ...`` of every share, and every wait is for the same program on another
rank, so it also runs in the interpreter. Nothing needs a barrier: a rank writes a peer's
workspace for call ``g + 1`` only after it has received that peer's rows of call ``g``,
which the peer sends after it has read everything of call ``g`` it was sent.

Both forms sum the members in member order, so every rank computes bitwise the same ``s``
(with the same residual everywhere) and both forms give the same results. Both number their
launches with a counter in the workspace that every launch advances by exactly ``2**20``
(:func:`iris.ccl.triton.sync.advance_launch_counter`), and every flag holds
``launch mod (2**31 - 1) + 1``, compared for equality: a flag is written once per launch and
takes its next value only after its reader has seen this one, so the values may wrap.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import triton
import triton.language as tl

import iris.mem
from iris.ccl import Work
from iris.ccl.triton import ll
from iris.ccl.triton.sync import advance_launch_counter
from iris.mem import runtime
from iris.mem.triton.group import enter_group
from iris.mem.triton.sync import enter_launch
from iris.mem.utils import global_timer, keep_waiting, record_timeout

from . import _host
from .config import MAX_PROGRAMS
from .workspace import Workspace

_OP = "all_reduce_rmsnorm"
#: The forms ``AllReduceRMSNormConfig.form`` accepts.
FORMS = ("auto", "ll", "rs_ag")
#: ``"auto"`` picks ``"ll"`` while what a rank sends ((G - 1) x the input's bytes) is at
#: most this; above it the ll form's doubled bytes cost more than the reduce-scatter form's
#: second flag round trip. An estimate from iris.ccl's measured all_reduce thresholds on
#: 2 x H200 (ll up to 128 KiB, one-barrier forms up to a few MiB), to be confirmed with
#: ``benchmarks/ops/bench_rmsnorm.py``, which times both forms.
LL_MAX_BYTES = 256 << 10
#: Bytes of one bank of ll boxes at most (compiled, interpreted); longer inputs are
#: processed in several launches of as many rows as fit.
_LL_BANK_BYTES = (8 << 20, 1 << 20)
#: Elements of a row a program holds in registers at once at most (compiled, interpreted);
#: longer rows are processed in several pieces (two passes over them).
_MAX_BLOCK = (8192, 4096)
#: What every launch adds to a workspace's launch counter (``launches``, int64): its
#: programs' shares add up to exactly this, whatever the grid
#: (:func:`iris.ccl.triton.sync.advance_launch_counter`), so ``counter >> 20`` numbers the
#: launches the same way in every program.
_LAUNCH_UNIT: tl.constexpr = tl.constexpr(1 << 20)
#: Flags run through 1 .. 2**31 - 1 and are compared for equality, so they wrap safely: a
#: flag is written once per launch, and the next value it takes comes only after its reader
#: has seen this one.
_FLAG_PERIOD: tl.constexpr = tl.constexpr((1 << 31) - 1)


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AllReduceRMSNormConfig:
    """How :func:`all_reduce_rmsnorm` runs; fields left at 0 / ``"auto"`` / None are chosen
    per shape.

    Attributes:
        form: ``"ll"`` (one-shot flag-in-data exchange, for decode sizes), ``"rs_ag"``
            (reduce-scatter of rows, norm, all-gather, for large token counts) or
            ``"auto"`` (``"ll"`` while each rank sends at most ``LL_MAX_BYTES``).
        block: elements of a row held in registers at once (power of two, 64-16384);
            default: the row rounded up to a power of two, at most 8192 (4096 in the
            interpreter). Longer rows take two passes.
        num_warps: warps per program (power of two, 1-16); default: ``block / 512``
            within 4-16.
        programs: persistent programs (1-1024, never more than the device keeps resident);
            default: one per row (``"ll"``: per pushed piece as well) up to the SM count.
        spread: ``"ll"`` only: spread the pushes over every program in pieces of two
            lines (16 bytes) per thread (2048 bf16 elements with 16 warps) instead of each
            program pushing the rows it receives. None: on where programs run concurrently
            (compiled kernels). Never when ``out`` is ``inp`` (a program must read its rows
            before it overwrites them).
    """

    form: str = "auto"
    block: int = 0
    num_warps: int = 0
    programs: int = 0
    spread: bool | None = None

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"AllReduceRMSNormConfig.form must be one of {FORMS}, got {self.form!r}")
        for name in ("block", "num_warps", "programs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"AllReduceRMSNormConfig.{name} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"AllReduceRMSNormConfig.{name} must be >= 0 (0 chooses), got {value}")
        if self.block and (not _power_of_two(self.block) or not 64 <= self.block <= 16384):
            raise ValueError(
                f"AllReduceRMSNormConfig.block must be a power of two from 64 to 16384, got {self.block}"
            )
        if self.num_warps and (not _power_of_two(self.num_warps) or self.num_warps > 16):
            raise ValueError(
                f"AllReduceRMSNormConfig.num_warps must be a power of two up to 16, got {self.num_warps}"
            )
        if self.programs > MAX_PROGRAMS:
            raise ValueError(
                f"AllReduceRMSNormConfig.programs must be at most {MAX_PROGRAMS}, got {self.programs}"
            )
        if self.spread is not None and not isinstance(self.spread, bool):
            raise TypeError(f"AllReduceRMSNormConfig.spread must be True, False or None, got {self.spread!r}")


def _check_config(config: object) -> None:
    if config is not None and not isinstance(config, AllReduceRMSNormConfig):
        raise TypeError(
            f"{_OP}: config must be an iris.ops.AllReduceRMSNormConfig or None, got {type(config).__name__}"
        )


def choose_form(tokens: int, hidden: int, itemsize: int, size: int) -> str:
    """The form ``"auto"`` runs for ``tokens x hidden`` elements of ``itemsize`` bytes over
    ``size`` ranks."""
    return "ll" if (size - 1) * tokens * hidden * itemsize <= LL_MAX_BYTES else "rs_ag"


def resolve(
    config: AllReduceRMSNormConfig | None,
    tokens: int,
    hidden: int,
    itemsize: int,
    size: int,
    interpreted: bool,
) -> AllReduceRMSNormConfig:
    """``config`` with every field left to choose filled in (``programs`` stays 0 unless
    set: it depends on the rows of each launch)."""
    _check_config(config)
    config = config or AllReduceRMSNormConfig()
    form = config.form if config.form != "auto" else choose_form(tokens, hidden, itemsize, size)
    block = config.block or max(64, min(triton.next_power_of_2(max(hidden, 1)), _MAX_BLOCK[interpreted]))
    warps = config.num_warps or (4 if interpreted else max(4, min(16, block // 512)))
    spread = config.spread if config.spread is not None else not interpreted
    return dataclasses.replace(config, form=form, block=block, num_warps=warps, spread=spread)


def piece_elements(cfg: AllReduceRMSNormConfig, itemsize: int) -> int:
    """Elements of one piece of a row the ll form pushes: two lines (16 bytes) per thread."""
    return min(cfg.block, 256 * cfg.num_warps // itemsize)


# --------------------------------------------------------------------------- device side


@triton.jit
def _this_launch(launches):
    """This launch's number (the same in every program) and its flag, 1 .. 2**31 - 1."""
    launch = tl.load(launches) >> 20
    return launch, (launch % _FLAG_PERIOD + 1).to(tl.int32)


@triton.jit
def _raise(ctx, flag, value, to_rank):
    """Set ``flag`` on ``to_rank`` to ``value`` once every thread's earlier stores are
    visible there (CTA barrier, then a release exchange at system scope)."""
    tl.debug_barrier()
    ctx.atomic_xchg(flag, value, to_rank, sem="release", scope="sys")


@triton.jit
def _await(ctx, group, flag, value, peer):
    """Spin (acquire, system scope) until the local ``flag`` holds ``value``; after
    ``group.budget`` ns record a timeout naming ``peer`` (who sets it) for the host; once a
    timeout is recorded, do not wait at all. Every thread reads after the wait."""
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    start = global_timer()
    budget = tl.where(tl.load(group.status, volatile=True) == 0, group.budget, 0)
    while (seen != value) & keep_waiting(start, budget, group.status, peer):
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    if seen != value:
        record_timeout(group.status, ctx.rank, peer, flag)
    tl.debug_barrier()


@triton.jit
def _sum_chunk(
    ctx, group, inp_row, res_row, peers, peer_stride, h0, H, flag,
    LL: tl.constexpr, POLL: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
    GROUP: tl.constexpr, ME: tl.constexpr,
):  # fmt: skip
    """``s`` of elements ``h0 .. h0 + BLOCK`` of one row (fp32, 0 past ``H``): the members'
    rows summed in member order, then the residual. This rank's row is read from
    ``inp_row``; member ``m``'s from its slot of ``peers`` (``peer_stride`` apart):
    with ``LL``, lines in box slot ``(m - ME - 1) mod GROUP`` (polled for ``flag`` when
    ``POLL``), else elements in slot ``m`` of the workspace's partial rows."""
    ELEM: tl.constexpr = inp_row.dtype.element_ty
    BITS: tl.constexpr = ELEM.primitive_bitwidth
    offs = h0 + tl.arange(0, BLOCK)
    mask = offs < H
    lines = h0 * BITS // 32 + tl.arange(0, BLOCK * BITS // 32)
    valid = lines < tl.cdiv(H * BITS, 32)
    acc = tl.zeros([BLOCK], tl.float32)
    for m in tl.static_range(GROUP):
        if m == ME:
            x = tl.load(inp_row + offs, mask=mask, other=0)
        elif LL:
            box = peers + ((m - ME - 1 + GROUP) % GROUP) * peer_stride
            if POLL:
                x = ll.unpack(ll.receive(ctx, group, box, lines, valid, flag, m), ELEM)
            else:
                x = ll.unpack(tl.load(box + lines, mask=valid, other=0, volatile=True), ELEM)
        else:
            x = tl.load(peers + m * peer_stride + offs, mask=mask, other=0)
        acc += x.to(tl.float32)
    if HAS_RES:
        acc += tl.load(res_row + offs, mask=mask, other=0).to(tl.float32)
    return acc, offs, mask


@triton.jit
def _emit(ctx, group, local, shared, offs, mask, value, REMOTE: tl.constexpr, HINT: tl.constexpr,
          GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """Store ``value`` (rounded to the output's dtype) at ``local + offs`` and, with
    ``REMOTE``, at ``shared + offs`` on every peer."""
    v = value.to(local.dtype.element_ty)
    tl.store(local + offs, v, mask=mask)
    if REMOTE:
        for k in tl.static_range(1, GROUP):
            ctx.store(shared + offs, v, group.rank((ME + k) % GROUP), mask=mask, hint=HINT)


@triton.jit
def _norm_row(
    ctx, group, inp_row, res_row, peers, peer_stride, weight, out_row, rout_row, gout_row, gres_row,
    H, eps, flag,
    LL: tl.constexpr, REMOTE: tl.constexpr, SINGLE: tl.constexpr, HAS_RES: tl.constexpr,
    HAS_RES_OUT: tl.constexpr, REREAD: tl.constexpr, HINT: tl.constexpr, BLOCK: tl.constexpr,
    GROUP: tl.constexpr, ME: tl.constexpr,
):  # fmt: skip
    """One row: ``s`` (see :func:`_sum_chunk`) into ``residual_out`` and its RMSNorm into
    ``out`` (both also into the peers' ``gres_row`` / ``gout_row`` with ``REMOTE``). A row
    of at most ``BLOCK`` elements stays in registers (``SINGLE``); a longer one takes two
    passes, the second computing ``s`` again (the peers' data is still where the first pass
    found it), or reading it back from ``residual_out`` where that is ``residual``
    (``REREAD``)."""
    if SINGLE:
        s, offs, mask = _sum_chunk(
            ctx, group, inp_row, res_row, peers, peer_stride, 0, H, flag, LL, True, HAS_RES, BLOCK, GROUP, ME
        )
        rstd = tl.rsqrt(tl.sum(s * s) / H + eps)
        if HAS_RES_OUT:
            _emit(ctx, group, rout_row, gres_row, offs, mask, s, REMOTE, HINT, GROUP, ME)
        w = tl.load(weight + offs, mask=mask, other=0).to(tl.float32)
        _emit(ctx, group, out_row, gout_row, offs, mask, s * rstd * w, REMOTE, HINT, GROUP, ME)
    else:
        squares = tl.zeros([BLOCK], tl.float32)
        h0 = 0
        while h0 < H:
            s, offs, mask = _sum_chunk(
                ctx, group, inp_row, res_row, peers, peer_stride, h0, H, flag, LL, True, HAS_RES, BLOCK,
                GROUP, ME,
            )  # fmt: skip
            squares += s * s
            if HAS_RES_OUT:
                _emit(ctx, group, rout_row, gres_row, offs, mask, s, REMOTE, HINT, GROUP, ME)
            h0 += BLOCK
        rstd = tl.rsqrt(tl.sum(squares) / H + eps)
        tl.debug_barrier()  # REREAD: the first pass's stores of residual_out come first
        h0 = 0
        while h0 < H:
            if REREAD:
                offs = h0 + tl.arange(0, BLOCK)
                mask = offs < H
                s = tl.load(rout_row + offs, mask=mask, other=0).to(tl.float32)
            else:
                s, offs, mask = _sum_chunk(
                    ctx, group, inp_row, res_row, peers, peer_stride, h0, H, flag, LL, False, HAS_RES, BLOCK,
                    GROUP, ME,
                )  # fmt: skip
            w = tl.load(weight + offs, mask=mask, other=0).to(tl.float32)
            _emit(ctx, group, out_row, gout_row, offs, mask, s * rstd * w, REMOTE, HINT, GROUP, ME)
            h0 += BLOCK


@triton.jit
def _push_piece(ctx, group, inp, stride_i, bank, box_stride, row_lines, row, piece, H, flag,
                PIECE: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """Piece ``piece`` (``PIECE`` elements) of row ``row`` as lines into this rank's box slot
    of every peer (slot ``(ME - j - 1) mod GROUP`` on member ``j``). Elements past ``H`` go
    as zeros up to the end of the box row (``row_lines``, a multiple of 16), so the mask is
    the same for every 16 lines and each thread's lines leave as 16-byte stores."""
    LINES: tl.constexpr = PIECE * inp.dtype.element_ty.primitive_bitwidth // 32
    offs = piece * PIECE + tl.arange(0, PIECE)
    x = tl.load(inp + row.to(tl.int64) * stride_i + offs, mask=offs < H, other=0)
    lines = piece * LINES + tl.arange(0, LINES)
    data = ll.pack(x, flag)
    dst = bank + row.to(tl.int64) * row_lines + lines
    for k in tl.static_range(1, GROUP):
        j = (ME + k) % GROUP
        slot = (ME - j - 1 + GROUP) % GROUP
        ctx.store(dst + slot * box_stride, data, group.rank(j), mask=lines < row_lines, hint=16)


@triton.jit
def _ll_rmsnorm_kernel(
    context, members, sync_flags, epochs, status, budget, launches,
    inp, residual, weight, out, residual_out, boxes,
    T, H, eps, stride_i, stride_r, stride_o, stride_ro, row_lines, box_stride,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK: tl.constexpr, PIECE: tl.constexpr, SPREAD: tl.constexpr, SINGLE: tl.constexpr,
    HAS_RES: tl.constexpr, HAS_RES_OUT: tl.constexpr, REREAD: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """The ``"ll"`` form over ``T`` rows of ``H`` elements (see the module docstring);
    ``boxes`` holds two banks of ``GROUP - 1`` slots of ``box_stride`` lines, a row
    ``row_lines`` lines."""
    enter_launch(PDL)
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    launch, flag = _this_launch(launches)
    bank = boxes + (launch & 1) * (GROUP - 1) * box_stride
    programs = tl.num_programs(0)
    if SPREAD:
        pieces = tl.cdiv(H, PIECE)
        u = pid
        while u < T * pieces:
            row = u // pieces
            _push_piece(
                ctx, group, inp, stride_i, bank, box_stride, row_lines, row, u - row * pieces, H, flag, PIECE,
                GROUP, ME,
            )  # fmt: skip
            u += programs
    else:
        row = pid
        while row < T:
            piece = 0
            while piece * PIECE < H:
                _push_piece(
                    ctx, group, inp, stride_i, bank, box_stride, row_lines, row, piece, H, flag, PIECE, GROUP,
                    ME,
                )  # fmt: skip
                piece += 1
            row += programs
    row = pid
    while row < T:
        r = row.to(tl.int64)
        _norm_row(
            ctx, group, inp + r * stride_i, residual + r * stride_r, bank + r * row_lines, box_stride, weight,
            out + r * stride_o, residual_out + r * stride_ro, out, residual_out, H, eps, flag,
            True, False, SINGLE, HAS_RES, HAS_RES_OUT, REREAD, None, BLOCK, GROUP, ME,
        )  # fmt: skip
        row += programs
    advance_launch_counter(launches, _LAUNCH_UNIT)


@triton.jit
def _copy_row(src, dst, H, BLOCK: tl.constexpr):
    h0 = 0
    while h0 < H:
        offs = h0 + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < H), mask=offs < H)
        h0 += BLOCK


@triton.jit
def _rs_rmsnorm_kernel(
    context, members, sync_flags, epochs, status, budget, launches,
    inp, residual, weight, out, residual_out, gout, gres, partials, rs_flags, ag_flags,
    T, H, eps, share, part_stride, stride_i, stride_r, stride_o, stride_ro, stride_go, stride_gr,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK: tl.constexpr, SINGLE: tl.constexpr, HAS_RES: tl.constexpr, HAS_RES_OUT: tl.constexpr,
    REREAD: tl.constexpr, OUT_IN_PLACE: tl.constexpr, RES_IN_PLACE: tl.constexpr, HINT: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """The ``"rs_ag"`` form over ``T`` rows of ``H`` elements, ``share`` rows per rank (see
    the module docstring). ``partials`` holds ``GROUP`` slots of ``share`` rows of
    ``part_stride`` elements (slot ``m``: member ``m``'s rows of this rank's share);
    ``gout`` / ``gres`` are where peers store this rank's copy of their rows (``out`` /
    ``residual_out`` themselves with ``OUT_IN_PLACE`` / ``RES_IN_PLACE``)."""
    enter_launch(PDL)
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    flag = _this_launch(launches)[1]
    programs = tl.num_programs(0)
    slot = tl.cast(share, tl.int64) * part_stride
    # 1. This rank's rows of every peer's share, into the peer's partials, a flag per row.
    i = pid
    while i < share:
        for k in tl.static_range(1, GROUP):
            j = (ME + k) % GROUP
            row = j * share + i
            if row < T:
                src = inp + row.to(tl.int64) * stride_i
                dst = partials + ME * slot + i.to(tl.int64) * part_stride
                h0 = 0
                while h0 < H:
                    offs = h0 + tl.arange(0, BLOCK)
                    x = tl.load(src + offs, mask=offs < H)
                    ctx.store(dst + offs, x, group.rank(j), mask=offs < H, hint=16)
                    h0 += BLOCK
                _raise(ctx, rs_flags + ME * share + i, flag, group.rank(j))
        i += programs
    # 2. The rows of this rank's share, once every peer's part is there: summed,
    #    normalised, stored here and on every peer, a flag per row there.
    i = pid
    while i < share:
        row = ME * share + i
        if row < T:
            for k in tl.static_range(1, GROUP):
                j = (ME + k) % GROUP
                _await(ctx, group, rs_flags + j * share + i, flag, group.rank(j))
            r = row.to(tl.int64)
            mine = partials + i.to(tl.int64) * part_stride  # this row in slot 0
            _norm_row(
                ctx, group, inp + r * stride_i, residual + r * stride_r, mine, slot, weight,
                out + r * stride_o, residual_out + r * stride_ro, gout + r * stride_go, gres + r * stride_gr,
                H, eps, flag,
                False, True, SINGLE, HAS_RES, HAS_RES_OUT, REREAD, HINT, BLOCK, GROUP, ME,
            )  # fmt: skip
            for k in tl.static_range(1, GROUP):
                _raise(ctx, ag_flags + row, flag, group.rank((ME + k) % GROUP))
        i += programs
    # 3. The peers' rows, once they are here (copied out of the workspace unless in place).
    i = pid
    while i < share:
        for k in tl.static_range(1, GROUP):
            j = (ME + k) % GROUP
            row = j * share + i
            if row < T:
                _await(ctx, group, ag_flags + row, flag, group.rank(j))
                r = row.to(tl.int64)
                if not OUT_IN_PLACE:
                    _copy_row(gout + r * stride_go, out + r * stride_o, H, BLOCK)
                if HAS_RES_OUT and not RES_IN_PLACE:
                    _copy_row(gres + r * stride_gr, residual_out + r * stride_ro, H, BLOCK)
        i += programs
    advance_launch_counter(launches, _LAUNCH_UNIT)


# --------------------------------------------------------------------------- host side


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _check(out, inp, weight, eps, residual, residual_out) -> None:
    """Types, shapes, dtypes, devices and overlaps of a call's arguments."""
    _host._tensor(out, "out", _OP, 2)
    _host._tensor(inp, "inp", _OP, 2)
    _host._tensor(weight, "weight", _OP, 1)
    named = [("out", out)]
    for name, t in (("residual", residual), ("residual_out", residual_out)):
        if t is not None:
            named.append((name, _host._tensor(t, name, _OP, 2)))
    if inp.dtype not in _host.DTYPES:
        raise TypeError(
            f"{_OP}: dtype {inp.dtype} is not supported; use one of {', '.join(map(str, _host.DTYPES))}"
        )
    if weight.dtype not in _host.DTYPES:
        raise TypeError(
            f"{_OP}: weight has dtype {weight.dtype}; use one of {', '.join(map(str, _host.DTYPES))}"
        )
    for name, t in named + [("weight", weight)]:
        if t.device != inp.device:
            raise ValueError(f"{_OP}: {name} is on {t.device} but inp is on {inp.device}; they must match")
    for name, t in named:
        if t.dtype != inp.dtype:
            raise TypeError(f"{_OP}: {name} has dtype {t.dtype} but inp has {inp.dtype}; they must match")
        if t.shape != inp.shape:
            raise ValueError(
                f"{_OP}: {name} has shape {list(t.shape)} but inp has {list(inp.shape)} ([tokens, hidden]); "
                "they must match"
            )
    if weight.shape[0] != inp.shape[1]:
        raise ValueError(
            f"{_OP}: weight has {weight.shape[0]} elements, expected {inp.shape[1]} (inp's hidden size)"
        )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{_OP}: eps must be a finite number >= 0, got {eps!r}")
    # Outputs may be their input's own view (in place), never overlap anything else.
    inputs = [("inp", inp), ("weight", weight)] + ([("residual", residual)] if residual is not None else [])
    outputs = named[:1] + ([("residual_out", residual_out)] if residual_out is not None else [])
    partner = {"out": "inp", "residual_out": "residual"}
    for oname, o in outputs:
        for iname, t in inputs:
            if partner[oname] == iname and _same_view(o, t):
                continue
            if _host.overlaps(o, t):
                allowed = f" (it may be {partner[oname]} itself, for an in-place call)"
                raise ValueError(
                    f"{_OP}: {oname} overlaps {iname}; outputs must not share memory with inputs{allowed}"
                )
    if residual_out is not None and _host.overlaps(out, residual_out):
        raise ValueError(f"{_OP}: out overlaps residual_out; the two outputs must not share memory")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit stride along the hidden dimension (a copy when it has another)."""
    return t if t.stride(1) == 1 or t.shape[1] <= 1 else t.contiguous()


def all_reduce_rmsnorm(
    out: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
    residual: torch.Tensor | None = None, residual_out: torch.Tensor | None = None, group=None,
    async_op: bool = False, config: AllReduceRMSNormConfig | None = None, workspace: Workspace | None = None,
) -> Work | None:  # fmt: skip
    """``out = rmsnorm(all_reduce(inp) + residual) * weight`` over the ranks of ``group``,
    in one kernel per call.

    With ``s = sum over the group of inp, + residual`` (when given): writes
    ``residual_out = s`` (when given) and ``out = s * rsqrt(mean(s**2, last dim) + eps) *
    weight``, computed in fp32 from the inputs and rounded once to the output's dtype.

    Shapes: ``inp``, ``out``, ``residual`` and ``residual_out`` are ``[tokens, hidden]``,
    the same on every rank; ``weight`` is ``[hidden]``. bf16, fp16 or fp32 (``weight`` any
    of them; the others all ``inp``'s). ``residual`` must be the same on every rank, as in
    tensor parallelism. ``out`` may be ``inp`` and ``residual_out`` may be ``residual``
    (in place); no other output may overlap an input. Any tensors work, on a heap or not.

    :param eps: added to the mean of squares (a finite number >= 0).
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`~iris.ccl.Work` handle instead of None.
    :param config: an :class:`AllReduceRMSNormConfig` (``form`` forces ``"ll"`` or
        ``"rs_ag"``); None chooses by size.
    :param workspace: a :class:`~iris.ops.Workspace` to reuse across calls; None keeps one
        per signature internally. The first call of a signature prepares it (collectively,
        not inside a CUDA graph capture); later calls allocate nothing.
    """
    if torch.compiler.is_compiling():
        from . import _library

        opts = {"group": group, "config": config, "async_op": async_op, "workspace": workspace}
        opts.update(residual=residual, residual_out=residual_out)
        return _library.compiled("all_reduce_rmsnorm", out, inp, weight, eps, **opts)
    _check(out, inp, weight, eps, residual, residual_out)
    _check_config(config)
    from . import _hier  # a group spanning nodes: fused within the node, staged between

    spans, work = _hier.entry(
        group, inp.device, "all_reduce_rmsnorm", out, inp, weight, eps, residual, residual_out,
        async_op=async_op,
    )  # fmt: skip
    if spans:
        return work
    ranks, index = _host.group_position(group)
    size = len(ranks)
    tokens, hidden = inp.shape
    caps = iris.mem.capabilities(inp.device)
    cfg = resolve(config, tokens, hidden, inp.element_size(), size, caps.interpreted)
    if out.numel() == 0:
        return _host.finish(inp.device, async_op)
    k_inp, k_res, k_w = _rows(inp), _rows(residual) if residual is not None else None, weight.contiguous()
    k_out = out if out.stride(1) == 1 else torch.empty_like(out, memory_format=torch.contiguous_format)
    k_rout = None
    if residual_out is not None:
        rout_ok = residual_out.stride(1) == 1
        k_rout = (
            residual_out if rout_ok else torch.empty_like(residual_out, memory_format=torch.contiguous_format)
        )
    flags: dict[str, Any] = {
        "HAS_RES": residual is not None,
        "HAS_RES_OUT": residual_out is not None,
        "REREAD": k_rout is not None and k_res is not None and _host.overlaps(k_rout, k_res),
        "SINGLE": hidden <= cfg.block,
        "BLOCK": cfg.block,
    }
    # Unused pointers: any tensor of the right dtype.
    args = (k_inp, k_res if k_res is not None else k_inp, k_w, k_out, k_rout if k_rout is not None else k_out)
    run = _run_ll if cfg.form == "ll" else _run_rs
    run(args, out, residual_out, ranks, index, size, cfg, flags, caps, float(eps), group, workspace)
    if k_out is not out:
        out.copy_(k_out)
    if k_rout is not None and k_rout is not residual_out:
        residual_out.copy_(k_rout)
    return _host.finish(inp.device, async_op)


def _shapes(inp, weight, flags, *more) -> tuple:
    """What besides the op, group, dtype, config and heap binds a workspace."""
    return (tuple(inp.shape), str(weight.dtype), flags["HAS_RES"], flags["HAS_RES_OUT"], *more)


def _run_ll(args, out, residual_out, ranks, index, size, cfg, flags, caps, eps, group, workspace) -> None:
    inp, res, weight, k_out, k_rout = args
    tokens, hidden = inp.shape
    row_lines = _host.cdiv(_host.cdiv(hidden * inp.element_size(), 4), 16) * 16  # see _push_piece
    peers = size - 1
    rows = max(1, min(tokens, _LL_BANK_BYTES[caps.interpreted] // max(1, peers * row_lines * 8)))
    box_stride = rows * row_lines
    specs = [("launches", 1, torch.int64), ("boxes", 2 * peers * box_stride, torch.int64)]
    # A program must read its rows of inp before it overwrites them in out; alone, nothing to push.
    spread = cfg.spread and size > 1 and not _host.overlaps(k_out, inp)
    shapes = _shapes(inp, weight, flags, spread)
    ws = _host.workspace_for(_OP, ranks, index, shapes, inp, cfg, rows, out, False, specs, workspace, group)
    piece = piece_elements(cfg, inp.element_size())
    for start in range(0, tokens, rows):
        count = min(rows, tokens - start)
        want = count * _host.cdiv(hidden, piece) if spread else count
        grid = max(1, min(cfg.programs or want, caps.resident_programs))
        runtime.launch(
            _ll_rmsnorm_kernel, grid, ws.sync, ws.buffers["launches"],
            inp[start:], res[start:], weight, k_out[start:], k_rout[start:], ws.buffers["boxes"],
            count, hidden, eps, inp.stride(0), res.stride(0), k_out.stride(0), k_rout.stride(0), row_lines,
            box_stride, PIECE=piece, SPREAD=spread, num_warps=cfg.num_warps, **flags,
        )  # fmt: skip


def _run_rs(args, out, residual_out, ranks, index, size, cfg, flags, caps, eps, group, workspace) -> None:
    inp, res, weight, k_out, k_rout = args
    tokens, hidden = inp.shape
    itemsize = inp.element_size()
    share = _host.cdiv(tokens, size)
    stride = _host.cdiv(hidden * itemsize, 16) * 16 // itemsize  # workspace rows 16-byte aligned
    heap = _host.heap_of(out, ranks)
    out_in_place = size == 1 or (k_out is out and _host.writable_in_place(out, heap))
    res_in_place = not flags["HAS_RES_OUT"] or size == 1
    if not res_in_place and k_rout is residual_out and heap is not None:
        res_in_place = _host.heap_of(residual_out, ranks) is heap and residual_out.is_contiguous()
    specs = [
        ("launches", 1, torch.int64),
        ("partials", size * share * stride, inp.dtype),
        ("rs_flags", size * share, torch.int32),
        ("ag_flags", tokens, torch.int32),
        ("gout", 0 if out_in_place else tokens * stride, inp.dtype),
        ("gres", 0 if res_in_place else tokens * stride, inp.dtype),
    ]
    shapes = _shapes(inp, weight, flags, res_in_place)
    ws = _host.workspace_for(
        _OP, ranks, index, shapes, inp, cfg, None, out, out_in_place, specs, workspace, group
    )
    gout = k_out if out_in_place else ws.buffers["gout"].view(tokens, stride)
    gres = k_rout if res_in_place else ws.buffers["gres"].view(tokens, stride)
    hint = 16 if _host.aligned(gout, cfg.block) and _host.aligned(gres, cfg.block) else None
    grid = max(1, min(cfg.programs or share, caps.resident_programs))
    runtime.launch(
        _rs_rmsnorm_kernel, grid, ws.sync, ws.buffers["launches"],
        inp, res, weight, k_out, k_rout, gout, gres, ws.buffers["partials"], ws.buffers["rs_flags"],
        ws.buffers["ag_flags"], tokens, hidden, eps, share, stride, inp.stride(0), res.stride(0),
        k_out.stride(0), k_rout.stride(0), gout.stride(0), gres.stride(0),
        OUT_IN_PLACE=out_in_place, RES_IN_PLACE=res_in_place, HINT=hint, num_warps=cfg.num_warps, **flags,
    )  # fmt: skip


__all__ = ["FORMS", "LL_MAX_BYTES", "AllReduceRMSNormConfig", "all_reduce_rmsnorm", "choose_form", "resolve"]
