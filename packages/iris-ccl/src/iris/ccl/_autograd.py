"""Autograd of the functional ``torch.ops.iris`` collectives (``torch.library.register_autograd``).

The backward of each collective is another collective, as in
``torch.distributed.nn.functional``:

==================  ==============================================================
forward             backward (of the gradient ``g`` of the output)
==================  ==============================================================
``all_reduce``      ``all_reduce(g)`` with the same op (SUM or AVG)
``all_gather``      ``reduce_scatter(g)`` (SUM)
``reduce_scatter``  ``all_gather(g)`` (divided by the group size for AVG)
``all_to_all``      ``all_to_all(g)`` with the split sizes swapped
``broadcast``       ``reduce(g)`` (SUM) to the source; zero on the other ranks
``reduce``          ``broadcast(g)`` from the destination (divided by ``G`` for AVG)
``gather``          ``scatter(g)`` from the destination
``scatter``         ``gather(g)`` to the source; zero on the other ranks
==================  ==============================================================

MAX and MIN have no gradient here (torch.distributed.nn's formula for them is not their
derivative): their backward raises. The backward calls are ``torch.ops.iris`` ops too, so
a compiled training step (``torch.compile``, AOTAutograd) runs them as ops of its backward
graph. They pick their configuration by size, except ``all_reduce`` and ``all_to_all``,
which reuse the forward's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _torch_ops, library

_iris = torch.ops.iris


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _no_grad_op(collective: str, op: str) -> None:
    if op not in ("sum", "avg"):
        raise RuntimeError(
            f"iris.ccl {collective} with op={op!r} has no gradient (only SUM and AVG are differentiable); "
            "detach its input, or compute the reduction's gradient yourself"
        )


def _op(op: str) -> str:
    return library.op_name(op).lower().rsplit(".", 1)[-1]


# --------------------------------------------------------------------------- all_reduce


def _all_reduce_setup(ctx, inputs, output):
    _inp, op, group, config = inputs
    ctx.op, ctx.group, ctx.config = _op(op), group, config


def _all_reduce_backward(ctx, grad):
    _no_grad_op("all_reduce", ctx.op)
    return _iris.all_reduce(grad, ctx.op, ctx.group, ctx.config), None, None, None


# --------------------------------------------------------------------------- all_gather / reduce_scatter


def _all_gather_setup(ctx, inputs, output):
    inp, group, _config = inputs
    ctx.shape, ctx.group = inp.shape, group


def _all_gather_backward(ctx, grad):
    return _iris.reduce_scatter(grad, "sum", ctx.group, "").view(ctx.shape), None, None


def _reduce_scatter_setup(ctx, inputs, output):
    inp, op, group, _config = inputs
    ctx.shape, ctx.op, ctx.group = inp.shape, _op(op), group


def _reduce_scatter_backward(ctx, grad):
    _no_grad_op("reduce_scatter", ctx.op)
    g = _iris.all_gather(grad, ctx.group, "").view(ctx.shape)
    if ctx.op == "avg":
        g = g / library.group_size(ctx.group)
    return g, None, None, None


# --------------------------------------------------------------------------- all_to_all


def _all_to_all_setup(ctx, inputs, output):
    inp, out_splits, in_splits, group, config = inputs
    ctx.shape, ctx.group, ctx.config = inp.shape, group, config
    if out_splits is None and in_splits is None:
        ctx.splits = None
        return
    size = library.group_size(group)
    if in_splits is None:  # equal splits of inp's rows
        in_splits = [inp.shape[0] // size] * size
    if out_splits is None:  # equal splits of the output's rows
        out_splits = [output.shape[0] // size] * size
    ctx.splits = (list(out_splits), list(in_splits))


def _all_to_all_backward(ctx, grad):
    if ctx.splits is None:
        g = _iris.all_to_all(grad, None, None, ctx.group, ctx.config).view(ctx.shape)
    else:  # what this rank received goes back where it came from
        out_splits, in_splits = ctx.splits
        g = _iris.all_to_all(grad, in_splits, out_splits, ctx.group, ctx.config)
    return g, None, None, None, None


# --------------------------------------------------------------------------- rooted


def _rooted_setup(ctx, inputs, output):
    inp, root = inputs[0], inputs[1]
    ctx.shape, ctx.root, ctx.group = inp.shape, root, inputs[-2]
    ctx.op = _op(inputs[2]) if len(inputs) == 5 else "sum"  # reduce's op


def _broadcast_backward(ctx, grad):
    g = _iris.reduce(grad, ctx.root, "sum", ctx.group, "")
    if _rank() != ctx.root:  # the other ranks' input is not read
        g = torch.zeros_like(grad)
    return g, None, None, None


def _reduce_backward(ctx, grad):
    _no_grad_op("reduce", ctx.op)
    g = _iris.broadcast(grad, ctx.root, ctx.group, "")
    if ctx.op == "avg":
        g = g / library.group_size(ctx.group)
    return g, None, None, None, None


def _gather_backward(ctx, grad):
    return _iris.scatter(grad, ctx.root, ctx.group, "").view(ctx.shape), None, None, None


def _scatter_backward(ctx, grad):
    g = _iris.gather(grad, ctx.root, ctx.group, "").view(ctx.shape)
    if _rank() != ctx.root:  # the other ranks' input is not read
        g = torch.zeros(ctx.shape, dtype=grad.dtype, device=grad.device)
    return g, None, None, None


def register() -> None:
    """Register the backward of every functional collective (once, at import)."""
    for op, backward, setup in (
        (_torch_ops.all_reduce, _all_reduce_backward, _all_reduce_setup),
        (_torch_ops.all_gather, _all_gather_backward, _all_gather_setup),
        (_torch_ops.reduce_scatter, _reduce_scatter_backward, _reduce_scatter_setup),
        (_torch_ops.all_to_all, _all_to_all_backward, _all_to_all_setup),
        (_torch_ops.broadcast, _broadcast_backward, _rooted_setup),
        (_torch_ops.reduce, _reduce_backward, _rooted_setup),
        (_torch_ops.gather, _gather_backward, _rooted_setup),
        (_torch_ops.scatter, _scatter_backward, _rooted_setup),
    ):
        op.register_autograd(backward, setup_context=setup)


register()
