"""The kernels of ``moe_dispatch`` and ``moe_combine`` (:mod:`iris.ops.moe`), built from named
parts.

Experts are split evenly and contiguously over the ``G`` members of the group: expert ``e``
lives on member ``e // L``, which holds ``L = E // G`` local experts.

**Dispatch** (:func:`_moe_dispatch_kernel`), on every rank at once:

1. Each program counts the expert ids of its share of this rank's ``(token, slot)`` pairs
   and publishes the histogram to the other programs of its rank (a local flag per program)
   (:func:`_count_experts`, :func:`_rank_counts`).
2. Program 0 stores the rank's histogram (``E`` counts, and whether an id was out of range)
   into a box of every member, as flag-in-data lines (:mod:`iris.ccl.triton.ll`: the data
   beside the call's generation in every 8-byte word; two banks by the call's parity)
   (:func:`_send_counts`). A rank's counts also tell its peers that it has entered the
   call, so its receive buffer may be written.
3. Every program reads the ``G`` histograms of its rank's boxes (:func:`_read_counts`). From
   them every rank knows the layout of every member's output: rows ordered by local expert,
   then source rank, then token, then slot (:func:`_row_layout`). So a sender computes the
   final position of each of its rows in the receiver's output itself, and every rank knows
   whether any member would receive more rows than the capacity (then no row moves
   anywhere, and the error is recorded).
4. Each program walks its tokens (:func:`_send_token`): it stores each token's row once into
   the output of every rank holding one of its experts (at the position of the first slot
   going there), and for every slot the position that row landed at (``origin``), then
   raises a counter on every member (release, system scope).
5. Once every member's programs have raised this rank's counter, the rows routed twice or
   more to this rank are replicated locally from where they landed
   (:func:`_replicate_rows`).

**Combine** (:func:`_moe_combine_kernel`): every rank stores each received row back into the
``back`` buffer of the rank and slot it came from, and raises a counter on every member
(:func:`_return_rows`); then, for each of its tokens, it sums the rows of its slots, weighted,
in fp32 (:func:`_weighted_sum`).

Buffers are safe to reuse without a barrier: a sender writes a receiver's output only after
it has the receiver's counts of the same call, which the receiver sends after its previous
work on the stream; and a rank overwrites a peer's ``back`` buffer only after the next
dispatch's counts from every rank, sent after each rank's previous combine had read it.
Hence every combine must follow its own dispatch (one combine per dispatch).
"""

import triton
import triton.language as tl

from iris.ccl.triton import ll
from iris.mem.triton.group import enter_group
from iris.mem.utils import record_timeout, wait_at_least

from ._sync import call_generation, finish_call, signal_count, wait

#: Error codes a kernel records in a workspace's ``errors`` words ``[code, rank, a, b]``:
#: a member would receive more rows than the capacity (``a`` rows, capacity ``b``), an
#: expert id out of range (``a``, with ``b`` experts), an ``expert_out`` shorter than the
#: rows received (``a`` received, ``b`` given; -1, -1 as seen by the other members).
ERR_CAPACITY: tl.constexpr = tl.constexpr(1)
ERR_EXPERT_ID: tl.constexpr = tl.constexpr(2)
ERR_SHORT_OUTPUT: tl.constexpr = tl.constexpr(3)
#: Lines before the counts in a member's box: [ids out of range, the low and high half of
#: one of them, the member's token count], padded to 16 so that the counts start on a whole
#: 16-line group (128 bytes) and the lines leave in 16-byte vector stores.
BOX_HEAD = 16
_HEAD: tl.constexpr = tl.constexpr(BOX_HEAD)
#: Sentinel of the search for an out-of-range id: below (above) every int64 expert id read.
_NONE_BELOW: tl.constexpr = tl.constexpr(-(1 << 62))
_NONE_ABOVE: tl.constexpr = tl.constexpr(1 << 62)


# --------------------------------------------------------------------------- small helpers


@triton.jit
def _record(errors, code, rank, a, b):
    """Record ``[code, rank, a, b]`` in the int64 ``errors`` words unless one is recorded
    (the compare-and-swap of the code elects one writer; the host reads after the kernel)."""
    if tl.atomic_cas(errors, tl.cast(0, tl.int64), tl.cast(code, tl.int64), sem="relaxed", scope="gpu") == 0:
        tl.store(errors + 1, tl.cast(rank, tl.int64))
        tl.store(errors + 2, tl.cast(a, tl.int64))
        tl.store(errors + 3, tl.cast(b, tl.int64))


@triton.jit
def _pick(vec, ak, k):
    """Element ``k`` of the small vector ``vec`` (indices ``ak``) as a scalar."""
    return tl.sum(tl.where(ak == k, vec, 0))


# --------------------------------------------------------------------------- dispatch parts


@triton.jit
def _count_experts(idx, t0, t1, K: tl.constexpr, E: tl.constexpr, EP: tl.constexpr, BLOCK_S: tl.constexpr):
    """``(histogram, out of range, one of them)``: rows per expert (``EP`` counts, past ``E``
    zero) of the slots of tokens ``t0 .. t1`` (``idx``: ``K`` expert ids per token, -1 for
    none), the number of ids out of range (counted as none) and one of those ids."""
    experts = tl.arange(0, EP)
    histogram = tl.zeros([EP], tl.int32)
    bad_count = tl.zeros([], tl.int32)
    bad_id = tl.zeros([], tl.int64)
    n = t0.to(tl.int64) * K
    end = t1.to(tl.int64) * K
    while n < end:
        offs = n + tl.arange(0, BLOCK_S)
        m = offs < end
        ids = tl.load(idx + offs, mask=m, other=-1).to(tl.int64)
        out_of_range = m & ((ids < -1) | (ids >= E))
        n_out_of_range = tl.sum(out_of_range.to(tl.int32))
        if n_out_of_range > 0:  # the first block's largest wrong id (its smallest if none is larger)
            bad_id = tl.where(bad_count == 0, tl.max(tl.where(out_of_range, ids, _NONE_BELOW)), bad_id)
            bad_id = tl.where(bad_id == _NONE_BELOW, tl.min(tl.where(out_of_range, ids, _NONE_ABOVE)), bad_id)
            bad_count += n_out_of_range
        expert = tl.where(out_of_range, -1, ids).to(tl.int32)
        histogram += tl.sum((expert[:, None] == experts[None, :]).to(tl.int32), axis=0)
        n += BLOCK_S
    return histogram, bad_count, bad_id


@triton.jit
def _rank_counts(ctx, group, hist, bad, ready, gen, pid, programs, histogram, bad_count, bad_id,
                 EP: tl.constexpr):  # fmt: skip
    """Publish this program's ``histogram`` and out-of-range ids to the rank's other
    programs, and sum theirs: ``(total, before, out of range, one of them)``, ``total`` the
    rank's histogram and ``before`` that of the programs before this one."""
    experts = tl.arange(0, EP)
    tl.store(hist + pid * EP + experts, histogram)
    tl.store(bad + 2 * pid, bad_count.to(tl.int64))
    tl.store(bad + 2 * pid + 1, bad_id)
    # Every thread's stores first (CTA barrier), then the flag with release: the readers are
    # programs of this GPU, so GPU scope suffices.
    tl.debug_barrier()
    tl.atomic_max(ready + pid, gen, sem="release", scope="gpu")
    total = tl.zeros([EP], tl.int32)
    before = tl.zeros([EP], tl.int32)
    p = 0
    while p < programs:
        if wait_at_least(ready + p, gen, group.budget, group.status) < gen:
            record_timeout(group.status, ctx.rank, ctx.rank, ready + p)
        # volatile: written by other programs while this one runs (ordered by the acquire wait)
        theirs = tl.load(hist + p * EP + experts, volatile=True)
        total += theirs
        before += tl.where(p < pid, theirs, 0)
        their_bad_count = tl.load(bad + 2 * p, volatile=True)
        their_bad_id = tl.load(bad + 2 * p + 1, volatile=True)
        bad_id = tl.where((bad_count == 0) & (their_bad_count > 0), their_bad_id, bad_id)
        bad_count += their_bad_count.to(tl.int32)
        p += 1
    return total, before, bad_count, bad_id


@triton.jit
def _send_counts(ctx, group, bank, total, bad_count, bad_id, T, gen, GROUP: tl.constexpr, ME: tl.constexpr,
                 EP: tl.constexpr):  # fmt: skip
    """The rank's box (head: ids out of range, one of them in two halves, ``T``; then the
    ``EP`` counts ``total``) into slot ``ME`` of ``bank`` on every member, this one included,
    as flag-in-data lines carrying ``gen`` (no fence or flag: each line is its own flag)."""
    experts = tl.arange(0, EP)
    head_words = tl.arange(0, _HEAD)
    BOX: tl.constexpr = _HEAD + EP
    low, high = bad_id & 0xFFFFFFFF, bad_id >> 32
    head = tl.where(
        head_words == 0, bad_count, tl.where(head_words == 1, low, tl.where(head_words == 2, high, 0))
    )
    head = tl.where(head_words == 3, T, head)
    head_lines = ll.pack(head.to(tl.int32), gen)
    count_lines = ll.pack(total, gen)
    for j in tl.static_range(GROUP):
        ctx.store(bank + ME * BOX + head_words, head_lines, group.rank(j), hint=16)
        ctx.store(bank + ME * BOX + _HEAD + experts, count_lines, group.rank(j), hint=16)


@triton.jit
def _read_counts(ctx, group, bank, errors, gen, pid, capacity, K: tl.constexpr, E: tl.constexpr,
                 EP: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """Every member's box of this call: ``(group_counts, counts_before, over)``, the
    group's rows per expert, those of the members before this one, and whether a member's
    own slots (its tokens x ``K``, which come back to it in combine) exceed ``capacity``.
    Program 0 records the first such member and every member's out-of-range id."""
    experts = tl.arange(0, EP)
    head_words = tl.arange(0, _HEAD)
    BOX: tl.constexpr = _HEAD + EP
    group_counts = tl.zeros([EP], tl.int32)
    counts_before = tl.zeros([EP], tl.int32)
    over = tl.zeros([], tl.int32)
    for q in tl.static_range(GROUP):
        box = bank + q * BOX
        member_counts = ll.unpack(
            ll.receive(ctx, group, box + _HEAD, experts, experts >= 0, gen, q), tl.int32
        )
        group_counts += member_counts
        if q < ME:
            counts_before += member_counts
        head = ll.unpack(ll.receive(ctx, group, box, head_words, head_words < 4, gen, q), tl.int32)
        if _pick(head, head_words, 3).to(tl.int64) * K > capacity:  # its slots come back to its buffer
            if over == 0:
                if pid == 0:
                    _record(errors, ERR_CAPACITY, q, _pick(head, head_words, 3).to(tl.int64) * K, capacity)
            over = 1
        if pid == 0:
            if _pick(head, head_words, 0) != 0:
                low = _pick(head, head_words, 1).to(tl.int64) & 0xFFFFFFFF
                value = low | (_pick(head, head_words, 2).to(tl.int64) << 32)
                _record(errors, ERR_EXPERT_ID, q, value, E)
    return group_counts, counts_before, over


@triton.jit
def _row_layout(counts, meta, errors, pid, group_counts, counts_before, before, over, capacity,
                E: tl.constexpr, EP: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """From the group's rows per expert: ``(next_row, received, over)``, the position in
    its rank's output of this program's next row for each expert, the rows this rank
    receives, and whether a member would receive more than ``capacity`` (program 0 records
    the first and stores this rank's ``counts`` per local expert and ``meta``)."""
    L: tl.constexpr = E // GROUP
    experts = tl.arange(0, EP)
    owner = experts // L
    rank_start = tl.zeros([EP], tl.int32)
    rows_so_far = tl.zeros([], tl.int32)
    received = tl.zeros([], tl.int32)
    for r in tl.static_range(GROUP):
        in_r = owner == r
        rows = tl.sum(tl.where(in_r, group_counts, 0))
        rank_start = tl.where(in_r, rows_so_far, rank_start)
        rows_so_far += rows
        if rows > capacity:
            if over == 0:
                if pid == 0:
                    _record(errors, ERR_CAPACITY, r, rows, capacity)
            over = 1
        if r == ME:
            received = rows
    # An expert's rows start after the earlier experts of its rank; this program's after
    # those of the members before this one and of this rank's programs before it.
    next_row = tl.cumsum(group_counts, 0) - group_counts - rank_start + counts_before + before
    if pid == 0:
        local = (experts >= ME * L) & (experts < ME * L + L)
        tl.store(counts + (experts - ME * L), group_counts.to(tl.int64), mask=local)
        tl.store(meta, received.to(tl.int64))
        tl.store(meta + 1, over.to(tl.int64))
    return next_row, received, over


@triton.jit
def _send_token(ctx, group, x, idx, positions, tokens, origin, source, next_row, t, over, H, stride_x,
                E: tl.constexpr, K: tl.constexpr, EP: tl.constexpr, KP: tl.constexpr, GROUP: tl.constexpr,
                ME: tl.constexpr, BLOCK_H: tl.constexpr, HINT: tl.constexpr):  # fmt: skip
    """Token ``t``: the position of each slot in its expert's rank's output (``positions``),
    the token's row once into the output of every rank holding one of its experts (at the
    first slot going there, the carrier; ``origin`` of every slot names that row, ``source``
    the slot), unless ``over``. Returns ``next_row`` advanced past the token's rows."""
    L: tl.constexpr = E // GROUP
    experts = tl.arange(0, EP)
    slots = tl.arange(0, KP)
    row = t.to(tl.int64)
    ids = tl.load(idx + row * K + slots, mask=slots < K, other=-1).to(tl.int64)
    valid = (ids >= 0) & (ids < E)
    expert = tl.where(valid, ids, -1).to(tl.int32)
    routed = expert[:, None] == experts[None, :]
    # Slots of one token with the same expert take consecutive rows, in slot order.
    earlier = (expert[:, None] == expert[None, :]) & (slots[None, :] < slots[:, None]) & valid[None, :]
    row_of_slot = tl.sum(tl.where(routed, next_row[None, :], 0), axis=1)
    row_of_slot = row_of_slot + tl.sum(earlier.to(tl.int32), axis=1)
    next_row += tl.sum(routed.to(tl.int32), axis=0)
    dest = tl.where(valid, expert // L, -1)
    # The carrier of each slot: the token's first slot going to the same rank, whose row
    # crosses the link for both.
    same = (dest[:, None] == dest[None, :]) & (slots[None, :] <= slots[:, None]) & valid[None, :]
    carrier = tl.min(tl.where(same, slots[None, :], KP), axis=1)
    carrier_row = tl.sum(tl.where(slots[None, :] == carrier[:, None], row_of_slot[None, :], 0), axis=1)
    carries = valid & (carrier == slots)
    tl.store(positions + row * K + slots, tl.where(valid, row_of_slot, -1), mask=slots < K)
    if over == 0:
        for k in tl.static_range(K):
            if _pick(valid.to(tl.int32), slots, k) != 0:
                to = group.rank(_pick(dest, slots, k))
                ctx.store(origin + _pick(row_of_slot, slots, k), _pick(carrier_row, slots, k), to)
                ctx.store(source + _pick(row_of_slot, slots, k), (row * K + k) | (ME << 32), to)
        h0 = 0
        while h0 < H:
            offs = h0 + tl.arange(0, BLOCK_H)
            hm = offs < H
            xv = tl.load(x + row * stride_x + offs, mask=hm)
            for k in tl.static_range(K):
                if _pick(carries.to(tl.int32), slots, k) != 0:
                    dst = tokens + _pick(row_of_slot, slots, k).to(tl.int64) * H + offs
                    ctx.store(dst, xv, group.rank(_pick(dest, slots, k)), mask=hm, hint=HINT)
            h0 += BLOCK_H
    return next_row


@triton.jit
def _replicate_rows(tokens, origin, pid, programs, received, H, BLOCK_H: tl.constexpr):
    """Rows ``pid, pid + programs, ...`` of the ``received`` rows: a row whose ``origin``
    names another row (a token routed to several experts of this rank crossed the link
    once) is copied from there."""
    i = pid
    while i < received:
        # volatile: stored by peers during this kernel (ordered by the counter waits)
        source_row = tl.load(origin + i, volatile=True)
        if source_row != i:
            h0 = 0
            while h0 < H:
                offs = h0 + tl.arange(0, BLOCK_H)
                hm = offs < H
                v = tl.load(tokens + source_row.to(tl.int64) * H + offs, mask=hm)
                tl.store(tokens + i.to(tl.int64) * H + offs, v, mask=hm)
                h0 += BLOCK_H
        i += programs


@triton.jit
def _moe_dispatch_kernel(
    context, members, sync_flags, epochs, status, budget, state,
    x, idx, positions, counts, tokens, origin, source, boxes, hist, ready, bad, arrive, meta, errors,
    T, H, stride_x, capacity,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, E: tl.constexpr,
    K: tl.constexpr, EP: tl.constexpr, KP: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    HINT: tl.constexpr,
):  # fmt: skip
    """One dispatch (module docstring). ``x`` ``[T, H]`` (row stride ``stride_x``), ``idx``
    ``[T, K]`` expert ids; writes ``positions`` ``[T, K]`` (int32: each slot's row in its
    rank's output, -1 for none), ``counts`` (int64 rows per local expert) and ``meta``
    (rows received, whether a member overflowed); ``tokens`` ``[capacity, H]`` and
    ``origin`` ``[capacity]`` receive. ``boxes``: two banks of ``GROUP`` boxes of
    ``_HEAD + EP`` lines; ``hist``/``ready``/``bad``: per-program histograms, their flags
    and out-of-range ids; ``arrive``: int64 counters per member."""
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    gen = call_generation(state)
    programs = tl.num_programs(0)
    per = tl.cdiv(T, programs)
    t0 = pid * per
    t1 = tl.minimum(T, t0 + per)
    # 1. This program's histogram, then the rank's (ids out of range count as none).
    histogram, bad_count, bad_id = _count_experts(idx, t0, t1, K, E, EP, BLOCK_S)
    total, before, bad_count, bad_id = _rank_counts(
        ctx, group, hist, bad, ready, gen, pid, programs, histogram, bad_count, bad_id, EP
    )
    # 2. The counts to every member: the bank of this call's parity (a member one call
    #    ahead writes the other bank).
    bank = boxes + (gen & 1).to(tl.int64) * GROUP * (_HEAD + EP)
    if pid == 0:
        _send_counts(ctx, group, bank, total, bad_count, bad_id, T, gen, GROUP, ME, EP)
    # 3. Every member's counts: the layout of every member's output.
    group_counts, counts_before, over = _read_counts(
        ctx, group, bank, errors, gen, pid, capacity, K, E, EP, GROUP, ME
    )
    next_row, received, over = _row_layout(
        counts, meta, errors, pid, group_counts, counts_before, before, over, capacity, E, EP, GROUP, ME
    )
    # 4. This program's tokens: each row once to every rank holding one of its experts.
    t = t0
    while t < t1:
        next_row = _send_token(
            ctx, group, x, idx, positions, tokens, origin, source, next_row, t, over, H, stride_x, E, K, EP,
            KP, GROUP, ME, BLOCK_H, HINT,
        )  # fmt: skip
        t += 1
    # 5. Every member's rows have landed here (each program of each member counts once on
    #    every member, with release after its stores): replicate the rows of slots that share one.
    for j in tl.static_range(GROUP):
        signal_count(ctx, arrive + ME, group.rank(j))
    for q in tl.static_range(GROUP):
        wait(ctx, group, arrive + q, gen.to(tl.int64) * programs, group.rank(q))
    if over == 0:
        _replicate_rows(tokens, origin, pid, programs, received, H, BLOCK_H)
    finish_call(state, gen)


# --------------------------------------------------------------------------- combine parts


@triton.jit
def _return_rows(ctx, group, expert_out, back, source, short, errors, gen, pid, programs, received, over,
                 n_out, H, stride_e, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK_H: tl.constexpr,
                 HINT: tl.constexpr):  # fmt: skip
    """Rows ``pid, pid + programs, ...`` of ``expert_out`` back to the rank and slot
    ``source[i]`` names (``rank << 32 | token * K + slot``), into its ``back`` buffer. With
    fewer rows than received (``n_out < received``), program 0 records the error and marks
    ``short`` with ``gen`` on every peer (whose results then read rows never sent)."""
    if over == 0:
        if (received > n_out) & (pid == 0):
            _record(errors, ERR_SHORT_OUTPUT, ME, received, n_out)
            for j in tl.static_range(GROUP):
                if j != ME:
                    # relaxed: read after the counter waits, which order it
                    ctx.atomic_max(short + ME, gen, group.rank(j), sem="relaxed", scope="sys")
        i = pid.to(tl.int64)
        while i < tl.minimum(received, n_out):
            src = tl.load(source + i)
            to = group.rank((src >> 32).to(tl.int32))
            dst = back + (src & 0xFFFFFFFF) * H
            h0 = 0
            while h0 < H:
                offs = h0 + tl.arange(0, BLOCK_H)
                hm = offs < H
                ctx.store(
                    dst + offs, tl.load(expert_out + i * stride_e + offs, mask=hm), to, mask=hm, hint=HINT
                )
                h0 += BLOCK_H
            i += programs


@triton.jit
def _weighted_sum(idx, weights, y, back, pid, programs, over, T, H, stride_y, E: tl.constexpr,
                  K: tl.constexpr, KP: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """Tokens ``pid, pid + programs, ...``: ``y[t] = sum_k weights[t, k] * back[t * K + k]``
    in fp32 over the slots with an expert (zeros where the dispatch moved no row: ``over``)."""
    slots = tl.arange(0, KP)
    t = pid
    while t < T:
        row = t.to(tl.int64)
        ids = tl.load(idx + row * K + slots, mask=slots < K, other=-1).to(tl.int64)
        valid = ((ids >= 0) & (ids < E)).to(tl.int32)
        w = tl.load(weights + row * K + slots, mask=slots < K, other=0).to(tl.float32)
        h0 = 0
        while h0 < H:
            offs = h0 + tl.arange(0, BLOCK_H)
            hm = offs < H
            acc = tl.zeros([BLOCK_H], tl.float32)
            if over == 0:
                for k in tl.static_range(K):
                    if _pick(valid, slots, k) != 0:
                        v = tl.load(back + (row * K + k) * H + offs, mask=hm, other=0)
                        acc += _pick(w, slots, k) * v.to(tl.float32)
            tl.store(y + row * stride_y + offs, acc.to(y.dtype.element_ty), mask=hm)
            h0 += BLOCK_H
        t += programs


@triton.jit
def _moe_combine_kernel(
    context, members, sync_flags, epochs, status, budget, state,
    expert_out, weights, idx, y, back, source, done, short, meta, errors,
    T, H, n_out, stride_e, stride_y,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, E: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_H: tl.constexpr, HINT: tl.constexpr,
):  # fmt: skip
    """One combine (module docstring): row ``i`` of ``expert_out`` goes back to the rank and
    slot ``source[i]`` names, into its ``back`` buffer (``[capacity, H]``); then ``y[t] =
    sum_k weights[t, k] * back[t * K + k]`` in fp32 over the slots with an expert. ``meta``:
    what the dispatch recorded (rows received, whether a member overflowed); ``done``: int64
    counters per member; ``short``: the generation of the last call in which a member's
    ``expert_out`` had fewer rows than it received."""
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    gen = call_generation(state)
    programs = tl.num_programs(0)
    received = tl.load(meta)
    over = tl.load(meta + 1)
    # 1. Every received row back to the slot it came from.
    _return_rows(
        ctx, group, expert_out, back, source, short, errors, gen, pid, programs, received, over, n_out, H,
        stride_e, GROUP, ME, BLOCK_H, HINT,
    )  # fmt: skip
    # Each program of each member counts once on every member after its stores (release).
    for j in tl.static_range(GROUP):
        signal_count(ctx, done + ME, group.rank(j))
    for q in tl.static_range(GROUP):
        wait(ctx, group, done + q, gen.to(tl.int64) * programs, group.rank(q))
        if q != ME:
            if pid == 0:
                if tl.load(short + q, volatile=True) == gen:
                    _record(errors, ERR_SHORT_OUTPUT, q, -1, -1)
    # 2. This rank's tokens: the weighted sum of their experts' rows, in fp32.
    _weighted_sum(idx, weights, y, back, pid, programs, over, T, H, stride_y, E, K, KP, BLOCK_H)
    finish_call(state, gen)
