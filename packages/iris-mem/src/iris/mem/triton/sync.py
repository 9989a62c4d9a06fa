"""Per-program barriers of a group of ranks, with generation counters.

Every program ``p`` of a kernel on every member rank owns slot ``p`` of a
:class:`iris.mem.runtime.SyncState`: a local generation counter ``epochs[p]`` and one flag
per member, ``flags[p, i]``, written by member ``i``. :func:`group_sync` bumps the
generation, publishes it in every other member's ``flags[p, ME]`` (release, system scope)
and waits (acquire) until the peers' entries of its own ``flags[p, :]`` have reached it (its
own entry is never written). Generations only grow and every member runs the same sequence
of launches, so nothing needs resetting between calls or CUDA graph replays.
"""

import triton
import triton.language as tl

from .. import settings
from ..utils import record_mismatch, record_timeout, wait_at_least

if settings.interpreted():

    @triton.jit
    def thread_fence():
        """Interpreter: programs run one at a time in program order; nothing to fence."""
        pass

    @triton.jit
    def enter_launch(PDL: tl.constexpr):
        """Interpreter: launches run one after another; nothing to wait for."""
        pass

else:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def enter_launch(PDL: tl.constexpr):
        """Start of a kernel launched with programmatic dependent launch (``PDL``): wait
        until the launch before it in the stream has completed and its memory operations
        are visible (``griddepcontrol.wait``), then let the launch after it start its
        programs now (``griddepcontrol.launch_dependents``), so that they are resident and
        waiting here when this one ends, instead of being launched then (1-2 us between
        consecutive kernels of a CUDA graph on H200). Nothing may touch memory before it."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

    @triton.jit
    def thread_fence():
        """``fence.acq_rel.sys`` in every thread: the thread's earlier loads and stores are
        performed (at system scope) before any later memory operation. A scalar release by
        one thread after a CTA barrier orders only what that barrier made visible; remote
        loads still in flight in other warps (whose values are not consumed yet) could
        otherwise be overtaken by a peer that already saw the release."""
        tl.inline_asm_elementwise("fence.acq_rel.sys;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def group_sync(
    ctx,
    members,
    flags,
    epochs,
    status,
    budget,
    slot,
    GROUP: tl.constexpr,
    ME: tl.constexpr,
    FENCE: tl.constexpr = False,
    sig=0,
):
    """Barrier of program ``slot`` with the same program on every member rank, which also
    checks that every member is making the same call.

    :param ctx: the kernel's :class:`iris.mem.triton.Context`.
    :param members: pointer to the members' heap ranks (int32, ``GROUP`` entries).
    :param flags: the rows of the sync slots on the heap, int32 ``[slots, 3 * GROUP]``: a
        flag per member, then two call signatures per member (by the parity of the
        generation); ``epochs``: ``[slots]`` int32 on the heap.
    :param status: int64 ``[4]`` on the heap: ``[code, rank, peer, detail]`` of a timeout or
        mismatch.
    :param budget: nanoseconds to wait for each peer before giving up (``IRIS_WAIT_TIMEOUT``).
    :param FENCE: fence every thread first (``fence.acq_rel.sys``, 2-3 us on H200). Not
        needed for ordering: the CTA barrier and the releasing thread's system-scope release
        order every thread's earlier loads and stores (remote ones included) before the
        peers see the flag, the pattern torch symm_mem's barriers use too. Off by default.
    :param sig: this call's signature (int32; 0 where the caller checks nothing): published
        with the flag and compared with each peer's once the peer's flag has arrived; a
        different one is recorded (:func:`iris.mem.utils.record_mismatch`). Kept by the
        parity of the generation: a peer cannot publish two generations ahead, so the
        signature read is the one of this generation.

    A group of one (``GROUP == 1``) compiles to nothing.
    """
    if GROUP > 1:  # a group of one has nobody to wait for or publish to
        if FENCE:
            thread_fence()
        tl.debug_barrier()  # every thread's earlier loads and stores come before the release below
        epoch = tl.load(epochs + slot, volatile=True) + 1  # not a stale L1 line: no fence may precede
        # Every thread has read the old generation before one thread stores the new one: a
        # warp reading after that store would take the next generation as its own (threads of
        # one program disagreeing on the generation: on H200, waits that ran to the budget).
        tl.debug_barrier()
        tl.store(epochs + slot, epoch)
        row = flags + slot * (3 * GROUP)
        signatures = row + GROUP + (epoch & 1)
        # Published to the peers only: nobody reads this member's own entry (releasing it
        # and waiting for it cost a local atomic round on the path of every barrier). The
        # signature is stored before the flag's release, which orders it.
        for i in tl.static_range(GROUP):
            if i != ME:
                peer = tl.load(members + i)
                ctx.store(signatures + 2 * ME, tl.cast(sig, tl.int32), peer)
                ctx.atomic_max(row + ME, epoch, peer, sem="release", scope="sys")
        for i in tl.static_range(GROUP):
            if i != ME:
                if wait_at_least(row + i, epoch, budget, status, tl.load(members + i)) < epoch:
                    record_timeout(status, ctx.rank, tl.load(members + i), row + i)
                else:
                    theirs = tl.load(signatures + 2 * i, volatile=True)
                    if theirs != sig:
                        record_mismatch(status, ctx.rank, tl.load(members + i), sig, theirs)
        tl.debug_barrier()  # every thread reads after the acquire above


__all__ = ["enter_launch", "group_sync", "thread_fence"]
