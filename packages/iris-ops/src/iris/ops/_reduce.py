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
trip to the peers or waiting out their start (about 3 us a call).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.ccl.triton import Group
from iris.mem.triton import Context

from . import _host
from ._gemm import add_bias, copy_tile, grouped_tile, matmul_tile, tile_offsets
from ._sync import call_generation, finish_call, raise_exits, remote_tile, signal, wait, wait_exits
from .config import Config


@triton.jit
def _chunk_tile(
    t, chunk_tiles, tiles_m, tiles_n, M, N, CM, CN, stride_om, stride_on, out_chunk_step,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_N: tl.constexpr,
):  # fmt: skip
    """Where tile ``t`` of the chunk-major list lies: ``(chunk, index in the chunk, first row
    and column of the chunk, its valid rows and columns, the tile's first row and column
    inside the chunk, its output origin, offsets and mask)``."""
    j = t // chunk_tiles
    local = t - j * chunk_tiles
    pid_m, pid_n = grouped_tile(local, tiles_m, tiles_n, GROUP_M)
    if SPLIT_N:
        row_base = j * 0
        col_base = j * CN
    else:
        row_base = j * CM
        col_base = j * 0
    rows = tl.minimum(CM, M - row_base)
    cols = tl.minimum(CN, N - col_base)
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    o_origin, o_offs, o_mask = tile_offsets(row0, rows, col0, cols, stride_om, stride_on, BLOCK_M, BLOCK_N)
    o_origin += tl.cast(j, tl.int64) * out_chunk_step
    return j, local, row_base, col_base, rows, cols, row0, col0, o_origin, o_offs, o_mask


@triton.jit
def _reduce_own(
    ctx, group, acc, ready, ws, bias, out, gen, local, chunk_tiles, slot_elems,
    col_base, rows, cols, row0, col0, CN, o_origin, o_offs, o_mask,
    GROUP: tl.constexpr, ME: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, ALL_REDUCE: tl.constexpr, ALIGNED: tl.constexpr, PUSH: tl.constexpr = True,
):  # fmt: skip
    """Add the peers' partials of own tile ``local`` to ``acc`` as their flags show ``gen``,
    add the bias, store the tile into the output (``ALL_REDUCE``: into every member's, or
    with ``PUSH`` False only this rank's: the caller streams it to the peer)."""
    origin, offs, mask = tile_offsets(row0, rows, col0, cols, CN, 1, BLOCK_M, BLOCK_N)
    for s in tl.static_range(GROUP - 1):
        sender = group.rank((ME + 1 + s) % GROUP)
        wait(ctx, group, ready + s * chunk_tiles + local, gen, sender)
        part = tl.load(ws + s * slot_elems + origin + offs, mask=mask, other=0.0, cache_modifier=".cg")
        acc += part.to(tl.float32)
    acc = add_bias(acc, bias + col_base, col0, cols, HAS_BIAS, BLOCK_N)
    result = acc.to(out.dtype.element_ty)
    tl.store(out + o_origin + o_offs, result, mask=o_mask)
    if ALL_REDUCE:
        if PUSH:
            for i in tl.static_range(1, GROUP):
                peer = group.rank((ME + i) % GROUP)
                tl.store(remote_tile(ctx, out, peer, o_origin, o_offs, ALIGNED), result, mask=o_mask)


@triton.jit
def _matmul_reduce_kernel(
    context, members, sync_flags, epochs, status, budget, state, ready, exits, stage,
    a, b, bias, out, ws, a_desc, b_desc,
    M, N, K, CM, CN,
    stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on, out_chunk_step,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_N: tl.constexpr, ALL_REDUCE: tl.constexpr,
    ALIGNED: tl.constexpr, WS_ALIGNED: tl.constexpr, TMA_A: tl.constexpr, TMA_B: tl.constexpr,
    SPREAD: tl.constexpr = False, STREAM: tl.constexpr = False, STREAM_ROWS: tl.constexpr = 1,
    STREAM_OUT: tl.constexpr = False, STREAM_ALIGNED: tl.constexpr = False,
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
    streamed rows may move in 16-byte vectors."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, sync_flags, epochs, status, budget, GROUP, ME)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    gen = call_generation(state)
    if ALL_REDUCE:  # peers store into the output: every member must have entered the call
        group.sync(ctx, pid, fence=False)  # nothing remote before it: no fence (2-3 us)
    cleared = pid < 0  # reduce-scatter: may push, the peers have left the previous call
    tiles_m = tl.cdiv(CM, BLOCK_M)
    tiles_n = tl.cdiv(CN, BLOCK_N)
    chunk_tiles = tiles_m * tiles_n
    slot_elems = tl.cast(CM, tl.int64) * CN
    mine = tl.cdiv(GROUP * chunk_tiles - pid, programs)  # this program's tiles: pid + k * programs
    pending = pid * 0 - 1  # flag index of the last partial pushed and not yet signalled
    pending_rank = pid * 0
    held = pid * 0 - 1  # SPREAD: k of the own tile parked one step ago, -1 for none
    staged = stage + tl.cast(pid, tl.int64) * (BLOCK_M * BLOCK_N)  # STREAM: this program's
    job_src = staged  # STREAM: the tile to copy under the next GEMM (row stride job_src_ld),
    job_src_ld = pid * 0 + BLOCK_N
    job_dst = ws  # where it goes (a peer's ws or output, row stride job_ld),
    job_ld = pid * 0 + CN
    job_rows = pid * 0  # its valid rows (0: no copy pending) and columns
    job_cols = pid * 0
    for phase in tl.static_range(1 if SPREAD else 2):
        step = pid * 0
        while step < mine:
            k = step
            if SPREAD:
                if pid % 2 == 1:  # odd programs walk their tiles backwards
                    k = mine - 1 - step
            j, local, row_base, col_base, rows, cols, row0, col0, o_origin, o_offs, o_mask = _chunk_tile(
                pid + k * programs, chunk_tiles, tiles_m, tiles_n, M, N, CM, CN, stride_om, stride_on,
                out_chunk_step, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_N,
            )  # fmt: skip
            if SPREAD:
                take = row0 >= 0
            elif phase == 0:
                take = j != ME
            else:
                take = j == ME
            parking = pid * 0 - 1
            if take & (row0 < rows) & (col0 < cols):
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                a_chunk = a + tl.cast(row_base, tl.int64) * stride_am
                b_chunk = b + tl.cast(col_base, tl.int64) * stride_bn
                acc = matmul_tile(
                    acc, a_chunk, b_chunk, row0, rows, col0, cols, K,
                    stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                    a_desc, row_base + row0, b_desc, 0, col_base + col0, TMA_A, TMA_B,
                    job_src, job_src_ld, job_dst, job_ld, job_rows, job_cols,
                    STREAM, STREAM_ROWS, STREAM_ALIGNED,
                )  # fmt: skip
                job_rows = pid * 0
                if pending >= 0:
                    signal(ctx, ready + pending, gen, pending_rank)
                    pending = pid * 0 - 1
                if j != ME:
                    if not ALL_REDUCE:
                        if cleared == 0:
                            wait_exits(ctx, group, exits, gen, pid, programs, GROUP, ME)
                            cleared = pid >= 0
                    owner = group.rank(j)
                    slot = (ME - j - 1 + GROUP) % GROUP
                    origin, offs, mask = tile_offsets(row0, rows, col0, cols, CN, 1, BLOCK_M, BLOCK_N)
                    if STREAM:  # staged here, copied while the next tile is computed
                        s_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                        tl.store(staged + s_offs, acc.to(ws.dtype.element_ty))
                        tl.debug_barrier()  # read back by other threads of the program
                        job_src = staged
                        job_src_ld = pid * 0 + BLOCK_N
                        job_dst = ctx.translate(ws, owner) + slot * slot_elems + origin
                        job_ld = pid * 0 + CN
                        job_rows = rows - row0
                        job_cols = cols - col0
                    else:
                        dst = remote_tile(ctx, ws, owner, slot * slot_elems + origin, offs, WS_ALIGNED)
                        tl.store(dst, acc.to(ws.dtype.element_ty), mask=mask)
                    pending = slot * chunk_tiles + local
                    pending_rank = owner
                elif SPREAD & (step < mine - 1):
                    # Parked in the output, in its dtype like the peers' partials, and
                    # reduced after the next tile (when the peers' copies have arrived).
                    tl.store(out + o_origin + o_offs, acc.to(out.dtype.element_ty), mask=o_mask)
                    parking = k
                else:
                    _reduce_own(
                        ctx, group, acc, ready, ws, bias, out, gen, local, chunk_tiles, slot_elems,
                        col_base, rows, cols, row0, col0, CN, o_origin, o_offs, o_mask,
                        GROUP, ME, BLOCK_M, BLOCK_N, HAS_BIAS, ALL_REDUCE, ALIGNED, not STREAM_OUT,
                    )  # fmt: skip
                    if STREAM_OUT:  # the reduced tile goes to the peer under the next GEMM
                        tl.debug_barrier()  # read back by other threads of the program
                        job_src = out + o_origin
                        job_src_ld = pid * 0 + stride_om
                        job_dst = ctx.translate(out, group.rank((ME + 1) % GROUP)) + o_origin
                        job_ld = pid * 0 + stride_om
                        job_rows = rows - row0
                        job_cols = cols - col0
            if SPREAD:
                if held >= 0:
                    _reduce_parked(
                        ctx, group, held, pid, programs, ready, ws, bias, out, gen, chunk_tiles, tiles_m,
                        tiles_n, slot_elems, M, N, CM, CN, stride_om, stride_on, out_chunk_step,
                        GROUP, ME, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_N, HAS_BIAS, ALL_REDUCE, ALIGNED,
                    )  # fmt: skip
                held = parking
            step += 1
    if STREAM:
        if job_rows > 0:  # left after the program's last GEMM: copied now, at once
            copy_tile(
                job_src, job_src_ld, job_dst, job_ld, job_rows, job_cols, BLOCK_M, BLOCK_N, STREAM_ALIGNED
            )
    if pending >= 0:
        signal(ctx, ready + pending, gen, pending_rank)
    if SPREAD:
        if held >= 0:  # parked at the program's second-to-last tile
            _reduce_parked(
                ctx, group, held, pid, programs, ready, ws, bias, out, gen, chunk_tiles, tiles_m,
                tiles_n, slot_elems, M, N, CM, CN, stride_om, stride_on, out_chunk_step,
                GROUP, ME, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_N, HAS_BIAS, ALL_REDUCE, ALIGNED,
            )  # fmt: skip
    if ALL_REDUCE:
        group.sync(ctx, pid)
    elif GROUP > 1:
        raise_exits(ctx, group, exits, gen, pid, programs, GROUP, ME)
    finish_call(state, gen)


@triton.jit
def _reduce_parked(
    ctx, group, k, pid, programs, ready, ws, bias, out, gen, chunk_tiles, tiles_m, tiles_n, slot_elems,
    M, N, CM, CN, stride_om, stride_on, out_chunk_step,
    GROUP: tl.constexpr, ME: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_N: tl.constexpr, HAS_BIAS: tl.constexpr, ALL_REDUCE: tl.constexpr,
    ALIGNED: tl.constexpr,
):  # fmt: skip
    """Reduce the own tile this program parked in the output at its tile ``k``."""
    j, local, row_base, col_base, rows, cols, row0, col0, o_origin, o_offs, o_mask = _chunk_tile(
        pid + k * programs, chunk_tiles, tiles_m, tiles_n, M, N, CM, CN, stride_om, stride_on,
        out_chunk_step, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_N,
    )  # fmt: skip
    tl.debug_barrier()  # other threads of the program parked it
    acc = tl.load(out + o_origin + o_offs, mask=o_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    _reduce_own(
        ctx, group, acc, ready, ws, bias, out, gen, local, chunk_tiles, slot_elems,
        col_base, rows, cols, row0, col0, CN, o_origin, o_offs, o_mask,
        GROUP, ME, BLOCK_M, BLOCK_N, HAS_BIAS, ALL_REDUCE, ALIGNED,
    )  # fmt: skip


def spread(cfg: Config) -> bool:
    """Whether to run the "spread" order (``Config.order``); ``"auto"`` runs "peers_first":
    with the partials streamed (``Config.stream``) it measured faster for both ops on
    2 x H200 (matmul_reduce_scatter at 1024 x 8192 x 4096: 103.6 us against 114.4 for
    "spread" without streaming and 124.4 with it)."""
    return cfg.order == "spread"


def run(
    op: str,
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    *,
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
    ``all_reduce``, this rank's chunk otherwise; ``chunk`` is ``(CM, CN)``."""
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
        ("partials", (size - 1) * cm * cn, a.dtype),
        ("stage", grid * cfg.block_m * cfg.block_n if stream else 0, a.dtype),
    ]
    if not in_place:
        specs.append(("out", m * n, a.dtype))
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
    _host.launch(
        _matmul_reduce_kernel, grid, ws, cfg,
        ws.buffers["ready"], ws.buffers["exits"], ws.buffers["stage"], a, b, bias if bias is not None else a,
        kout, ws.buffers["partials"],
        a_desc, b_desc,
        m, n, k, cm, cn, *a.stride(), *b.stride(), *kout.stride(), step,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None, SPLIT_N=split_n, ALL_REDUCE=all_reduce,
        ALIGNED=aligned, WS_ALIGNED=ws_aligned,
        TMA_A=tma_a, TMA_B=tma_b, SPREAD=size > 1 and spread(cfg), STREAM=stream,
        STREAM_ROWS=stream_rows, STREAM_OUT=stream and all_reduce and size == 2 and not spread(cfg),
        STREAM_ALIGNED=ws_aligned and (aligned or not all_reduce),
    )  # fmt: skip
    if kout is not out:
        out.copy_(kout)
