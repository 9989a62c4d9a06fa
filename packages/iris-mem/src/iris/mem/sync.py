"""Device-side barrier across the ranks of a heap (stream-ordered, graph-capturable)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .triton import ops
from .utils import record_timeout, wait_at_least

if TYPE_CHECKING:
    from .heap import SymmetricHeap


@triton.jit
def _device_barrier_kernel(
    flags,
    epoch_ptr,
    status,
    heap_bases,
    budget,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
):
    """One program: bump the local generation, publish it in every peer's ``flags[RANK]``
    (release, system scope), then wait (acquire) until every ``flags[peer]`` here has
    reached it. After ``budget`` ns of waiting for a peer (``IRIS_WAIT_TIMEOUT``), record
    ``[1, RANK, peer, flag address]`` in ``status`` and return."""
    epoch = tl.load(epoch_ptr) + 1
    # Every thread has read the old generation before one thread stores the new one (a warp
    # reading after the store would wait for a generation nobody publishes).
    tl.debug_barrier()
    tl.store(epoch_ptr, epoch)
    for peer in tl.static_range(WORLD):
        ops.atomic_max(flags + RANK, epoch, RANK, peer, heap_bases, sem="release", scope="sys")
    for peer in tl.static_range(WORLD):
        if wait_at_least(flags + peer, epoch, budget) < epoch:
            record_timeout(status, RANK, peer, flags + peer)


def launch_device_barrier(heap: SymmetricHeap, budget: int) -> None:
    """Queue the barrier kernel for ``heap`` on the current stream."""
    _device_barrier_kernel[(1,)](
        heap._barrier_flags,
        heap._barrier_epoch,
        heap._status,
        heap.get_heap_bases(),
        budget,
        RANK=heap.rank,
        WORLD=heap.world_size,
    )
