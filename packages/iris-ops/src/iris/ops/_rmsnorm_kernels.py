"""The kernels of ``all_reduce_rmsnorm`` (:mod:`iris.ops.all_reduce_rmsnorm`), built from named
parts: with ``s = sum over the group of inp (+ residual)``, row by row, ``residual_out = s``
and ``out = s * rsqrt(mean(s**2) + eps) * weight``, in fp32 from the inputs to the final
rounding. Two forms, each one kernel per call:

``"ll"`` (:func:`_ll_rmsnorm_kernel`, decode sizes). Every rank stores its input into a box of
every peer as 8-byte lines of 4 data bytes and a 4-byte flag that numbers the launch (the
flag-in-data exchange of iris.ccl's ``ll`` variant, through :mod:`iris.ccl.triton.ll`). A
program then polls the lines of its rows in its own boxes until each carries this launch's
flag, sums the members' rows in member order in registers, adds the residual and
normalises. No barrier and no flag round trip: a call costs one link latency plus the
bytes, twice the input's on the link. The boxes alternate between two banks (the launch
number's parity): a rank can run at most one call ahead of a peer still reading its boxes,
because its next call needs that peer's lines of the call in between. Where programs run
concurrently (compiled kernels), the pushes are spread over every program in pieces
(``SPREAD``), so that one token's row leaves through many SMs; the interpreter runs
programs one after another, so there each program pushes exactly the rows it receives.

``"rs_ag"`` (:func:`_rs_rmsnorm_kernel`, large token counts). Row ``t`` belongs to rank
``t // ceil(T / G)``. Each rank stores its rows of the other ranks' shares into their
workspaces and raises a flag per row; each owner waits for the flags of its rows, sums and
normalises them, stores the result (and ``residual_out``) into its own outputs and into
every peer's (their outputs, when on a heap spanning the group, else their workspace,
copied after), and raises a flag per row there; each rank then waits for its peers' rows.
The bytes on the link are those of a reduce-scatter and an all-gather, without the ll
form's doubling. Program ``p`` handles rows ``p, p + P, ...`` of every share, and every
wait is for the same program on another rank, so it also runs in the interpreter. Nothing
needs a barrier: a rank writes a peer's workspace for call ``g + 1`` only after it has
received that peer's rows of call ``g``, which the peer sends after it has read everything
of call ``g`` it was sent.

Both forms sum the members in member order, so every rank computes bitwise the same ``s``
(with the same residual everywhere) and both forms give the same results. Both number their
launches with a counter in the workspace that every launch advances by exactly ``2**20``
(:func:`iris.ccl.triton.sync.advance_launch_counter`), and every flag holds
``launch mod (2**31 - 1) + 1``, compared for equality: a flag is written once per launch and
takes its next value only after its reader has seen this one, so the values may wrap.
"""

import triton
import triton.language as tl

from iris.ccl.triton import convert, ll
from iris.ccl.triton.sync import advance_launch_counter
from iris.mem.triton.group import enter_group
from iris.mem.triton.sync import enter_launch
from iris.mem.utils import global_timer, keep_waiting, record_timeout

#: What every launch adds to a workspace's launch counter (``launches``, int64): its
#: programs' shares add up to exactly this, whatever the grid
#: (:func:`iris.ccl.triton.sync.advance_launch_counter`), so ``counter >> 20`` numbers the
#: launches the same way in every program.
_LAUNCH_UNIT: tl.constexpr = tl.constexpr(1 << 20)
#: Flags run through 1 .. 2**31 - 1 and are compared for equality, so they wrap safely: a
#: flag is written once per launch, and the next value it takes comes only after its reader
#: has seen this one.
_FLAG_PERIOD: tl.constexpr = tl.constexpr((1 << 31) - 1)
#: ``QUANT``: how ``out`` is written. ``_PLAIN``: ``y`` rounded to out's dtype; ``_STATIC``:
#: ``fp8(y / scale)`` with the one scale given; ``_DYNAMIC``: ``fp8(y / s_t)`` with the row's
#: own scale ``s_t = max(amax|y_t|, _TINY) / fp8_max``, stored into ``scales_out``.
_PLAIN: tl.constexpr = tl.constexpr(0)
_STATIC: tl.constexpr = tl.constexpr(1)
_DYNAMIC: tl.constexpr = tl.constexpr(2)
#: The smallest amax a dynamic scale is made from (2**-40): an all-zero row gets a tiny but
#: normal fp32 scale (2**-40 / fp8_max), never 0 (whose quotients would be NaN).
_TINY: tl.constexpr = tl.constexpr(2.0**-40)


# --------------------------------------------------------------------------- shared parts


@triton.jit
def _this_launch(launches):
    """This launch's number (the same in every program) and its flag, 1 .. 2**31 - 1."""
    # A plain load: the counter moves only at the end of a launch (by _LAUNCH_UNIT = 2**20),
    # and every earlier launch on the stream has ended (under PDL, enter_launch has waited
    # for it) before this one reads it.
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
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")  # adding 0: an acquire read
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
            else:  # a second pass: the first polled these lines until they carried the flag
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
def _fp8_max(DTYPE: tl.constexpr):
    """The largest finite value of the float8 type ``DTYPE`` (e4m3fn: 448, e5m2: 57344)."""
    if DTYPE == tl.float8e4nv:
        return 448.0
    else:
        return 57344.0


@triton.jit
def _out_scale(ctx, group, scale, gscale, peak, REMOTE: tl.constexpr, QUANT: tl.constexpr,
               DTYPE: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """The scale ``out`` of one row is divided by: with ``_STATIC`` the one at ``scale``; with
    ``_DYNAMIC`` ``max(peak, _TINY) / fp8_max`` (``peak``: the row's amax of ``|y|``; an IEEE
    division, the same bits compiled and interpreted), stored at ``scale`` (the row's element
    of ``scales_out``) and, with ``REMOTE``, at ``gscale`` on every peer; else 1."""
    if QUANT == _STATIC:
        s = tl.load(scale).to(tl.float32)
    elif QUANT == _DYNAMIC:
        s = tl.div_rn(tl.maximum(peak, _TINY), _fp8_max(DTYPE))
        tl.store(scale, s)
        if REMOTE:
            for k in tl.static_range(1, GROUP):
                ctx.store(gscale, s, group.rank((ME + k) % GROUP))
    else:
        s = 1.0
    return s


@triton.jit
def _quantize(y, s, QUANT: tl.constexpr, DTYPE: tl.constexpr):
    """``y`` as written into ``out``: with a scale (``QUANT``), ``fp8(y / s)``, divided as IEEE
    does and rounded to nearest even, saturating to the finite range
    (:func:`iris.ccl.triton.convert`); else ``y`` (rounded when stored)."""
    if QUANT == _PLAIN:
        return y
    else:
        return convert(tl.div_rn(y, s), DTYPE)


@triton.jit
def _norm_row(
    ctx, group, inp_row, res_row, peers, peer_stride, weight, out_row, rout_row, gout_row, gres_row,
    scale, gscale, H, eps, flag,
    LL: tl.constexpr, REMOTE: tl.constexpr, SINGLE: tl.constexpr, HAS_RES: tl.constexpr,
    HAS_RES_OUT: tl.constexpr, QUANT: tl.constexpr, HINT: tl.constexpr, BLOCK: tl.constexpr,
    GROUP: tl.constexpr, ME: tl.constexpr,
):  # fmt: skip
    """One row: ``s`` (see :func:`_sum_chunk`) into ``residual_out`` and its RMSNorm
    ``y = (s * weight) * rstd`` into ``out`` (both also into the peers' ``gres_row`` /
    ``gout_row`` with ``REMOTE``), quantized as ``QUANT`` says with the row's scale
    (:func:`_out_scale`; ``scale`` / ``gscale``). Since ``rstd > 0`` and rounding is monotone,
    the row's amax of ``|y|`` is exactly ``rstd * max|s * weight|``, known before any of
    ``y`` is stored. A row of at most ``BLOCK`` elements stays in registers (``SINGLE``); a
    longer one takes two passes: the first only sums the squares of ``s`` (and, ``_DYNAMIC``,
    takes the amax of ``s * weight``), the second computes ``s`` again (the peers' data is
    still where the first pass found it, and the residual is still unwritten where
    ``residual_out`` is ``residual``) and stores both outputs. So the norm always comes from
    the fp32 ``s``, never from ``s`` rounded into ``residual_out`` (an fp16 sum past 65504
    would read back as infinity)."""
    DTYPE: tl.constexpr = out_row.dtype.element_ty
    if SINGLE:
        s, offs, mask = _sum_chunk(
            ctx, group, inp_row, res_row, peers, peer_stride, 0, H, flag, LL, True, HAS_RES, BLOCK, GROUP, ME
        )
        rstd = tl.rsqrt(tl.sum(s * s) / H + eps)
        if HAS_RES_OUT:
            _emit(ctx, group, rout_row, gres_row, offs, mask, s, REMOTE, HINT, GROUP, ME)
        sw = s * tl.load(weight + offs, mask=mask, other=0).to(tl.float32)
        peak = 0.0
        if QUANT == _DYNAMIC:
            peak = tl.max(tl.abs(sw)) * rstd
        out_scale = _out_scale(ctx, group, scale, gscale, peak, REMOTE, QUANT, DTYPE, GROUP, ME)
        y = _quantize(sw * rstd, out_scale, QUANT, DTYPE)
        _emit(ctx, group, out_row, gout_row, offs, mask, y, REMOTE, HINT, GROUP, ME)
    else:
        squares = tl.zeros([BLOCK], tl.float32)
        peaks = tl.zeros([BLOCK], tl.float32)  # _DYNAMIC: the largest |s * weight| so far
        h0 = 0
        while h0 < H:
            s, offs, mask = _sum_chunk(
                ctx, group, inp_row, res_row, peers, peer_stride, h0, H, flag, LL, True, HAS_RES, BLOCK,
                GROUP, ME,
            )  # fmt: skip
            squares += s * s
            if QUANT == _DYNAMIC:
                w = tl.load(weight + offs, mask=mask, other=0).to(tl.float32)
                peaks = tl.maximum(peaks, tl.abs(s * w))
            h0 += BLOCK
        rstd = tl.rsqrt(tl.sum(squares) / H + eps)
        peak = 0.0
        if QUANT == _DYNAMIC:
            peak = tl.max(peaks) * rstd
        out_scale = _out_scale(ctx, group, scale, gscale, peak, REMOTE, QUANT, DTYPE, GROUP, ME)
        h0 = 0
        while h0 < H:
            # Each element of the residual is read here before residual_out (maybe the same
            # memory) is written at it, by the same thread.
            s, offs, mask = _sum_chunk(
                ctx, group, inp_row, res_row, peers, peer_stride, h0, H, flag, LL, False, HAS_RES, BLOCK,
                GROUP, ME,
            )  # fmt: skip
            if HAS_RES_OUT:
                _emit(ctx, group, rout_row, gres_row, offs, mask, s, REMOTE, HINT, GROUP, ME)
            sw = s * tl.load(weight + offs, mask=mask, other=0).to(tl.float32)
            y = _quantize(sw * rstd, out_scale, QUANT, DTYPE)
            _emit(ctx, group, out_row, gout_row, offs, mask, y, REMOTE, HINT, GROUP, ME)
            h0 += BLOCK


@triton.jit
def _scale_of(scales, row, QUANT: tl.constexpr):
    """Where row ``row``'s scale is: its element of ``scales_out`` (``_DYNAMIC``), else the
    one scale (or nothing)."""
    if QUANT == _DYNAMIC:
        return scales + row
    else:
        return scales


# --------------------------------------------------------------------------- the "ll" form


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
        slot = (ME - j - 1 + GROUP) % GROUP  # member j keeps its GROUP - 1 peers' boxes in order
        # No flag after the stores: every 8-byte line carries the launch's flag itself.
        ctx.store(dst + slot * box_stride, data, group.rank(j), mask=lines < row_lines, hint=16)


@triton.jit
def _push_rows(ctx, group, inp, stride_i, bank, box_stride, row_lines, pid, programs, T, H, flag,
               PIECE: tl.constexpr, SPREAD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """``"ll"``: this program's share of the ``T`` rows as lines into every peer's boxes:
    with ``SPREAD`` pieces ``pid, pid + programs, ...`` of all rows (one row leaves through
    many programs), else whole rows ``pid, pid + programs, ...`` (the rows this program
    then receives, which is what works where programs run one after another)."""
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


@triton.jit
def _ll_rmsnorm_kernel(
    context, members, sync_flags, epochs, status, budget,  # the group's sync state (runtime.launch)
    launches, inp, residual, weight, out, residual_out, scales, boxes,
    T, H, eps, stride_i, stride_r, stride_o, stride_ro, row_lines, box_stride,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK: tl.constexpr, PIECE: tl.constexpr, SPREAD: tl.constexpr, SINGLE: tl.constexpr,
    HAS_RES: tl.constexpr, HAS_RES_OUT: tl.constexpr, QUANT: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """The ``"ll"`` form over ``T`` rows of ``H`` elements (see the module docstring);
    ``boxes`` holds two banks of ``GROUP - 1`` slots of ``box_stride`` lines, a row
    ``row_lines`` lines. ``scales``: with ``QUANT`` ``_STATIC`` the one scale, ``_DYNAMIC``
    ``scales_out`` (``T`` fp32)."""
    enter_launch(PDL)
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    launch, flag = _this_launch(launches)
    bank = boxes + (launch & 1) * (GROUP - 1) * box_stride
    programs = tl.num_programs(0)
    _push_rows(
        ctx, group, inp, stride_i, bank, box_stride, row_lines, pid, programs, T, H, flag, PIECE, SPREAD,
        GROUP, ME,
    )  # fmt: skip
    row = pid
    while row < T:
        r = row.to(tl.int64)
        _norm_row(
            ctx, group, inp + r * stride_i, residual + r * stride_r, bank + r * row_lines, box_stride, weight,
            out + r * stride_o, residual_out + r * stride_ro, out, residual_out, _scale_of(scales, r, QUANT),
            scales, H, eps, flag, True, False, SINGLE, HAS_RES, HAS_RES_OUT, QUANT, None, BLOCK, GROUP, ME,
        )  # fmt: skip
        row += programs
    advance_launch_counter(launches, _LAUNCH_UNIT)


# --------------------------------------------------------------------------- the "rs_ag" form


@triton.jit
def _copy_row(src, dst, H, BLOCK: tl.constexpr):
    """``dst[:H] = src[:H]`` (local memory), ``BLOCK`` elements at a time."""
    h0 = 0
    while h0 < H:
        offs = h0 + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < H), mask=offs < H)
        h0 += BLOCK


@triton.jit
def _share_row(i, k, share, GROUP: tl.constexpr, ME: tl.constexpr):
    """``(j, row)``: member ``j``, ``k`` places after this one, and row ``i`` of its share."""
    j = (ME + k) % GROUP
    return j, j * share + i


@triton.jit
def _push_to_owners(ctx, group, inp, partials, rs_flags, flag, pid, programs, T, H, share, part_stride,
                    stride_i, BLOCK: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """``"rs_ag"`` step 1: this rank's rows ``i = pid, pid + programs, ...`` of every peer's
    share into slot ``ME`` of that peer's ``partials`` (16-byte stores: workspace rows are
    16-byte aligned), each followed by its flag ``rs_flags[ME, i]`` there."""
    slot = tl.cast(share, tl.int64) * part_stride
    i = pid
    while i < share:
        for k in tl.static_range(1, GROUP):
            j, row = _share_row(i, k, share, GROUP, ME)
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


@triton.jit
def _collect_rows(ctx, group, out, residual_out, scales, gout, gres, gscales, ag_flags, flag, pid, programs,
                  T, H, share, stride_o, stride_ro, stride_go, stride_gr, HAS_RES_OUT: tl.constexpr,
                  OUT_IN_PLACE: tl.constexpr, RES_IN_PLACE: tl.constexpr, QUANT: tl.constexpr,
                  BLOCK: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """``"rs_ag"`` step 3: wait for the flag of each peer's row ``i = pid, pid + programs,
    ...`` of its share (stored by its owner into ``gout`` / ``gres``) and copy it into
    ``out`` / ``residual_out`` unless the owner stored it there itself (in place); with
    ``_DYNAMIC`` its scale too, from ``gscales`` into ``scales`` (``scales_out``)."""
    i = pid
    while i < share:
        for k in tl.static_range(1, GROUP):
            j, row = _share_row(i, k, share, GROUP, ME)
            if row < T:
                _await(ctx, group, ag_flags + row, flag, group.rank(j))
                r = row.to(tl.int64)
                if not OUT_IN_PLACE:
                    _copy_row(gout + r * stride_go, out + r * stride_o, H, BLOCK)
                if HAS_RES_OUT and not RES_IN_PLACE:
                    _copy_row(gres + r * stride_gr, residual_out + r * stride_ro, H, BLOCK)
                if QUANT == _DYNAMIC:
                    tl.store(scales + r, tl.load(gscales + r))
        i += programs


@triton.jit
def _rs_rmsnorm_kernel(
    context, members, sync_flags, epochs, status, budget,  # the group's sync state (runtime.launch)
    launches, inp, residual, weight, out, residual_out, scales, gout, gres, gscales, partials, rs_flags,
    ag_flags, T, H, eps, share, part_stride, stride_i, stride_r, stride_o, stride_ro, stride_go, stride_gr,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK: tl.constexpr, SINGLE: tl.constexpr, HAS_RES: tl.constexpr, HAS_RES_OUT: tl.constexpr,
    OUT_IN_PLACE: tl.constexpr, RES_IN_PLACE: tl.constexpr, HINT: tl.constexpr, QUANT: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """The ``"rs_ag"`` form over ``T`` rows of ``H`` elements, ``share`` rows per rank (see
    the module docstring). ``partials`` holds ``GROUP`` slots of ``share`` rows of
    ``part_stride`` elements (slot ``m``: member ``m``'s rows of this rank's share);
    ``gout`` / ``gres`` are where peers store this rank's copy of their rows (``out`` /
    ``residual_out`` themselves with ``OUT_IN_PLACE`` / ``RES_IN_PLACE``). ``scales``: with
    ``QUANT`` ``_STATIC`` the one scale, ``_DYNAMIC`` ``scales_out`` (``T`` fp32), whose
    peers' rows the owners store into ``gscales`` (always the workspace)."""
    enter_launch(PDL)
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    flag = _this_launch(launches)[1]
    programs = tl.num_programs(0)
    slot = tl.cast(share, tl.int64) * part_stride
    # 1. This rank's rows of every peer's share, into the peer's partials, a flag per row.
    _push_to_owners(
        ctx, group, inp, partials, rs_flags, flag, pid, programs, T, H, share, part_stride, stride_i,
        BLOCK, GROUP, ME,
    )  # fmt: skip
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
                _scale_of(scales, r, QUANT), gscales + r, H, eps, flag,
                False, True, SINGLE, HAS_RES, HAS_RES_OUT, QUANT, HINT, BLOCK, GROUP, ME,
            )  # fmt: skip
            for k in tl.static_range(1, GROUP):
                _raise(ctx, ag_flags + row, flag, group.rank((ME + k) % GROUP))
        i += programs
    # 3. The peers' rows, once they are here (copied out of the workspace unless in place).
    _collect_rows(
        ctx, group, out, residual_out, scales, gout, gres, gscales, ag_flags, flag, pid, programs, T, H,
        share, stride_o, stride_ro, stride_go, stride_gr, HAS_RES_OUT, OUT_IN_PLACE, RES_IN_PLACE, QUANT,
        BLOCK, GROUP, ME,
    )  # fmt: skip
    advance_launch_counter(launches, _LAUNCH_UNIT)
