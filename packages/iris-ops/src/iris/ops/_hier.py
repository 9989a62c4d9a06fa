"""Fused ops over a group spanning several nodes: the fused kernel within the node, the
step between nodes through torch.distributed (see :mod:`iris.ccl._staged`).

* ``matmul_all_reduce``: the fused GEMM + all-reduce over the node's ranks, then the
  node sums are all-reduced between nodes in shards (each rank of a node carries one shard
  over the network) and gathered back within the node; the bias is added once at the end.
* ``matmul_reduce_scatter``: the fused GEMM + all-reduce over the node's ranks, then each
  rank's slice is reduce-scattered between nodes.
* ``all_gather_matmul`` / ``matmul_all_gather`` / ``all_reduce_rmsnorm``: the staged
  collective of :mod:`iris.ccl` (Iris within the node, torch.distributed between nodes)
  and the local GEMM or normalisation.

Results equal the single-node semantics (fp32 accumulation within the node; the sums
between nodes are made in the tensors' dtype, as NCCL does).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import iris.ccl
from iris.ccl import nodes as _ccl_nodes

_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def entry(group, device: torch.device, name: str, *args, async_op: bool, **kwargs):
    """``(True, handle)`` after running op ``name`` in stages when ``group`` spans nodes,
    ``(False, None)`` otherwise."""
    hier = _ccl_nodes.spanning(group, device)
    if hier is None:
        return False, None
    globals()["_" + name](hier, *args, **kwargs)
    return True, iris.ccl.Work(device) if async_op else None


def _node_sum(hier, a, b):
    """``a @ b`` summed over this node's ranks of the group, on every one of them (fp32
    accumulation), by the fused kernel (or a local GEMM on a node of one rank)."""
    from .matmul_all_reduce import matmul_all_reduce

    part = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    if hier.intra is not None:
        matmul_all_reduce(part, a, b, group=hier.intra)
    else:
        part.copy_(torch.matmul(a.float(), b.float()))
    return part


def _matmul_all_reduce(hier, out, a, b, bias, config=None):
    part = _node_sum(hier, a, b).reshape(-1)
    n = part.numel()
    if hier.uniform and hier.intra is not None:
        shard = -(-n // hier.per_node)
        buf = torch.zeros(hier.per_node * shard, dtype=part.dtype, device=part.device)
        buf[:n] = part
        mine = buf[hier.local_index * shard : (hier.local_index + 1) * shard].clone()
        if hier.inter is not None:
            dist.all_reduce(mine, group=hier.inter)
        iris.ccl.all_gather(buf, mine, group=hier.intra)
        part = buf[:n]
    else:
        if hier.local_index == 0 and hier.inter is not None:
            dist.all_reduce(part, group=hier.inter)
        if hier.intra is not None:
            iris.ccl.broadcast(part, hier.local[0], group=hier.intra)
    result = part.view(out.shape)
    if bias is not None:
        result = (result.float() + bias.float()).to(out.dtype)
    out.copy_(result)


def _matmul_reduce_scatter(hier, out, a, b, bias, scatter_dim=0, config=None):
    part = _node_sum(hier, a, b)
    size, me = hier.size, hier.position[dist.get_rank()]
    chunks = part.chunk(size, dim=scatter_dim)
    if hier.uniform:
        # the inter group of this local index holds ranks R(li, b): their chunks, reduced
        mine = torch.empty_like(chunks[0], memory_format=torch.contiguous_format)
        picks = torch.stack(
            [chunks[hier.order[hier.local_index * hier.num_nodes + k]].contiguous() for k in range(hier.num_nodes)]
        )
        if hier.inter is not None:
            _reduce_scatter_single(mine, picks.reshape(-1), group=hier.inter)
        else:
            mine.copy_(picks[0])
        result = mine
    else:
        whole = part.clone()
        if hier.local_index == 0 and hier.inter is not None:
            dist.all_reduce(whole, group=hier.inter)
        if hier.intra is not None:
            iris.ccl.broadcast(whole, hier.local[0], group=hier.intra)
        result = whole.chunk(size, dim=scatter_dim)[me]
    if bias is not None:
        cols = bias if scatter_dim == 0 else bias.chunk(size)[me]
        result = (result.float() + cols.float()).to(out.dtype)
    out.copy_(result)


def _all_gather_matmul(hier, out, a_shard, b, bias, gather_dim=0, config=None):
    size = hier.size
    whole = torch.empty(size * a_shard.numel(), dtype=a_shard.dtype, device=a_shard.device)
    iris.ccl.all_gather(whole, a_shard, group=hier.group)
    pieces = whole.view(size, *a_shard.shape)
    a = torch.cat(list(pieces), dim=gather_dim)
    result = torch.matmul(a.float(), b.float())
    if bias is not None:
        result = result + bias.float()
    out.copy_(result.to(out.dtype))


def _matmul_all_gather(hier, out, a, b, bias, config=None):
    mine = torch.matmul(a.float(), b.float())
    if bias is not None:
        mine = mine + bias.float()
    mine = mine.to(out.dtype)
    whole = torch.empty(hier.size * mine.numel(), dtype=out.dtype, device=out.device)
    iris.ccl.all_gather(whole, mine, group=hier.group)
    out.copy_(whole.view(out.shape))


def _all_reduce_rmsnorm(hier, out, inp, weight, eps, residual=None, residual_out=None, config=None):
    total = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device)
    iris.ccl.all_reduce(total, inp, group=hier.group)
    s = total.float()
    if residual is not None:
        s = s + residual.float()
    if residual_out is not None:
        residual_out.copy_(s.to(residual_out.dtype))
    normed = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    out.copy_(normed.to(out.dtype))
