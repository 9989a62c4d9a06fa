"""The kernel behind ``matmul_reduce_scatter`` and ``matmul_all_reduce``: each rank's partial
product ``a @ b`` is reduced tile by tile as soon as it is computed.

The output ``(M, N)`` is cut into ``G`` chunks (G: the group's size), along M or along N;
member ``j`` owns chunk ``j`` and reduces it. Tile ``t`` of the ``G x T`` tiles (chunk-major,
grouped order inside a chunk) is computed by program ``t mod P`` on every rank, in two
phases:

1. tiles of the other members' chunks: the partial tile is stored straight into the
   owner's workspace (slot of this rank) and the owner's flag for it is raised to the call's
   generation; the flag is raised one tile later, after the next tile's GEMM, so the remote
   stores drain while the tensor cores work;
2. tiles of this rank's own chunk: the partial stays in registers, the peers' partials are
   added from the local workspace as soon as their flags show this call's generation, the
   bias is added, and the tile is stored into the output (``matmul_all_reduce``: into every
   member's output).

Every program starts with a barrier of its sync slot (each member has entered the call, so
its workspace and output are free) and, for ``matmul_all_reduce``, ends with one (every
member's final tiles have arrived). Because tile ``t`` is handled by program ``t mod P``
everywhere, a program only ever waits for the same program on other ranks, in a phase
that program reaches first: this holds even when programs run one after another (the
interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.ccl.triton import Group
from iris.mem.triton import Context

from . import _host
from ._gemm import add_bias, grouped_tile, matmul_tile, tile_offsets
from ._sync import call_generation, finish_call, remote_tile, signal, wait
from .config import Config


@triton.jit
def _matmul_reduce_kernel(
    context, members, sync_flags, epochs, status, budget, state, ready,
    a, b, bias, out, ws, a_desc, b_desc,
    M, N, K, CM, CN,
    stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on, out_chunk_step,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_N: tl.constexpr, ALL_REDUCE: tl.constexpr,
    ALIGNED: tl.constexpr, WS_ALIGNED: tl.constexpr, TMA_A: tl.constexpr, TMA_B: tl.constexpr,
):  # fmt: skip
    """Chunk ``j`` covers rows ``[j*CM, (j+1)*CM)`` (``SPLIT_N`` False, CN = N) or columns
    ``[j*CN, (j+1)*CN)`` (``SPLIT_N``, CM = M), clipped to the matrix. ``ws`` holds
    ``GROUP - 1`` slots of ``CM x CN`` (row-major) for the peers' partials of this rank's
    chunk; ``ready[s, t]`` is the flag of slot ``s``, tile ``t`` of the chunk. The output
    tile of chunk ``j`` is at ``out + j * out_chunk_step`` (0 when ``out`` holds only this
    rank's chunk). ``ALIGNED`` / ``WS_ALIGNED``: the output's / workspace's tiles may be
    stored to peers in 16-byte vectors."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, sync_flags, epochs, status, budget, GROUP, ME)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    gen = call_generation(state)
    group.sync(ctx, pid, fence=False)  # nothing remote before it: no fence (2-3 us)
    tiles_m = tl.cdiv(CM, BLOCK_M)
    tiles_n = tl.cdiv(CN, BLOCK_N)
    chunk_tiles = tiles_m * tiles_n
    slot_elems = tl.cast(CM, tl.int64) * CN
    pending = pid * 0 - 1  # flag index of the last partial pushed and not yet signalled
    pending_rank = pid * 0
    for phase in tl.static_range(2):
        t = pid
        while t < GROUP * chunk_tiles:
            j = t // chunk_tiles
            if phase == 0:
                take = j != ME
            else:
                take = j == ME
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
            if take & (row0 < rows) & (col0 < cols):
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                a_chunk = a + tl.cast(row_base, tl.int64) * stride_am
                b_chunk = b + tl.cast(col_base, tl.int64) * stride_bn
                acc = matmul_tile(
                    acc, a_chunk, b_chunk, row0, rows, col0, cols, K,
                    stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                    a_desc, row_base + row0, b_desc, 0, col_base + col0, TMA_A, TMA_B,
                )  # fmt: skip
                if pending >= 0:
                    signal(ctx, ready + pending, gen, pending_rank)
                    pending = pid * 0 - 1
                origin, offs, mask = tile_offsets(row0, rows, col0, cols, CN, 1, BLOCK_M, BLOCK_N)
                if phase == 0:
                    owner = group.rank(j)
                    slot = (ME - j - 1 + GROUP) % GROUP
                    dst = remote_tile(ctx, ws, owner, slot * slot_elems + origin, offs, WS_ALIGNED)
                    tl.store(dst, acc.to(ws.dtype.element_ty), mask=mask)
                    pending = slot * chunk_tiles + local
                    pending_rank = owner
                else:
                    for s in tl.static_range(GROUP - 1):
                        sender = group.rank((ME + 1 + s) % GROUP)
                        wait(ctx, group, ready + s * chunk_tiles + local, gen, sender)
                        slot_tile = ws + s * slot_elems + origin
                        part = tl.load(slot_tile + offs, mask=mask, other=0.0, cache_modifier=".cg")
                        acc += part.to(tl.float32)
                    acc = add_bias(acc, bias + col_base, col0, cols, HAS_BIAS, BLOCK_N)
                    result = acc.to(out.dtype.element_ty)
                    o_origin, o_offs, o_mask = tile_offsets(
                        row0, rows, col0, cols, stride_om, stride_on, BLOCK_M, BLOCK_N
                    )
                    o_origin += tl.cast(j, tl.int64) * out_chunk_step
                    tl.store(out + o_origin + o_offs, result, mask=o_mask)
                    if ALL_REDUCE:
                        for i in tl.static_range(1, GROUP):
                            peer = group.rank((ME + i) % GROUP)
                            dst = remote_tile(ctx, out, peer, o_origin, o_offs, ALIGNED)
                            tl.store(dst, result, mask=o_mask)
            t += programs
    if pending >= 0:
        signal(ctx, ready + pending, gen, pending_rank)
    if ALL_REDUCE:
        group.sync(ctx, pid)
    finish_call(state, gen)


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
    specs = [("ready", (size - 1) * chunk_tiles, torch.int32), ("partials", (size - 1) * cm * cn, a.dtype)]
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
    grid = max(1, min(cfg.num_sms, size * chunk_tiles))
    a_desc, tma_a = _host.tma_operand(a, (cfg.block_m, cfg.block_k), cfg.tma)
    b_desc, tma_b = _host.tma_operand(b, (cfg.block_k, cfg.block_n), cfg.tma)
    _host.launch(
        _matmul_reduce_kernel, grid, ws, cfg,
        ws.buffers["ready"], a, b, bias if bias is not None else a, kout, ws.buffers["partials"],
        a_desc, b_desc,
        m, n, k, cm, cn, *a.stride(), *b.stride(), *kout.stride(), step,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None, SPLIT_N=split_n, ALL_REDUCE=all_reduce,
        ALIGNED=_host.aligned(kout, step), WS_ALIGNED=_host.aligned(ws.buffers["partials"], cn),
        TMA_A=tma_a, TMA_B=tma_b,
    )  # fmt: skip
    if kout is not out:
        out.copy_(kout)
