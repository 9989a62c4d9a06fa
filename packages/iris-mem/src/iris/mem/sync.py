"""Device-side barrier across the ranks of a heap (stream-ordered, graph-capturable)."""

import triton
import triton.language as tl

from .triton.context import Context
from .triton.sync import group_sync


@triton.jit
def device_barrier_kernel(
    context, members, flags, epochs, status, budget,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr,
):  # fmt: skip
    """One program: the barrier of sync slot 0 of the heap's :class:`~iris.mem.runtime.SyncState`
    (every rank of the heap): publish the next generation to every peer (release, system
    scope), wait (acquire) until every peer has published it. A wait longer than the budget
    records a timeout in ``status``."""
    ctx = Context.initialize(context, RANK, WORLD)
    group_sync(ctx, members, flags, epochs, status, budget, 0, GROUP, ME)
