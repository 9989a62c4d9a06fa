"""``matmul_all_reduce``: ``out = sum over ranks of a_r @ b_r (+ bias)`` on every rank.

The tensor-parallel row-parallel layer: K is sharded, every rank holds ``a_r`` (M, K) and
``b_r`` (K, N) and the sum of the partial products is needed everywhere. The output tiles
are owned chunk by chunk (along M, or along N for short M); each rank pushes its partial
tiles of the other chunks into their owners' workspaces as soon as they are computed, the
owner adds them to its own partial, adds the bias, and stores the tile into every rank's
output (see ``_reduce.py``). Communication overlaps the GEMM: a partial tile is in flight
while the next one is computed.
"""

from __future__ import annotations

import torch

from iris.ccl import Work

from . import _composed, _host, _reduce, _select
from .config import Config
from .workspace import Workspace


def choose_split(m: int, n: int, size: int, cfg: Config) -> bool:
    """Whether to own chunks along N (True) or M: whichever wastes fewer tile rows/columns
    when cut into ``size`` chunks (along N for decode shapes, where M is a few rows)."""
    if cfg.split != "auto":
        return cfg.split == "n"

    def waste(extent: int, block: int) -> float:
        chunk = _host.cdiv(extent, size)
        return size * _host.cdiv(chunk, block) * block / max(extent, 1)

    return waste(n, cfg.block_n) < waste(m, cfg.block_m)


def _check(out, a, b, bias, *, scale_a, scale_b, group, **_) -> None:
    _, _, m, _, n = _host.check_call(_OP, out, a, b, bias, group, scale_a, scale_b)
    _host.check_shape(_OP, out, (m, n), "a's rows, b's columns")
    _host.check_bias(_OP, bias, n)


_OP = "matmul_all_reduce"


@_host.gemm_op(_OP, _check)
def matmul_all_reduce(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
    scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
    group=None, async_op: bool = False, config: Config | None = None, workspace: Workspace | None = None,
) -> Work | None:  # fmt: skip
    """``out = all_reduce(a @ b) + bias`` over the ranks of ``group``, in one kernel.

    Shapes: ``a`` is this rank's ``(M, K)`` (its slice of the K dimension), ``b`` its
    ``(K, N)``, ``out`` is ``(M, N)`` and, on return, the same on every rank; ``bias`` is
    ``(N,)`` or None, the same on every rank, added once. Any M, N, K, the same on every
    rank. bf16, fp16 or fp32 (tf32), all the same; partial products are exchanged in that
    dtype and summed in fp32. Peers store into ``out`` directly when it is a contiguous
    tensor on a symmetric heap spanning ``group``; any other ``out`` is written through the
    workspace and copied.

    Float8 ``a`` and ``b`` (``torch.float8_e4m3fn`` / ``float8_e5m2``, either for each)
    multiply on float8 tensor cores; ``out`` (and ``bias``) is bf16 or fp32, and the
    partial products are exchanged in ``out``'s dtype.

    {GEMM_PARAMS}
    :param config: a :class:`Config` (``split`` picks the ownership dimension); None picks
        the best known for the shape.
    :param workspace: a :class:`Workspace` to reuse across calls; None keeps one per
        signature internally.
    """
    op = _OP
    ranks, index = _host.group_position(group)
    m, _, n = _host.matmul_dims(op, a, b)
    if _select.path(op, m * n * a.shape[1], len(ranks), a.device, config) == "composed":
        kw = {"ranks": ranks, "index": index, "group": group, "workspace": workspace}
        _composed.matmul_all_reduce(out, a, b, bias, scale_a, scale_b, **kw)
        return _host.finish(a.device, async_op)
    size = len(ranks)
    cfg = _host.resolve(m, n, a, config, wide=True)
    split_n = choose_split(m, n, size, cfg)
    chunk = (m, _host.cdiv(n, size)) if split_n else (_host.cdiv(m, size), n)
    _reduce.run(
        op, out, a, b, bias, scale_a=scale_a, scale_b=scale_b, split_n=split_n, chunk=chunk, all_reduce=True,
        ranks=ranks, index=index, cfg=cfg, workspace=workspace, group=group,
    )  # fmt: skip
    return _host.finish(a.device, async_op)
