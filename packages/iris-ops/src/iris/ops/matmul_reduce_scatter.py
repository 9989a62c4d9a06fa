"""``matmul_reduce_scatter``: the sum over ranks of ``a_r @ b_r``, each rank keeping its
slice of the rows (or columns).

Each rank computes its partial product tile by tile; tiles of the other ranks' slices are
stored into their owners' workspaces as soon as they are computed, and each rank adds the
peers' partials of its own slice to its own as they arrive (see ``_reduce.py``), so the
exchange overlaps the GEMM.
"""

from __future__ import annotations

import torch

from iris.ccl import Work

from . import _composed, _host, _reduce, _select
from .config import Config
from .workspace import Workspace

_OP = "matmul_reduce_scatter"


def _check(out, a, b, bias, *, scale_a, scale_b, scatter_dim, group, **_) -> None:
    ranks, _, m, _, n = _host.check_call(_OP, out, a, b, bias, group, scale_a, scale_b)
    if scatter_dim not in (0, 1) or isinstance(scatter_dim, bool):
        raise ValueError(f"{_OP}: scatter_dim must be 0 (rows) or 1 (columns), got {scatter_dim!r}")
    size = len(ranks)
    _host.divisible(_OP, "M (a's rows)" if scatter_dim == 0 else "N (b's columns)", (m, n)[scatter_dim], size)
    chunk = (m // size, n) if scatter_dim == 0 else (m, n // size)
    _host.check_shape(_OP, out, chunk, f"this rank's slice for scatter_dim={scatter_dim}")
    _host.check_bias(_OP, bias, n)


@_host.gemm_op(_OP, _check)
def matmul_reduce_scatter(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
    scatter_dim: int = 0, scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
    group=None, async_op: bool = False, config: Config | None = None, workspace: Workspace | None = None,
) -> Work | None:  # fmt: skip
    """``out = reduce_scatter(a @ b, scatter_dim) + bias`` over the ranks of ``group``.

    Shapes (G: the group's size): ``a`` is this rank's ``(M, K)``, ``b`` its ``(K, N)``.
    ``scatter_dim=0``: ``out`` is ``(M/G, N)``, rank ``r`` keeping rows ``[r*M/G, (r+1)*M/G)``
    of the sum (like ``torch.distributed.reduce_scatter_tensor``); M must be divisible by G.
    ``scatter_dim=1``: ``out`` is ``(M, N/G)``, rank ``r`` keeping columns
    ``[r*N/G, (r+1)*N/G)``; N must be divisible by G. ``bias`` is ``(N,)`` or None, the same
    on every rank, added once (rank ``r`` adds its slice). bf16, fp16 or fp32 (tf32), all the
    same; partials are exchanged in that dtype and summed in fp32. Float8 ``a`` and ``b``
    (either format each) with ``out`` and ``bias`` in bf16 or fp32: partials in ``out``'s dtype.

    {GEMM_PARAMS}
    :param config: a :class:`Config`; None picks the best known for the shape.
    :param workspace: a :class:`Workspace` to reuse across calls; None keeps one per
        signature internally.

    ``out`` may be any tensor (only this rank writes it); the workspace lives on ``out``'s
    heap when ``out`` is on a symmetric heap spanning ``group``.
    """
    op = _OP
    ranks, index = _host.group_position(group)
    m, _, n = _host.matmul_dims(op, a, b)
    size = len(ranks)
    chunk = (m // size, n) if scatter_dim == 0 else (m, n // size)
    if _select.path(op, m * n * a.shape[1], size, a.device, config) == "composed":
        kw = {"ranks": ranks, "index": index, "group": group, "workspace": workspace}
        _composed.matmul_reduce_scatter(out, a, b, bias, scale_a, scale_b, scatter_dim=scatter_dim, **kw)
        return _host.finish(a.device, async_op)
    cfg = _host.resolve(chunk[0], chunk[1], a, config, wide=True)
    _reduce.run(
        op, out, a, b, bias, scale_a=scale_a, scale_b=scale_b, split_n=scatter_dim == 1, chunk=chunk,
        all_reduce=False,
        ranks=ranks, index=index, cfg=cfg, workspace=workspace, group=group,
    )  # fmt: skip
    return _host.finish(a.device, async_op)
