"""Exceptions raised by :mod:`iris.mem`."""

from __future__ import annotations


class IrisError(RuntimeError):
    """Base class of the errors Iris raises for problems it detects itself."""


class HeapMismatchError(IrisError):
    """Ranks disagree about the symmetric heap (size or allocation sequence)."""


class DeviceWaitTimeout(IrisError):
    """A device-side wait (barrier, flag) gave up after ``IRIS_WAIT_TIMEOUT`` seconds."""


class CallMismatchError(IrisError):
    """Ranks made different calls over one group (another collective or op, element count,
    dtype, reduction, root or variant) where they had to make the same one: the kernels saw
    it on the device and stopped waiting. The message names both calls.

    ``rank`` and ``peer`` are the heap ranks that disagreed; ``mine`` and ``theirs`` the two
    calls as described by the library that made them.
    """

    def __init__(self, message: str, rank: int = -1, peer: int = -1, mine: str = "", theirs: str = ""):
        super().__init__(message)
        self.rank, self.peer, self.mine, self.theirs = rank, peer, mine, theirs


class HeapPointerError(IrisError):
    """A translation that would leave the heap: a rank argument that is not a rank of the
    heap, or a pointer that is not in the calling rank's heap (rank arguments swapped, an
    ordinary tensor, an index past its allocation). Raised for every translation on the
    ``cpu`` backend; compiled kernels check in debug mode (``IRIS_DEBUG``), and trap."""


class UseAfterFreeError(IrisError, ValueError):
    """A tensor passed to Iris lies in a range of the symmetric heap that was freed (debug
    mode checks the tensors Iris's own collectives and ops are given)."""


class AbortedError(IrisError):
    """The symmetric heap was aborted: by :meth:`~iris.mem.SymmetricHeap.abort` (or
    ``iris.ccl.abort``), or because a peer process of the heap exited. Device-side waits of
    the heap stop, and every later use of the heap raises this error.

    ``rank`` is the heap rank of the peer that exited (None for an abort on request);
    ``reason`` says how it ended, or why the heap was aborted.
    """

    def __init__(self, message: str, rank: int | None = None, reason: str = ""):
        super().__init__(message)
        self.rank = rank
        self.reason = reason
