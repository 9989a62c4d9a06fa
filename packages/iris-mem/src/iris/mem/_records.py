"""The symmetric heap's allocation records: what is live where, scopes, and the checks that
every rank allocates and frees alike.

The heap hands out byte ranges through a deterministic first-fit allocator
(:mod:`iris.mem._alloc`). :class:`AllocationTable` keeps one :class:`Allocation` per live,
non-empty allocation (the caller's number for it, offset, size, shape, dtype), the frames of
the open ``heap.scope()`` blocks, and in debug mode compares every rank's allocation and free
sequence over the heap's group. It deals in byte offsets only: the heap turns them into
tensors and tensors back into offsets.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from ._alloc import ALIGNMENT, FirstFit, MemoryStats
from .bootstrap import exchange
from .errors import HeapMismatchError

#: ``Allocation.index`` of the heap's own bookkeeping (sync flags): not numbered, not checked
#: across ranks in debug mode, in no scope.
INTERNAL = -1


@dataclasses.dataclass(eq=False)
class Allocation:
    """One live allocation: where it is, what it holds, and its place in the sequence.

    ``eq=False``: two allocations are the same only when they are the same object, whatever
    their fields hold.
    """

    index: int  #: the caller's allocation number, from 0; :data:`INTERNAL` for the heap's own
    offset: int  #: bytes from the start of the heap
    nbytes: int  #: bytes requested (the allocator rounds them up to ``ALIGNMENT``)
    shape: tuple[int, ...]
    dtype: torch.dtype
    live: bool = True
    kept: bool = False  #: made inside ``heap.unscoped()``: a buffer a library keeps for itself

    def describe(self) -> str:
        what = f"allocation #{self.index}" if self.index != INTERNAL else "internal allocation"
        return f"{what} at offset {self.offset}, {self.nbytes} bytes, shape {list(self.shape)}, {self.dtype}"


#: Where a tensor lies on the heap: ``(first byte, one past the last byte)`` as offsets from
#: the heap's base, or None when it is not on the heap (the heap's ``_locate``).
Locate = Callable[[torch.Tensor], tuple[int, int] | None]


def _nowhere(tensor: torch.Tensor) -> None:
    """A closed heap holds no tensor."""
    return None


class AllocationTable:
    """Allocation records of one rank's heap of ``heap_size`` bytes.

    :param rank: this rank (for messages).
    :param group: the heap's process group, over which debug mode compares the ranks.
    :param debug: compare every rank's allocations and frees (``IRIS_DEBUG``).
    :param locate: how the heap finds a tensor's bytes (see :data:`Locate`).
    """

    def __init__(
        self, heap_size: int, rank: int, group: dist.ProcessGroup | None, debug: bool, locate: Locate
    ):
        self.allocator = FirstFit(heap_size, ALIGNMENT)
        self._rank = rank
        self._group = group
        self._debug = debug
        self._locate = locate
        self._records: dict[int, Allocation] = {}  # offset -> live allocation (non-empty ones)
        self._allocations = 0  # the caller's allocations so far (numbers them)
        self._frees = 0  # the caller's frees so far (numbers them in debug checks)
        self._scopes: list[list[Allocation]] = []  # one frame per open heap.scope(), innermost last
        self._unscoped = 0  # depth of heap.unscoped() blocks: their allocations join no scope

    # ------------------------------------------------------------------ allocating
    def forget_heap(self) -> None:
        """Drop the heap's ``locate`` (a bound method of the heap: a cycle) once it is closed."""
        self._locate = _nowhere

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, internal: bool = False) -> Allocation:
        """Room for a tensor of ``shape`` and ``dtype``: the caller's next allocation, or
        (``internal``) one of the heap's own, left out of the numbering, of the debug check
        and of scopes. Empty tensors take no room: they sit at offset 0.

        :raises MemoryError: no free range is large enough (sizes in the message).
        :raises HeapMismatchError: debug mode, and the ranks asked for different things.
        """
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        if nbytes > self.allocator.size:
            offset = None
        else:
            offset = self.allocator.allocate(nbytes) if nbytes else 0
        if offset is None:
            raise MemoryError(
                f"symmetric heap exhausted on rank {self._rank}: requested {nbytes} bytes "
                f"(shape {list(shape)}, {dtype}); {self.stats().summary()}. {self._owners()}. Memory comes "
                "back only through heap.free(), heap.scope() and heap.close() (dropping a tensor frees "
                "nothing); free what you no longer need, or pass a larger heap_size to iris.mem.init()"
            )
        if not internal and self._debug:
            try:
                self._check_sequence(offset, nbytes, shape, dtype)
            except BaseException:
                if nbytes:
                    self.allocator.release(offset, undo=True)
                raise
        index = INTERNAL if internal else self._allocations
        record = Allocation(
            index, offset, nbytes, tuple(shape), dtype, kept=not internal and self._unscoped > 0
        )
        if nbytes:
            self._records[offset] = record
            if not internal and self._scopes and not self._unscoped:
                self._scopes[-1].append(record)
        if not internal:  # internal allocations come first on every rank: the numbers still agree
            self._allocations += 1
        return record

    def undo(self, offset: int) -> None:
        """Take back the caller's allocation just made at ``offset`` (a factory whose fill
        failed), as if it had not been made."""
        self._allocations -= 1
        record = self._records.pop(offset, None)
        if record is not None:
            record.live = False
            self.allocator.release(record.offset, undo=True)

    def release(self, records: Sequence[Allocation]) -> None:
        """Give ``records`` back to the allocator, on this rank only (the caller synchronised)."""
        for record in records:
            record.live = False
            del self._records[record.offset]
            self.allocator.release(record.offset)

    def stats(self) -> MemoryStats:
        return self.allocator.stats()

    def _owners(self) -> str:
        """Whose the bytes in use are (aligned sizes): the caller's, those libraries keep, and
        the heap's own; for the message of an exhausted heap (a walk over every record)."""
        totals = {"yours": [0, 0], "kept": [0, 0], "own": [0, 0]}
        for record in self._records.values():
            owner = "own" if record.index == INTERNAL else "kept" if record.kept else "yours"
            totals[owner][0] += self.allocator.length(record.offset)
            totals[owner][1] += 1
        (yours, n_yours), (kept, n_kept), (own, n_own) = totals.values()
        allocations = "allocation" if n_yours == 1 else "allocations"
        return (
            f"Of the bytes in use, {yours} bytes in {n_yours} {allocations} of yours, {kept} bytes in "
            f"{n_kept} that libraries keep (made in heap.unscoped(), such as iris.ops' workspaces) and {own} "
            f"bytes in {n_own} of the heap's own (the sync flags of its device barrier and of collectives)"
        )

    # ------------------------------------------------------------------ finding records
    def owner(self, start: int, end: int) -> Allocation | None:
        """The live allocation holding all of bytes ``[start, end)`` (offsets), or None."""
        offset = self.allocator.owner(start, end)
        return None if offset is None else self._records.get(offset)

    def records_of(self, tensors: Sequence[torch.Tensor], what: str) -> list[Allocation]:
        """The live allocations ``tensors`` start, checked (and, in debug mode, agreed by
        every rank before any is given back). ``what`` names the call in messages."""
        records: list[Allocation] = []
        problem: Exception | None = None
        for i, tensor in enumerate(tensors):
            if not isinstance(tensor, torch.Tensor):
                problem = TypeError(f"{what}: argument {i} is a {type(tensor).__name__}, not a heap tensor")
                break
            span = self._locate(tensor)
            if span is None:
                problem = ValueError(f"{what}: argument {i} is not on this symmetric heap")
                break
            if tensor.numel() == 0 or tensor.element_size() == 0:
                continue  # empty tensors hold no space
            record = self._records.get(span[0])
            if record is None or self.owner(*span) is not record:
                problem = ValueError(
                    f"{what}: argument {i} ({list(tensor.shape)}, {tensor.dtype}) does not start a live "
                    "allocation of this heap: it was freed already, or it is a view that does not begin "
                    "where its allocation does (pass the tensor the factory returned)"
                )
                break
            if record in records:
                problem = ValueError(f"{what}: argument {i} frees the same allocation twice")
                break
            records.append(record)
        if self._debug:
            self._check_frees(records, problem)
        if problem is not None:
            raise problem
        return records

    # ------------------------------------------------------------------ scopes
    def open_scope(self) -> list[Allocation]:
        """A frame that collects the caller's allocations until :meth:`close_scope`."""
        frame: list[Allocation] = []
        self._scopes.append(frame)
        return frame

    def close_scope(self, frame: list[Allocation]) -> list[Allocation]:
        """Stop collecting into ``frame``; returns its allocations still live, newest first."""
        # By identity: frames are lists, and two empty ones are equal (list.remove would take
        # the outer frame of an empty scope inside an empty scope).
        self._scopes = [f for f in self._scopes if f is not frame]
        return [r for r in reversed(frame) if r.live]

    @contextlib.contextmanager
    def unscoped(self) -> Iterator[None]:
        """Allocations made inside join no open scope."""
        self._unscoped += 1
        try:
            yield
        finally:
            self._unscoped -= 1

    # ------------------------------------------------------------------ debug checks
    def _check_sequence(self, offset: int, nbytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        entry = (self._allocations, offset, nbytes, tuple(shape), str(dtype))
        entries = exchange(self._group, "heap allocation", entry, HeapMismatchError)
        if len(set(entries)) != 1:
            table = "; ".join(
                f"rank {r}: allocation #{e[0]} at offset {e[1]}, {e[2]} bytes, shape {list(e[3])}, {e[4]}"
                for r, e in enumerate(entries)
            )
            raise HeapMismatchError(
                "ranks allocated different sequences on the symmetric heap (IRIS_DEBUG); every rank must "
                f"allocate the same shapes and dtypes in the same order: {table}"
            )

    def _check_frees(self, records: list[Allocation], problem: Exception | None) -> None:
        # Exchanged even when this rank found a problem: the peers must not wait for it, and
        # they learn which rank refused what.
        entry = f"error: {problem}" if problem is not None else [r.describe() for r in records]
        entries = exchange(self._group, "heap free", (self._frees, entry), HeapMismatchError)
        self._frees += 1
        if len({repr(e) for e in entries}) != 1:
            table = "; ".join(
                f"rank {r}: free #{n} of " + (e if isinstance(e, str) else ", ".join(e) or "nothing")
                for r, (n, e) in enumerate(entries)
            )
            raise HeapMismatchError(
                "ranks freed different allocations of the symmetric heap (IRIS_DEBUG); every rank must free "
                f"the same allocations in the same order: {table}"
            )
