"""Differentiable collectives that return new tensors (``iris.ccl.functional``).

Each function calls the functional ``torch.ops.iris`` op of the collective, which has an
autograd formula (the same as ``torch.distributed.nn.functional``'s; see
:doc:`/pytorch`), so gradients flow through it, eagerly and under ``torch.compile``
(``fullgraph=True``). Unlike the output-first functions of :mod:`iris.ccl`, these take
the group as a process group object, the op as a :class:`~iris.ccl.ReduceOp` (or its
name, or ``torch.distributed.ReduceOp``) and the config as a :class:`~iris.ccl.Config`,
and convert them to the ops' primitive arguments.

Rooted collectives name their root by global rank, as in ``torch.distributed``. Like the
ops, ``reduce`` and ``gather`` return a tensor of the result's shape on every rank, whose
values are defined on the root only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import library
from .config import Config
from .reduce_op import ReduceOp

_iris = torch.ops.iris


def _args(group, config: Config | None) -> tuple[str, str]:
    return library.group_name(group), library.encode_config(config)


def all_reduce(
    inp: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM, *, group=None, config: Config | None = None
) -> torch.Tensor:
    """The reduction of ``inp`` over ``group`` (None: the world), ``inp``'s shape.
    Differentiable for SUM and AVG: the gradient is the all_reduce of the output's."""
    return _iris.all_reduce(inp, library.op_name(op), *_args(group, config))


def all_gather(inp: torch.Tensor, *, group=None, config: Config | None = None) -> torch.Tensor:
    """Every rank's ``inp`` concatenated along dim 0 (a 0-d ``inp``: stacked). The gradient
    is the reduce_scatter (SUM) of the output's."""
    return _iris.all_gather(inp, *_args(group, config))


def reduce_scatter(
    inp: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM, *, group=None, config: Config | None = None
) -> torch.Tensor:
    """This rank's chunk along dim 0 of the reduction of ``inp`` (dim 0 divisible by the
    group's size). Differentiable for SUM and AVG: the gradient is the all_gather of the
    output's."""
    return _iris.reduce_scatter(inp, library.op_name(op), *_args(group, config))


def all_to_all(
    inp: torch.Tensor, output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None, *, group=None, config: Config | None = None,
) -> torch.Tensor:  # fmt: skip
    """Chunk ``j`` of ``inp`` to rank ``j``; the chunks every rank sent, in rank order (as
    ``torch.distributed.all_to_all_single``): equal flat chunks without split sizes, else
    rows of dim 0. The gradient is the all_to_all of the output's with the split sizes
    swapped."""
    out_splits = None if output_split_sizes is None else [int(s) for s in output_split_sizes]
    in_splits = None if input_split_sizes is None else [int(s) for s in input_split_sizes]
    return _iris.all_to_all(inp, out_splits, in_splits, *_args(group, config))


def broadcast(tensor: torch.Tensor, src: int, *, group=None, config: Config | None = None) -> torch.Tensor:
    """Rank ``src``'s ``tensor`` on every rank. The gradient is the reduce (SUM) of the
    output's to ``src``, zero on the other ranks."""
    return _iris.broadcast(tensor, src, *_args(group, config))


def reduce(
    inp: torch.Tensor, dst: int, op: ReduceOp | str = ReduceOp.SUM, *, group=None,
    config: Config | None = None,
) -> torch.Tensor:  # fmt: skip
    """The reduction of ``inp``, defined on rank ``dst``. Differentiable for SUM and AVG:
    the gradient is the broadcast of ``dst``'s output gradient."""
    return _iris.reduce(inp, dst, library.op_name(op), *_args(group, config))


def gather(inp: torch.Tensor, dst: int, *, group=None, config: Config | None = None) -> torch.Tensor:
    """Every rank's ``inp`` concatenated along dim 0, defined on rank ``dst``. The gradient
    is the scatter of ``dst``'s output gradient."""
    return _iris.gather(inp, dst, *_args(group, config))


def scatter(inp: torch.Tensor, src: int, *, group=None, config: Config | None = None) -> torch.Tensor:
    """Chunk ``i`` along dim 0 of rank ``src``'s ``inp`` on the group's ``i``-th rank (every
    rank passes an ``inp`` of the same shape, read on ``src`` only). The gradient is the
    gather of the outputs' to ``src``, zero on the other ranks."""
    return _iris.scatter(inp, src, *_args(group, config))


__all__ = [
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
]
