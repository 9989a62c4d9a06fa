"""Device-side signalling of the fused ops: per-tile flags holding call generations, and a
per-call generation counter that resets itself.

Every workspace keeps a small local ``state`` array (int32):

* ``state[GEN]``: generations completed so far. Every program of a call reads it at start
  (:func:`call_generation`), so a call's generation is ``state[GEN] + 1`` on every program of
  every rank (ranks make the same calls with the same workspace).
* ``state[EXITED]``: programs of the running call that have finished. The last one
  (:func:`finish_call`) stores the new generation and zeroes the counters, so nothing is
  reset by the host between calls or CUDA graph replays.
* ``state[CLAIM]``: the next tile to hand out when programs claim tiles dynamically
  (:func:`claim_tile`).

A flag set to generation ``g`` means "the data of call ``g`` is there"; flags only grow, so
a stale flag from an earlier call never satisfies a wait.
"""

import triton
import triton.language as tl

from iris.ccl.triton import record_timeout
from iris.mem.utils import wait_at_least

GEN: tl.constexpr = tl.constexpr(0)
EXITED: tl.constexpr = tl.constexpr(1)
CLAIM: tl.constexpr = tl.constexpr(2)
#: int32 words of a workspace's ``state`` array.
STATE_WORDS = 4


@triton.jit
def call_generation(state):
    """This call's generation (the same on every program and every rank)."""
    return tl.load(state + GEN) + 1


@triton.jit
def finish_call(state, gen):
    """Count this program out; the last program of the call stores ``gen`` and resets the
    counters for the next call. Call it last, after every wait and store of the program."""
    tl.debug_barrier()
    done = tl.atomic_add(state + EXITED, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        tl.atomic_xchg(state + CLAIM, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(state + EXITED, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(state + GEN, gen, sem="release", scope="gpu")


@triton.jit
def claim_tile(state):
    """The next unclaimed tile number of this call (numbers past the last tile mean "done")."""
    return tl.atomic_add(state + CLAIM, 1, sem="relaxed", scope="gpu")


@triton.jit
def signal(ctx, flag, gen, to_rank):
    """Set ``flag`` on ``to_rank`` to ``gen`` once every thread's earlier stores are visible
    there (barrier, then a release atomic at system scope)."""
    tl.debug_barrier()
    ctx.atomic_max(flag, gen, to_rank, sem="release", scope="sys")


@triton.jit
def signal_count(ctx, flag, to_rank):
    """Add one to ``flag`` on ``to_rank`` once every thread's earlier stores are visible
    there: for a flag raised by several programs per call, whose waiters expect
    ``generation x programs`` counts (it only grows, like a generation)."""
    tl.debug_barrier()
    ctx.atomic_add(flag, 1, to_rank, sem="release", scope="sys")


@triton.jit
def wait(ctx, group, flag, gen, peer):
    """Spin (acquire, system scope) until the local ``flag`` reaches ``gen``; record a
    timeout naming ``peer`` (the rank expected to set it) after ``group.budget`` ns.
    Every thread reads after the wait."""
    if wait_at_least(flag, gen, group.budget, group.status, peer) < gen:
        record_timeout(group.status, ctx.rank, peer, flag)
    tl.debug_barrier()


@triton.jit
def remote_tile(ctx, base, rank, origin, offs, ALIGNED: tl.constexpr):
    """Pointers to the tile ``base + origin + offs`` (``offs`` a row-major ``[rows, cols]``
    block from :func:`~iris.ops._gemm.tile_offsets`) in ``rank``'s heap. Translation hides
    the pointers' alignment from the compiler; with ``ALIGNED`` (the base, the row stride and
    ``origin`` are multiples of 16 bytes) it is declared again, so the tile moves in 16-byte
    vector accesses instead of one element at a time."""
    ptrs = ctx.translate(base, rank) + origin + offs
    if ALIGNED:
        ptrs = tl.max_contiguous(tl.multiple_of(ptrs, [1, 16]), [1, offs.shape[1]])
    return ptrs


@triton.jit
def wait_exits(ctx, group, exits, gen, slot, programs, GROUP: tl.constexpr, ME: tl.constexpr):
    """Wait until program ``slot`` of every other member has left the previous call
    (``exits[s, slot]`` raised by :func:`raise_exits` to ``gen - 1``): its reads of this
    program's earlier pushes are done, so they may be overwritten. Replaces a barrier where
    only workspace buffers are written remotely: the flag is normally set long before, and
    a local read costs no round trip and does not wait for the peers to enter the call."""
    for s in tl.static_range(GROUP - 1):
        peer = group.rank((ME + 1 + s) % GROUP)
        wait(ctx, group, exits + s * programs + slot, gen - 1, peer)


@triton.jit
def raise_exits(ctx, group, exits, gen, slot, programs, GROUP: tl.constexpr, ME: tl.constexpr):
    """Tell program ``slot`` of every other member that this one has left call ``gen``
    (every thread's reads of the workspace done: barrier, then release at system scope).
    Member ``ME`` is slot ``(ME - peer - 1) mod GROUP`` of peer ``peer``'s ``exits``."""
    tl.debug_barrier()
    for i in tl.static_range(1, GROUP):
        peer = (ME + i) % GROUP
        s = (ME - peer - 1 + GROUP) % GROUP
        ctx.atomic_max(exits + s * programs + slot, gen, group.rank(peer), sem="release", scope="sys")
