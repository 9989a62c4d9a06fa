"""The kernel behind ``matmul_reduce_scatter`` and ``matmul_all_reduce``: each rank's partial
product ``a @ b`` is reduced tile by tile as soon as it is computed.

The output ``(M, N)`` is cut into ``G`` chunks (G: the group's size), along M or along N;
member ``j`` owns chunk ``j`` and reduces it. Tile ``t`` of the ``G x T`` tiles (chunk-major,
grouped order inside a chunk) is computed by program ``t mod P`` on every rank; program
``p``'s tiles are ``p, p + P, ...``. What a rank does with a tile:

* a tile of another member's chunk: the partial goes into the owner's workspace (slot of
  this rank) and the owner's flag for it is raised to the call's generation one tile later,
  after the next tile's GEMM. With ``STREAM`` it is staged in the program's local staging
  tile and copied to the owner a few rows per K step of that next GEMM (the program's last
  partial at once, at the end), so it leaves at the pace of the tensor cores instead of
  stalling the program while the link drains; without, it is stored to the owner at once;
* a tile of its own chunk: the peers' partials are added from the local workspace as soon
  as their flags show this call's generation, then the bias, and the tile is stored into
  the output (``matmul_all_reduce``: into every member's output; in a group of two with
  ``STREAM`` and "peers_first", copied from this rank's output to the peer's under the
  program's next GEMM, like a partial).

Two orders (``Config.order``):

* ``peers_first``: every program computes its tiles of the other chunks first, then its own
  tiles, whose partials have been pushed by then (streamed during the program's first own
  tile, for the last of them).
* ``spread``: even programs walk their tiles forwards, odd ones backwards, so about half
  of the pushes happen in each part of the call. An own tile that is not the program's
  last is parked in the output (rounded to its dtype, as the peers' partials are) and
  reduced after the program's next tile, when the peers' partials of it have arrived (the
  peers computed it at the same step); the last one is reduced at once.

Either way a program only ever waits for the same program on other ranks, for a tile that
program handles at the same step or earlier: this holds even when programs run one after
another (the interpreter).

``matmul_all_reduce`` starts every program with a barrier of its sync slot (each member has
entered the call, so its output is free to be written) and ends with one (every member's
final tiles have arrived). ``matmul_reduce_scatter`` writes no peer's output, only peers'
workspaces, and needs less: before its first push, a program waits until the same program
of every peer has left the previous call (``exits`` flags each program raises on its peers
as it finishes). That flag is normally set long before, so a call starts without a round
trip to the peers or waiting out their start.
"""

import torch
import triton
import triton.language as tl

from iris.ccl.triton import Group
from iris.mem.triton import Context, aggregate

from . import _host
from ._aggregates import Value, fields
from ._gemm import add_bias, copy_tile, grouped_tile, matmul_tile, scale_cols, scale_rows, tile_offsets
from ._sync import call_generation, finish_call, raise_exits, remote_tile, signal, wait, wait_exits
from .config import Config


@aggregate
@fields
class _Tile:
    """One output tile: ``j``, the chunk it lies in, and ``local``, its index in the chunk;
    the chunk's first row and column (``row_base``, ``col_base``) and valid extent
    (``rows x cols``); the tile's first row and column inside the chunk (``row0``, ``col0``);
    its elements in the output, ``origin + offs`` under ``mask``."""

    j: tl.tensor
    local: tl.tensor
    row_base: tl.tensor
    col_base: tl.tensor
    rows: tl.tensor
    cols: tl.tensor
    row0: tl.tensor
    col0: tl.tensor
    origin: tl.tensor
    offs: tl.tensor
    mask: tl.tensor


@aggregate
@fields
class _Tiles:
    """The output's chunks and tiles, and the ones the calling program visits.

    Chunk ``j`` of the ``M x N`` output is cut into ``tiles_m x tiles_n`` tiles
    (``chunk_tiles``, grouped order of ``GROUP_M``); a workspace slot holds one chunk,
    ``slot_elems`` elements. The output is addressed with ``stride_om``, ``stride_on`` and
    ``out_chunk_step``. Program ``pid`` of ``programs`` handles tiles ``pid + k * programs``
    of the chunk-major list (its tiles ``k < count``); ``SPREAD``: in the "spread" order,
    odd programs walking them backwards."""

    M: Value
    N: Value
    CM: Value
    CN: Value
    stride_om: Value
    stride_on: Value
    out_chunk_step: Value
    tiles_m: Value
    tiles_n: Value
    chunk_tiles: Value
    slot_elems: Value
    pid: tl.tensor
    programs: tl.tensor
    count: tl.tensor
    BLOCK_M: tl.constexpr
    BLOCK_N: tl.constexpr
    GROUP_M: tl.constexpr
    SPLIT_N: tl.constexpr
    SPREAD: tl.constexpr

    @staticmethod
    @triton.jit
    def initialize(
        M, N, CM, CN, stride_om, stride_on, out_chunk_step, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_N: tl.constexpr, SPREAD: tl.constexpr,
    ):  # fmt: skip
        """The tiles of the calling program, for a group of ``GROUP`` members."""
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        tiles_m = tl.cdiv(CM, BLOCK_M)
        tiles_n = tl.cdiv(CN, BLOCK_N)
        chunk_tiles = tiles_m * tiles_n
        count = tl.cdiv(GROUP * chunk_tiles - pid, programs)
        return _Tiles(
            M, N, CM, CN, stride_om, stride_on, out_chunk_step, tiles_m, tiles_n, chunk_tiles,
            tl.cast(CM, tl.int64) * CN, pid, programs, count, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_N, SPREAD,
        )  # fmt: skip

    @triton.jit
    def tile(self, k):
        """This program's tile ``k``: tile ``pid + k * programs`` of the chunk-major list."""
        t = self.pid + k * self.programs
        j = t // self.chunk_tiles
        local = t - j * self.chunk_tiles
        pid_m, pid_n = grouped_tile(local, self.tiles_m, self.tiles_n, self.GROUP_M)
        if self.SPLIT_N:
            row_base = j * 0
            col_base = j * self.CN
        else:
            row_base = j * self.CM
            col_base = j * 0
        rows = tl.minimum(self.CM, self.M - row_base)
        cols = tl.minimum(self.CN, self.N - col_base)
        row0 = pid_m * self.BLOCK_M
        col0 = pid_n * self.BLOCK_N
        origin, offs, mask = tile_offsets(
            row0, rows, col0, cols, self.stride_om, self.stride_on, self.BLOCK_M, self.BLOCK_N
        )
        origin += tl.cast(j, tl.int64) * self.out_chunk_step
        return _Tile(j, local, row_base, col_base, rows, cols, row0, col0, origin, offs, mask)


@aggregate
@fields
class _Copy:
    """A tile copy left for the program's next GEMM to stream (``STREAM``): the valid
    ``rows x cols`` of the ``BLOCK_M x BLOCK_N`` tile at ``src`` (row stride ``src_ld``) go to
    ``dst`` (row stride ``ld``). ``rows`` 0: no copy is pending."""

    src: tl.tensor
    src_ld: tl.tensor
    dst: tl.tensor
    ld: tl.tensor
    rows: tl.tensor
    cols: tl.tensor


@aggregate
@fields
class _Gemm:
    """The GEMM of one output tile: operands ``a`` and ``b`` (read through the tensor
    descriptors ``a_desc`` / ``b_desc`` with ``TMA_A`` / ``TMA_B``), the K extent and the
    strides, the block sizes and ``EVEN_K``; with ``SCALE_A`` / ``SCALE_B`` (float8) the
    product scaled by ``scale_a`` per row (``stride_sa`` apart, 0: one scale) and ``scale_b``
    per column (``stride_sb``); with ``STREAM`` a pending :class:`_Copy` moves
    ``STREAM_ROWS`` rows per K step (16-byte vectors with ``STREAM_ALIGNED``); ``INTERPRETED``:
    the interpreter-safe K loop of :func:`~iris.ops._gemm.matmul_tile`."""

    a: tl.tensor
    b: tl.tensor
    a_desc: Value
    b_desc: Value
    scale_a: tl.tensor
    scale_b: tl.tensor
    stride_sa: Value
    stride_sb: Value
    K: Value
    stride_am: Value
    stride_ak: Value
    stride_bk: Value
    stride_bn: Value
    BLOCK_M: tl.constexpr
    BLOCK_N: tl.constexpr
    BLOCK_K: tl.constexpr
    EVEN_K: tl.constexpr
    TMA_A: tl.constexpr
    TMA_B: tl.constexpr
    SCALE_A: tl.constexpr
    SCALE_B: tl.constexpr
    STREAM: tl.constexpr
    STREAM_ROWS: tl.constexpr
    STREAM_ALIGNED: tl.constexpr
    INTERPRETED: tl.constexpr

    @triton.jit
    def product(self, tile, job):
        """The fp32 product ``a @ b`` over ``tile`` (scaled); the copy ``job`` runs under its
        K loop."""
        acc = tl.zeros((self.BLOCK_M, self.BLOCK_N), dtype=tl.float32)
        a = self.a + tl.cast(tile.row_base, tl.int64) * self.stride_am
        b = self.b + tl.cast(tile.col_base, tl.int64) * self.stride_bn
        acc = matmul_tile(
            acc, a, b, tile.row0, tile.rows, tile.col0, tile.cols, self.K,
            self.stride_am, self.stride_ak, self.stride_bk, self.stride_bn,
            self.BLOCK_M, self.BLOCK_N, self.BLOCK_K, self.EVEN_K,
            self.a_desc, tile.row_base + tile.row0, self.b_desc, 0, tile.col_base + tile.col0,
            self.TMA_A, self.TMA_B, job.src, job.src_ld, job.dst, job.ld, job.rows, job.cols,
            self.STREAM, self.STREAM_ROWS, self.STREAM_ALIGNED, self.INTERPRETED,
        )  # fmt: skip
        row0, rows = tile.row_base + tile.row0, tile.row_base + tile.rows  # rows of a, the chunk's end
        acc = scale_rows(acc, self.scale_a, self.stride_sa, row0, rows, self.SCALE_A, self.BLOCK_M)
        col0, cols = tile.col_base + tile.col0, tile.col_base + tile.cols
        return scale_cols(acc, self.scale_b, self.stride_sb, col0, cols, self.SCALE_B, self.BLOCK_N)


@aggregate
@fields
class _Exchange:
    """What this rank exchanges with the group's members during the call: ``ctx``, ``group``
    and the call's generation ``gen``; the kernel's ``ready`` and ``exits`` flags, workspace
    ``ws``, output ``out`` and ``bias`` (``HAS_BIAS``); ``staged``, this program's staging
    tile (``STREAM``). ``ALL_REDUCE``, ``ALIGNED``, ``WS_ALIGNED``, ``STREAM`` and
    ``STREAM_OUT`` as the kernel's arguments of those names."""

    ctx: Context
    group: Group
    gen: tl.tensor
    ready: tl.tensor
    exits: tl.tensor
    ws: tl.tensor
    out: tl.tensor
    bias: tl.tensor
    staged: tl.tensor
    HAS_BIAS: tl.constexpr
    ALL_REDUCE: tl.constexpr
    ALIGNED: tl.constexpr
    WS_ALIGNED: tl.constexpr
    STREAM: tl.constexpr
    STREAM_OUT: tl.constexpr


@aggregate
@fields
class _Carry:
    """What a program carries from one tile to the next: ``job``, the :class:`_Copy` its next
    GEMM streams; ``flag`` (-1: none), the ``ready`` flag of the partial pushed last, to raise
    on rank ``owner`` once that GEMM is done; ``held`` (``SPREAD``, -1: none), ``k`` of the own
    tile (:meth:`_Tiles.tile`) parked in the output to be reduced; ``cleared``
    (reduce-scatter): the peers have left the previous call, partials may be pushed."""

    job: _Copy
    flag: tl.tensor
    owner: tl.tensor
    held: tl.tensor
    cleared: tl.tensor


@triton.jit
def _raise_pending(ex, flag, owner):
    """Raise flag ``flag`` of ``ready`` on rank ``owner`` to the call's generation, when one is
    pending (``flag`` >= 0): the partial it covers has been stored there completely (the
    GEMM that streamed it is over). Returns -1, no flag pending."""
    if flag >= 0:
        signal(ex.ctx, ex.ready + flag, ex.gen, owner)
    return flag * 0 - 1


@triton.jit
def _push_partial(ex, tiles, tile, acc, job, cleared):
    """Send ``acc``, the partial of a tile of another member's chunk, to that member's
    workspace (the slot of this rank): with ``STREAM`` it is staged in this program's
    staging tile and becomes the copy ``job`` of the next GEMM, so it leaves at the pace of
    the tensor cores; without, it is stored at once. Reduce-scatter: first, once per call,
    waits until the peers have left the previous call (``cleared``). Returns ``(job, flag,
    owner, cleared)``, the flag to raise on ``owner`` after the next GEMM."""
    group = ex.group
    if not ex.ALL_REDUCE:
        if cleared == 0:
            wait_exits(ex.ctx, group, ex.exits, ex.gen, tiles.pid, tiles.programs, group.size, group.index)
            cleared = tiles.pid >= 0
    owner = group.rank(tile.j)
    slot = (group.index - tile.j - 1 + group.size) % group.size
    origin, offs, mask = tile_offsets(
        tile.row0, tile.rows, tile.col0, tile.cols, tiles.CN, 1, tiles.BLOCK_M, tiles.BLOCK_N
    )
    partial = acc.to(ex.ws.dtype.element_ty)
    if ex.STREAM:
        s_offs = tl.arange(0, tiles.BLOCK_M)[:, None] * tiles.BLOCK_N + tl.arange(0, tiles.BLOCK_N)[None, :]
        tl.store(ex.staged + s_offs, partial)
        tl.debug_barrier()  # read back by other threads of the program
        dst = ex.ctx.translate(ex.ws, owner) + slot * tiles.slot_elems + origin
        zero = slot * 0
        rows, cols = tile.rows - tile.row0, tile.cols - tile.col0
        job = _Copy(ex.staged, zero + tiles.BLOCK_N, dst, zero + tiles.CN, rows, cols)
    else:
        dst = remote_tile(ex.ctx, ex.ws, owner, slot * tiles.slot_elems + origin, offs, ex.WS_ALIGNED)
        tl.store(dst, partial, mask=mask)
    return job, slot * tiles.chunk_tiles + tile.local, owner, cleared


@triton.jit
def _reduce_own(ex, tiles, tile, acc, PUSH: tl.constexpr):
    """Add the peers' partials of own tile ``tile`` to ``acc`` as their flags show the call's
    generation, add the bias, store the tile into the output (``ALL_REDUCE``: into every
    member's, or with ``PUSH`` False only this rank's: the caller streams it to the peer)."""
    group = ex.group
    origin, offs, mask = tile_offsets(
        tile.row0, tile.rows, tile.col0, tile.cols, tiles.CN, 1, tiles.BLOCK_M, tiles.BLOCK_N
    )
    for s in tl.static_range(group.size - 1):
        sender = group.rank((group.index + 1 + s) % group.size)
        wait(ex.ctx, group, ex.ready + s * tiles.chunk_tiles + tile.local, ex.gen, sender)
        src = ex.ws + s * tiles.slot_elems + origin
        part = tl.load(src + offs, mask=mask, other=0.0, cache_modifier=".cg")
        acc += part.to(tl.float32)
    acc = add_bias(acc, ex.bias + tile.col_base, tile.col0, tile.cols, ex.HAS_BIAS, tiles.BLOCK_N)
    result = acc.to(ex.out.dtype.element_ty)
    tl.store(ex.out + tile.origin + tile.offs, result, mask=tile.mask)
    if ex.ALL_REDUCE:
        if PUSH:
            for i in tl.static_range(1, group.size):
                peer = group.rank((group.index + i) % group.size)
                dst = remote_tile(ex.ctx, ex.out, peer, tile.origin, tile.offs, ex.ALIGNED)
                tl.store(dst, result, mask=tile.mask)


@triton.jit
def _reduce_parked(ex, tiles, k):
    """Reduce this program's own tile ``k``, parked in the output."""
    tile = tiles.tile(k)
    tl.debug_barrier()  # other threads of the program parked it
    acc = tl.load(ex.out + tile.origin + tile.offs, mask=tile.mask, other=0.0, cache_modifier=".cg")
    _reduce_own(ex, tiles, tile, acc.to(tl.float32), True)


@triton.jit
def _step(tiles, gemm, ex, carry, step, PHASE: tl.constexpr):
    """Visit the program's tile at ``step`` and return the new :class:`_Carry`. The tile is
    computed (the pending copy streaming under its K loop) if this phase takes it ("peers
    first": phase 0 the peers' chunks, phase 1 the own chunk; ``SPREAD``: all in one), then
    the previous partial's flag is raised and the tile is pushed to its owner, parked in the
    output (``SPREAD``, not the last step) or reduced. With ``SPREAD`` the tile parked one
    step earlier is reduced last: the peers computed its partials at that step too."""
    me = ex.group.index
    k = step
    if tiles.SPREAD:
        if tiles.pid % 2 == 1:  # odd programs walk their tiles backwards
            k = tiles.count - 1 - step
    tile = tiles.tile(k)
    if tiles.SPREAD:
        take = tile.row0 >= 0
    elif PHASE == 0:
        take = tile.j != me
    else:
        take = tile.j == me
    job, flag, owner, cleared = carry.job, carry.flag, carry.owner, carry.cleared
    zero = step * 0
    parking = zero - 1
    if take & (tile.row0 < tile.rows) & (tile.col0 < tile.cols):
        acc = gemm.product(tile, job)
        job = _Copy(job.src, job.src_ld, job.dst, job.ld, zero, job.cols)  # copied under the GEMM
        flag = _raise_pending(ex, flag, owner)
        if tile.j != me:
            job, flag, owner, cleared = _push_partial(ex, tiles, tile, acc, job, cleared)
        elif (step < tiles.count - 1) & tiles.SPREAD:
            # Parked in the output, in its dtype like the peers' partials, and
            # reduced after the next tile (when the peers' copies have arrived).
            tl.store(ex.out + tile.origin + tile.offs, acc.to(ex.out.dtype.element_ty), mask=tile.mask)
            parking = k
        else:
            _reduce_own(ex, tiles, tile, acc, not ex.STREAM_OUT)
            if ex.STREAM_OUT:  # the reduced tile goes to the peer under the next GEMM
                tl.debug_barrier()  # read back by other threads of the program
                peer_out = ex.ctx.translate(ex.out, ex.group.rank((me + 1) % ex.group.size))
                ld = zero + tiles.stride_om
                rows, cols = tile.rows - tile.row0, tile.cols - tile.col0
                job = _Copy(ex.out + tile.origin, ld, peer_out + tile.origin, ld, rows, cols)
    held = carry.held
    if tiles.SPREAD:
        if held >= 0:
            _reduce_parked(ex, tiles, held)
        held = parking
    return _Carry(job, flag, owner, held, cleared)


@triton.jit
def _matmul_reduce_kernel(
    context, members, sync_flags, epochs, status, budget, state, ready, exits, stage,
    a, b, bias, out, ws, a_desc, b_desc, scale_a, scale_b,
    M, N, K, CM, CN,
    stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on, out_chunk_step, stride_sa, stride_sb,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_N: tl.constexpr, ALL_REDUCE: tl.constexpr,
    ALIGNED: tl.constexpr, WS_ALIGNED: tl.constexpr, TMA_A: tl.constexpr, TMA_B: tl.constexpr,
    SPREAD: tl.constexpr = False, STREAM: tl.constexpr = False, STREAM_ROWS: tl.constexpr = 1,
    STREAM_OUT: tl.constexpr = False, STREAM_ALIGNED: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
    SCALE_A: tl.constexpr = False, SCALE_B: tl.constexpr = False,
):  # fmt: skip
    """Chunk ``j`` covers rows ``[j*CM, (j+1)*CM)`` (``SPLIT_N`` False, CN = N) or columns
    ``[j*CN, (j+1)*CN)`` (``SPLIT_N``, CM = M), clipped to the matrix. ``ws`` holds
    ``GROUP - 1`` slots of ``CM x CN`` (row-major) for the peers' partials of this rank's
    chunk; ``ready[s, t]`` is the flag of slot ``s``, tile ``t`` of the chunk. The output
    tile of chunk ``j`` is at ``out + j * out_chunk_step`` (0 when ``out`` holds only this
    rank's chunk). ``ALIGNED`` / ``WS_ALIGNED``: the output's / workspace's tiles may be
    stored to peers in 16-byte vectors. ``SPREAD``: the "spread" order of the module
    docstring instead of the peers' chunks first. ``exits[s, p]``: the last call program
    ``p`` of the member in slot ``s`` has left (reduce-scatter only). ``STREAM``: a peer's
    partial is staged in ``stage`` (``BLOCK_M x BLOCK_N`` per program, local) and copied to
    its owner ``STREAM_ROWS`` rows per K step of the program's next tile (or at the end);
    ``STREAM_OUT`` (all-reduce of two members, "peers_first" order): a reduced tile is
    streamed the same way from this rank's output into the peer's. ``STREAM_ALIGNED``: the
    streamed rows may move in 16-byte vectors. ``SCALE_A`` / ``SCALE_B``: float8 ``a`` / ``b``
    with scales (``scale_a`` per row of ``a``, ``stride_sa`` apart, 0 for one scale;
    ``scale_b`` per column of ``b``), applied to each partial before it is exchanged: the
    partials and the output are in ``out``'s dtype.

    Each program visits its tiles one :func:`_step` at a time, carrying a :class:`_Carry`
    from one to the next, and finishes what the last step left pending."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, sync_flags, epochs, status, budget, GROUP, ME)
    tiles = _Tiles.initialize(
        M, N, CM, CN, stride_om, stride_on, out_chunk_step, GROUP, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_N, SPREAD
    )
    pid = tiles.pid
    gen = call_generation(state)
    if ALL_REDUCE:  # peers store into the output: every member must have entered the call
        group.sync(ctx, pid, fence=False)  # nothing remote before it: no fence
    gemm = _Gemm(
        a, b, a_desc, b_desc, scale_a, scale_b, stride_sa, stride_sb, K, stride_am, stride_ak, stride_bk,
        stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, TMA_A, TMA_B, SCALE_A, SCALE_B, STREAM, STREAM_ROWS,
        STREAM_ALIGNED, INTERPRETED,
    )  # fmt: skip
    staged = stage + tl.cast(pid, tl.int64) * (BLOCK_M * BLOCK_N)
    ex = _Exchange(
        ctx, group, gen, ready, exits, ws, out, bias, staged, HAS_BIAS, ALL_REDUCE, ALIGNED, WS_ALIGNED,
        STREAM, STREAM_OUT,
    )  # fmt: skip
    # No copy or flag pending, no tile parked; reduce-scatter: no push cleared yet.
    zero = pid * 0
    idle = _Copy(staged, zero + BLOCK_N, ws, zero + CN, zero, zero)
    carry = _Carry(idle, zero - 1, zero, zero - 1, pid < 0)
    for phase in tl.static_range(1 if SPREAD else 2):
        step = zero
        while step < tiles.count:
            carry = _step(tiles, gemm, ex, carry, step, phase)
            step += 1
    job = carry.job
    if STREAM:
        if job.rows > 0:  # left after the program's last GEMM: copied now, at once
            copy_tile(
                job.src, job.src_ld, job.dst, job.ld, job.rows, job.cols, BLOCK_M, BLOCK_N, STREAM_ALIGNED
            )
    _raise_pending(ex, carry.flag, carry.owner)
    if SPREAD:
        if carry.held >= 0:  # parked at the program's second-to-last step
            _reduce_parked(ex, tiles, carry.held)
    if ALL_REDUCE:
        group.sync(ctx, pid)
    elif GROUP > 1:
        raise_exits(ctx, group, exits, gen, pid, tiles.programs, GROUP, ME)
    finish_call(state, gen)


def spread(cfg: Config) -> bool:
    """Whether to run the "spread" order (``Config.order``); ``"auto"`` runs "peers_first":
    with the partials streamed (``Config.stream``) it measured faster for both ops on
    2 x H200 than "spread", streamed or not."""
    return cfg.order == "spread"


def run(
    op: str,
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    scale_a: torch.Tensor | None,
    scale_b: torch.Tensor | None,
    split_n: bool,
    chunk: tuple[int, int],
    all_reduce: bool,
    ranks: tuple[int, ...],
    index: int,
    cfg: Config,
    workspace,
    group,
) -> None:
    """Validate-free launcher shared by the two ops: ``out`` is the final output, (M, N) for
    ``all_reduce``, this rank's chunk otherwise; ``chunk`` is ``(CM, CN)``. Partials are
    exchanged in ``out``'s dtype (``a``'s, but for float8 inputs)."""
    size = len(ranks)
    (m, k), n = a.shape, b.shape[1]
    cm, cn = chunk
    chunk_tiles = _host.cdiv(cm, cfg.block_m) * _host.cdiv(cn, cfg.block_n)
    heap = _host.heap_of(out, ranks)
    # Peers store into the output of matmul_all_reduce: it must be on the heap, else staged.
    in_place = not all_reduce or size == 1 or _host.writable_in_place(out, heap)
    grid = max(1, min(cfg.num_sms, size * chunk_tiles))
    stream = size > 1 and cfg.stream is not False
    # Rows of a staged tile copied per K step: all of them over the K loop (K = 0: at once).
    k_steps = max(_host.cdiv(k, cfg.block_k), 1)
    stream_rows = min(cfg.block_m, triton.next_power_of_2(_host.cdiv(cfg.block_m, k_steps)))
    specs = [
        ("ready", (size - 1) * chunk_tiles, torch.int32),
        ("exits", (size - 1) * grid, torch.int32),
        ("partials", (size - 1) * cm * cn, out.dtype),
        ("stage", grid * cfg.block_m * cfg.block_n if stream else 0, out.dtype),
    ]
    if not in_place:
        specs.append(("out", m * n, out.dtype))
    shapes = (tuple(a.shape), tuple(b.shape), tuple(out.shape))
    ws = _host.workspace_for(
        op, ranks, index, shapes, a, cfg, ("n" if split_n else "m"), out, in_place, specs, workspace, group
    )
    kout = out if in_place else ws.buffers["out"].view(m, n)
    if m * n == 0:
        return
    if all_reduce:
        step = cm * kout.stride(0) if not split_n else cn * kout.stride(1)
    else:
        step = 0
    aligned, ws_aligned = _host.aligned(kout, step), _host.aligned(ws.buffers["partials"], cn)
    a_desc, tma_a = _host.tma_operand(a, (cfg.block_m, cfg.block_k), cfg.tma)
    # A chunk of columns must start on a 16-byte boundary for the copy engine's boxes (an
    # fp16 chunk of 1500 columns made the launch fail with an illegal instruction).
    b_boxes = not split_n or cn * b.element_size() % 16 == 0
    b_desc, tma_b = _host.tma_operand(b, (cfg.block_k, cfg.block_n), cfg.tma and b_boxes)
    sa, stride_sa, scaled_a = _host.scale_operand(scale_a, 0, kout)
    sb, stride_sb, scaled_b = _host.scale_operand(scale_b, 1, kout)
    _host.launch(
        _matmul_reduce_kernel, grid, ws, cfg,
        ws.buffers["ready"], ws.buffers["exits"], ws.buffers["stage"], a, b, bias if bias is not None else a,
        kout, ws.buffers["partials"],
        a_desc, b_desc, sa, sb,
        m, n, k, cm, cn, *a.stride(), *b.stride(), *kout.stride(), step, stride_sa, stride_sb,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None, SPLIT_N=split_n, ALL_REDUCE=all_reduce,
        ALIGNED=aligned, WS_ALIGNED=ws_aligned,
        TMA_A=tma_a, TMA_B=tma_b, SPREAD=size > 1 and spread(cfg), STREAM=stream,
        STREAM_ROWS=stream_rows, STREAM_OUT=stream and all_reduce and size == 2 and not spread(cfg),
        STREAM_ALIGNED=ws_aligned and (aligned or not all_reduce), SCALE_A=scaled_a, SCALE_B=scaled_b,
    )  # fmt: skip
    if kout is not out:
        out.copy_(kout)
