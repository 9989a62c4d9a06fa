"""The symmetric heap's allocator: deterministic first fit over a sorted free list.

Every rank runs the same allocator on the same sequence of requests, so the same calls give
the same offsets everywhere; nothing here communicates. Requests are rounded up to the
alignment; a request takes the lowest free range that holds it, and a freed range is merged
with free neighbours at once, so the free list never holds two adjacent ranges.
"""

from __future__ import annotations

import bisect
import dataclasses

#: Byte alignment of every allocation of the symmetric heap, and of the heap's size: 256
#: bytes covers 16-byte vector accesses and whole 128-byte cache lines, so no two
#: allocations share a line that one rank's atomics and another's stores would contend for.
ALIGNMENT = 256


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Occupancy of one rank's symmetric heap (:meth:`iris.mem.SymmetricHeap.memory_stats`).

    Byte counts include alignment padding and the heap's own bookkeeping (sync flags). They
    are the same on every rank of a heap used symmetrically.
    """

    #: Bytes of the heap (per rank).
    heap_bytes: int
    #: Bytes held by live allocations.
    in_use_bytes: int
    #: Bytes not held by any allocation (possibly split over several ranges).
    free_bytes: int
    #: The most bytes ever held at once since the heap was created.
    peak_bytes: int
    #: The largest single request that fits now.
    largest_free_bytes: int
    #: Number of free ranges (1 when nothing is fragmented).
    free_ranges: int
    #: Live allocations.
    allocations: int
    #: Allocations made since the heap was created.
    total_allocations: int
    #: Allocations given back since the heap was created.
    total_frees: int

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line for error messages and logs."""
        return (
            f"{self.in_use_bytes} of {self.heap_bytes} bytes in use in {self.allocations} allocations; "
            f"{self.free_bytes} bytes free in {self.free_ranges} ranges, "
            f"the largest {self.largest_free_bytes}; peak {self.peak_bytes}"
        )


class FirstFit:
    """Ranges of ``[0, size)`` handed out by lowest-offset first fit, in multiples of ``alignment``.

    ``allocate`` returns an offset or None when no free range is large enough; ``release``
    takes an offset that ``allocate`` returned and returns its (aligned) size.
    """

    def __init__(self, size: int, alignment: int):
        if size % alignment:
            raise ValueError(f"size {size} is not a multiple of the alignment {alignment}")
        self.size = size
        self.alignment = alignment
        # Free ranges as two parallel sorted lists (starts ascending; lengths beside them).
        self._starts: list[int] = [0] if size else []
        self._lengths: list[int] = [size] if size else []
        self._live: dict[int, int] = {}  # offset -> aligned length
        self._offsets: list[int] = []  # the keys of _live, ascending
        self.in_use = 0
        self.peak = 0
        self.total_allocations = 0
        self.total_frees = 0

    def aligned(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.alignment)) * self.alignment

    def allocate(self, nbytes: int) -> int | None:
        need = self.aligned(nbytes)
        for i, length in enumerate(self._lengths):
            if length >= need:
                offset = self._starts[i]
                if length == need:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] += need
                    self._lengths[i] -= need
                self._live[offset] = need
                bisect.insort(self._offsets, offset)
                self.in_use += need
                self.peak = max(self.peak, self.in_use)
                self.total_allocations += 1
                return offset
        return None

    def owner(self, start: int, end: int) -> int | None:
        """The offset of the live allocation holding bytes ``[start, end)``, or None."""
        i = bisect.bisect_right(self._offsets, start) - 1
        if i < 0:
            return None
        offset = self._offsets[i]
        return offset if end <= offset + self._live[offset] else None

    def length(self, offset: int) -> int | None:
        """Aligned length of the live allocation at ``offset``, or None when there is none."""
        return self._live.get(offset)

    def release(self, offset: int, undo: bool = False) -> int:
        """Free the allocation at ``offset``; ``undo``: as if it had never been made (it
        counts in neither total)."""
        length = self._live.pop(offset)
        del self._offsets[bisect.bisect_left(self._offsets, offset)]
        self.in_use -= length
        if undo:
            self.total_allocations -= 1
        else:
            self.total_frees += 1
        i = bisect.bisect_left(self._starts, offset)
        end = offset + length
        merge_next = i < len(self._starts) and self._starts[i] == end
        merge_prev = i > 0 and self._starts[i - 1] + self._lengths[i - 1] == offset
        if merge_prev and merge_next:
            self._lengths[i - 1] += length + self._lengths[i]
            del self._starts[i], self._lengths[i]
        elif merge_prev:
            self._lengths[i - 1] += length
        elif merge_next:
            self._starts[i] = offset
            self._lengths[i] += length
        else:
            self._starts.insert(i, offset)
            self._lengths.insert(i, length)
        return length

    def free_ranges(self) -> list[tuple[int, int]]:
        """``(start, length)`` of every free range, ascending."""
        return list(zip(self._starts, self._lengths))

    def stats(self) -> MemoryStats:
        return MemoryStats(
            heap_bytes=self.size,
            in_use_bytes=self.in_use,
            free_bytes=self.size - self.in_use,
            peak_bytes=self.peak,
            largest_free_bytes=max(self._lengths, default=0),
            free_ranges=len(self._starts),
            allocations=len(self._live),
            total_allocations=self.total_allocations,
            total_frees=self.total_frees,
        )
