"""The composed path of the fused ops (``Config(path="composed")``): ``torch.matmul`` (cuBLAS on
GPUs) and the iris.ccl collective, one after the other, with ``variant="auto"``.

The intermediate buffers live in the op's :class:`~iris.ops.Workspace` (on the output's
heap when that spans the group, so the collective runs in place there; else on a heap of
the workspace's own), prepared by the first call like the fused path's: later calls
allocate nothing and can be captured in a CUDA graph. The bias is added by the GEMM of
the group's first rank (so the reduction adds it once) or of every rank's own rows.
"""

from __future__ import annotations

import torch

import iris.ccl as ccl

from . import _host
from .config import Config

#: The resolved config composed calls record in their workspace signature.
COMPOSED = Config(path="composed")


def _gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, dst: torch.Tensor) -> None:
    """``dst = a @ b (+ bias)`` (``dst`` contiguous)."""
    if bias is not None:
        torch.addmm(bias, a, b, out=dst)
    else:
        torch.mm(a, b, out=dst)


def _workspace(op, ranks, index, a, b, out, extra, specs, workspace, group):
    shapes = (tuple(a.shape), tuple(b.shape), tuple(out.shape))
    args = (a, COMPOSED, extra, out, _direct(out), specs, workspace, group)
    return _host.workspace_for(op, ranks, index, shapes, *args)


def _buf(ws, name: str, numel: int) -> torch.Tensor:
    """The first ``numel`` elements of the workspace buffer ``name`` (buffers hold at least one)."""
    return ws.buffers[name][:numel]


def _direct(out: torch.Tensor) -> bool:
    """Whether results can be written into ``out`` itself (contiguous, row-major)."""
    return out.is_contiguous()


def _alone(out, a, b, bias) -> None:
    """A group of one: the GEMM is the whole op."""
    if _direct(out):
        _gemm(a, b, bias, out)
    else:
        out.copy_(torch.addmm(bias, a, b) if bias is not None else a @ b)


def matmul_all_reduce(out, a, b, bias, *, ranks, index, group, workspace) -> None:
    """``out = all_reduce(a @ b) + bias``: every rank's product, the first rank's with the bias,
    summed by :func:`iris.ccl.all_reduce` in place."""
    if len(ranks) == 1:
        return _alone(out, a, b, bias)
    if out.numel() == 0:  # the same shapes on every rank: nothing to reduce anywhere
        return None
    m, n = out.shape
    direct = _direct(out)
    specs = [] if direct else [("prod", m * n, a.dtype)]
    ws = _workspace("matmul_all_reduce", ranks, index, a, b, out, "composed", specs, workspace, group)
    prod = out if direct else _buf(ws, "prod", m * n).view(m, n)
    _gemm(a, b, bias if index == 0 else None, prod)
    ccl.all_reduce(prod, prod, group=group)
    if prod is not out:
        out.copy_(prod)
    return None


def matmul_reduce_scatter(out, a, b, bias, *, scatter_dim, ranks, index, group, workspace) -> None:
    """``out = reduce_scatter(a @ b) + bias``: the product laid out chunk by chunk (along N, each
    chunk's columns contiguous), reduced by :func:`iris.ccl.reduce_scatter`."""
    size = len(ranks)
    if size == 1:
        return _alone(out, a, b, bias)
    if out.numel() == 0:
        return None
    (m, _), n = a.shape, b.shape[1]
    direct = _direct(out)
    specs = [("prod", m * n, a.dtype)] + ([] if direct else [("res", out.numel(), a.dtype)])
    ws = _workspace("matmul_reduce_scatter", ranks, index, a, b, out, scatter_dim, specs, workspace, group)
    prod = _buf(ws, "prod", m * n)
    add = bias if index == 0 else None
    if scatter_dim == 0:
        _gemm(a, b, add, prod.view(m, n))
    else:
        cols = n // size
        for j in range(size):
            part = slice(j * cols, (j + 1) * cols)
            dst = prod[j * m * cols : (j + 1) * m * cols].view(m, cols)
            _gemm(a, b[:, part], add[part] if add is not None else None, dst)
    res = out.view(-1) if direct else _buf(ws, "res", out.numel())
    ccl.reduce_scatter(res, prod, group=group)
    if not direct:
        out.copy_(res.view(out.shape))
    return None


def all_gather_matmul(out, a_shard, b, bias, *, gather_dim, ranks, index, group, workspace) -> None:
    """``out = all_gather(a_shard, gather_dim) @ b + bias``: the shards gathered by
    :func:`iris.ccl.all_gather` (rows of every rank, in group order), regrouped by columns
    along K, then one GEMM."""
    size = len(ranks)
    if size == 1:
        return _alone(out, a_shard, b, bias)
    if out.numel() == 0:
        return None
    ms, ks = a_shard.shape
    m, n = out.shape
    direct = _direct(out)
    specs = [("gathered", size * ms * ks, a_shard.dtype)]
    if gather_dim == 1:
        specs.append(("a", m * size * ks, a_shard.dtype))
    if not direct:
        specs.append(("res", m * n, a_shard.dtype))
    ws = _workspace("all_gather_matmul", ranks, index, a_shard, b, out, gather_dim, specs, workspace, group)
    gathered = _buf(ws, "gathered", size * ms * ks)
    if ks:  # (K = 0: no shard has data; the product is the bias)
        ccl.all_gather(gathered, a_shard.reshape(-1), group=group)
    if gather_dim == 0:
        full = gathered.view(size * ms, ks)
    else:
        full = _buf(ws, "a", m * size * ks).view(ms, size * ks)
        full.view(ms, size, ks).copy_(gathered.view(size, ms, ks).transpose(0, 1))
    dst = out if direct else _buf(ws, "res", m * n).view(m, n)
    _gemm(full, b, bias, dst)
    if dst is not out:
        out.copy_(dst)
    return None


def matmul_all_gather(out, a, b, bias, *, ranks, index, group, workspace) -> None:
    """``out = all_gather(a @ b + bias)`` along M: this rank's product, then
    :func:`iris.ccl.all_gather`."""
    size = len(ranks)
    if size == 1:
        return _alone(out, a, b, bias)
    if out.numel() == 0:
        return None
    m, n = a.shape[0], b.shape[1]
    direct = _direct(out)
    specs = [("prod", m * n, a.dtype)] + ([] if direct else [("res", size * m * n, a.dtype)])
    ws = _workspace("matmul_all_gather", ranks, index, a, b, out, "composed", specs, workspace, group)
    prod = _buf(ws, "prod", m * n)
    _gemm(a, b, bias, prod.view(m, n))
    res = out.view(-1) if direct else _buf(ws, "res", size * m * n)
    ccl.all_gather(res, prod, group=group)
    if not direct:
        out.copy_(res.view(out.shape))
    return None
