"""The staged forms of the fused ops over a group spanning several nodes, registered with
:mod:`iris.ccl.entry`: the fused kernel within the node, the step between nodes through
torch.distributed.

* ``matmul_all_reduce``: the fused GEMM + all-reduce over the node's ranks, then the
  node sums are all-reduced between nodes in shards (each rank of a node carries one shard
  over the network) and gathered back within the node; the bias is added once at the end.
* ``matmul_reduce_scatter``: the fused GEMM + all-reduce over the node's ranks, then each
  rank's slice is reduce-scattered between nodes.
* ``all_gather_matmul`` / ``matmul_all_gather`` / ``all_reduce_rmsnorm``: the staged
  collective of :mod:`iris.ccl` (Iris within the node, torch.distributed between nodes)
  and the local GEMM or normalisation.

Results equal the single-node semantics (fp32 accumulation within the node; the sums
between nodes are made in the tensors' dtype, as NCCL does). Float8 operands: the local
GEMMs multiply the dequantized operands in fp32, shards cross as bytes with their row
scales beside them; a float8 ``all_reduce_rmsnorm`` output is quantized as the kernels do
(``y / scale`` in fp32, rounded to nearest even with saturation).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import iris.ccl
from iris.ccl import entry
from iris.ccl.nodes import NodeGroups

from .matmul_all_reduce import matmul_all_reduce

_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _dequantized(x: torch.Tensor, scale) -> torch.Tensor:
    """``x`` in fp32 times its scale (float8 operands): one element, ``[rows, 1]`` for ``a`` or
    ``[1, columns]`` for ``b`` (they broadcast)."""
    if scale is None:
        return x.float()
    return x.float() * (scale.reshape(()) if scale.numel() == 1 else scale)


def _product(a, b, args: dict) -> torch.Tensor:
    """``(a * scale_a) @ (b * scale_b)`` in fp32 (the scales of ``args``)."""
    return torch.matmul(_dequantized(a, args["scale_a"]), _dequantized(b, args["scale_b"]))


def _node_sum(groups: NodeGroups, a, b, args: dict):
    """``a @ b`` summed over this node's ranks of the group, on every one of them (fp32
    accumulation), by the fused kernel (or a local GEMM on a node of one rank), in the
    output's dtype."""
    part = torch.empty(a.shape[0], b.shape[1], dtype=args["out"].dtype, device=a.device)
    if groups.intra is not None:
        scales = {"scale_a": args["scale_a"], "scale_b": args["scale_b"]}
        matmul_all_reduce(part, a, b, group=groups.intra, **scales)
    else:
        part.copy_(_product(a, b, args))
    return part


@entry.staged_form("matmul_all_reduce")
def _matmul_all_reduce(groups: NodeGroups, args: dict) -> None:
    out, a, b, bias = args["out"], args["a"], args["b"], args["bias"]
    part = _node_sum(groups, a, b, args).reshape(-1)
    n = part.numel()
    if groups.uniform and groups.intra is not None:
        shard = -(-n // groups.per_node)
        buf = torch.zeros(groups.per_node * shard, dtype=part.dtype, device=part.device)
        buf[:n] = part
        mine = buf[groups.local_index * shard : (groups.local_index + 1) * shard].clone()
        if groups.inter is not None:
            dist.all_reduce(mine, group=groups.inter)
        iris.ccl.all_gather(buf, mine, group=groups.intra)
        part = buf[:n]
    else:
        if groups.local_index == 0 and groups.inter is not None:
            dist.all_reduce(part, group=groups.inter)
        if groups.intra is not None:
            iris.ccl.broadcast(part, groups.local[0], group=groups.intra)
    result = part.view(out.shape)
    if bias is not None:
        result = (result.float() + bias.float()).to(out.dtype)
    out.copy_(result)


@entry.staged_form("matmul_reduce_scatter")
def _matmul_reduce_scatter(groups: NodeGroups, args: dict) -> None:
    out, a, b, bias, scatter_dim = args["out"], args["a"], args["b"], args["bias"], args["scatter_dim"]
    part = _node_sum(groups, a, b, args)
    size, me = groups.size, groups.position[dist.get_rank()]
    chunks = part.chunk(size, dim=scatter_dim)
    if groups.uniform:
        # the inter group of this local index holds ranks R(li, b): their chunks, reduced
        mine = torch.empty_like(chunks[0], memory_format=torch.contiguous_format)
        picks = torch.stack(
            [
                chunks[groups.order[groups.local_index * groups.num_nodes + k]].contiguous()
                for k in range(groups.num_nodes)
            ]
        )
        if groups.inter is not None:
            # both flat: gloo checks dim 0 of the output against the input's
            _reduce_scatter_single(mine.view(-1), picks.reshape(-1), group=groups.inter)
        else:
            mine.copy_(picks[0])
        result = mine
    else:
        whole = part.clone()
        if groups.local_index == 0 and groups.inter is not None:
            dist.all_reduce(whole, group=groups.inter)
        if groups.intra is not None:
            iris.ccl.broadcast(whole, groups.local[0], group=groups.intra)
        result = whole.chunk(size, dim=scatter_dim)[me]
    if bias is not None:
        cols = bias if scatter_dim == 0 else bias.chunk(size)[me]
        result = (result.float() + cols.float()).to(out.dtype)
    out.copy_(result)


@entry.staged_form("all_gather_matmul")
def _all_gather_matmul(groups: NodeGroups, args: dict) -> None:
    out, a_shard, b, bias, gather_dim = (
        args["out"],
        args["a_shard"],
        args["b"],
        args["bias"],
        args["gather_dim"],
    )
    size, scale_a = groups.size, args["scale_a"]
    whole = torch.empty(size * a_shard.numel(), dtype=a_shard.dtype, device=a_shard.device)
    iris.ccl.all_gather(whole, a_shard, group=groups.group)
    pieces = whole.view(size, *a_shard.shape).float()
    if scale_a is not None:  # every shard's own row scales, gathered beside it
        mine = scale_a.reshape(-1).expand(a_shard.shape[0]).contiguous()
        scales = torch.empty(size * mine.numel(), dtype=torch.float32, device=mine.device)
        iris.ccl.all_gather(scales, mine, group=groups.group)
        pieces = pieces * scales.view(size, -1, 1)
    a = torch.cat(list(pieces), dim=gather_dim)
    result = torch.matmul(a, _dequantized(b, args["scale_b"]))
    if bias is not None:
        result = result + bias.float()
    out.copy_(result.to(out.dtype))


@entry.staged_form("matmul_all_gather")
def _matmul_all_gather(groups: NodeGroups, args: dict) -> None:
    out, a, b, bias = args["out"], args["a"], args["b"], args["bias"]
    mine = _product(a, b, args)
    if bias is not None:
        mine = mine + bias.float()
    mine = mine.to(out.dtype)
    whole = torch.empty(groups.size * mine.numel(), dtype=out.dtype, device=out.device)
    iris.ccl.all_gather(whole, mine, group=groups.group)
    out.copy_(whole.view(out.shape))


@entry.staged_form("all_reduce_rmsnorm")
def _all_reduce_rmsnorm(groups: NodeGroups, args: dict) -> None:
    out, inp, weight, eps = args["out"], args["inp"], args["weight"], args["eps"]
    residual, residual_out = args["residual"], args["residual_out"]
    total = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device)
    iris.ccl.all_reduce(total, inp, group=groups.group)
    s = total.float()
    if residual is not None:
        s = s + residual.float()
    if residual_out is not None:
        residual_out.copy_(s.to(residual_out.dtype))
    normed = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    scale, scales_out = args["scale"], args["scales_out"]
    if scale is None and scales_out is None:
        out.copy_(normed.to(out.dtype))
        return
    top = torch.finfo(out.dtype).max
    if scales_out is not None:  # per row: max(amax, 2**-40) / fp8_max
        scale = normed.abs().amax(dim=-1, keepdim=True).clamp_min(2.0**-40) / top
        scales_out.copy_(scale.view(-1))
    out.copy_((normed / scale.float().reshape(-1, 1)).clamp(-top, top).to(out.dtype))
