"""Exceptions raised by :mod:`iris.mem`."""

from __future__ import annotations


class IrisError(RuntimeError):
    """Base class of the errors Iris raises for problems it detects itself."""


class HeapMismatchError(IrisError):
    """Ranks disagree about the symmetric heap (size or allocation sequence)."""


class DeviceWaitTimeout(IrisError):
    """A device-side wait (barrier, flag) gave up after ``IRIS_WAIT_TIMEOUT`` seconds."""


class HeapPointerError(IrisError):
    """A translated pointer falls outside the target rank's heap (debug mode)."""


class UseAfterFreeError(IrisError, ValueError):
    """A tensor passed to Iris lies in a range of the symmetric heap that was freed (debug
    mode checks the tensors Iris's own collectives and ops are given)."""
