"""The MoE ops as ``torch.library`` custom ops (``torch.ops.iris.moe_dispatch``,
``moe_combine`` and their gradients), differentiable through ``register_autograd``, and the
compiled forms of :func:`iris.ops.moe_dispatch` / :func:`iris.ops.moe_combine` (what they
run under ``torch.compile``, registered with :mod:`iris.ccl.entry`).

``group`` is the process group's ``group_name`` (``""``: the default group), ``config``
:func:`iris.ccl.library.encode_config` of a :class:`~iris.ops.MoEConfig` (``""`` for None).

``moe_dispatch`` returns ``(tokens, expert_counts, expert_offsets, positions, scales,
source, meta)``: the receive buffer (``[capacity, H]``, its row count decided when the
workspace is made: a size the fake implementation declares data-dependent), the counts and
offsets per local expert, the positions of this rank's slots, the float8 block scales
(``[capacity, H // 128]``, ``[0, 0]`` without float8), and, for the gradient, the origin of
every received row (``[capacity]`` with ``grad``, else ``[0]``) and ``[rows received,
overflow]``. With ``grad`` (autograd records the call) ``tokens`` is a copy, not a view of
the workspace. ``moe_combine`` takes the positions back and finds the dispatch they came from;
it returns ``(y, slot_rows, meta)``, ``slot_rows`` the ``[T, K, H]`` expert rows it summed
when ``keep_rows`` (the weights' gradient needs them), else ``[0, 0, 0]``.
"""

from __future__ import annotations

import torch

import iris.mem
from iris.ccl import entry
from iris.ccl.library import NAMESPACE, decode_config, encode_config, group_name, keep_in_order, resolve_group

from . import _host, moe
from . import _moe_grad as _grad
from ._moe_host import FP8, SCALE_BLOCK, check_float8_grad, resolve
from .config import MoEConfig

Tensor = torch.Tensor


def _group_size(group: str) -> int:
    return len(_host.group_position(resolve_group(group))[0])


@torch.library.custom_op(f"{NAMESPACE}::moe_dispatch", mutates_args=())
def moe_dispatch(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, x_scales: torch.Tensor | None = None,
    quantize: torch.dtype | None = None, max_recv_rows: int = 0, group: str = "", config: str = "",
    grad: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``iris.ops.moe_dispatch`` (module docstring)."""
    with torch.no_grad():
        d = moe.moe_dispatch(
            x, topk_idx, num_experts, x_scales=x_scales, quantize=quantize,
            max_recv_rows=max_recv_rows or None, group=resolve_group(group),
            config=decode_config(config, MoEConfig),
        )  # fmt: skip
    moe.remember(d)
    meta = d._ws.buffers["meta"].clone()
    source = d._ws.buffers["source"].clone() if grad else meta.new_empty(0)
    scales = d.scales if d.scales is not None else x.new_empty((0, 0), dtype=torch.float32)
    tokens = d.tokens
    if grad:  # autograd may keep the rows; the workspace's are overwritten by the next call
        tokens, scales = tokens.clone(), scales.clone()
    return tokens, d.expert_counts, d.expert_offsets, d.positions, scales, source, meta


@moe_dispatch.register_fake
def _(
    x, topk_idx, num_experts, x_scales=None, quantize=None, max_recv_rows=0, group="", config="", grad=False
):
    rows = torch.library.get_ctx().new_dynamic_size()
    local = num_experts // _group_size(group)
    float8 = quantize is not None or x.dtype in FP8
    hidden = x.shape[1]
    return (
        x.new_empty((rows, hidden), dtype=quantize or x.dtype),
        x.new_empty(local, dtype=torch.int64),
        x.new_empty(local + 1, dtype=torch.int64),
        x.new_empty(topk_idx.shape, dtype=torch.int32),
        x.new_empty((rows, hidden // SCALE_BLOCK) if float8 else (0, 0), dtype=torch.float32),
        x.new_empty(rows if grad else 0, dtype=torch.int64),
        x.new_empty(2, dtype=torch.int64),
    )


@torch.library.custom_op(f"{NAMESPACE}::moe_combine", mutates_args=())
def moe_combine(
    expert_out: torch.Tensor, topk_weights: torch.Tensor, topk_idx: torch.Tensor, positions: torch.Tensor,
    num_experts: int, capacity: int, group: str = "", config: str = "", keep_rows: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``iris.ops.moe_combine`` of the dispatch that returned ``positions`` (module docstring;
    ``capacity``: its ``tokens``' rows, for the gradient)."""
    d = moe.recall(positions)
    with torch.no_grad():
        y = moe.moe_combine(expert_out, d, topk_weights)
    tokens_n, slots = positions.shape
    if keep_rows:
        rows = _grad.slot_rows(d._ws, tokens_n, slots, expert_out.shape[1], expert_out.dtype)
    else:
        rows = expert_out.new_empty((0, 0, 0))
    return y, rows, d._ws.buffers["meta"].clone()


@moe_combine.register_fake
def _(
    expert_out, topk_weights, topk_idx, positions, num_experts, capacity, group="", config="", keep_rows=False
):
    tokens_n, slots = positions.shape
    hidden = expert_out.shape[1]
    rows = expert_out.new_empty((tokens_n, slots, hidden) if keep_rows else (0, 0, 0))
    return expert_out.new_empty(tokens_n, hidden), rows, expert_out.new_empty(2, dtype=torch.int64)


def _routing(
    topk_idx, positions, meta, source, num_experts, capacity, hidden, group, config
) -> _grad.Routing:
    """The :class:`~iris.ops._moe_grad.Routing` of a custom op's gradient call."""
    process_group = resolve_group(group)
    ranks = _host.group_position(process_group)[0]
    cfg = resolve(decode_config(config, MoEConfig), hidden, iris.mem.capabilities(topk_idx.device))
    return _grad.Routing(
        topk_idx, positions, meta, source, num_experts, capacity, hidden, ranks, process_group, cfg
    )


@torch.library.custom_op(f"{NAMESPACE}::moe_dispatch_backward", mutates_args=())
def moe_dispatch_backward(
    grad_tokens: torch.Tensor, topk_idx: torch.Tensor, positions: torch.Tensor, source: torch.Tensor,
    meta: torch.Tensor, num_experts: int, group: str = "", config: str = "",
) -> torch.Tensor:  # fmt: skip
    """The gradient of ``moe_dispatch`` with respect to ``x``: ``[T, H]``."""
    capacity, hidden = grad_tokens.shape
    r = _routing(topk_idx, positions, meta, source, num_experts, capacity, hidden, group, config)
    return _grad.dispatch_backward(grad_tokens, r)


@moe_dispatch_backward.register_fake
def _(grad_tokens, topk_idx, positions, source, meta, num_experts, group="", config=""):
    return grad_tokens.new_empty(topk_idx.shape[0], grad_tokens.shape[1])


@torch.library.custom_op(f"{NAMESPACE}::moe_combine_backward", mutates_args=())
def moe_combine_backward(
    grad_y: torch.Tensor, topk_weights: torch.Tensor, topk_idx: torch.Tensor, positions: torch.Tensor,
    meta: torch.Tensor, num_experts: int, capacity: int, n_out: int, group: str = "", config: str = "",
) -> torch.Tensor:  # fmt: skip
    """The gradient of ``moe_combine`` with respect to ``expert_out``: ``[n_out, H]``."""
    hidden = grad_y.shape[1]
    r = _routing(topk_idx, positions, meta, None, num_experts, capacity, hidden, group, config)
    return _grad.combine_backward(grad_y, topk_weights, r, n_out)


@moe_combine_backward.register_fake
def _(grad_y, topk_weights, topk_idx, positions, meta, num_experts, capacity, n_out, group="", config=""):
    return grad_y.new_empty(n_out, grad_y.shape[1])


# --------------------------------------------------------------------------- autograd


def _dispatch_context(ctx, inputs, output) -> None:
    topk_idx, num_experts, group, config = inputs[1], inputs[2], inputs[6], inputs[7]
    _, _, _, positions, _, source, meta = output
    ctx.save_for_backward(topk_idx, positions, source, meta)
    ctx.num_experts, ctx.group, ctx.config = num_experts, group, config
    ctx.tokens_shape, ctx.tokens_dtype = output[0].shape, output[0].dtype


def _dispatch_grad(ctx, grad_tokens, *_):
    topk_idx, positions, source, meta = ctx.saved_tensors
    if grad_tokens is None:  # the rows were not used; the peers' gradients still travel
        grad_tokens = meta.new_zeros(ctx.tokens_shape, dtype=ctx.tokens_dtype)
    grad_x = torch.ops.iris.moe_dispatch_backward(
        grad_tokens, topk_idx, positions, source, meta, ctx.num_experts, ctx.group, ctx.config
    )
    return (grad_x,) + (None,) * 8


def _combine_context(ctx, inputs, output) -> None:
    expert_out, topk_weights, topk_idx, positions, num_experts, capacity, group, config, _ = inputs
    _, rows, meta = output
    ctx.save_for_backward(topk_weights, topk_idx, positions, rows, meta)
    ctx.num_experts, ctx.group, ctx.config = num_experts, group, config
    ctx.capacity, ctx.n_out = capacity, expert_out.shape[0]


def _combine_grad(ctx, grad_y, *_):
    topk_weights, topk_idx, positions, rows, meta = ctx.saved_tensors
    grad_out = torch.ops.iris.moe_combine_backward(
        grad_y, topk_weights, topk_idx, positions, meta, ctx.num_experts, ctx.capacity, ctx.n_out, ctx.group,
        ctx.config,
    )  # fmt: skip
    grad_w = None
    if ctx.needs_input_grad[1]:
        grad_w = _grad.weights_backward(grad_y, rows, topk_idx, meta, ctx.num_experts, topk_weights.dtype)
    return grad_out, grad_w, None, None, None, None, None, None, None


moe_dispatch.register_autograd(_dispatch_grad, setup_context=_dispatch_context)
moe_combine.register_autograd(_combine_grad, setup_context=_combine_context)
keep_in_order(moe_dispatch, moe_combine, moe_dispatch_backward, moe_combine_backward)


# --------------------------------------------------------------------------- compiled forms


@entry.compiled_form("moe_dispatch")
def _(args: dict) -> moe.MoEDispatch:
    x, topk_idx, num_experts, group, config = (
        args[n] for n in ("x", "topk_idx", "num_experts", "group", "config")
    )
    x_scales, quantize = args["x_scales"], args["quantize"]
    grad = torch.is_grad_enabled()
    check_float8_grad("moe_dispatch", x, x_scales, quantize)
    tokens, counts, offsets, positions, scales, _, _ = torch.ops.iris.moe_dispatch(
        x, topk_idx, num_experts, x_scales, quantize, args["max_recv_rows"] or 0, group_name(group),
        encode_config(config, MoEConfig), grad,
    )  # fmt: skip
    float8 = quantize is not None or x.dtype in FP8
    return moe.MoEDispatch(
        tokens, counts, positions, topk_idx, num_experts, offsets, scales if float8 else None, None, 0,
        config, group,
    )  # fmt: skip


@entry.compiled_form("moe_combine")
def _(args: dict) -> torch.Tensor:
    d, expert_out, topk_weights = args["d"], args["expert_out"], args["topk_weights"]
    keep_rows = torch.is_grad_enabled() and topk_weights.requires_grad
    y, _, _ = torch.ops.iris.moe_combine(
        expert_out, topk_weights, d.topk_idx, d.positions, d.num_experts, d.tokens.shape[0],
        group_name(d._group), encode_config(d._cfg, MoEConfig), keep_rows,
    )  # fmt: skip
    return y
