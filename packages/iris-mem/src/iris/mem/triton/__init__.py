"""Device-side API for Triton kernels: :class:`Context`, its event recorder :class:`Tracing`,
and the functional RMA forms."""

from ._compat import aggregate
from .context import HEAP_BASES_OFFSET, Context
from .group import Group, enter_group
from .ops import (
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
    copy,
    get,
    load,
    put,
    store,
    translate,
)
from .tracing import Tracing

__all__ = [
    "HEAP_BASES_OFFSET",
    "Context",
    "Group",
    "Tracing",
    "aggregate",
    "atomic_add",
    "atomic_and",
    "atomic_cas",
    "atomic_max",
    "atomic_min",
    "atomic_or",
    "atomic_sub",
    "atomic_xchg",
    "atomic_xor",
    "copy",
    "enter_group",
    "get",
    "load",
    "put",
    "store",
    "translate",
]
