"""Gradients of ``moe_dispatch`` and ``moe_combine`` (:mod:`iris.ops.moe`).

With ``d = moe_dispatch(x, idx, E)`` and ``y = moe_combine(expert_out, d, w)``, where
``d.tokens[row(t, k)] = x[t]`` for every slot ``(t, k)`` with an expert:

* ``grad_x[t] = sum_k grad_tokens[row(t, k)]``: the rows' gradients travel back to their
  tokens and are summed over the slots, as combine does with weight 1;
* ``grad_expert_out[row(t, k)] = w[t, k] * grad_y[t]``: the output's gradient travels to the
  slots' rows, as dispatch does, one row per slot (rows nobody was routed to get zeros);
* ``grad_w[t, k] = <grad_y[t], expert_out[row(t, k)]>``: local, from the rows combine
  brought back (kept by the forward call when the weights require grad).

The two kernels (:mod:`iris.ops._moe_kernels`) run in a workspace of their own per signature
(autograd runs them in an order of its choosing, interleaved with forward calls under
activation checkpointing); what they need of the forward call is kept beside it in a
:class:`Routing` (the dispatch's workspace is reused by the next call).

Eager calls attach :class:`DispatchFunction` / :class:`CombineFunction`; compiled ones
register the same backward with ``torch.library.register_autograd``
(:mod:`iris.ops._moe_library`).
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from iris.mem import runtime

from . import workspace as _workspace
from ._moe_host import accumulator, row_hint, some
from ._moe_kernels import _moe_combine_kernel, _moe_scatter_kernel
from .config import MoEConfig


@dataclasses.dataclass
class Routing:
    """What the gradient of one dispatch / combine needs of the forward call.

    Attributes:
        topk_idx: ``[T, K]`` expert ids of this rank's slots (a copy).
        positions: ``[T, K]`` int32 row of each slot on its expert's rank.
        meta: int64 ``[2]``: rows received and whether the dispatch overflowed (a copy).
        source: int64 ``[capacity]``: ``rank << 32 | t * K + k`` of each received row (a
            copy; None where only combine's gradient is needed).
        num_experts, capacity, hidden: the call's sizes (capacity: ``d.tokens``' rows).
        ranks: global ranks of the group; group: the process group (None: the world).
        cfg: the resolved :class:`~iris.ops.MoEConfig` of the forward call.
    """

    topk_idx: torch.Tensor
    positions: torch.Tensor
    meta: torch.Tensor
    source: torch.Tensor | None
    num_experts: int
    capacity: int
    hidden: int
    ranks: tuple[int, ...]
    group: object
    cfg: MoEConfig


def _workspace_for(r: Routing, dtype: torch.dtype, device: torch.device) -> _workspace.Workspace:
    """The gradients' workspace of this signature: a receive buffer of ``capacity`` rows and
    the counters of the entry handshake and of the rows' arrival."""
    size = len(r.ranks)
    slots = r.topk_idx.shape[1]
    signature = (
        "moe_grad", r.ranks, (r.hidden, slots, r.num_experts, r.capacity), str(dtype), r.cfg, (None, False)
    )  # fmt: skip
    specs = [
        ("rows", r.capacity * r.hidden, dtype),
        ("enter", size, torch.int64),
        ("done", size, torch.int64),
        ("short", size, torch.int32),
        ("errors", 4, torch.int64),
    ]
    return _workspace.acquire(None, signature, None, r.group, size, device, specs)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit stride along its rows (autograd may hand over expanded gradients)."""
    return t if t.stride(1) == 1 and t.stride(0) >= t.shape[1] else t.contiguous()


def dispatch_backward(grad_tokens: torch.Tensor, r: Routing) -> torch.Tensor:
    """``grad_x`` ``[T, H]`` from the gradient of ``d.tokens`` (``[capacity, H]``): each
    received row's gradient back to its token, summed over the token's slots."""
    tokens_n, slots = r.topk_idx.shape
    g = _rows(grad_tokens)
    ws = _workspace_for(r, g.dtype, g.device)
    grad_x = torch.empty((tokens_n, r.hidden), dtype=g.dtype, device=g.device)
    ones = torch.ones((tokens_n, slots), dtype=g.dtype, device=g.device)
    b, cfg = ws.buffers, r.cfg
    runtime.launch(
        _moe_combine_kernel, cfg.programs, ws.sync, b["state"],
        some(g), some(ones), some(r.topk_idx), some(grad_x), b["rows"], some(r.source), b["enter"], b["done"],
        b["short"], r.meta, b["errors"],
        tokens_n, r.hidden, g.shape[0], max(g.stride(0), 1), max(grad_x.stride(0), 1),
        E=r.num_experts, K=slots, KP=triton.next_power_of_2(slots), BLOCK_H=cfg.block,
        HINT=row_hint(r.hidden, g.element_size(), cfg), num_warps=cfg.num_warps, ACC=accumulator(g.dtype),
        ENTER=True, programs=cfg.programs,
    )  # fmt: skip
    return grad_x


def combine_backward(grad_y: torch.Tensor, weights: torch.Tensor, r: Routing, n_out: int) -> torch.Tensor:
    """``grad_expert_out`` ``[n_out, H]``: ``weights[t, k] * grad_y[t]`` at each slot's row
    on its expert's rank, zeros elsewhere."""
    tokens_n, slots = r.topk_idx.shape
    g = _rows(grad_y)
    ws = _workspace_for(r, g.dtype, g.device)
    out = torch.empty((n_out, r.hidden), dtype=g.dtype, device=g.device)
    b, cfg = ws.buffers, r.cfg
    runtime.launch(
        _moe_scatter_kernel, cfg.programs, ws.sync, b["state"],
        some(g), some(weights.contiguous()), some(r.topk_idx), some(r.positions), b["rows"], some(out),
        b["enter"], b["done"], r.meta,
        tokens_n, r.hidden, n_out, max(g.stride(0), 1), max(out.stride(0), 1),
        E=r.num_experts, K=slots, KP=triton.next_power_of_2(slots), BLOCK_H=cfg.block,
        HINT=row_hint(r.hidden, g.element_size(), cfg), num_warps=cfg.num_warps, ACC=accumulator(g.dtype),
        programs=cfg.programs,
    )  # fmt: skip
    return out


def weights_backward(grad_y, slot_rows, topk_idx, meta, num_experts: int, dtype: torch.dtype) -> torch.Tensor:
    """``grad_w[t, k] = <grad_y[t], slot_rows[t, k]>`` (``slot_rows``: the expert rows combine
    brought back, ``[T, K, H]``) in fp32 (fp64 for fp64), zero for slots without an expert
    or when the dispatch overflowed; in ``dtype``."""
    acc = torch.float64 if torch.float64 in (grad_y.dtype, slot_rows.dtype) else torch.float32
    dots = torch.bmm(slot_rows.to(acc), grad_y.to(acc)[:, :, None])[:, :, 0]
    valid = (topk_idx >= 0) & (topk_idx < num_experts) & (meta[1] == 0)
    # where, not a product: rows of slots without an expert were never written (any bits)
    return torch.where(valid, dots, torch.zeros((), dtype=acc, device=dots.device)).to(dtype)


def slot_rows(ws: _workspace.Workspace, tokens_n: int, slots: int, hidden: int, dtype) -> torch.Tensor:
    """A copy of the expert rows a combine brought back for this rank's slots, ``[T, K, H]``
    (the workspace's ``back`` buffer is overwritten by the next combine)."""
    return ws.buffers["back"].view(dtype)[: tokens_n * slots * hidden].view(tokens_n, slots, hidden).clone()


class DispatchFunction(torch.autograd.Function):
    """Attaches a dispatch to autograd: ``apply(x, received, routing)`` returns a copy of
    ``received`` (the rows the kernel delivered: autograd may keep them for an expert's
    backward, while the workspace is reused by the next call); backward returns ``grad_x``."""

    @staticmethod
    def forward(ctx, x, received, routing):
        ctx.routing = routing
        return received.clone()

    @staticmethod
    def backward(ctx, grad_tokens):
        return dispatch_backward(grad_tokens, ctx.routing), None, None


class CombineFunction(torch.autograd.Function):
    """Attaches a combine to autograd: ``apply(expert_out, topk_weights, run, routing)``
    returns ``y`` from ``run() -> (y, slot_rows or None)``; backward returns the gradients
    of ``expert_out`` and ``topk_weights``."""

    @staticmethod
    def forward(ctx, expert_out, topk_weights, run, routing):
        y, rows = run()
        ctx.routing, ctx.n_out = routing, expert_out.shape[0]
        ctx.save_for_backward(topk_weights, rows)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        weights, rows = ctx.saved_tensors
        r = ctx.routing
        # Collective: runs on every rank, whether or not this rank's expert_out needs it (the
        # peers' tokens routed to this rank's experts need its grad_y).
        grad_out = combine_backward(grad_y, weights, r, ctx.n_out)
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = weights_backward(grad_y, rows, r.topk_idx, r.meta, r.num_experts, weights.dtype)
        return grad_out if ctx.needs_input_grad[0] else None, grad_w, None, None
