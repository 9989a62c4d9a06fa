"""The named parts of the MoE dispatch kernel (:mod:`iris.ops._moe_kernels` composes them),
the error codes the MoE kernels record, and the float8 block quantization of rows.

Experts are split evenly and contiguously over the ``G`` members of the group: expert ``e``
lives on member ``e // L``, which holds ``L = E // G`` local experts.
"""

import triton
import triton.language as tl

from iris.ccl.triton import convert, ll
from iris.mem.utils import record_timeout, wait_at_least

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
#: How a dispatch moves rows (the kernel's ``SCALES``): as they are; float8 rows with their
#: block scales beside them; rows quantized to float8 in the kernel, scales computed there.
ROWS_ONLY: tl.constexpr = tl.constexpr(0)
WITH_SCALES: tl.constexpr = tl.constexpr(1)
QUANTIZE: tl.constexpr = tl.constexpr(2)
#: Channels per float8 scale.
SCALE_BLOCK = 128
_SCALE_BLOCK: tl.constexpr = tl.constexpr(SCALE_BLOCK)
#: Floor of a block's largest magnitude when its scale is computed: a block of zeros gets a
#: scale above zero (a normal fp32 number on every format), so dividing by it stays finite.
AMAX_FLOOR = 1e-12
_AMAX_FLOOR: tl.constexpr = tl.constexpr(AMAX_FLOOR)


# --------------------------------------------------------------------------- small helpers


@triton.jit
def record(errors, code, rank, a, b):
    """Record ``[code, rank, a, b]`` in the int64 ``errors`` words unless one is recorded
    (the compare-and-swap of the code elects one writer; the host reads after the kernel)."""
    if tl.atomic_cas(errors, tl.cast(0, tl.int64), tl.cast(code, tl.int64), sem="relaxed", scope="gpu") == 0:
        tl.store(errors + 1, tl.cast(rank, tl.int64))
        tl.store(errors + 2, tl.cast(a, tl.int64))
        tl.store(errors + 3, tl.cast(b, tl.int64))


@triton.jit
def pick(vec, ak, k):
    """Element ``k`` of the small vector ``vec`` (indices ``ak``) as a scalar."""
    return tl.sum(tl.where(ak == k, vec, 0))


# --------------------------------------------------------------------------- float8 rows


@triton.jit
def quantize_blocks(xv, QDTYPE: tl.constexpr, BLOCK_H: tl.constexpr):
    """``(bytes, scales)`` of the ``BLOCK_H`` values ``xv`` (masked lanes 0): one fp32 scale
    per block of 128, ``max(amax, floor) / fp8_max``, and the values ``fp8(x / scale)`` as
    uint8 (both divisions rounded to nearest, as IEEE and torch divide; the conversion
    :func:`iris.ccl.triton.convert`'s: to nearest even, saturating, the same bits compiled
    and interpreted)."""
    NB: tl.constexpr = BLOCK_H // _SCALE_BLOCK
    FP8_MAX: tl.constexpr = 448.0 if QDTYPE == tl.float8e4nv else 57344.0
    blocks = tl.reshape(xv.to(tl.float32), [NB, _SCALE_BLOCK])
    amax = tl.maximum(tl.max(tl.abs(blocks), axis=1), _AMAX_FLOOR)
    scale = tl.div_rn(amax, tl.full([NB], FP8_MAX, tl.float32))
    scaled = tl.div_rn(blocks, tl.broadcast_to(scale[:, None], [NB, _SCALE_BLOCK]))
    return tl.reshape(convert(scaled, QDTYPE).to(tl.uint8, bitcast=True), [BLOCK_H]), scale


# --------------------------------------------------------------------------- dispatch parts


@triton.jit
def count_experts(idx, t0, t1, K: tl.constexpr, E: tl.constexpr, EP: tl.constexpr, BLOCK_S: tl.constexpr):
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
def rank_counts(ctx, group, hist, bad, ready, gen, pid, programs, histogram, bad_count, bad_id,
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
def send_counts(ctx, group, bank, total, bad_count, bad_id, T, gen, GROUP: tl.constexpr, ME: tl.constexpr,
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
def read_counts(ctx, group, bank, errors, gen, pid, capacity, K: tl.constexpr, E: tl.constexpr,
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
        if pick(head, head_words, 3).to(tl.int64) * K > capacity:  # its slots come back to its buffer
            if over == 0:
                if pid == 0:
                    record(errors, ERR_CAPACITY, q, pick(head, head_words, 3).to(tl.int64) * K, capacity)
            over = 1
        if pid == 0:
            if pick(head, head_words, 0) != 0:
                low = pick(head, head_words, 1).to(tl.int64) & 0xFFFFFFFF
                value = low | (pick(head, head_words, 2).to(tl.int64) << 32)
                record(errors, ERR_EXPERT_ID, q, value, E)
    return group_counts, counts_before, over


@triton.jit
def row_layout(counts, offsets, meta, errors, pid, group_counts, counts_before, before, over, capacity,
               E: tl.constexpr, EP: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """From the group's rows per expert: ``(next_row, received, over)``, the position in
    its rank's output of this program's next row for each expert, the rows this rank
    receives, and whether a member would receive more than ``capacity`` (program 0 records
    the first and stores this rank's ``counts`` and ``offsets`` per local expert, and
    ``meta``)."""
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
                    record(errors, ERR_CAPACITY, r, rows, capacity)
            over = 1
        if r == ME:
            received = rows
    # An expert's rows start after the earlier experts of its rank; this program's after
    # those of the members before this one and of this rank's programs before it.
    expert_start = tl.cumsum(group_counts, 0) - group_counts - rank_start
    next_row = expert_start + counts_before + before
    if pid == 0:
        local = (experts >= ME * L) & (experts < ME * L + L)
        tl.store(counts + (experts - ME * L), group_counts.to(tl.int64), mask=local)
        tl.store(offsets + (experts - ME * L), expert_start.to(tl.int64), mask=local)
        tl.store(offsets + L, received.to(tl.int64))
        tl.store(meta, received.to(tl.int64))
        tl.store(meta + 1, over.to(tl.int64))
    return next_row, received, over


@triton.jit
def send_row(ctx, group, x, x_scales, tokens, scales, row, stride_x, stride_s, H, carries, rows, dest,
             slots, K: tl.constexpr, BLOCK_H: tl.constexpr, HINT: tl.constexpr, SCALES: tl.constexpr,
             SP: tl.constexpr, QDTYPE: tl.constexpr):  # fmt: skip
    """Row ``row`` of ``x`` into ``tokens`` at row ``rows[k]`` of rank ``dest[k]`` for each
    slot ``k`` that ``carries``; with ``SCALES``, its block scales into ``scales`` there
    too (``WITH_SCALES``: the row of ``x_scales``; ``QUANTIZE``: computed here, the row
    stored as float8 bytes)."""
    n_scales = H // _SCALE_BLOCK
    if SCALES == WITH_SCALES:
        sk = tl.arange(0, SP)
        row_scales = tl.load(x_scales + row * stride_s + sk, mask=sk < n_scales)
        for k in tl.static_range(K):
            if pick(carries.to(tl.int32), slots, k) != 0:
                dst = scales + pick(rows, slots, k).to(tl.int64) * n_scales + sk
                ctx.store(dst, row_scales, group.rank(pick(dest, slots, k)), mask=sk < n_scales)
    h0 = 0
    while h0 < H:
        offs = h0 + tl.arange(0, BLOCK_H)
        hm = offs < H
        xv = tl.load(x + row * stride_x + offs, mask=hm, other=0)
        if SCALES == QUANTIZE:
            xv, block_scales = quantize_blocks(xv, QDTYPE, BLOCK_H)
            blocks = h0 // _SCALE_BLOCK + tl.arange(0, BLOCK_H // _SCALE_BLOCK)
        for k in tl.static_range(K):
            if pick(carries.to(tl.int32), slots, k) != 0:
                to = group.rank(pick(dest, slots, k))
                at = pick(rows, slots, k).to(tl.int64)
                ctx.store(tokens + at * H + offs, xv, to, mask=hm, hint=HINT)
                if SCALES == QUANTIZE:
                    ctx.store(scales + at * n_scales + blocks, block_scales, to, mask=blocks < n_scales)
        h0 += BLOCK_H


@triton.jit
def send_token(ctx, group, x, x_scales, idx, positions, tokens, scales, origin, source, next_row, t, over,
               H, stride_x, stride_s, E: tl.constexpr, K: tl.constexpr, EP: tl.constexpr, KP: tl.constexpr,
               GROUP: tl.constexpr, ME: tl.constexpr, BLOCK_H: tl.constexpr, HINT: tl.constexpr,
               SCALES: tl.constexpr, SP: tl.constexpr, QDTYPE: tl.constexpr):  # fmt: skip
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
            if pick(valid.to(tl.int32), slots, k) != 0:
                to = group.rank(pick(dest, slots, k))
                ctx.store(origin + pick(row_of_slot, slots, k), pick(carrier_row, slots, k), to)
                ctx.store(source + pick(row_of_slot, slots, k), (row * K + k) | (ME << 32), to)
        send_row(
            ctx, group, x, x_scales, tokens, scales, row, stride_x, stride_s, H, carries, row_of_slot, dest,
            slots, K, BLOCK_H, HINT, SCALES, SP, QDTYPE,
        )  # fmt: skip
    return next_row


@triton.jit
def replicate_rows(tokens, scales, origin, pid, programs, received, H, BLOCK_H: tl.constexpr,
                   SCALES: tl.constexpr, SP: tl.constexpr):  # fmt: skip
    """Rows ``pid, pid + programs, ...`` of the ``received`` rows: a row whose ``origin``
    names another row (a token routed to several experts of this rank crossed the link
    once) is copied from there, with its scales."""
    n_scales = H // _SCALE_BLOCK
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
            if SCALES != ROWS_ONLY:
                sk = tl.arange(0, SP)
                v = tl.load(scales + source_row.to(tl.int64) * n_scales + sk, mask=sk < n_scales)
                tl.store(scales + i.to(tl.int64) * n_scales + sk, v, mask=sk < n_scales)
        i += programs
