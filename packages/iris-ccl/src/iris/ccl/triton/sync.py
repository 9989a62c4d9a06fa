"""Per-program synchronisation of a group of ranks, with generation counters.

Every program ``p`` of a collective kernel on every member rank owns slot ``p``: a local
generation counter ``epochs[p]`` and one flag per member, ``flags[p, i]``, written by member
``i``. :func:`group_sync` bumps the generation, publishes it in every member's
``flags[p, ME]`` (release, system scope) and waits (acquire) until all of its own
``flags[p, :]`` have reached it. Generations only grow and every member runs the same
sequence of launches, so nothing needs resetting between calls or CUDA graph replays.
"""

import triton
import triton.language as tl


@triton.jit
def group_sync(ctx, members, flags, epochs, status, budget, slot, GROUP: tl.constexpr, ME: tl.constexpr):
    """Barrier of program ``slot`` with the same program on every member rank.

    :param ctx: the kernel's :class:`iris.mem.triton.Context`.
    :param members: pointer to the members' heap ranks (int32, ``GROUP`` entries).
    :param flags: ``[slots, GROUP]`` int32 on the heap; ``epochs``: ``[slots]`` int32 on the heap.
    :param status: int64 ``[4]`` on the heap: ``[code, rank, peer, flag address]`` of a timeout.
    :param budget: spin iterations per peer before giving up.
    """
    tl.debug_barrier()  # every thread's earlier writes happen before the release below
    epoch = tl.load(epochs + slot) + 1
    tl.store(epochs + slot, epoch)
    row = flags + slot * GROUP
    for i in tl.static_range(GROUP):
        ctx.atomic_max(row + ME, epoch, tl.load(members + i), sem="release", scope="sys")
    for i in tl.static_range(GROUP):
        seen = tl.atomic_add(row + i, 0, sem="acquire", scope="sys")
        spins = epoch * 0
        while (seen < epoch) & (spins < budget):
            seen = tl.atomic_add(row + i, 0, sem="acquire", scope="sys")
            spins += 1
        if seen < epoch:
            record_timeout(status, ctx.rank, tl.load(members + i), row + i)
    tl.debug_barrier()  # every thread reads after the acquire above


@triton.jit
def record_timeout(status, rank, peer, flag):
    """Record ``[TIMEOUT, rank, peer, flag address]`` in ``status`` unless an error is
    already recorded there (the host raises it as ``DeviceWaitTimeout``). Scalars are made
    with ``tl.cast`` (no layout needed), so Gluon kernels compile this too."""
    code = tl.cast(1, tl.int64)
    if tl.atomic_cas(status, code - 1, code, sem="relaxed", scope="gpu") == 0:
        tl.store(status + 1, tl.cast(rank, tl.int64))
        tl.store(status + 2, peer.to(tl.int64))
        tl.store(status + 3, flag.to(tl.int64, bitcast=True))


@triton.jit
def combine(acc, x, OP: tl.constexpr):
    """``acc (op) x`` for OP "sum"/"avg" (add), "max" or "min"."""
    if OP == "max":
        return tl.maximum(acc, x)
    elif OP == "min":
        return tl.minimum(acc, x)
    else:
        return acc + x
