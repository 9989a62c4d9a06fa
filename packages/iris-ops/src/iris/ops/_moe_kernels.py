"""The kernels of ``moe_dispatch`` and ``moe_combine`` (:mod:`iris.ops.moe`) and of their
gradients (:mod:`iris.ops._moe_grad`), built from named parts (:mod:`iris.ops._moe_parts`).

Experts are split evenly and contiguously over the ``G`` members of the group: expert ``e``
lives on member ``e // L``, which holds ``L = E // G`` local experts.

**Dispatch** (:func:`_moe_dispatch_kernel`), on every rank at once:

1. Each program counts the expert ids of its share of this rank's ``(token, slot)`` pairs
   and publishes the histogram to the other programs of its rank (a local flag per program)
   (``count_experts``, ``rank_counts``).
2. Program 0 stores the rank's histogram (``E`` counts, and whether an id was out of range)
   into a box of every member, as flag-in-data lines (:mod:`iris.ccl.triton.ll`: the data
   beside the call's generation in every 8-byte word; two banks by the call's parity)
   (``send_counts``). A rank's counts also tell its peers that it has entered the call, so
   its receive buffer may be written.
3. Every program reads the ``G`` histograms of its rank's boxes (``read_counts``). From
   them every rank knows the layout of every member's output: rows ordered by local expert,
   then source rank, then token, then slot (``row_layout``, which also stores the counts
   and offsets per local expert). So a sender computes the final position of each of its
   rows in the receiver's output itself, and every rank knows whether any member would
   receive more rows than the capacity (then no row moves anywhere, and the error is
   recorded).
4. Each program walks its tokens (``send_token``): it stores each token's row once into
   the output of every rank holding one of its experts (at the position of the first slot
   going there), and for every slot the position that row landed at (``origin``), then
   raises a counter on every member (release, system scope). Float8 rows travel as bytes
   with their block scales beside them, or are quantized here first (``send_row``).
5. Once every member's programs have raised this rank's counter, the rows routed twice or
   more to this rank are replicated locally from where they landed (``replicate_rows``).

**Combine** (:func:`_moe_combine_kernel`): every rank stores each received row back into the
``back`` buffer of the rank and slot it came from, and raises a counter on every member
(:func:`_return_rows`); then, for each of its tokens, it sums the rows of its slots, weighted,
in fp32 (fp64 for fp64 rows) (:func:`_weighted_sum`).

Buffers are safe to reuse without a barrier: a sender writes a receiver's output only after
it has the receiver's counts of the same call, which the receiver sends after its previous
work on the stream; and a rank overwrites a peer's ``back`` buffer only after the next
dispatch's counts from every rank, sent after each rank's previous combine had read it.
Hence every combine must follow its own dispatch (one combine per dispatch).

**Gradients** run in a workspace of their own, in any order (autograd decides it), so each
call starts with a handshake instead (:func:`_all_counted` on ``enter``: every program of every member has
entered this call, hence finished reading the buffers in the previous one). The gradient of
dispatch is a combine with weight 1 of the rows' gradients (:func:`_moe_combine_kernel` with
``ENTER``); that of combine with respect to ``expert_out`` is ``w[t, k] * grad_y[t]``
stored at each slot's row on its expert's rank (:func:`_moe_scatter_kernel`).
"""

import triton
import triton.language as tl

from iris.mem.triton.group import enter_group

from ._moe_parts import _HEAD as HEAD
from ._moe_parts import (
    ERR_SHORT_OUTPUT,
    count_experts,
    pick,
    rank_counts,
    read_counts,
    record,
    replicate_rows,
    row_layout,
    send_counts,
    send_token,
)
from ._sync import call_generation, finish_call, signal_count, wait


@triton.jit
def _moe_dispatch_kernel(
    context, members, sync_flags, epochs, status, budget, state,
    x, x_scales, idx, positions, counts, offsets, tokens, scales, origin, source, boxes, hist, ready, bad,
    arrive, meta, errors,
    T, H, stride_x, stride_s, capacity,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, E: tl.constexpr,
    K: tl.constexpr, EP: tl.constexpr, KP: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    HINT: tl.constexpr, SCALES: tl.constexpr, SP: tl.constexpr, QDTYPE: tl.constexpr,
):  # fmt: skip
    """One dispatch (module docstring). ``x`` ``[T, H]`` (row stride ``stride_x``), ``idx``
    ``[T, K]`` expert ids; writes ``positions`` ``[T, K]`` (int32: each slot's row in its
    rank's output, -1 for none), ``counts`` and ``offsets`` (int64 rows per local expert and
    their exclusive prefix sum, ``L + 1``) and ``meta`` (rows received, whether a member
    overflowed); ``tokens`` ``[capacity, H]`` and ``origin`` ``[capacity]`` receive, and
    ``scales`` ``[capacity, H / 128]`` with ``SCALES`` (``x_scales``: row stride
    ``stride_s``). ``boxes``: two banks of ``GROUP`` boxes of ``HEAD + EP`` lines;
    ``hist``/``ready``/``bad``: per-program histograms, their flags and out-of-range ids;
    ``arrive``: int64 counters per member."""
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    gen = call_generation(state)
    programs = tl.num_programs(0)
    per = tl.cdiv(T, programs)
    t0 = pid * per
    t1 = tl.minimum(T, t0 + per)
    # 1. This program's histogram, then the rank's (ids out of range count as none).
    histogram, bad_count, bad_id = count_experts(idx, t0, t1, K, E, EP, BLOCK_S)
    total, before, bad_count, bad_id = rank_counts(
        ctx, group, hist, bad, ready, gen, pid, programs, histogram, bad_count, bad_id, EP
    )
    # 2. The counts to every member: the bank of this call's parity (a member one call
    #    ahead writes the other bank).
    bank = boxes + (gen & 1).to(tl.int64) * GROUP * (HEAD + EP)
    if pid == 0:
        send_counts(ctx, group, bank, total, bad_count, bad_id, T, gen, GROUP, ME, EP)
    # 3. Every member's counts: the layout of every member's output.
    group_counts, counts_before, over = read_counts(
        ctx, group, bank, errors, gen, pid, capacity, K, E, EP, GROUP, ME
    )
    next_row, received, over = row_layout(
        counts, offsets, meta, errors, pid, group_counts, counts_before, before, over, capacity, E, EP,
        GROUP, ME,
    )  # fmt: skip
    # 4. This program's tokens: each row once to every rank holding one of its experts.
    t = t0
    while t < t1:
        next_row = send_token(
            ctx, group, x, x_scales, idx, positions, tokens, scales, origin, source, next_row, t, over, H,
            stride_x, stride_s, E, K, EP, KP, GROUP, ME, BLOCK_H, HINT, SCALES, SP, QDTYPE,
        )  # fmt: skip
        t += 1
    # 5. Every member's rows have landed here: replicate the rows of slots that share one.
    _all_counted(ctx, group, arrive, gen, programs, GROUP, ME)
    if over == 0:
        replicate_rows(tokens, scales, origin, pid, programs, received, H, BLOCK_H, SCALES, SP)
    finish_call(state, gen)


# --------------------------------------------------------------------------- combine parts


@triton.jit
def _all_counted(ctx, group, counters, gen, programs, GROUP: tl.constexpr, ME: tl.constexpr):
    """Count this program on every member (``counters[ME]`` there, released after every
    thread's stores), then wait until every program of every member has counted here in
    call ``gen`` (``gen x programs`` in each member's counter): their stores are visible."""
    for j in tl.static_range(GROUP):
        signal_count(ctx, counters + ME, group.rank(j))
    for q in tl.static_range(GROUP):
        wait(ctx, group, counters + q, gen.to(tl.int64) * programs, group.rank(q))


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
            record(errors, ERR_SHORT_OUTPUT, ME, received, n_out)
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
def _token_slots(idx, weights, row, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, ACC: tl.constexpr):
    """Token ``row``'s ``KP`` slots (past ``K``: none): ``(expert ids, whether each has an
    expert (int32), weights in ACC)``."""
    slots = tl.arange(0, KP)
    ids = tl.load(idx + row * K + slots, mask=slots < K, other=-1).to(tl.int64)
    valid = ((ids >= 0) & (ids < E)).to(tl.int32)
    return ids, valid, tl.load(weights + row * K + slots, mask=slots < K, other=0).to(ACC)


@triton.jit
def _weighted_sum(idx, weights, y, back, pid, programs, over, T, H, stride_y, E: tl.constexpr,
                  K: tl.constexpr, KP: tl.constexpr, BLOCK_H: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """Tokens ``pid, pid + programs, ...``: ``y[t] = sum_k weights[t, k] * back[t * K + k]``
    in ``ACC`` over the slots with an expert (zeros where the dispatch moved no row: ``over``)."""
    slots = tl.arange(0, KP)
    t = pid
    while t < T:
        row = t.to(tl.int64)
        _, valid, w = _token_slots(idx, weights, row, E, K, KP, ACC)
        h0 = 0
        while h0 < H:
            offs = h0 + tl.arange(0, BLOCK_H)
            hm = offs < H
            acc = tl.zeros([BLOCK_H], ACC)
            if over == 0:
                for k in tl.static_range(K):
                    if pick(valid, slots, k) != 0:
                        v = tl.load(back + (row * K + k) * H + offs, mask=hm, other=0)
                        acc += pick(w, slots, k) * v.to(ACC)
            tl.store(y + row * stride_y + offs, acc.to(y.dtype.element_ty), mask=hm)
            h0 += BLOCK_H
        t += programs


@triton.jit
def _moe_combine_kernel(
    context, members, sync_flags, epochs, status, budget, state,
    expert_out, weights, idx, y, back, source, enter, done, short, meta, errors,
    T, H, n_out, stride_e, stride_y,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, E: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_H: tl.constexpr, HINT: tl.constexpr, ACC: tl.constexpr,
    ENTER: tl.constexpr,
):  # fmt: skip
    """One combine (module docstring): row ``i`` of ``expert_out`` goes back to the rank and
    slot ``source[i]`` names, into its ``back`` buffer (``[capacity, H]``); then ``y[t] =
    sum_k weights[t, k] * back[t * K + k]`` in ``ACC`` over the slots with an expert.
    ``meta``: what the dispatch recorded (rows received, whether a member overflowed);
    ``done``: int64 counters per member; ``short``: the generation of the last call in which
    a member's ``expert_out`` had fewer rows than it received. With ``ENTER`` (a gradient's
    workspace), the call first waits for every member to enter it (``enter`` counters)."""
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    gen = call_generation(state)
    programs = tl.num_programs(0)
    received = tl.load(meta)
    over = tl.load(meta + 1)
    if ENTER:  # every member has entered, so has finished reading its buffers in the last call
        _all_counted(ctx, group, enter, gen, programs, GROUP, ME)
    # 1. Every received row back to the slot it came from.
    _return_rows(
        ctx, group, expert_out, back, source, short, errors, gen, pid, programs, received, over, n_out, H,
        stride_e, GROUP, ME, BLOCK_H, HINT,
    )  # fmt: skip
    _all_counted(ctx, group, done, gen, programs, GROUP, ME)
    if pid == 0:
        for q in tl.static_range(GROUP):
            if q != ME:
                if tl.load(short + q, volatile=True) == gen:
                    record(errors, ERR_SHORT_OUTPUT, q, -1, -1)
    # 2. This rank's tokens: the weighted sum of their experts' rows.
    _weighted_sum(idx, weights, y, back, pid, programs, over, T, H, stride_y, E, K, KP, BLOCK_H, ACC)
    finish_call(state, gen)


# --------------------------------------------------------------------------- combine's gradient


@triton.jit
def _scatter_slots(ctx, group, grad_y, weights, idx, positions, rows, pid, programs, T, H, stride_g,
                   E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, GROUP: tl.constexpr,
                   BLOCK_H: tl.constexpr, HINT: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """Tokens ``pid, pid + programs, ...``: for each slot with an expert, ``weights[t, k] *
    grad_y[t]`` (in ``ACC``, rounded once) into ``rows`` at row ``positions[t, k]`` of the
    expert's rank."""
    L: tl.constexpr = E // GROUP
    slots = tl.arange(0, KP)
    t = pid
    while t < T:
        row = t.to(tl.int64)
        ids, valid, w = _token_slots(idx, weights, row, E, K, KP, ACC)
        at = tl.load(positions + row * K + slots, mask=slots < K, other=0).to(tl.int64)
        h0 = 0
        while h0 < H:
            offs = h0 + tl.arange(0, BLOCK_H)
            hm = offs < H
            g = tl.load(grad_y + row * stride_g + offs, mask=hm, other=0).to(ACC)
            for k in tl.static_range(K):
                if pick(valid, slots, k) != 0:
                    to = group.rank((pick(ids, slots, k) // L).to(tl.int32))
                    value = (pick(w, slots, k) * g).to(rows.dtype.element_ty)
                    ctx.store(rows + pick(at, slots, k) * H + offs, value, to, mask=hm, hint=HINT)
            h0 += BLOCK_H
        t += programs


@triton.jit
def _moe_scatter_kernel(
    context, members, sync_flags, epochs, status, budget, state,
    grad_y, weights, idx, positions, rows, out, enter, done, meta,
    T, H, n_out, stride_g, stride_o,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, E: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_H: tl.constexpr, HINT: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """The gradient of a combine with respect to ``expert_out``: ``out[row(t, k)] =
    weights[t, k] * grad_y[t]`` on the expert's rank for every slot with an expert
    (``positions``: the rows the dispatch gave them), zeros in the rows of ``out``
    (``[n_out, H]``) past the rows received (``meta``: the dispatch's rows received and
    whether it overflowed; then every row is zero). ``rows``: the workspace's receive buffer."""
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    gen = call_generation(state)
    programs = tl.num_programs(0)
    received = tl.load(meta)
    over = tl.load(meta + 1)
    # every member has entered, so has finished reading its buffers in the last call
    _all_counted(ctx, group, enter, gen, programs, GROUP, ME)
    if over == 0:
        _scatter_slots(
            ctx, group, grad_y, weights, idx, positions, rows, pid, programs, T, H, stride_g, E, K, KP, GROUP,
            BLOCK_H, HINT, ACC,
        )  # fmt: skip
    _all_counted(ctx, group, done, gen, programs, GROUP, ME)
    # Every member's rows are here: copy them out, zeros past the rows received.
    kept = tl.where(over == 0, received, 0)
    i = pid.to(tl.int64)
    while i < n_out:
        h0 = 0
        while h0 < H:
            offs = h0 + tl.arange(0, BLOCK_H)
            hm = offs < H
            v = tl.load(rows + i * H + offs, mask=hm & (i < kept), other=0)
            tl.store(out + i * stride_o + offs, v, mask=hm)
            h0 += BLOCK_H
        i += programs
    finish_call(state, gen)
