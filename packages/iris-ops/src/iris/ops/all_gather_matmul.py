"""``all_gather_matmul``: ``out = all_gather(a_shard) @ b``, with A gathered while the GEMM
runs.

Two layouts (``gather_dim``): A sharded along M (sequence parallelism, like torch's
``fused_all_gather_matmul``: every rank holds rows of A) or along K (every rank holds
columns of A, the layout of the reference Iris).

One persistent kernel. Its first ``comm_sms`` programs push this rank's shard, block of
``BLOCK_M`` rows by block, into every peer's workspace (remote vector stores, then a flag per
row block raised to the call's generation); then they join the others, which
claim output tiles from a counter:

* along M: tiles whose rows are this rank's own shard come first and read the shard where
  it is, without waiting; tiles of a peer's rows wait for the flag of their row block and
  read the workspace;
* along K: every tile needs every shard; it multiplies this rank's K slice first, then
  each peer's slice once its row block has arrived.

Where TMA is available (and ``Config.tma`` on), the GEMM reads A through one tensor
descriptor over the workspace's shard slots, seen as one ``(G*MS, KS)`` matrix; the own
shard is then copied into its slot before the launch and read from there.

Float8 shards move as they are (one byte an element); with ``scale_a`` each row block's
scales (``MS`` per shard: one per row, or the shard's one scale repeated) travel with it into
the peers' ``scales`` slots before its flag, and every product of a shard is scaled by its
own rows' scales (along K: each slice by its own, before the slices are summed).

Nothing is pulled from a peer, so nothing of this rank's is read after the kernel ends:
the only barrier is the pushers' start barrier (a peer's workspace is free once that peer
has entered the call).
"""

# No ``from __future__ import annotations`` here: Triton checks the fields of an aggregate
# (``_Operands``) against their annotations at run time, which must be types, not strings.
import dataclasses

import torch
import triton
import triton.language as tl

import iris.mem
from iris.ccl import Work
from iris.ccl.triton import Group
from iris.mem.triton import Context, aggregate

from . import _composed, _host, _select
from ._aggregates import Value, fields
from ._gemm import add_bias, grouped_tile, matmul_tile, scale_cols, scale_rows, tile_offsets
from ._sync import call_generation, claim_tile, finish_call, remote_tile, signal, signal_count, wait
from .config import Config, select
from .workspace import Workspace

_OP = "all_gather_matmul"


@triton.jit
def _send_block(ctx, group, a, ws, slot, origin, offs, mask, FIRST: tl.constexpr, ALIGNED: tl.constexpr):
    """Store the block ``a[origin + offs]`` at ``slot + origin`` of the ``ws`` of members
    ``index + FIRST, ...`` (``FIRST=0``: this rank's own ``ws`` too)."""
    x = tl.load(a + origin + offs, mask=mask)
    for i in tl.static_range(FIRST, group.size):
        peer = group.rank((group.index + i) % group.size)
        tl.store(remote_tile(ctx, ws, peer, slot + origin, offs, ALIGNED), x, mask=mask)


@triton.jit
def _send_scales(ctx, group, scale_a, stride_sa, scales, row0, MS, R: tl.constexpr, FIRST: tl.constexpr):
    """Store the scales of rows ``row0 .. row0 + R`` of this rank's shard (``scale_a``,
    ``stride_sa`` apart: 0 repeats the shard's one scale) at their rows of slot ``ME`` of the
    ``scales`` of members ``index + FIRST, ...`` (``FIRST=0``: this rank's own too)."""
    rows = row0 + tl.arange(0, R)
    mask = rows < MS
    x = tl.load(scale_a + rows.to(tl.int64) * stride_sa, mask=mask)
    dst = scales + group.index * MS + rows
    for i in tl.static_range(FIRST, group.size):
        ctx.store(dst, x, group.rank((group.index + i) % group.size), mask=mask)


@triton.jit
def _push_shard(
    ctx, group, a, ws, ready, gen, MS, KS, row_blocks, pushers, scale_a, stride_sa, scales,
    BLOCK_M: tl.constexpr, PUSH_K: tl.constexpr, ALIGNED: tl.constexpr, SCALE_A: tl.constexpr,
):  # fmt: skip
    """This pusher's row blocks (``pid``, ``pid + pushers``, ...) of the local shard ``a``
    (``MS x KS``, row-major) into slot ``ME`` of every peer's ``ws`` (with ``SCALE_A`` their
    scales into its ``scales``), each followed by its flag ``ready[ME, block]`` on that peer."""
    slot = group.index * tl.cast(MS, tl.int64) * KS
    rb = tl.program_id(0)
    while rb < row_blocks:
        kk = rb * 0
        while kk < KS:
            origin, offs, mask = tile_offsets(rb * BLOCK_M, MS, kk, KS, KS, 1, BLOCK_M, PUSH_K)
            _send_block(ctx, group, a, ws, slot, origin, offs, mask, 1, ALIGNED)
            kk += PUSH_K
        if SCALE_A:
            _send_scales(ctx, group, scale_a, stride_sa, scales, rb * BLOCK_M, MS, BLOCK_M, 1)
        # One flag per row block and peer, raised with release after the block's stores
        # (signal: CTA barrier, then a system-scope release): readers start on it at once.
        for i in tl.static_range(1, group.size):
            peer = group.rank((group.index + i) % group.size)
            signal(ctx, ready + group.index * row_blocks + rb, gen, peer)
        rb += pushers


@triton.jit
def _push_combined(
    ctx, group, a, ws, ready, MS, KS, pushers, scale_a, stride_sa, scales,
    PUSH_M: tl.constexpr, PUSH_K: tl.constexpr, ALIGNED: tl.constexpr, SCALE_A: tl.constexpr,
):  # fmt: skip
    """``COMBINED``: this pusher's column blocks (``pid``, ``pid + pushers``, ...) of the
    whole local shard (``MS <= PUSH_M`` rows) into slot ``ME`` of every member's ``ws``, its
    own included (with ``SCALE_A``, pusher 0 also the shard's scales into ``scales``); then
    one count on ``ready[ME]`` of every member. The shard is complete there once the flag
    reaches ``pushers`` counts per call (``gen * pushers``)."""
    slot = group.index * tl.cast(MS, tl.int64) * KS
    kk = tl.program_id(0) * PUSH_K
    while kk < KS:
        origin, offs, mask = tile_offsets(0, MS, kk, KS, KS, 1, PUSH_M, PUSH_K)
        _send_block(ctx, group, a, ws, slot, origin, offs, mask, 0, ALIGNED)
        kk += pushers * PUSH_K
    if SCALE_A:
        if tl.program_id(0) == 0:
            _send_scales(ctx, group, scale_a, stride_sa, scales, 0, MS, PUSH_M, 0)
    # A count rather than the generation: several pushers share the flag, and each adds one
    # once its column blocks are stored (release), so it reaches gen * pushers when complete.
    for i in tl.static_range(group.size):
        signal_count(ctx, ready + group.index, group.rank((group.index + i) % group.size))


@triton.jit
def _proxy_fence(TMA_A: tl.constexpr):
    """With ``TMA_A``: order the shard rows a wait has just acquired (stored by peers through
    ordinary stores) before this program's copy-engine reads of them (another memory proxy)."""
    if TMA_A:
        tl.inline_asm_elementwise(
            "fence.proxy.async.global;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )


@aggregate
@fields
class _Operands:
    """What the output tiles of a call read: this rank's shard ``a`` and the workspace's shard
    slots ``ws`` (every shard ``MS x KS``, row-major; row block ``r`` of member ``j``'s shard
    has arrived once ``ready[j, r]`` holds the call's generation ``gen``), ``b`` (strides
    ``stride_bk``, ``stride_bn``) and the tensor descriptors of A and B (read through them
    with ``TMA_A`` / ``TMA_B``); with ``SCALE_A`` the shards' row scales: this rank's at
    ``scale_a`` (``stride_sa`` apart), the others' in their slots of ``scales`` (``MS``
    each); the output's ``N`` columns in ``tiles_n`` tiles, a shard's ``row_blocks`` row
    blocks; the kernel's tile sizes, ``EVEN_K`` and ``INTERPRETED``."""

    a: tl.tensor
    ws: tl.tensor
    ready: tl.tensor
    gen: tl.tensor
    b: tl.tensor
    a_desc: Value
    b_desc: Value
    scale_a: tl.tensor
    stride_sa: Value
    scales: tl.tensor
    MS: Value
    KS: Value
    N: Value
    stride_bk: Value
    stride_bn: Value
    row_blocks: Value
    tiles_n: Value
    BLOCK_M: tl.constexpr
    BLOCK_N: tl.constexpr
    BLOCK_K: tl.constexpr
    GROUP_M: tl.constexpr
    EVEN_K: tl.constexpr
    TMA_A: tl.constexpr
    TMA_B: tl.constexpr
    SCALE_A: tl.constexpr
    INTERPRETED: tl.constexpr

    @triton.jit
    def scaled(self, acc, group, j, row0):
        """``acc``, a product of rows ``row0 ..`` of member ``j``'s shard, times their scales
        (with ``SCALE_A``)."""
        if self.SCALE_A:
            if j == group.index:
                acc = scale_rows(acc, self.scale_a, self.stride_sa, row0, self.MS, True, self.BLOCK_M)
            else:
                acc = scale_rows(acc, self.scales + j * self.MS, 1, row0, self.MS, True, self.BLOCK_M)
        return acc

    @triton.jit
    def source(self, ctx, group, j, pid_m):
        """Where member ``j``'s shard is read: ``a`` itself for this rank, else the workspace
        slot, once the flag of row block ``pid_m`` shows this call's generation."""
        if j == group.index:
            src = self.a
        else:
            wait(ctx, group, self.ready + j * self.row_blocks + pid_m, self.gen, group.rank(j))
            src = self.ws + tl.cast(j, tl.int64) * self.MS * self.KS
        return src

    @triton.jit
    def product(self, acc, src, b, row0, rows_valid, pid_n, a_row, b_row):
        """``acc`` plus rows ``row0 ..`` of the shard matrix ``src`` (``rows_valid`` rows)
        times columns ``pid_n * BLOCK_N ..`` of the ``KS`` rows of B at ``b``; through the
        descriptors, A's rows start at ``a_row`` and B's at ``b_row``."""
        col0 = pid_n * self.BLOCK_N
        return matmul_tile(
            acc, src, b, row0, rows_valid, col0, self.N, self.KS, self.KS, 1, self.stride_bk, self.stride_bn,
            self.BLOCK_M, self.BLOCK_N, self.BLOCK_K, self.EVEN_K, self.a_desc, a_row, self.b_desc, b_row,
            col0, self.TMA_A, self.TMA_B, INTERPRETED=self.INTERPRETED,
        )  # fmt: skip


@triton.jit
def _combined_tile(ctx, group, ops, pushers, i, GROUP: tl.constexpr):
    """``COMBINED``: output tile ``i`` (of the one row block: the rows of every shard, in
    member order) once every member's whole shard is in ``ws``. Returns ``(acc, pid_m,
    pid_n, first output row, valid rows)``."""
    pid_m = i * 0
    pid_n = i
    acc = tl.zeros((ops.BLOCK_M, ops.BLOCK_N), dtype=tl.float32)
    for j in tl.static_range(GROUP):
        wait(ctx, group, ops.ready + j, ops.gen * pushers, group.rank(j))
    _proxy_fence(ops.TMA_A)
    acc = ops.product(acc, ops.ws, ops.b, 0, GROUP * ops.MS, pid_n, 0, 0)
    acc = scale_rows(acc, ops.scales, 1, 0, GROUP * ops.MS, ops.SCALE_A, ops.BLOCK_M)  # every shard's rows
    return acc, pid_m, pid_n, pid_m * 0, GROUP * ops.MS


@triton.jit
def _k_sliced_tile(ctx, group, ops, i, GROUP: tl.constexpr, ME: tl.constexpr):
    """``GATHER_K``: output tile ``i``, the product of every member's K slice of A (this
    rank's first: it is there already) and the matching rows of ``b``, each slice once its
    row block has arrived (with ``SCALE_A`` each slice's product scaled by its own rows'
    scales before it is added). Returns ``(acc, pid_m, pid_n, first output row, valid
    rows)``."""
    pid_m, pid_n = grouped_tile(i, ops.row_blocks, ops.tiles_n, ops.GROUP_M)
    acc = tl.zeros((ops.BLOCK_M, ops.BLOCK_N), dtype=tl.float32)
    for s in range(GROUP):  # this rank's K slice first
        j = (ME + s) % GROUP
        src = ops.source(ctx, group, j, pid_m)
        _proxy_fence(ops.TMA_A)
        b_slice = ops.b + tl.cast(j, tl.int64) * ops.KS * ops.stride_bk
        row0 = pid_m * ops.BLOCK_M
        if ops.SCALE_A:
            part = tl.zeros((ops.BLOCK_M, ops.BLOCK_N), dtype=tl.float32)
            part = ops.product(part, src, b_slice, row0, ops.MS, pid_n, j * ops.MS + row0, j * ops.KS)
            acc += ops.scaled(part, group, j, row0)
        else:
            acc = ops.product(acc, src, b_slice, row0, ops.MS, pid_n, j * ops.MS + row0, j * ops.KS)
    return acc, pid_m, pid_n, pid_m * 0, ops.MS


@triton.jit
def _m_sharded_tile(ctx, group, ops, i, GROUP: tl.constexpr, ME: tl.constexpr):
    """Along M: output tile ``i`` of the rows of member ``c``'s shard (tiles of this rank's
    own rows come first and need no wait), once its row block has arrived. Returns ``(acc,
    pid_m, pid_n, first output row, valid rows)``."""
    chunk_tiles = ops.row_blocks * ops.tiles_n
    position = i // chunk_tiles  # this rank's rows first
    c = (ME + position) % GROUP
    pid_m, pid_n = grouped_tile(i - position * chunk_tiles, ops.row_blocks, ops.tiles_n, ops.GROUP_M)
    acc = tl.zeros((ops.BLOCK_M, ops.BLOCK_N), dtype=tl.float32)
    src = ops.source(ctx, group, c, pid_m)
    _proxy_fence(ops.TMA_A)
    row0 = pid_m * ops.BLOCK_M
    acc = ops.product(acc, src, ops.b, row0, ops.MS, pid_n, c * ops.MS + row0, 0)
    acc = ops.scaled(acc, group, c, row0)
    return acc, pid_m, pid_n, c * ops.MS, ops.MS


@triton.jit
def _store_tile(out, bias, acc, pid_m, pid_n, out_row, rows_valid, N, stride_om, stride_on, scale_b,
                stride_sb, HAS_BIAS: tl.constexpr, SCALE_B: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):  # fmt: skip
    """``acc`` (times ``b``'s column scales with ``SCALE_B``, + bias), rounded to ``out``'s
    dtype, into tile ``(pid_m, pid_n)`` of the output rows starting at ``out_row``
    (``rows_valid`` of them)."""
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    acc = scale_cols(acc, scale_b, stride_sb, col0, N, SCALE_B, BLOCK_N)
    acc = add_bias(acc, bias, col0, N, HAS_BIAS, BLOCK_N)
    origin, offs, mask = tile_offsets(row0, rows_valid, col0, N, stride_om, stride_on, BLOCK_M, BLOCK_N)
    origin += tl.cast(out_row, tl.int64) * stride_om
    tl.store(out + origin + offs, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _all_gather_matmul_kernel(
    context, members, sync_flags, epochs, status, budget, state, ready,
    a, b, bias, out, ws, a_desc, b_desc, scale_a, scale_b, scales,
    MS, N, KS, stride_bk, stride_bn, stride_om, stride_on, pushers, stride_sa, stride_sb,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PUSH_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, GATHER_K: tl.constexpr,
    TMA_A: tl.constexpr, TMA_B: tl.constexpr, ALIGNED: tl.constexpr, COMBINED: tl.constexpr = False,
    PUSH_M: tl.constexpr = 16, INTERPRETED: tl.constexpr = False, SCALE_A: tl.constexpr = False,
    SCALE_B: tl.constexpr = False,
):  # fmt: skip
    """Every shard is ``MS x KS`` (row-major; ``a`` is this rank's). Along M (``GATHER_K``
    False) ``out`` is ``(GROUP*MS, N)`` and ``b`` ``(KS, N)``; along K ``out`` is ``(MS, N)``
    and ``b`` ``(GROUP*KS, N)``. ``ws`` holds ``GROUP`` shard slots; ``ready[j, r]`` is the
    flag of row block ``r`` of member ``j``'s shard.

    ``COMBINED`` (along M, when all ``GROUP*MS`` rows fit in one tile row: decode shapes):
    the pushers split the shard by columns (``PUSH_M x PUSH_K`` blocks) and copy it into
    this rank's own slot too, so ``ws`` holds the gathered A as one ``(GROUP*MS, KS)``
    matrix; every tile waits for all shards and reads B once, instead of once per shard.

    ``TMA_A``: A is read through ``a_desc``, one tensor descriptor over all ``GROUP*MS`` rows
    of ``ws`` seen as a ``(GROUP*MS, KS)`` matrix (this rank's own shard copied into its slot
    before the launch; in a group of one, a descriptor over ``a`` itself). Member ``j``'s row
    block ``r`` starts at row ``j*MS + r*BLOCK_M``; a tile's rows past its shard belong to the
    next one (or are zero-filled past the end) and their results are never stored.

    ``SCALE_A`` / ``SCALE_B``: float8 shards with row scales (this rank's at ``scale_a``,
    ``stride_sa`` apart, 0 for one scale; gathered into ``scales``, ``GROUP`` slots of
    ``MS``) and ``b`` with column scales (``scale_b``, ``stride_sb``)."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, sync_flags, epochs, status, budget, GROUP, ME)
    gen = call_generation(state)
    row_blocks = tl.cdiv(MS, BLOCK_M)
    if tl.program_id(0) < pushers:
        # every member has entered: its workspace is free (nothing remote before: no fence)
        group.sync(ctx, tl.program_id(0), fence=False)
        if COMBINED:
            _push_combined(
                ctx, group, a, ws, ready, MS, KS, pushers, scale_a, stride_sa, scales, PUSH_M, PUSH_K,
                ALIGNED, SCALE_A,
            )  # fmt: skip
        else:
            _push_shard(
                ctx, group, a, ws, ready, gen, MS, KS, row_blocks, pushers, scale_a, stride_sa, scales,
                BLOCK_M, PUSH_K, ALIGNED, SCALE_A,
            )  # fmt: skip
    # Then every program (the pushers too) claims output tiles until none is left.
    tiles_n = tl.cdiv(N, BLOCK_N)
    if GATHER_K or COMBINED:
        total = row_blocks * tiles_n
    else:
        total = GROUP * row_blocks * tiles_n
    ops = _Operands(
        a, ws, ready, gen, b, a_desc, b_desc, scale_a, stride_sa, scales, MS, KS, N, stride_bk, stride_bn,
        row_blocks, tiles_n, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, TMA_A, TMA_B, SCALE_A, INTERPRETED,
    )  # fmt: skip
    i = claim_tile(state)
    while i < total:
        if COMBINED:
            acc, pid_m, pid_n, out_row, rows_valid = _combined_tile(ctx, group, ops, pushers, i, GROUP)
        elif GATHER_K:
            acc, pid_m, pid_n, out_row, rows_valid = _k_sliced_tile(ctx, group, ops, i, GROUP, ME)
        else:
            acc, pid_m, pid_n, out_row, rows_valid = _m_sharded_tile(ctx, group, ops, i, GROUP, ME)
        _store_tile(
            out, bias, acc, pid_m, pid_n, out_row, rows_valid, N, stride_om, stride_on, scale_b, stride_sb,
            HAS_BIAS, SCALE_B, BLOCK_M, BLOCK_N,
        )  # fmt: skip
        i = claim_tile(state)
    finish_call(state, gen)


# --------------------------------------------------------------------------- host side


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a call runs: the resolved config and the launch sizes."""

    cfg: Config
    row_blocks: int  # row blocks of BLOCK_M rows of a shard (one ready flag each)
    combined: bool  # the decode layout: the whole gathered A in one tile row
    push_m: int  # rows and columns of the blocks the pushers copy
    push_k: int
    pushers: int  # programs that push the shard before they join the GEMM
    grid: int
    tma_a: bool  # read the gathered A through a tensor descriptor, where its layout allows
    tma_b: bool  # read B through a tensor descriptor, where its layout allows


def _plan(m: int, n: int, a_shard: torch.Tensor, size: int, gather_dim: int, config: Config | None) -> _Plan:
    """The plan of a call with output tiles over ``m x n`` and shards like ``a_shard``, for the
    device's capabilities (interpreted programs get small push blocks: cheap to interpret)."""
    caps = iris.mem.capabilities(a_shard.device)
    cfg = select(m, n, a_shard.dtype, caps.sm_count, caps.interpreted, config, wide=True)
    ms, ks = a_shard.shape
    row_blocks = _host.cdiv(ms, cfg.block_m)
    # Decode shapes: the whole gathered A fits in one tile row; gather it into the workspace
    # (own shard included) and read B once rather than once per shard.
    combined = gather_dim == 0 and size > 1 and m <= cfg.block_m
    tiles = row_blocks * _host.cdiv(n, cfg.block_n) * (size if gather_dim == 0 and not combined else 1)
    k_pow2 = triton.next_power_of_2(max(ks, 16))
    if combined:  # the shard's few rows, as many columns as 16K elements (registers) allow
        push_m = triton.next_power_of_2(max(ms, 1))
        push_k = min(32 if caps.interpreted else 16384 // push_m, k_pow2)
        pushers = min(cfg.comm_sms, _host.cdiv(ks, push_k))
    else:  # whole row blocks of BLOCK_M rows
        push_m, push_k = cfg.block_m, min(32 if caps.interpreted else 128, k_pow2)
        pushers = min(cfg.comm_sms, row_blocks) if size > 1 else 0
    grid = max(1, min(cfg.num_sms, tiles + pushers))
    # Along K a B block past a slice's end holds the next slice's rows: only exact slices.
    tma_b = cfg.tma and (gather_dim == 0 or ks % cfg.block_k == 0)
    tma_a = cfg.tma and caps.tma
    return _Plan(cfg, row_blocks, combined, push_m, push_k, pushers, grid, tma_a, tma_b)


def _gathered_a(a_shard: torch.Tensor, shards: torch.Tensor, size: int, index: int, plan: _Plan):
    """``(a_desc, TMA_A)`` of the kernel: one tensor descriptor (blocks ``BLOCK_M x BLOCK_K``)
    over the gathered A as a ``(size*MS, KS)`` matrix, where the plan reads A through TMA and
    the rows are 16-byte aligned; else ``(shards, False)`` (pointer loads). In a group of one
    it covers ``a_shard`` itself; otherwise the workspace's shard slots, this rank's own shard
    copied into its slot here (in the combined layout the pushers copy it)."""
    ms, ks = a_shard.shape
    if not plan.tma_a:
        return shards, False
    gathered = a_shard if size == 1 else shards[: size * ms * ks].view(size * ms, ks)
    desc, tma = _host.tma_operand(gathered, (plan.cfg.block_m, plan.cfg.block_k), True)
    if tma and size > 1 and not plan.combined:
        gathered[index * ms : (index + 1) * ms].copy_(a_shard)
    return (desc, True) if tma else (shards, False)


def _run(
    plan: _Plan, out, a_shard, b, bias, scale_a, scale_b, gather_dim: int, ranks, index: int, group, workspace
) -> None:
    """Acquire the call's workspace and launch the kernel (nothing to launch for an empty
    output)."""
    size, cfg = len(ranks), plan.cfg
    ms, ks = a_shard.shape
    specs = [
        ("ready", size * plan.row_blocks, torch.int32),
        ("shards", size * ms * ks, a_shard.dtype),
        ("scales", size * ms if scale_a is not None else 0, torch.float32),  # the shards' row scales
    ]
    shapes = (tuple(a_shard.shape), tuple(b.shape), tuple(out.shape))
    # Whether shards carry scales is part of the signature: ranks that disagree (the pushers
    # of one would not send what the others read) raise CallMismatchError when it is prepared.
    extra = (gather_dim, scale_a is not None)
    ws = _host.workspace_for(
        _OP, ranks, index, shapes, a_shard, cfg, extra, out, True, specs, workspace, group
    )
    if not out.numel():
        return
    b_desc, tma_b = _host.tma_operand(b, (cfg.block_k, cfg.block_n), plan.tma_b)
    a_desc, tma_a = _gathered_a(a_shard, ws.buffers["shards"], size, index, plan)
    sa, stride_sa, scaled_a = _host.scale_operand(scale_a, 0, out)
    sb, stride_sb, scaled_b = _host.scale_operand(scale_b, 1, out)
    _host.launch(
        _all_gather_matmul_kernel, plan.grid, ws, cfg,
        ws.buffers["ready"], a_shard, b, bias if bias is not None else a_shard, out, ws.buffers["shards"],
        a_desc, b_desc, sa, sb, ws.buffers["scales"],
        ms, out.shape[1], ks, *b.stride(), *out.stride(), min(plan.pushers, plan.grid), stride_sa, stride_sb,
        PUSH_M=plan.push_m, PUSH_K=plan.push_k,
        EVEN_K=ks % cfg.block_k == 0, HAS_BIAS=bias is not None, GATHER_K=gather_dim == 1,
        TMA_A=tma_a, TMA_B=tma_b,
        ALIGNED=_host.aligned(ws.buffers["shards"], ks), COMBINED=plan.combined, SCALE_A=scaled_a,
        SCALE_B=scaled_b,
    )  # fmt: skip


def _validate(out, a_shard, b, bias, scale_a, scale_b, gather_dim, group) -> tuple:
    """``(global ranks of group, this rank's index, M, N)`` of a call, or a clear error."""
    op = _OP
    _host.check_operands(op, out, a_shard, b, bias, scale_a, scale_b)
    if gather_dim not in (0, 1) or isinstance(gather_dim, bool):
        raise ValueError(f"{op}: gather_dim must be 0 (A sharded along M) or 1 (along K), got {gather_dim!r}")
    ranks, index = _host.group_position(group)
    size = len(ranks)
    (ms, ks), (k, n) = a_shard.shape, b.shape
    m = ms * size if gather_dim == 0 else ms
    if k != (ks if gather_dim == 0 else ks * size):
        what = "a_shard's columns" if gather_dim == 0 else "the group size x a_shard's columns"
        raise ValueError(
            f"{op}: a_shard is {list(a_shard.shape)} and b is {list(b.shape)}; b's rows must equal {what} "
            f"for gather_dim={gather_dim}"
        )
    _host.check_shape(op, out, (m, n), f"the gathered A's rows, b's columns for gather_dim={gather_dim}")
    _host.check_bias(op, bias, n)
    return ranks, index, m, n


def _check(out, a_shard, b, bias, *, scale_a, scale_b, gather_dim, group, **_) -> None:
    _validate(out, a_shard, b, bias, scale_a, scale_b, gather_dim, group)


@_host.gemm_op(_OP, _check, a="a_shard")
def all_gather_matmul(
    out: torch.Tensor, a_shard: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
    gather_dim: int = 0, scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
    group=None, async_op: bool = False, config: Config | None = None, workspace: Workspace | None = None,
) -> Work | None:  # fmt: skip
    """``out = all_gather(a_shard, gather_dim) @ b + bias`` over the ranks of ``group``.

    Shapes (G: the group's size; A is the gathered matrix, shards in group-rank order):

    * ``gather_dim=0`` (A sharded along M, sequence parallel): ``a_shard`` is this rank's
      ``(M/G, K)`` rows of A, ``b`` is ``(K, N)``, ``out`` is ``(M, N)``.
    * ``gather_dim=1`` (A sharded along K): ``a_shard`` is this rank's ``(M, K/G)`` columns
      of A, ``b`` is the full ``(K, N)``, ``out`` is ``(M, N)``.

    ``b`` and ``bias`` (``(N,)`` or None) are this rank's own (they may differ between ranks,
    as in column-parallel layers where each rank holds its slice of N). bf16, fp16 or fp32
    (tf32), all the same; fp32 accumulation.

    Float8 ``a_shard`` and ``b`` (either format each), ``out`` and ``bias`` bf16 or fp32: the
    shards move in float8 (half the bytes of bf16) and multiply on float8 tensor cores.

    :param scale_a: float8 only: ``a_shard``'s scale (``value = fp8 x scale``, as
        :func:`torch._scaled_mm` takes it): a one-element float32 tensor or ``[rows of
        a_shard, 1]``; each rank's own, gathered with its shard (so each shard, or each K
        slice along K, keeps its own scales). Given on every rank or on none. None: 1.
    :param scale_b: float8 only: ``b``'s, one element or ``[1, N]`` (per column). None: 1.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`~iris.ccl.Work` handle instead of None.
    :param config: a :class:`Config` (``comm_sms``: programs pushing the shard); None picks
        the best known for the shape.
    :param workspace: a :class:`Workspace` to reuse across calls; None keeps one per
        signature internally.

    Any tensors work: the shard is read locally and pushed into the peers' workspaces, the
    output is written locally. A shard that is not row-major contiguous is copied first.
    """
    ranks, index = _host.group_position(group)
    m = a_shard.shape[0] * len(ranks) if gather_dim == 0 else a_shard.shape[0]
    n = b.shape[1]
    ks = a_shard.shape[1]
    if a_shard.stride() != (ks, 1):
        a_shard = a_shard.contiguous()
    size, k = len(ranks), b.shape[0]
    if _select.path(_OP, m * n * k, size, a_shard.device, config) == "composed":
        kw = {"ranks": ranks, "index": index, "group": group, "workspace": workspace}
        _composed.all_gather_matmul(out, a_shard, b, bias, scale_a, scale_b, gather_dim=gather_dim, **kw)
        return _host.finish(a_shard.device, async_op)
    plan = _plan(m, n, a_shard, size, gather_dim, config)
    _run(plan, out, a_shard, b, bias, scale_a, scale_b, gather_dim, ranks, index, group, workspace)
    return _host.finish(a_shard.device, async_op)
