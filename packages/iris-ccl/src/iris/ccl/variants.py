"""The registry of collective variants: every ``Config(variant=...)`` that all_reduce,
all_gather, reduce_scatter and all_to_all accept is one :class:`Variant` here, declaring
what it needs from a call and what runs instead when that does not hold.

:data:`iris.ccl.VARIANTS`, ``Config.check_variant``, the tuning table's checks and
``Config(variant="auto")`` read the registry, and every one of those collectives runs the
variant it names through :mod:`iris.ccl._plan` (validate, plan, ``variant.run(plan)``).

Adding a variant: write one module of iris.ccl holding its kernel, a function that runs it
on a prepared call (``run(plan)``, see :class:`iris.ccl._plan.Plan`) and a tuple
``REGISTERED`` of its :class:`Variant` objects (one per collective it serves); then add the
module's name to :data:`MODULES`. Its name becomes valid in ``Config(variant=...)``, in
``iris.ccl.VARIANTS`` (after the variants listed before it) and in tuning tables.

Modules are imported on the first question asked of the registry, not when it is imported:
the modules holding variants import the helpers that read the registry.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from .reduce_op import ReduceOp

if TYPE_CHECKING:
    import torch

    from ._plan import Plan

#: Modules of iris.ccl holding variants (each a tuple ``REGISTERED``), in the order
#: ``iris.ccl.VARIANTS`` lists them.
MODULES = ("_ll", "_boxed", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    """One algorithm of one collective and what it needs.

    Attributes:
        collective: the collective it implements ("all_reduce", ...).
        name: its ``Config.variant`` name.
        run: runs it on a prepared call of at least two members with data (``run(plan)``).
        staged: it always works on iris.ccl's own heap, never the caller's (the caller's
            tensors are copied through staging buffers when they are not there).
        workspace: whether it needs a workspace of its own (or, a function, whether it does
            for elements of ``workspace(dtype)``); it then runs on iris.ccl's own heap too,
            so that the caller's heap is never spent on it.
        in_place: it needs the caller's tensors on a heap spanning the group (used in
            place); otherwise :attr:`fallback` runs.
        disjoint: it needs an output that does not overlap the input (peers use the output
            as scratch while the input is still read); otherwise :attr:`fallback` runs.
        ops: the reductions it supports (None: all); another one is a ValueError.
        other_ops: what that ValueError advises instead.
        compiled_only: why it cannot run in Triton's interpreter ("": it can); asking for
            it there is a RuntimeError.
        fallback: the variant of the same collective that runs when :attr:`in_place` or
            :attr:`disjoint` does not hold.
        default: ``Config(variant="auto")`` picks it where the tuning table has no rule for
            the collective (one per collective).
    """

    collective: str
    name: str
    run: Callable[[Plan], None]
    staged: bool = False
    workspace: bool | Callable[[torch.dtype], bool] = False
    in_place: bool = False
    disjoint: bool = False
    ops: tuple[ReduceOp, ...] | None = None
    other_ops: str = ""
    compiled_only: str = ""
    fallback: str | None = None
    default: bool = False

    def own_heap(self, dtype: torch.dtype) -> bool:
        """Whether a call with elements of ``dtype`` runs on iris.ccl's own heap."""
        workspace = self.workspace if isinstance(self.workspace, bool) else self.workspace(dtype)
        return self.staged or workspace

    def check_op(self, op: ReduceOp | None) -> None:
        """A ValueError for a reduction this variant does not support."""
        if op is not None and self.ops is not None and op not in self.ops:
            names = " and ".join(o.name for o in self.ops)
            raise ValueError(
                f"{self.collective} variant {self.name!r} supports {names} only; {self.other_ops}"
            )

    def check_backend(self, interpreted: bool) -> None:
        """A RuntimeError when the kernels are interpreted and this variant needs them compiled."""
        if interpreted and self.compiled_only:
            raise RuntimeError(
                f"{self.collective}: Config(variant={self.name!r}) needs the cuda backend: "
                f"{self.compiled_only}; use another variant"
            )


@functools.cache
def registry() -> dict[tuple[str, str], Variant]:
    """Every registered variant by ``(collective, name)``, in :data:`MODULES` order."""
    found: dict[tuple[str, str], Variant] = {}
    for module in MODULES:
        for variant in importlib.import_module(f".{module}", __package__).REGISTERED:
            key = (variant.collective, variant.name)
            if key in found or variant.name == "auto":
                raise RuntimeError(f"iris.ccl: {module} registers {key}, a name already taken")
            found[key] = variant
    for variant in found.values():
        _check_fallback(variant, found)
    return found


def _check_fallback(variant: Variant, found: dict[tuple[str, str], Variant]) -> None:
    """A variant names a fallback exactly when it has requirements of the call (``in_place``,
    ``disjoint``), and the fallback is registered and runs wherever the variant was placed,
    with every reduction: it has no requirements of its own (so one step always suffices)."""
    needs = variant.in_place or variant.disjoint
    if not needs and variant.fallback is None:
        return
    target = found.get((variant.collective, variant.fallback or ""))
    if needs and target is not None and _runs_anywhere(target):
        return
    raise RuntimeError(
        f"iris.ccl: {variant.collective} variant {variant.name!r} has fallback={variant.fallback!r}: a "
        "variant with in_place or disjoint needs a registered fallback without requirements, others none"
    )


def _runs_anywhere(variant: Variant) -> bool:
    return not (
        variant.staged or variant.workspace or variant.in_place or variant.disjoint
        or variant.ops or variant.compiled_only
    )  # fmt: skip


@functools.cache
def names() -> dict[str, tuple[str, ...]]:
    """The variants each collective accepts, "auto" first (``iris.ccl.VARIANTS``)."""
    table: dict[str, tuple[str, ...]] = {}
    for collective, name in registry():
        table[collective] = table.get(collective, ("auto",)) + (name,)
    return table


def get(collective: str, name: str) -> Variant | None:
    """The variant ``name`` of ``collective``; None for "auto" and names it does not have."""
    return registry().get((collective, name))


def default(collective: str) -> str:
    """The variant "auto" runs where the tuning table has no rule for ``collective``
    ("auto" itself for collectives without variants)."""
    return next((v.name for v in registry().values() if v.collective == collective and v.default), "auto")
