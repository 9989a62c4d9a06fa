"""``matmul_all_gather``: every rank's product ``a @ b`` gathered along M on every rank.

One persistent kernel: each program computes output tiles of this rank's product and, as
each tile is finished, stores it into this rank's rows of the output on every member
(remote stores are posted, so they drain while the program computes its next tile). A
barrier of the program's sync slot at the start (every member has entered the call, so its
output is free) and at the end (every member's tiles have arrived) is all the
synchronisation there is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.ccl import Work
from iris.ccl.triton import Group
from iris.mem.triton import Context

from . import _composed, _host, _select
from ._gemm import add_bias, grouped_tile, matmul_tile, scale_cols, scale_rows, tile_offsets
from ._sync import remote_tile
from .config import Config
from .workspace import Workspace


@triton.jit
def _matmul_all_gather_kernel(
    context, members, sync_flags, epochs, status, budget, state,
    a, b, bias, out, a_desc, b_desc, scale_a, scale_b,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on, stride_sa, stride_sb,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, ALIGNED: tl.constexpr,
    TMA_A: tl.constexpr, TMA_B: tl.constexpr, INTERPRETED: tl.constexpr = False,
    SCALE_A: tl.constexpr = False, SCALE_B: tl.constexpr = False,
):  # fmt: skip
    """``out[ME*M : (ME+1)*M]`` of every member = ``a @ b (+ bias)``; ``out`` is ``(GROUP*M, N)``.
    ``SCALE_A`` / ``SCALE_B``: float8 operands' scales, ``scale_a`` per row (``stride_sa``
    apart, 0: one scale) and ``scale_b`` per column, applied to the fp32 product."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, sync_flags, epochs, status, budget, GROUP, ME)
    pid = tl.program_id(0)
    group.sync(ctx, pid, fence=False)  # nothing remote before it: no fence (2-3 us)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    mine = tl.cast(ME, tl.int64) * M * stride_om
    t = pid
    while t < tiles_m * tiles_n:
        pid_m, pid_n = grouped_tile(t, tiles_m, tiles_n, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = matmul_tile(
            acc, a, b, row0, M, col0, N, K, stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, a_desc, row0, b_desc, 0, col0, TMA_A, TMA_B,
            INTERPRETED=INTERPRETED,
        )  # fmt: skip
        acc = scale_rows(acc, scale_a, stride_sa, row0, M, SCALE_A, BLOCK_M)
        acc = scale_cols(acc, scale_b, stride_sb, col0, N, SCALE_B, BLOCK_N)
        acc = add_bias(acc, bias, col0, N, HAS_BIAS, BLOCK_N)
        result = acc.to(out.dtype.element_ty)
        origin, offs, mask = tile_offsets(row0, M, col0, N, stride_om, stride_on, BLOCK_M, BLOCK_N)
        origin += mine
        tl.store(out + origin + offs, result, mask=mask)
        for i in tl.static_range(1, GROUP):
            peer = group.rank((ME + i) % GROUP)
            tl.store(remote_tile(ctx, out, peer, origin, offs, ALIGNED), result, mask=mask)
        t += tl.num_programs(0)
    group.sync(ctx, pid)


_OP = "matmul_all_gather"


def _check(out, a, b, bias, *, scale_a, scale_b, group, **_) -> None:
    ranks, _, m, _, n = _host.check_call(_OP, out, a, b, bias, group, scale_a, scale_b)
    _host.check_shape(_OP, out, (len(ranks) * m, n), "group size x a's rows, b's columns")
    _host.check_bias(_OP, bias, n)


@_host.gemm_op(_OP, _check)
def matmul_all_gather(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
    scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
    group=None, async_op: bool = False, config: Config | None = None,
    workspace: Workspace | None = None,
) -> Work | None:  # fmt: skip
    """``out = all_gather(a @ b + bias)`` along M, over the ranks of ``group``.

    Shapes (G: the group's size): ``a`` is this rank's ``(M, K)``, ``b`` its ``(K, N)`` (it may
    differ between ranks), ``bias`` its ``(N,)`` or None (added to this rank's product, so
    once per output row); ``out`` is ``(G*M, N)``, rows ``[r*M, (r+1)*M)`` holding rank
    ``r``'s product. bf16, fp16 or fp32 (tf32), all the same; fp32 accumulation. Float8
    ``a`` and ``b`` (either format each) with ``out`` and ``bias`` in bf16 or fp32.

    {GEMM_PARAMS}
    :param config: a :class:`Config`; None picks the best known for the shape.
    :param workspace: a :class:`Workspace` to reuse across calls; None keeps one per
        signature internally.

    Peers store into ``out`` directly when it is a contiguous tensor on a symmetric heap
    spanning ``group``; any other ``out`` is written through the workspace and copied.
    """
    op = _OP
    ranks, index = _host.group_position(group)
    m, k, n = _host.matmul_dims(op, a, b)
    size = len(ranks)
    if _select.path(op, m * n * k, size, a.device, config) == "composed":
        kw = {"ranks": ranks, "index": index, "group": group, "workspace": workspace}
        _composed.matmul_all_gather(out, a, b, bias, scale_a, scale_b, **kw)
        return _host.finish(a.device, async_op)
    cfg = _host.resolve(m, n, a, config)
    heap = _host.heap_of(out, ranks)
    in_place = size == 1 or _host.writable_in_place(out, heap)
    specs = [] if in_place else [("out", size * m * n, out.dtype)]
    shapes = (tuple(a.shape), tuple(b.shape), tuple(out.shape))
    ws = _host.workspace_for(op, ranks, index, shapes, a, cfg, None, out, in_place, specs, workspace, group)
    kout = out if in_place else ws.buffers["out"].view(size * m, n)
    if out.numel():
        tiles = _host.cdiv(m, cfg.block_m) * _host.cdiv(n, cfg.block_n)
        a_desc, tma_a = _host.tma_operand(a, (cfg.block_m, cfg.block_k), cfg.tma)
        b_desc, tma_b = _host.tma_operand(b, (cfg.block_k, cfg.block_n), cfg.tma)
        sa, stride_sa, scaled_a = _host.scale_operand(scale_a, 0, kout)
        sb, stride_sb, scaled_b = _host.scale_operand(scale_b, 1, kout)
        _host.launch(
            _matmul_all_gather_kernel, max(1, min(cfg.num_sms, tiles)), ws, cfg,
            a, b, bias if bias is not None else a, kout, a_desc, b_desc, sa, sb,
            m, n, k, *a.stride(), *b.stride(), *kout.stride(), stride_sa, stride_sb,
            EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None, ALIGNED=_host.aligned(kout),
            TMA_A=tma_a, TMA_B=tma_b, SCALE_A=scaled_a, SCALE_B=scaled_b,
        )  # fmt: skip
        if kout is not out:
            out.copy_(kout)
    return _host.finish(a.device, async_op)
