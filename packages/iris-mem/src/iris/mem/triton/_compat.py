"""Small adapters that let the same device code run compiled and in Triton's interpreter."""

from __future__ import annotations

import functools
import sys

import triton
from triton.backends import backends
from triton.language.core import _aggregate
from triton.runtime.driver import driver
from triton.runtime.errors import InterpreterError
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITCallable, JITFunction, constexpr_function

from ..errors import IrisError

__all__ = [
    "aggregate",
    "compiled_kernel_error",
    "constexpr_function",
    "explain_compiled_launches",
    "interpret_triton_library",
    "iris_error_of",
    "jit",
    "jit_methods_of",
]


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


# --------------------------------------------------------------------------- errors of device functions


def iris_error_of(error: BaseException) -> IrisError | None:
    """The :class:`~iris.mem.IrisError` that ``error`` (Triton's ``InterpreterError``, which
    wraps whatever a kernel raised) stands for, found down its ``__cause__`` chain, or None."""
    while error is not None:
        if isinstance(error, IrisError):
            return error
        error = error.__cause__
    return None


class _PassingIrisErrors(InterpretedFunction):
    """An interpreted device function that lets an :class:`~iris.mem.IrisError` raised inside
    it through as it is. Triton wraps whatever a device function call raises in an
    ``InterpreterError`` quoting the previous one, so after the four calls between a kernel
    and a translation Iris's message would be buried in four quotes."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except InterpreterError as e:
            cause = iris_error_of(e)
            if cause is None:
                raise
            raise cause from None


def jit(fn):
    """``triton.jit`` for Iris's device functions that may raise an IrisError (the RMA API):
    compiled, exactly ``triton.jit``; interpreted, a function that lets the error reach the
    kernel's launch unwrapped (the launch itself wraps it once)."""
    decorated = triton.jit(fn)
    if isinstance(decorated, InterpretedFunction):
        return _PassingIrisErrors(fn, **decorated.kwargs)
    return decorated


# --------------------------------------------------------------------------- kernels defined too early


def compiled_kernel_error(kernel_name: str | None) -> RuntimeError:
    """The error of launching a compiled-mode kernel where kernels are interpreted."""
    if kernel_name is None:  # a use of the driver other than a launch we can name
        what = "Triton asked for a GPU driver and found none ('0 active drivers'): a kernel defined"
    else:
        what = f"kernel {kernel_name} was defined"
    return RuntimeError(
        f"{what} for a GPU (before `import iris.mem` turned Triton's interpreter on), but the heap's "
        "kernels run in Triton's interpreter (the cpu backend), and Triton found no GPU driver here "
        "(its message: '0 active drivers'). Triton decides when a kernel is defined whether it interprets "
        "it: import iris.mem before defining kernels (it decides whether Triton interprets them), or set "
        "TRITON_INTERPRET=1 in the environment before Python starts"
    )


def _launching_kernel() -> str | None:
    """The name of the compiled-mode kernel whose launch asks for the driver (the caller
    frames hold it as ``self``), if any."""
    frame = sys._getframe(2)
    while frame is not None:
        kernel = frame.f_locals.get("self")
        if isinstance(kernel, JITFunction):
            return kernel.__name__
        frame = frame.f_back
    return None


class _NoDriver:
    """Triton's active driver where Triton finds none (a machine without a GPU): any use
    (the launch of a kernel compiled for a GPU) raises :func:`compiled_kernel_error`."""

    def __getattr__(self, name: str):
        raise compiled_kernel_error(_launching_kernel())


def explain_compiled_launches() -> None:
    """Where Triton has no GPU driver (the cpu backend on a machine without a GPU), make the
    launch of a kernel defined before ``import iris.mem`` (a compiled-mode kernel) say so,
    instead of Triton's "0 active drivers ([]). There should only be one." (raised by
    ``triton.runtime.driver`` when the launch first asks for the active driver). Nothing
    changes where a GPU driver is active."""
    if not any(backend.driver.is_active() for backend in backends.values()):
        driver.set_active(_NoDriver())
