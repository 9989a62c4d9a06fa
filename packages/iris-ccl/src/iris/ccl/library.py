"""Helpers for writing ``torch.library`` custom ops over Iris's collectives and fused ops.

``torch.compile`` cannot trace into a collective (host-side planning, Triton launches, heap
bookkeeping), so every public op of iris.ccl and iris.ops is also an opaque custom op in the
``torch.ops.iris`` namespace, with a fake implementation; its compiled form (registered
with :func:`iris.ccl.entry.compiled_form`) calls it. A custom op takes only tensors and
primitives, so the Python objects of a call are passed as:

* ``group``: the process group's ``group_name`` (:func:`group_name`; ``""``: the default
  group), turned back into the group by :func:`resolve_group`;
* ``op``: the reduction's name (:func:`op_name`: ``"sum"``, ``"avg"``, ``"max"``, ...);
* ``config``: :func:`encode_config` of a config dataclass registered with
  :func:`register_config` (``""``: None): every field as ``name=repr(value)`` joined by
  ``;``, turned back into an equal object by :func:`decode_config`.

Every rank must run the same collectives in the same order, so each op is marked with
:func:`keep_in_order`.
"""

from __future__ import annotations

import ast
import dataclasses

import torch
import torch.distributed as dist

from .config import Config
from .entry import ensure_world
from .reduce_op import ReduceOp

#: The custom ops' namespace: ``torch.ops.iris``.
NAMESPACE = "iris"


def group_name(group) -> str:
    """The string a custom op takes for ``group``: its ``group_name``, ``""`` for None."""
    return "" if group is None else group.group_name


def resolve_group(name: str):
    """The process group a custom op's ``group`` string names (None for ``""``)."""
    if not name:
        return None
    return dist.distributed_c10d._resolve_process_group(name)


def group_size(name: str) -> int:
    """The size of the group ``name``; sets the world up first where torch.distributed is
    not initialised (as the first iris.ccl call does, :func:`iris.ccl.entry.ensure_world`)."""
    if not dist.is_initialized():
        ensure_world()
    return dist.get_world_size(resolve_group(name))


def op_name(op) -> str:
    """The string a custom op takes for a reduction (``ReduceOp``, a name, or
    torch.distributed's ``ReduceOp``)."""
    if isinstance(op, ReduceOp):
        return op.value
    if isinstance(op, str):
        return op
    return str(op)  # torch.distributed.ReduceOp: ReduceOp.parse reads its last part


#: Field names of each registered config class (filled at registration: torch.compile does
#: not trace ``dataclasses.fields``).
_FIELDS: dict[type, tuple[str, ...]] = {}


def register_config(cls: type) -> None:
    """Make ``cls`` (a dataclass of primitive fields) usable with :func:`encode_config`."""
    _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))


def encode_config(config, cls: type = Config) -> str:
    """``config`` (a ``cls`` dataclass or None) as a string a custom op can take."""
    if config is None:
        return ""
    if not isinstance(config, cls):
        raise TypeError(
            f"config must be an {cls.__module__}.{cls.__name__} or None, got {type(config).__name__}"
        )
    return ";".join(f"{name}={getattr(config, name)!r}" for name in _FIELDS[cls])


def decode_config(key: str, cls: type = Config):
    """The ``cls`` object :func:`encode_config` made ``key`` from (None for ``""``)."""
    if not key:
        return None
    fields = {}
    for item in key.split(";"):
        name, _, value = item.partition("=")
        fields[name] = ast.literal_eval(value)
    return cls(**fields)


def keep_in_order(*ops, ordered: bool = True) -> None:
    """Mark custom ops so that compiled graphs keep every call, in program order.

    A compiled graph may drop an op whose result is unused on this rank (a reduce's output
    off the root, say), and the ranks' graphs differ where they use the rank, so their
    schedulers could order independent ops differently; a peer would then wait for a call
    that never comes. Every op is marked side-effectful (never dropped); ``ordered`` ones
    also carry an effect token (never reordered). torch does not order mutating ops by
    effects, so mark the functional forms (and ops that return nothing) ``ordered``.
    """
    for custom_op in ops:
        if ordered:
            custom_op.register_effect(torch.library.EffectType.ORDERED)
        torch.fx.node.has_side_effect(custom_op._opoverload)


def dim0_scaled(t: torch.Tensor, factor: int, divide: bool, what: str) -> list[int]:
    """``t``'s shape with dim 0 multiplied (or divided) by ``factor`` (0-d: ``[factor]``):
    the output shape of a gather-like (or scatter-like) functional op."""
    shape = list(t.shape) or [1]
    if divide:
        if shape[0] % factor:
            raise ValueError(f"{what}: dim 0 of inp ({shape[0]}) is not divisible by the group size {factor}")
        shape[0] //= factor
    else:
        shape[0] *= factor
    return shape


register_config(Config)
