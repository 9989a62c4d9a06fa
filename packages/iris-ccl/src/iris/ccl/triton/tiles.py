"""Tile collectives: the bodies of iris.ccl's collectives, callable from a user's kernel.

Each function moves one tile (a block of offsets ``offs`` with ``mask``) and synchronises
through ``group.sync(ctx, slot)``; ``slot`` must be the same on every member for the same
tile and distinct between tiles in flight (a kernel that owns its tile loop passes the
program id, or a tile counter below the communicator's slot count). Pointers are given in
this rank's heap and translated by ``ctx``.
"""

import triton
import triton.language as tl

from iris.mem.utils import global_timer, keep_waiting

from .accumulate import average, convert
from .sync import combine, record_timeout, thread_fence


@triton.jit
def reduce_tile(
    ctx, group, src, offs, mask, OP: tl.constexpr = "sum", ACC_FP32: tl.constexpr = True,
    HINT: tl.constexpr = None,
):  # fmt: skip
    """Reduction of ``src[offs]`` over the members (pulled from each heap, in member order,
    so every rank computes bitwise the same result). Returns the accumulator (fp32 for
    floating types when ``ACC_FP32``); AVG is divided by the group size. (Masked lanes of
    the reductions' loads read ``0.0``, a float: Triton's interpreter cannot cast an integer
    to float8.)"""
    acc = ctx.load(src + offs, group.rank(0), mask=mask, other=0.0, hint=HINT)
    if ACC_FP32:
        acc = convert(acc, tl.float32)
    for i in tl.static_range(1, group.size):
        x = ctx.load(src + offs, group.rank(i), mask=mask, other=0.0, hint=HINT)
        if ACC_FP32:
            x = convert(x, tl.float32)
        acc = combine(acc, x, OP)
    if OP == "avg":
        acc = average(acc, group.size)
    return acc


@triton.jit
def all_reduce_one_shot(
    ctx, group, src, dst, offs, mask, slot, OP: tl.constexpr = "sum", ACC_FP32: tl.constexpr = True,
    SYNC: tl.constexpr = True, HINT: tl.constexpr = None,
):  # fmt: skip
    """Barrier, pull and reduce the tile from every member, barrier, store to the local
    ``dst`` (which may be ``src``, and need not be on the heap).

    With ``SYNC=False`` the barriers are left to the caller, who runs one barrier before
    and one after its whole tile loop (a persistent kernel); ``dst`` must then not alias
    ``src`` (a member may still read the tile). ``HINT`` (16 when every address is 16-byte
    aligned) keeps remote accesses vectorised after translation."""
    if SYNC:
        group.sync(ctx, slot)
    acc = reduce_tile(ctx, group, src, offs, mask, OP, ACC_FP32, HINT)
    if SYNC:
        group.sync(ctx, slot)
    tl.store(dst + offs, convert(acc, dst.dtype.element_ty), mask=mask)


@triton.jit
def store_everywhere(ctx, group, ptr, x, mask, HINT: tl.constexpr = None):
    """Store ``x`` at ``ptr`` (a heap address) on every member, this one first, the others in
    ring order from it (so the members do not all write the same peer at once)."""
    for i in tl.static_range(group.size):
        ctx.store(ptr, x, group.rank((group.index + i) % group.size), mask=mask, hint=HINT)


@triton.jit
def store_chunks(
    ctx, group, src, src_stride, dst, offs, mask, ME: tl.constexpr, GROUP: tl.constexpr, HINT: tl.constexpr
):
    """Store chunk ``j`` of ``src`` (chunks ``src_stride`` elements apart) at ``dst + offs``
    on member ``j``, for every member but this one, starting after it (each member begins
    with a different peer, so no link is every member's first target)."""
    for k in tl.static_range(1, GROUP):
        j = (ME + k) % GROUP
        x = tl.load(src + tl.cast(j, tl.int64) * src_stride + offs, mask=mask)
        ctx.store(dst + offs, x, group.rank(j), mask=mask, hint=HINT)


@triton.jit
def all_reduce_two_shot(
    ctx, group, src, dst, offs, mask, slot, owner, OP: tl.constexpr = "sum",
    ACC_FP32: tl.constexpr = True, SYNC: tl.constexpr = True, HINT: tl.constexpr = None,
):  # fmt: skip
    """Member ``owner`` reduces the tile and pushes it into every member's ``dst`` (on the
    heap); the others only take part in the barriers. ``SYNC=False``: the caller runs the
    barriers around its tile loop (``dst`` may alias ``src``: only the owner touches a tile)."""
    if SYNC:
        group.sync(ctx, slot)
    if owner == group.index:
        acc = convert(reduce_tile(ctx, group, src, offs, mask, OP, ACC_FP32, HINT), dst.dtype.element_ty)
        store_everywhere(ctx, group, dst + offs, acc, mask, HINT)
    if SYNC:
        group.sync(ctx, slot)


@triton.jit
def all_reduce_ring(
    ctx, group, src, part, dst, base, n, slot, BLOCK: tl.constexpr, OP: tl.constexpr = "sum",
    ACC_FP32: tl.constexpr = True,
):  # fmt: skip
    """Ring all-reduce of ``group.size`` consecutive tiles of ``BLOCK`` starting at element
    ``base`` (of ``n``): reduce-scatter then all-gather between neighbours, a barrier per
    step. Partial sums travel through ``part`` (on the heap, in the accumulation dtype: an
    fp32 buffer for half and float8 types, else ``dst`` itself); ``src`` and ``dst`` are on the heap and
    ``dst`` may be ``src``."""
    left = group.rank((group.index + group.size - 1) % group.size)
    lanes = tl.arange(0, BLOCK)
    group.sync(ctx, slot)
    for s in tl.static_range(group.size - 1):
        offs = base + ((group.index + 2 * group.size - 1 - s) % group.size) * BLOCK + lanes
        mask = offs < n
        if s == 0:
            theirs = ctx.load(src + offs, left, mask=mask, other=0.0)
        else:
            theirs = ctx.load(part + offs, left, mask=mask, other=0.0)
        mine = tl.load(src + offs, mask=mask, other=0.0)
        if ACC_FP32:
            partial = combine(convert(theirs, tl.float32), convert(mine, tl.float32), OP)
        else:
            partial = combine(theirs, mine, OP)
        if s == group.size - 2:
            if OP == "avg":
                partial = average(partial, group.size)
            tl.store(dst + offs, convert(partial, dst.dtype.element_ty), mask=mask)
        else:
            tl.store(part + offs, partial.to(part.dtype.element_ty), mask=mask)
        group.sync(ctx, slot)
    for s in tl.static_range(group.size - 1):
        offs = base + ((group.index + group.size - s) % group.size) * BLOCK + lanes
        mask = offs < n
        tl.store(dst + offs, ctx.load(dst + offs, left, mask=mask, other=0.0), mask=mask)
        group.sync(ctx, slot)


@triton.jit
def all_reduce_atomic(ctx, group, src, acc, offs, mask, slot):
    """SUM into every member's accumulator ``acc`` (heap, accumulation dtype) with atomics:
    zero the local tile, barrier, add, barrier."""
    x = convert(tl.load(src + offs, mask=mask, other=0.0), acc.dtype.element_ty)
    tl.store(acc + offs, tl.zeros_like(x), mask=mask)
    group.sync(ctx, slot)
    for i in tl.static_range(group.size):
        ctx.atomic_add(
            acc + offs, x, group.rank((group.index + i) % group.size), mask=mask, sem="relaxed", scope="sys"
        )
    group.sync(ctx, slot)


@triton.jit
def all_reduce_spinlock(ctx, group, src, acc, offs, mask, lock, slot):
    """SUM into every member's accumulator ``acc`` by read-add-write under the member's
    ``lock`` (int32 on the heap, 0 when free): zero the local tile, barrier, add, barrier.
    Every thread fences (system scope) after the lock is taken and before it is released:
    one thread's acquire and release order only what a CTA barrier made visible, and the
    next holder on another GPU must see all of this tile's stores. A lock not obtained
    within the budget is recorded as a timeout."""
    x = convert(tl.load(src + offs, mask=mask, other=0.0), acc.dtype.element_ty)
    tl.store(acc + offs, tl.zeros_like(x), mask=mask)
    group.sync(ctx, slot)
    for i in tl.static_range(group.size):
        peer = group.rank((group.index + i) % group.size)
        held = ctx.atomic_cas(lock, 0, 1, peer, sem="acquire", scope="sys")
        start = global_timer()
        while (held != 0) & keep_waiting(start, group.budget, group.status, peer):
            held = ctx.atomic_cas(lock, 0, 1, peer, sem="acquire", scope="sys")
        if held == 0:
            tl.debug_barrier()
            thread_fence()  # no thread reads the accumulator before the lock is held
            old = ctx.load(acc + offs, peer, mask=mask, other=0.0, volatile=True)
            ctx.store(acc + offs, old + x, peer, mask=mask)
            thread_fence()  # every thread's stores are performed before the release
            tl.debug_barrier()
            ctx.atomic_xchg(lock, 0, peer, sem="release", scope="sys")
        else:
            record_timeout(group.status, ctx.rank, peer, ctx.translate(lock, peer))
    group.sync(ctx, slot)


@triton.jit
def all_gather_push(
    ctx, group, src, dst, offs, mask, n_per_rank, slot, SYNC: tl.constexpr = True, HINT: tl.constexpr = None
):
    """Store the local tile ``src[offs]`` into every member's ``dst`` (on the heap) at
    ``index * n_per_rank + offs``, between two barriers: the first keeps a member's ``dst``
    untouched until it has entered the collective (it may still be reading the previous
    result), the second makes every member's tiles visible. ``src`` is read locally only
    and may be ``dst``'s own chunk (in-place all-gather). ``SYNC=False``: the caller runs
    the barriers around its tile loop."""
    x = tl.load(src + offs, mask=mask)
    at = dst + tl.cast(group.index, tl.int64) * n_per_rank
    if SYNC:
        group.sync(ctx, slot)
    store_everywhere(ctx, group, at + offs, x, mask, HINT)
    if SYNC:
        group.sync(ctx, slot)


@triton.jit
def all_gather_pull(
    ctx, group, src, dst, offs, mask, n_per_rank, slot, src_per_rank=0, SYNC: tl.constexpr = True,
    HINT: tl.constexpr = None,
):  # fmt: skip
    """Barrier, load the tile ``src[offs]`` (on the heap) of every member ``i`` into the
    local ``dst`` at ``i * n_per_rank + offs`` (``dst`` need not be on the heap), barrier
    (so no member changes its ``src`` while another still reads it). Member ``i``'s tile is
    read at ``src + i * src_per_rank``: 0 when every member's input is at the same heap
    offset; ``n_per_rank`` with ``src`` = ``dst`` for an in-place all-gather on the heap
    (each member's input is its own chunk of ``dst``). ``SYNC=False``: the caller runs the
    barriers around its tile loop."""
    if SYNC:
        group.sync(ctx, slot)
    for k in tl.static_range(group.size):
        i = (group.index + k) % group.size
        x = ctx.load(src + tl.cast(i, tl.int64) * src_per_rank + offs, group.rank(i), mask=mask, hint=HINT)
        tl.store(dst + tl.cast(i, tl.int64) * n_per_rank + offs, x, mask=mask)
    if SYNC:
        group.sync(ctx, slot)


@triton.jit
def reduce_scatter_pull(
    ctx, group, src, dst, offs, mask, n_per_rank, slot, OP: tl.constexpr = "sum",
    ACC_FP32: tl.constexpr = True, SYNC: tl.constexpr = True, HINT: tl.constexpr = None,
):  # fmt: skip
    """Barrier, reduce chunk ``index`` of ``src`` (on the heap, chunks ``n_per_rank``
    apart) over the members with :func:`reduce_tile`, barrier, store the tile into the local
    ``dst`` (which may alias this rank's chunk of ``src``: no member reads that chunk of
    this rank). ``SYNC=False``: the caller runs the barriers around its tile loop."""
    if SYNC:
        group.sync(ctx, slot)
    acc = reduce_tile(
        ctx, group, src + tl.cast(group.index, tl.int64) * n_per_rank, offs, mask, OP, ACC_FP32, HINT
    )
    if SYNC:
        group.sync(ctx, slot)
    tl.store(dst + offs, convert(acc, dst.dtype.element_ty), mask=mask)


@triton.jit
def reduce_scatter_push(
    ctx, group, src, dst, ws, offs, mask, n_per_rank, ws_per_rank, slot, OP: tl.constexpr = "sum",
    ACC_FP32: tl.constexpr = True, HINT: tl.constexpr = None,
):  # fmt: skip
    """Barrier (every member's workspace is free), push chunk ``j`` of the local ``src``
    (chunks ``n_per_rank`` apart) into member ``j``'s workspace ``ws`` (on the heap, slots
    ``ws_per_rank`` apart) at slot ``index``, barrier, reduce the ``size`` slots of the
    local workspace in member order (bitwise the same as :func:`reduce_scatter_pull`) and
    store the tile into the local ``dst``. A persistent kernel runs the two halves itself:
    :func:`reduce_scatter_push_send` over its tiles, a barrier, then
    :func:`reduce_scatter_push_reduce` over its tiles."""
    group.sync(ctx, slot)
    reduce_scatter_push_send(ctx, group, src, ws, offs, mask, n_per_rank, ws_per_rank, HINT)
    group.sync(ctx, slot)
    reduce_scatter_push_reduce(group, dst, ws, offs, mask, ws_per_rank, OP, ACC_FP32)


@triton.jit
def reduce_scatter_push_send(
    ctx, group, src, ws, offs, mask, n_per_rank, ws_per_rank, HINT: tl.constexpr = None
):
    """First half of :func:`reduce_scatter_push` (no barrier): push chunk ``j`` of the local
    tile into member ``j``'s workspace at slot ``index``."""
    at = ws + tl.cast(group.index, tl.int64) * ws_per_rank
    for k in tl.static_range(group.size):
        j = (group.index + k) % group.size
        x = tl.load(src + tl.cast(j, tl.int64) * n_per_rank + offs, mask=mask)
        ctx.store(at + offs, x, group.rank(j), mask=mask, hint=HINT)


@triton.jit
def reduce_scatter_push_reduce(
    group, dst, ws, offs, mask, ws_per_rank, OP: tl.constexpr = "sum", ACC_FP32: tl.constexpr = True
):
    """Second half of :func:`reduce_scatter_push` (no barrier): reduce the local workspace
    slots of the tile in member order into the local ``dst``."""
    own = ws + tl.cast(group.index, tl.int64) * ws_per_rank
    acc = reduce_slots(own, ws, ws_per_rank, offs, mask, group.index, group.size, OP, ACC_FP32)
    tl.store(dst + offs, convert(acc, dst.dtype.element_ty), mask=mask)


@triton.jit
def reduce_slots(
    own, slots, stride, offs, mask, ME: tl.constexpr, GROUP: tl.constexpr, OP: tl.constexpr = "sum",
    ACC_FP32: tl.constexpr = True,
):  # fmt: skip
    """Local reduction of one tile over the members, in member order (bitwise the same as
    :func:`reduce_tile`): member ``i``'s data is at ``own + offs`` for ``i == ME`` and at
    ``slots + i * stride + offs`` otherwise (the contributions a push-based collective has
    stored into this rank's memory). Returns the accumulator; AVG is divided by ``GROUP``."""
    acc = tl.load((own if ME == 0 else slots) + offs, mask=mask, other=0.0)
    if ACC_FP32:
        acc = convert(acc, tl.float32)
    for i in tl.static_range(1, GROUP):
        x = tl.load((own if i == ME else slots + tl.cast(i, tl.int64) * stride) + offs, mask=mask, other=0.0)
        if ACC_FP32:
            x = convert(x, tl.float32)
        acc = combine(acc, x, OP)
    if OP == "avg":
        acc = average(acc, GROUP)
    return acc


@triton.jit
def all_to_all_push(
    ctx, group, src, dst, offs, mask, src_per_rank, dst_per_rank, slot, SYNC: tl.constexpr = True,
    HINT: tl.constexpr = None,
):  # fmt: skip
    """Barrier, store chunk ``j`` of the local ``src`` (chunks ``src_per_rank`` apart) into
    member ``j``'s ``dst`` (on the heap, chunks ``dst_per_rank`` apart) at chunk ``index``,
    barrier. ``src`` must not overlap ``dst``. ``SYNC=False``: the caller runs the barriers
    around its tile loop."""
    at = dst + tl.cast(group.index, tl.int64) * dst_per_rank
    if SYNC:
        group.sync(ctx, slot)
    for k in tl.static_range(group.size):
        j = (group.index + k) % group.size
        x = tl.load(src + tl.cast(j, tl.int64) * src_per_rank + offs, mask=mask)
        ctx.store(at + offs, x, group.rank(j), mask=mask, hint=HINT)
    if SYNC:
        group.sync(ctx, slot)


@triton.jit
def all_to_all_pull(
    ctx, group, src, dst, offs, mask, src_per_rank, dst_per_rank, slot, SYNC: tl.constexpr = True,
    HINT: tl.constexpr = None,
):  # fmt: skip
    """Barrier, load chunk ``index`` of member ``j``'s ``src`` (on the heap, chunks
    ``src_per_rank`` apart) into chunk ``j`` of the local ``dst`` (chunks ``dst_per_rank``
    apart), barrier. ``src`` must not overlap ``dst``. ``SYNC=False``: the caller runs the
    barriers around its tile loop."""
    at = src + tl.cast(group.index, tl.int64) * src_per_rank
    if SYNC:
        group.sync(ctx, slot)
    for k in tl.static_range(group.size):
        j = (group.index + k) % group.size
        x = ctx.load(at + offs, group.rank(j), mask=mask, hint=HINT)
        tl.store(dst + tl.cast(j, tl.int64) * dst_per_rank + offs, x, mask=mask)
    if SYNC:
        group.sync(ctx, slot)


# --------------------------------------------------------------------------- rooted collectives


@triton.jit
def broadcast_pull(ctx, group, src, dst, offs, mask, root, slot):
    """Broadcast of one tile from member ``root`` (a group index, not a global rank):
    barrier, every other member loads ``src[offs]`` from ``root``'s heap into its local
    ``dst`` (which may be ``src``, and need not be on the heap), barrier (so ``root`` may
    change ``src`` afterwards). ``root``'s ``dst`` is not touched."""
    group.sync(ctx, slot)
    if group.index != root:
        x = ctx.load(src + offs, group.rank(root), mask=mask)
        tl.store(dst + offs, x, mask=mask)
    group.sync(ctx, slot)


@triton.jit
def reduce_pull(
    ctx, group, src, dst, offs, mask, root, slot, OP: tl.constexpr = "sum", ACC_FP32: tl.constexpr = True
):
    """Reduction of one tile to member ``root``: barrier, ``root`` reduces ``src[offs]`` (on
    the heap) over the members with :func:`reduce_tile` (bitwise the same as the
    all-reduces) and stores it into its local ``dst`` (which may be ``src``, and need not be
    on the heap), barrier. The other members' ``dst`` is not touched."""
    group.sync(ctx, slot)
    if group.index == root:
        acc = reduce_tile(ctx, group, src, offs, mask, OP, ACC_FP32)
        tl.store(dst + offs, convert(acc, dst.dtype.element_ty), mask=mask)
    group.sync(ctx, slot)


@triton.jit
def scatter_push(ctx, group, src, dst, offs, mask, n_per_rank, root, slot):
    """Scatter of one tile from member ``root``: barrier (every member's ``dst`` is free),
    ``root`` stores chunk ``i`` of its local ``src`` (chunks ``n_per_rank`` apart, any
    memory) into member ``i``'s ``dst[offs]`` (on the heap) for every member ``i``, barrier.
    ``src`` is read on ``root`` only."""
    group.sync(ctx, slot)
    if group.index == root:
        for k in tl.static_range(group.size):
            i = (group.index + k) % group.size
            x = tl.load(src + tl.cast(i, tl.int64) * n_per_rank + offs, mask=mask)
            ctx.store(dst + offs, x, group.rank(i), mask=mask)
    group.sync(ctx, slot)


@triton.jit
def gather_pull(ctx, group, src, dst, offs, mask, n_per_rank, root, slot):
    """Gather of one tile to member ``root``: barrier, ``root`` loads ``src[offs]`` (on the
    heap) of every member ``i`` into chunk ``i`` of its local ``dst`` (chunks ``n_per_rank``
    apart, any memory), barrier (so no member changes ``src`` while ``root`` reads it).
    ``dst`` is written on ``root`` only."""
    group.sync(ctx, slot)
    if group.index == root:
        for k in tl.static_range(group.size):
            i = (group.index + k) % group.size
            x = ctx.load(src + offs, group.rank(i), mask=mask)
            tl.store(dst + tl.cast(i, tl.int64) * n_per_rank + offs, x, mask=mask)
    group.sync(ctx, slot)
