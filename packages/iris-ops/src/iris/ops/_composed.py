"""The composed path of the fused ops (``Config(path="composed")``): ``torch.matmul`` (cuBLAS on
GPUs) and the iris.ccl collective, one after the other, with ``variant="auto"``.

The intermediate buffers live in the op's :class:`~iris.ops.Workspace` (on the output's
heap when that spans the group, so the collective runs in place there; else on a heap of
the workspace's own), prepared by the first call like the fused path's: later calls
allocate nothing and can be captured in a CUDA graph. The bias is added by the GEMM of
the group's first rank (so the reduction adds it once) or of every rank's own rows.

Float8 inputs multiply with ``torch._scaled_mm`` (:func:`_scaled_gemm`), tensor-wise when
both scales are single, else row-wise (a single scale repeated over the rows or columns: a
small copy). Where ``torch._scaled_mm`` is missing or refuses the call on the device (cuBLAS
wants ``b`` column-major and dimensions of multiples of 16, and some versions only bf16
outputs for row-wise scales), the first such call settles, for its kind of call, on a
dequantized matmul instead: ``(a * scale_a) @ (b * scale_b)`` in fp32, which allocates its
temporaries. All-gather moves float8 shards as bytes, and their row scales beside them; along
K each slice's product is scaled by its own scales and the slices summed in fp32.
"""

from __future__ import annotations

import torch

import iris.ccl as ccl

from . import _host
from .config import FP8, Config

#: The resolved config composed calls record in their workspace signature.
COMPOSED = Config(path="composed")
#: Whether ``torch._scaled_mm`` took a kind of call (:func:`_scaled_kind`) on this process.
_SCALED_MM_TAKES: dict[tuple, bool] = {}
#: A scale of 1 per device, for a float8 operand given without one.
_ONES: dict[torch.device, torch.Tensor] = {}


def _gemm(a, b, bias, dst, scale_a=None, scale_b=None) -> None:
    """``dst = a @ b (+ bias)`` (``dst`` contiguous); float8 ``a`` and ``b`` with their scales."""
    if a.dtype in FP8:
        _scaled_gemm(a, b, scale_a, scale_b, bias, dst)
    elif bias is not None:
        torch.addmm(bias, a, b, out=dst)
    else:
        torch.mm(a, b, out=dst)


def _scales(a, b, scale_a, scale_b) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales as ``torch._scaled_mm`` takes them: both single (tensor-wise), else
    contiguous ``[M, 1]`` and ``[1, N]`` (row-wise; a single one repeated: a copy)."""
    ones = _ONES.get(a.device)
    if ones is None:
        ones = _ONES[a.device] = torch.ones((), dtype=torch.float32, device=a.device)
    sa = scale_a if scale_a is not None else ones
    sb = scale_b if scale_b is not None else ones
    if sa.numel() == 1 and sb.numel() == 1:
        return sa.reshape(()), sb.reshape(())
    m, n = a.shape[0], b.shape[1]
    return sa.reshape(-1, 1).expand(m, 1).contiguous(), sb.reshape(1, -1).expand(1, n).contiguous()


def _scaled_kind(a, b, sa, bias, dst) -> tuple:
    """What decides whether ``torch._scaled_mm`` takes a call: device, dtypes, scaling, ``b``'s
    layout, the bias and the dimensions' alignment."""
    dims = tuple(d % 16 for d in (a.shape[0], a.shape[1], b.shape[1]))
    layout = (a.stride(1) == 1, b.stride(0) == 1)
    return (dst.device, a.dtype, b.dtype, dst.dtype, sa.dim(), layout, bias is not None, dims)


def _scaled_gemm(a, b, scale_a, scale_b, bias, dst) -> None:
    """``dst = (a * scale_a) @ (b * scale_b) + bias`` for float8 ``a`` and ``b`` (module
    docstring): ``torch._scaled_mm`` where it takes the call, else a dequantized matmul."""
    sa, sb = _scales(a, b, scale_a, scale_b)
    kind = _scaled_kind(a, b, sa, bias, dst)
    scaled_mm = getattr(torch, "_scaled_mm", None)
    if scaled_mm is not None and _SCALED_MM_TAKES.get(kind, True):
        try:
            scaled_mm(a, b, sa, sb, bias=bias, out_dtype=dst.dtype, out=dst)
        except (RuntimeError, ValueError, NotImplementedError):
            if kind in _SCALED_MM_TAKES:  # it took this kind of call before: a real error
                raise
            _SCALED_MM_TAKES[kind] = False
        else:
            _SCALED_MM_TAKES[kind] = True
            return
    product = torch.mm(a.float() * sa, b.float() * sb)
    dst.copy_(product + bias.float() if bias is not None else product)


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


def _alone(out, a, b, bias, scale_a, scale_b) -> None:
    """A group of one: the GEMM is the whole op."""
    if _direct(out):
        _gemm(a, b, bias, out, scale_a, scale_b)
    else:
        product = torch.empty(out.shape, dtype=out.dtype, device=out.device)
        _gemm(a, b, bias, product, scale_a, scale_b)
        out.copy_(product)


def matmul_all_reduce(out, a, b, bias, scale_a, scale_b, *, ranks, index, group, workspace) -> None:
    """``out = all_reduce(a @ b) + bias``: every rank's product, the first rank's with the bias,
    summed by :func:`iris.ccl.all_reduce` in place."""
    if len(ranks) == 1:
        return _alone(out, a, b, bias, scale_a, scale_b)
    if out.numel() == 0:  # the same shapes on every rank: nothing to reduce anywhere
        return None
    m, n = out.shape
    direct = _direct(out)
    specs = [] if direct else [("prod", m * n, out.dtype)]
    ws = _workspace("matmul_all_reduce", ranks, index, a, b, out, "composed", specs, workspace, group)
    prod = out if direct else _buf(ws, "prod", m * n).view(m, n)
    _gemm(a, b, bias if index == 0 else None, prod, scale_a, scale_b)
    ccl.all_reduce(prod, prod, group=group)
    if prod is not out:
        out.copy_(prod)
    return None


def matmul_reduce_scatter(out, a, b, bias, scale_a, scale_b, *, scatter_dim, ranks, index, group, workspace):
    """``out = reduce_scatter(a @ b) + bias``: the product laid out chunk by chunk (along N, each
    chunk's columns contiguous), reduced by :func:`iris.ccl.reduce_scatter`."""
    size = len(ranks)
    if size == 1:
        return _alone(out, a, b, bias, scale_a, scale_b)
    if out.numel() == 0:
        return None
    (m, _), n = a.shape, b.shape[1]
    direct = _direct(out)
    specs = [("prod", m * n, out.dtype)] + ([] if direct else [("res", out.numel(), out.dtype)])
    ws = _workspace("matmul_reduce_scatter", ranks, index, a, b, out, scatter_dim, specs, workspace, group)
    prod = _buf(ws, "prod", m * n)
    add = bias if index == 0 else None
    if scatter_dim == 0:
        _gemm(a, b, add, prod.view(m, n), scale_a, scale_b)
    else:
        cols = n // size
        for j in range(size):
            part = slice(j * cols, (j + 1) * cols)
            dst = prod[j * m * cols : (j + 1) * m * cols].view(m, cols)
            scale_part = scale_b[:, part] if scale_b is not None and scale_b.numel() > 1 else scale_b
            _gemm(a, b[:, part], add[part] if add is not None else None, dst, scale_a, scale_part)
    res = out.view(-1) if direct else _buf(ws, "res", out.numel())
    ccl.reduce_scatter(res, prod, group=group)
    if not direct:
        out.copy_(res.view(out.shape))
    return None


def all_gather_matmul(out, a_shard, b, bias, scale_a, scale_b, *, gather_dim, ranks, index, group, workspace):
    """``out = all_gather(a_shard, gather_dim) @ b + bias``: the shards gathered by
    :func:`iris.ccl.all_gather` (rows of every rank, in group order), regrouped by columns
    along K, then one GEMM; float8 shards with ``scale_a`` gather their row scales too, and
    along K take one GEMM per slice (:func:`_sliced_product`)."""
    size = len(ranks)
    if size == 1:
        return _alone(out, a_shard, b, bias, scale_a, scale_b)
    if out.numel() == 0:
        return None
    ms, ks = a_shard.shape
    m, n = out.shape
    direct = _direct(out)
    scaled = scale_a is not None
    specs = [("gathered", size * ms * ks, a_shard.dtype)]
    if scaled:  # this rank's row scales, then every rank's; along K, per-slice products in fp32
        specs += [("my_scales", ms, torch.float32), ("scales", size * ms, torch.float32)]
        specs += [("sum", m * n, torch.float32), ("part", m * n, torch.float32)] if gather_dim == 1 else []
    elif gather_dim == 1:
        specs.append(("a", m * size * ks, a_shard.dtype))
    if not direct:
        specs.append(("res", m * n, out.dtype))
    ws = _workspace(
        "all_gather_matmul", ranks, index, a_shard, b, out, (gather_dim, scaled), specs, workspace, group
    )
    gathered = _buf(ws, "gathered", size * ms * ks)
    if ks:  # (K = 0: no shard has data; the product is the bias)
        ccl.all_gather(gathered, a_shard.reshape(-1), group=group)
    scales = None
    if scaled:
        mine = _buf(ws, "my_scales", ms)
        mine.copy_(scale_a.reshape(-1).expand(ms))
        scales = _buf(ws, "scales", size * ms)
        ccl.all_gather(scales, mine, group=group)
    dst = out if direct else _buf(ws, "res", m * n).view(m, n)
    if gather_dim == 0:
        rows = scales.view(size * ms, 1) if scaled else None
        _gemm(gathered.view(size * ms, ks), b, bias, dst, rows, scale_b)
    elif scaled:
        _sliced_product(ws, gathered.view(size, ms, ks), b, bias, scales.view(size, ms, 1), scale_b, dst)
    else:
        full = _buf(ws, "a", m * size * ks).view(ms, size * ks)
        full.view(ms, size, ks).copy_(gathered.view(size, ms, ks).transpose(0, 1))
        _gemm(full, b, bias, dst, None, scale_b)
    if dst is not out:
        out.copy_(dst)
    return None


def _sliced_product(ws, slices, b, bias, scales, scale_b, dst) -> None:
    """``dst = sum over j of (slices[j] * scales[j]) @ (b's rows of slice j * scale_b) + bias``:
    float8 K slices, each with its own row scales, summed in fp32 and rounded once."""
    size, ms, ks = slices.shape
    total = _buf(ws, "sum", dst.numel()).view(dst.shape)
    part = _buf(ws, "part", dst.numel()).view(dst.shape)
    for j in range(size):
        _gemm(slices[j], b[j * ks : (j + 1) * ks], None, part if j else total, scales[j], scale_b)
        if j:
            total += part
    if bias is not None:
        total += bias
    dst.copy_(total)


def matmul_all_gather(out, a, b, bias, scale_a, scale_b, *, ranks, index, group, workspace) -> None:
    """``out = all_gather(a @ b + bias)`` along M: this rank's product, then
    :func:`iris.ccl.all_gather`."""
    size = len(ranks)
    if size == 1:
        return _alone(out, a, b, bias, scale_a, scale_b)
    if out.numel() == 0:
        return None
    m, n = a.shape[0], b.shape[1]
    direct = _direct(out)
    specs = [("prod", m * n, out.dtype)] + ([] if direct else [("res", size * m * n, out.dtype)])
    ws = _workspace("matmul_all_gather", ranks, index, a, b, out, "composed", specs, workspace, group)
    prod = _buf(ws, "prod", m * n)
    _gemm(a, b, bias, prod.view(m, n), scale_a, scale_b)
    res = out.view(-1) if direct else _buf(ws, "res", size * m * n)
    ccl.all_gather(res, prod, group=group)
    if not direct:
        out.copy_(res.view(out.shape))
    return None
