"""Building blocks for the aggregates (Triton structs) the fused ops' kernels pass between their
named parts: a field type for values a launch may specialise, and a constructor that takes
the fields in the order the class declares them. A module declaring aggregates must not use
``from __future__ import annotations``: Triton checks fields against their annotations, which
must then be types, not strings."""

import triton.language as tl
from triton.runtime.jit import constexpr_function

#: Type of an aggregate field that holds a run-time value or, where a launch specialises it,
#: a constexpr (a size or stride equal to 1) or a tensor descriptor in place of a pointer.
Value = tl.core.base_value


def fields(cls):
    """Class decorator (under ``aggregate``): a constructor taking the fields in the order the
    class declares them. Triton hands it constexprs unwrapped; those are stored as
    ``tl.constexpr`` again, everything else as given."""
    names = tuple(cls.__annotations__)

    def init(self, *values):
        for name, value in zip(names, values, strict=True):
            setattr(self, name, value if isinstance(value, Value) else tl.constexpr(value))

    cls.__init__ = constexpr_function(init)
    return cls
