"""Small adapters that let the same device code run compiled and in Triton's interpreter."""

from __future__ import annotations

import functools
import sys

from triton.language.core import _aggregate
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITCallable, JITFunction, constexpr_function

__all__ = ["aggregate", "constexpr_function", "interpret_triton_library", "jit_methods_of"]


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


def interpret_triton_library() -> None:
    """Re-decorate Triton's own ``@triton.jit`` library functions for the interpreter.

    ``tl.zeros``, ``tl.sum``, ``tl.ravel``... are decorated when ``triton.language`` is
    imported. A program that imported triton before iris.mem turned the interpreter on has
    them compiled for GPUs, and interpreted kernels fail inside them. Swap each for the
    interpreted function that decorating it now would have produced (nothing to swap when
    triton was imported with the interpreter on).
    """
    swapped: dict[int, object] = {}
    for name, module in list(sys.modules.items()):
        if not (name == "triton.language" or name.startswith("triton.language.")) or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if type(value) is JITFunction:
                if id(value) not in swapped:
                    swapped[id(value)] = InterpretedFunction(value.fn, **_jit_kwargs(value))
                setattr(module, attr, swapped[id(value)])


def _jit_kwargs(fn) -> dict:
    """The decoration options of a JITFunction that InterpretedFunction also takes."""
    keys = ("version", "do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline", "repr")
    return {k: getattr(fn, k) for k in keys if hasattr(fn, k)}
