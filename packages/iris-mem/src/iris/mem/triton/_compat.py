"""Small adapters that let the same device code run compiled and in Triton's interpreter."""

from __future__ import annotations

import functools

from triton.language.core import _aggregate
from triton.runtime.jit import constexpr_function

__all__ = ["aggregate", "constexpr_function", "jit_methods_of"]


class _BoundInterpreted:
    """Descriptor binding an interpreted ``@triton.jit`` method to its aggregate instance."""

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn.fn if hasattr(fn, "fn") else fn)

    def __get__(self, obj, objtype=None):
        return self.fn if obj is None else functools.partial(self.fn, obj)


def aggregate(cls):
    """``triton.language.core._aggregate`` that also works in the interpreter.

    Triton's aggregate attaches ``@triton.jit`` methods only when they are compiled
    ``JITFunction`` objects; under ``TRITON_INTERPRET=1`` they are ``InterpretedFunction``
    objects, which it skips. Attach those here, bound like ordinary methods.
    """
    out = _aggregate(cls)
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - Triton without an interpreter
        return out
    for name, member in vars(cls).items():
        if isinstance(member, staticmethod) and isinstance(member.__func__, InterpretedFunction):
            setattr(out, name, member)
        elif isinstance(member, InterpretedFunction):
            setattr(out, name, _BoundInterpreted(member))
    return out


def jit_methods_of(source, exclude=("initialize",)):
    """Class decorator (under :func:`aggregate`): give the class every ``@triton.jit``
    method of the aggregate ``source`` except ``exclude``, as the same function objects.

    A ``@triton.jit`` function called from a Gluon kernel compiles with Gluon's semantics,
    so the Gluon aggregates of :mod:`iris.mem.gluon` share the Triton ones' methods this
    way instead of copying them; methods added to ``source`` later are shared too.
    """
    from triton.runtime.jit import JITCallable

    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - Triton without an interpreter
        InterpretedFunction = JITCallable  # noqa: N806

    def decorate(cls):
        for name in dir(source):
            member = getattr(source, name)
            if (
                name not in exclude
                and not name.startswith("__")
                and isinstance(member, (JITCallable, InterpretedFunction))
            ):
                setattr(cls, name, member)
        return cls

    return decorate
