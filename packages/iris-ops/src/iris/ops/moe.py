"""Expert parallelism: ``moe_dispatch`` sends every token to the ranks holding its experts,
``moe_combine`` brings the experts' outputs back and sums them with the router's weights.
Each is one kernel launch, with no host synchronisation: the row counts travel on the
device.

Experts are split evenly and contiguously over the ``G`` ranks of the group: expert ``e``
lives on member ``e // (num_experts // G)``, which holds ``L = num_experts // G`` local
experts.

**Dispatch** (:func:`_moe_dispatch_kernel`), on every rank at once:

1. Each program counts the expert ids of its share of this rank's ``(token, slot)`` pairs
   and publishes the histogram to the other programs of its rank (a local flag per program).
2. Program 0 stores the rank's histogram (``num_experts`` counts, and whether an id was out
   of range) into a box of every member, as flag-in-data lines (:mod:`iris.ccl.triton.ll`:
   the data beside the call's generation in every 8-byte word; two banks by the call's
   parity). A rank's counts also tell its peers that it has entered the call, so its
   receive buffer may be written.
3. Every program reads the ``G`` histograms of its rank's boxes. From them every rank knows
   the layout of every member's output: rows ordered by local expert, then source rank,
   then token, then slot. So a sender computes the final position of each of its rows in
   the receiver's output itself, and every rank knows whether any member would receive more
   rows than the capacity (then no row moves anywhere, and the error is recorded).
4. Each program walks its tokens: it stores each token's row once into the output of every
   rank holding one of its experts (at the position of the first slot going there), and for
   every slot the position that row landed at (``origin``), then raises a counter on every
   member (release, system scope).
5. Once every member's programs have raised this rank's counter, the rows routed twice or
   more to this rank are replicated locally from where they landed.

**Combine** (:func:`_moe_combine_kernel`): every rank copies ``expert_out`` into its heap
staging buffer and raises a counter on every peer; then, for each of its tokens, it loads
the expert rows of every slot (its own from ``expert_out``, the others from their rank's
staging buffer, at the positions dispatch recorded) and sums them weighted in fp32.

Buffers are safe to reuse without a barrier: a sender writes a receiver's output only after
it has the receiver's counts of the same call, which the receiver sends after its previous
work on the stream; and a rank overwrites its combine staging buffer only after the next
dispatch's counts from every rank, sent after each rank's previous combine had read it.
Hence every ``moe_combine`` must follow its own ``moe_dispatch`` (one combine per dispatch).
"""

from __future__ import annotations

import dataclasses
import weakref

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris.mem
from iris.ccl.triton import ll
from iris.mem import runtime
from iris.mem.triton.group import enter_group
from iris.mem.utils import record_timeout, wait_at_least

from . import _host
from . import workspace as _workspace
from ._sync import call_generation, finish_call, signal_count, wait
from .config import MAX_PROGRAMS

#: Error codes a kernel records in a workspace's ``errors`` words ``[code, rank, a, b]``.
ERR_CAPACITY, ERR_EXPERT_ID, ERR_SHORT_OUTPUT = 1, 2, 3
#: Words before the counts in a member's box: [an id was out of range, its low, high half].
_HEAD: tl.constexpr = tl.constexpr(16)
#: Largest number of experts (the histograms live in registers).
MAX_EXPERTS = 4096


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MoEConfig:
    """How :func:`moe_dispatch` and :func:`moe_combine` run; fields left at 0 are chosen.

    Attributes:
        max_recv_rows: capacity of a rank's receive buffer (``d.tokens`` has this many
            rows on every rank), the most rows any rank may receive in one call. Default:
            ``G * K * T_max``, with ``T_max`` the largest token count of any rank at the
            first call (the worst case: every slot of every rank routed to one rank). A
            call that would exceed it moves no row, records the error on the device, and
            the host raises it at the next check (:meth:`MoEDispatch.check`,
            :func:`iris.ops.check_errors`; at once where kernels are interpreted).
        programs: persistent programs (1-1024); default: the device's SM count (1 where
            kernels are interpreted, where programs run one after another).
        block: elements of a row moved at once (power of two, 64-16384); default: the row
            rounded up to a power of two, at most 2048.
        num_warps: warps per program (power of two, 1-16); default ``block / 256`` in 1-8.
    """

    max_recv_rows: int = 0
    programs: int = 0
    block: int = 0
    num_warps: int = 0

    def __post_init__(self) -> None:
        for name in ("max_recv_rows", "programs", "block", "num_warps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"MoEConfig.{name} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"MoEConfig.{name} must be >= 0 (0 chooses), got {value}")
        if self.max_recv_rows >= 1 << 31:
            raise ValueError(f"MoEConfig.max_recv_rows must be below 2**31, got {self.max_recv_rows}")
        if self.programs > MAX_PROGRAMS:
            raise ValueError(f"MoEConfig.programs must be at most {MAX_PROGRAMS}, got {self.programs}")
        if self.block and (not _power_of_two(self.block) or not 64 <= self.block <= 16384):
            raise ValueError(f"MoEConfig.block must be a power of two from 64 to 16384, got {self.block}")
        if self.num_warps and (not _power_of_two(self.num_warps) or self.num_warps > 16):
            raise ValueError(f"MoEConfig.num_warps must be a power of two up to 16, got {self.num_warps}")


# --------------------------------------------------------------------------- device side


@triton.jit
def _record(errors, code, rank, a, b):
    """Record ``[code, rank, a, b]`` in the int64 ``errors`` words unless one is recorded."""
    if tl.atomic_cas(errors, tl.cast(0, tl.int64), tl.cast(code, tl.int64), sem="relaxed", scope="gpu") == 0:
        tl.store(errors + 1, tl.cast(rank, tl.int64))
        tl.store(errors + 2, tl.cast(a, tl.int64))
        tl.store(errors + 3, tl.cast(b, tl.int64))


@triton.jit
def _pick(vec, ak, k):
    """Element ``k`` of the small vector ``vec`` (indices ``ak``) as a scalar."""
    return tl.sum(tl.where(ak == k, vec, 0))


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
    L: tl.constexpr = E // GROUP
    BOX: tl.constexpr = _HEAD + EP
    ar = tl.arange(0, EP)
    ak = tl.arange(0, KP)
    wh = tl.arange(0, _HEAD)
    per = tl.cdiv(T, programs)
    t0 = pid * per
    t1 = tl.minimum(T, t0 + per)
    # 1. This program's histogram (ids out of range count as none and are reported).
    h = tl.zeros([EP], tl.int32)
    nbad = tl.zeros([], tl.int32)
    badv = tl.zeros([], tl.int64)
    n = t0.to(tl.int64) * K
    end = t1.to(tl.int64) * K
    while n < end:
        offs = n + tl.arange(0, BLOCK_S)
        m = offs < end
        ids = tl.load(idx + offs, mask=m, other=-1).to(tl.int64)
        wrong = m & ((ids < -1) | (ids >= E))
        nw = tl.sum(wrong.to(tl.int32))
        if nw > 0:
            badv = tl.where(nbad == 0, tl.max(tl.where(wrong, ids, -(1 << 62))), badv)
            badv = tl.where(badv == -(1 << 62), tl.min(tl.where(wrong, ids, 1 << 62)), badv)
            nbad += nw
        e = tl.where(wrong, -1, ids).to(tl.int32)
        h += tl.sum((e[:, None] == ar[None, :]).to(tl.int32), axis=0)
        n += BLOCK_S
    tl.store(hist + pid * EP + ar, h)
    tl.store(bad + 2 * pid, nbad.to(tl.int64))
    tl.store(bad + 2 * pid + 1, badv)
    tl.debug_barrier()
    tl.atomic_max(ready + pid, gen, sem="release", scope="gpu")
    # 2. The rank's histogram and the counts of the programs before this one.
    total = tl.zeros([EP], tl.int32)
    before = tl.zeros([EP], tl.int32)
    p = 0
    while p < programs:
        if wait_at_least(ready + p, gen, group.budget, group.status) < gen:
            record_timeout(group.status, ctx.rank, ctx.rank, ready + p)
        hp = tl.load(hist + p * EP + ar, volatile=True)
        total += hp
        before += tl.where(p < pid, hp, 0)
        pb = tl.load(bad + 2 * p, volatile=True)
        pv = tl.load(bad + 2 * p + 1, volatile=True)
        badv = tl.where((nbad == 0) & (pb > 0), pv, badv)
        nbad += pb.to(tl.int32)
        p += 1
    bank = boxes + (gen & 1).to(tl.int64) * GROUP * BOX
    if pid == 0:  # the counts to every member, this one included
        head = tl.where(wh == 0, nbad, tl.where(wh == 1, badv & 0xFFFFFFFF, tl.where(wh == 2, badv >> 32, 0)))
        head = tl.where(wh == 3, T, head)
        head_lines = ll.pack(head.to(tl.int32), gen)
        count_lines = ll.pack(total, gen)
        for j in tl.static_range(GROUP):
            ctx.store(bank + ME * BOX + wh, head_lines, group.rank(j), hint=16)
            ctx.store(bank + ME * BOX + _HEAD + ar, count_lines, group.rank(j), hint=16)
    # 3. Every member's counts: the layout of every member's output.
    colsum = tl.zeros([EP], tl.int32)
    prev = tl.zeros([EP], tl.int32)
    over = tl.zeros([], tl.int32)
    for q in tl.static_range(GROUP):
        c = ll.unpack(ll.receive(ctx, group, bank + q * BOX + _HEAD, ar, ar >= 0, gen, q), tl.int32)
        colsum += c
        if q < ME:
            prev += c
        hd = ll.unpack(ll.receive(ctx, group, bank + q * BOX, wh, wh < 4, gen, q), tl.int32)
        if _pick(hd, wh, 3).to(tl.int64) * K > capacity:  # its slots come back to its buffer
            if over == 0:
                if pid == 0:
                    _record(errors, 1, q, _pick(hd, wh, 3).to(tl.int64) * K, capacity)
            over = 1
        if pid == 0:
            if _pick(hd, wh, 0) != 0:
                value = (_pick(hd, wh, 1).to(tl.int64) & 0xFFFFFFFF) | (_pick(hd, wh, 2).to(tl.int64) << 32)
                _record(errors, 2, q, value, E)
    owner = ar // L
    rank_start = tl.zeros([EP], tl.int32)
    acc = tl.zeros([], tl.int32)
    mine = tl.zeros([], tl.int32)
    for r in tl.static_range(GROUP):
        in_r = owner == r
        rows = tl.sum(tl.where(in_r, colsum, 0))
        rank_start = tl.where(in_r, acc, rank_start)
        acc += rows
        if rows > capacity:
            if over == 0:
                if pid == 0:
                    _record(errors, 1, r, rows, capacity)
            over = 1
        if r == ME:
            mine = rows
    nxt = tl.cumsum(colsum, 0) - colsum - rank_start + prev + before
    if pid == 0:
        local = (ar >= ME * L) & (ar < ME * L + L)
        tl.store(counts + (ar - ME * L), colsum.to(tl.int64), mask=local)
        tl.store(meta, mine.to(tl.int64))
        tl.store(meta + 1, over.to(tl.int64))
    # 4. This program's tokens: each row once to every rank holding one of its experts.
    t = t0
    while t < t1:
        row = t.to(tl.int64)
        ids = tl.load(idx + row * K + ak, mask=ak < K, other=-1).to(tl.int64)
        valid = (ids >= 0) & (ids < E)
        e = tl.where(valid, ids, -1).to(tl.int32)
        sel = e[:, None] == ar[None, :]
        earlier = (e[:, None] == e[None, :]) & (ak[None, :] < ak[:, None]) & valid[None, :]
        pos = tl.sum(tl.where(sel, nxt[None, :], 0), axis=1) + tl.sum(earlier.to(tl.int32), axis=1)
        nxt += tl.sum(sel.to(tl.int32), axis=0)
        rr = tl.where(valid, e // L, -1)
        same = (rr[:, None] == rr[None, :]) & (ak[None, :] <= ak[:, None]) & valid[None, :]
        kstar = tl.min(tl.where(same, ak[None, :], KP), axis=1)
        first = tl.sum(tl.where(ak[None, :] == kstar[:, None], pos[None, :], 0), axis=1)
        lead = valid & (kstar == ak)
        tl.store(positions + row * K + ak, tl.where(valid, pos, -1), mask=ak < K)
        if over == 0:
            for k in tl.static_range(K):
                if _pick(valid.to(tl.int32), ak, k) != 0:
                    to = group.rank(_pick(rr, ak, k))
                    ctx.store(origin + _pick(pos, ak, k), _pick(first, ak, k), to)
                    ctx.store(source + _pick(pos, ak, k), (row * K + k) | (ME << 32), to)
            h0 = 0
            while h0 < H:
                offs = h0 + tl.arange(0, BLOCK_H)
                hm = offs < H
                xv = tl.load(x + row * stride_x + offs, mask=hm)
                for k in tl.static_range(K):
                    if _pick(lead.to(tl.int32), ak, k) != 0:
                        dst = tokens + _pick(pos, ak, k).to(tl.int64) * H + offs
                        ctx.store(dst, xv, group.rank(_pick(rr, ak, k)), mask=hm, hint=HINT)
                h0 += BLOCK_H
        t += 1
    # 5. Every member's rows have landed here: replicate the rows of slots that share one.
    for j in tl.static_range(GROUP):
        signal_count(ctx, arrive + ME, group.rank(j))
    for q in tl.static_range(GROUP):
        wait(ctx, group, arrive + q, gen.to(tl.int64) * programs, group.rank(q))
    if over == 0:
        i = pid
        while i < mine:
            o = tl.load(origin + i, volatile=True)
            if o != i:
                h0 = 0
                while h0 < H:
                    offs = h0 + tl.arange(0, BLOCK_H)
                    hm = offs < H
                    v = tl.load(tokens + o.to(tl.int64) * H + offs, mask=hm)
                    tl.store(tokens + i.to(tl.int64) * H + offs, v, mask=hm)
                    h0 += BLOCK_H
            i += programs
    finish_call(state, gen)


@triton.jit
def _moe_combine_kernel(
    context, members, sync_flags, epochs, status, budget, state,
    expert_out, weights, idx, y, back, source, done, short, meta, errors,
    T, H, n_out, stride_e, stride_y,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, E: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_H: tl.constexpr, HINT: tl.constexpr,
):  # fmt: skip
    """One combine (module docstring): row ``i`` of ``expert_out`` goes back to the rank and
    slot ``source[i]`` names (``rank << 32 | token * K + slot``), into its ``back`` buffer
    (``[capacity, H]``); then ``y[t] = sum_k weights[t, k] * back[t * K + k]`` in fp32 over
    the slots with an expert. ``meta``: what the dispatch recorded (rows received, whether a
    member overflowed); ``done``: int64 counters per member; ``short``: the generation of the
    last call in which a member's ``expert_out`` had fewer rows than it received."""
    ctx, group, pid = enter_group(
        context, members, sync_flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False
    )
    gen = call_generation(state)
    programs = tl.num_programs(0)
    ak = tl.arange(0, KP)
    mine = tl.load(meta)
    over = tl.load(meta + 1)
    # 1. Every received row back to the slot it came from.
    if over == 0:
        if (mine > n_out) & (pid == 0):
            _record(errors, 3, ME, mine, n_out)
            for j in tl.static_range(GROUP):
                if j != ME:
                    ctx.atomic_max(short + ME, gen, group.rank(j), sem="relaxed", scope="sys")
        i = pid.to(tl.int64)
        while i < tl.minimum(mine, n_out):
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
    for j in tl.static_range(GROUP):
        signal_count(ctx, done + ME, group.rank(j))
    for q in tl.static_range(GROUP):
        wait(ctx, group, done + q, gen.to(tl.int64) * programs, group.rank(q))
        if q != ME:
            if pid == 0:
                if tl.load(short + q, volatile=True) == gen:
                    _record(errors, 3, q, -1, -1)
    # 2. This rank's tokens: the weighted sum of their experts' rows, in fp32.
    t = pid
    while t < T:
        row = t.to(tl.int64)
        ids = tl.load(idx + row * K + ak, mask=ak < K, other=-1).to(tl.int64)
        valid = ((ids >= 0) & (ids < E)).to(tl.int32)
        w = tl.load(weights + row * K + ak, mask=ak < K, other=0).to(tl.float32)
        h0 = 0
        while h0 < H:
            offs = h0 + tl.arange(0, BLOCK_H)
            hm = offs < H
            acc = tl.zeros([BLOCK_H], tl.float32)
            if over == 0:
                for k in tl.static_range(K):
                    if _pick(valid, ak, k) != 0:
                        v = tl.load(back + (row * K + k) * H + offs, mask=hm, other=0)
                        acc += _pick(w, ak, k) * v.to(tl.float32)
            tl.store(y + row * stride_y + offs, acc.to(y.dtype.element_ty), mask=hm)
            h0 += BLOCK_H
        t += programs
    finish_call(state, gen)


# --------------------------------------------------------------------------- host side


@dataclasses.dataclass
class _Info:
    """What the host keeps beside a MoE workspace."""

    capacity: int
    calls: int = 0  # dispatches made with it
    combined: int = 0  # the dispatch the last combine consumed


#: MoE workspaces by process-group object (weakly), then signature; and their host info.
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_errors() -> None:
    """Raise the first wait timeout any fused op of this process recorded, then the first
    routing error (capacity, expert id) a MoE kernel recorded.

    Where kernels are interpreted ops raise by themselves; on GPUs kernels only record what
    went wrong, so call this after a synchronisation point (it synchronises the devices
    itself)."""
    _workspace.check_errors()
    for ws in list(_INFO):
        if ws.prepared:
            raise_recorded(ws)


def raise_recorded(ws: _workspace.Workspace) -> None:
    """Raise (and clear) the routing error the kernels of ``ws`` recorded, if any. Reads
    device memory: synchronise first where kernels run asynchronously."""
    errors = ws.buffers["errors"]
    code, rank, a, b = (int(v) for v in errors.tolist())
    if code == 0:
        return
    errors.zero_()
    if code == ERR_CAPACITY:
        raise RuntimeError(
            f"iris.ops.moe_dispatch: rank {rank} of the group needs {a} rows (the rows it receives, or its "
            f"tokens x top-k for the rows coming back in moe_combine), more than the {b} rows of the "
            "buffers (MoEConfig.max_recv_rows); no row was moved, d.tokens is not valid and moe_combine "
            "returns zeros. Pass MoEConfig(max_recv_rows=...) at least as large as the most rows a rank "
            "can receive (at most group size x top-k x the largest token count)"
        )
    if code == ERR_EXPERT_ID:
        raise ValueError(
            f"iris.ops.moe_dispatch: topk_idx of rank {rank} of the group holds expert id {a}, out of "
            f"range: ids must be -1 (no expert) or in [0, {b}) (num_experts); that slot was left out"
        )
    if rank >= 0 and a >= 0:
        raise ValueError(
            f"iris.ops.moe_combine: rank {rank} of the group received {a} rows but its expert_out has "
            f"{b}; expert_out needs a row for every row of d.tokens that holds a token"
        )
    raise ValueError(
        f"iris.ops.moe_combine: rank {rank} of the group passed an expert_out with fewer rows than it "
        "received; this rank's result reads rows it never had"
    )


@dataclasses.dataclass
class MoEDispatch:
    """What :func:`moe_dispatch` returns and :func:`moe_combine` takes.

    Attributes:
        tokens: ``[capacity, H]`` (capacity: ``MoEConfig.max_recv_rows``, the same on every
            rank): the rows this rank received, one per (source rank, token, slot) routed to
            one of its experts, ordered by local expert, then source rank, then token, then
            slot; rows past the received total hold stale data. It lives in the op's
            workspace: valid until the next ``moe_dispatch`` with the same signature.
        expert_counts: int64 ``[num_experts // G]``: rows per local expert (on the device).
        positions: int32 ``[T, K]``: where each slot of this rank's tokens landed in its
            expert's rank's ``tokens`` (-1 for none); what combine reads.
        topk_idx: the routing this rank passed.
        num_experts: the number of experts over the group.
    """

    tokens: torch.Tensor
    expert_counts: torch.Tensor
    positions: torch.Tensor
    topk_idx: torch.Tensor
    num_experts: int
    _ws: _workspace.Workspace | None = dataclasses.field(default=None, repr=False)
    _call: int = dataclasses.field(default=0, repr=False)
    _cfg: MoEConfig | None = dataclasses.field(default=None, repr=False)
    _group: object = dataclasses.field(default=None, repr=False)

    @property
    def capacity(self) -> int:
        """Rows of :attr:`tokens` (the receive buffer's capacity)."""
        return self.tokens.shape[0]

    def num_rows(self) -> int:
        """Rows received (synchronises with the device: for inspection, not inside a graph)."""
        return int(self.expert_counts.sum())

    def rows(self) -> torch.Tensor:
        """``tokens[:num_rows()]`` (synchronises with the device)."""
        return self.tokens[: self.num_rows()]

    def check(self) -> None:
        """Synchronise and raise what the kernels recorded: a capacity overflow, an expert
        id out of range, a wait that timed out."""
        if self._ws is not None and self._ws.prepared:
            iris.mem.synchronize(self._ws.heap.device)
            self._ws.check()
            raise_recorded(self._ws)


#: The latest dispatches made through ``torch.ops.iris.moe_dispatch``, by the address of
#: their positions tensor (a few: each is combined soon after it is made).
_MADE: dict[int, MoEDispatch] = {}
_MAX_MADE = 64


def remember(d: MoEDispatch) -> None:
    """Keep ``d`` findable from its positions (for ``torch.ops.iris.moe_combine``)."""
    _MADE.pop(d.positions.data_ptr(), None)
    _MADE[d.positions.data_ptr()] = d
    while len(_MADE) > _MAX_MADE:
        _MADE.pop(next(iter(_MADE)))


def recall(positions: torch.Tensor) -> MoEDispatch:
    """The dispatch whose ``positions`` tensor this is."""
    d = _MADE.get(positions.data_ptr())
    if d is None or d.positions.shape != positions.shape:
        raise RuntimeError(
            "torch.ops.iris.moe_combine: positions is not what a live torch.ops.iris.moe_dispatch returned; "
            "pass the positions of the dispatch being combined"
        )
    return d


def _check_config(config: object) -> None:
    if config is not None and not isinstance(config, MoEConfig):
        raise TypeError(f"config must be an iris.ops.MoEConfig or None, got {type(config).__name__}")


def resolve(config: MoEConfig | None, hidden: int, caps) -> MoEConfig:
    """``config`` with ``programs``, ``block`` and ``num_warps`` chosen (``max_recv_rows``
    stays as given: its default is agreed between the ranks when the workspace is made)."""
    _check_config(config)
    config = config or MoEConfig()
    if caps.interpreted:
        programs = 1
    else:
        programs = min(config.programs or caps.sm_count, caps.resident_programs, MAX_PROGRAMS)
    block = config.block or max(64, min(triton.next_power_of_2(max(hidden, 1)), 2048))
    warps = config.num_warps or max(1, min(8, block // 256))
    return dataclasses.replace(config, programs=max(programs, 1), block=block, num_warps=warps)


def _validate_dispatch(x, topk_idx, num_experts, size: int) -> tuple[int, int, int]:
    op = "moe_dispatch"
    _host._tensor(x, "x", op, 2)
    _host._tensor(topk_idx, "topk_idx", op, 2)
    if x.dtype not in _host.DTYPES:
        raise TypeError(f"{op}: x has dtype {x.dtype}; use one of {', '.join(map(str, _host.DTYPES))}")
    if topk_idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: topk_idx must hold int64 (or int32) expert ids, got {topk_idx.dtype}")
    if topk_idx.device != x.device:
        raise ValueError(f"{op}: topk_idx is on {topk_idx.device} but x is on {x.device}; they must match")
    if topk_idx.shape[0] != x.shape[0]:
        raise ValueError(
            f"{op}: x has {x.shape[0]} rows (tokens) but topk_idx has {topk_idx.shape[0]}; topk_idx must be "
            "[tokens, top-k], one row per row of x"
        )
    if topk_idx.shape[1] < 1:
        raise ValueError(
            f"{op}: topk_idx has no slots (shape {list(topk_idx.shape)}); it must be [tokens, top-k]"
        )
    if x.shape[1] < 1:
        raise ValueError(f"{op}: x has rows of no elements (shape {list(x.shape)})")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"{op}: num_experts must be a positive int, got {num_experts!r}")
    if num_experts % size:
        raise ValueError(
            f"{op}: num_experts ({num_experts}) must be divisible by the group size ({size}): experts are "
            "split evenly, expert e on rank e // (num_experts // group size)"
        )
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"{op}: at most {MAX_EXPERTS} experts are supported, got {num_experts}")
    return x.shape[0], x.shape[1], topk_idx.shape[1]


def _workspace_for(ranks, group, x, hidden: int, slots: int, num_experts: int, cfg: MoEConfig):
    """The prepared workspace of this signature and group (made collectively at its first
    call: the ranks agree on the default capacity there, from the largest token count of any
    rank) and its host info."""
    size = len(ranks)
    signature = ("moe", ranks, (hidden, slots, num_experts), str(x.dtype), cfg, (None, False))
    table = _TABLES.setdefault(dist.group.WORLD if group is None else group, {})
    ws = table.get(signature)
    if ws is not None and ws.prepared:
        return ws, _INFO[ws]
    if iris.mem.capturing(x.device):
        raise RuntimeError(
            "iris.ops.moe_dispatch: the first call of a signature makes its workspace (collectively, with "
            "allocations and a host exchange), which a CUDA graph cannot capture; call it once with the "
            "same hidden size, top-k, num_experts, dtype, group and config before capturing"
        )
    capacity = cfg.max_recv_rows
    if not capacity:
        tokens = runtime.exchange(group, "iris.ops.moe_dispatch workspace", x.shape[0], ValueError)
        capacity = max(1, size * slots * max(tokens))
    if capacity >= 1 << 31:
        raise ValueError(
            f"iris.ops.moe_dispatch: a receive buffer of {capacity} rows (group size x top-k x tokens) is "
            "over 2**31 - 1; pass a smaller MoEConfig(max_recv_rows=...)"
        )
    ep = _padded(num_experts)
    programs = cfg.programs
    specs = [
        ("cstate", 4, torch.int32),
        ("boxes", 2 * size * (16 + ep), torch.int64),
        ("hist", programs * ep, torch.int32),
        ("ready", programs, torch.int32),
        ("bad", 2 * programs, torch.int64),
        ("tokens", capacity * hidden, x.dtype),
        ("origin", capacity, torch.int32),
        ("source", capacity, torch.int64),
        ("arrive", size, torch.int64),
        ("back", capacity * hidden, x.dtype),
        ("done", size, torch.int64),
        ("short", size, torch.int32),
        ("meta", 2, torch.int64),
        ("errors", 4, torch.int64),
    ]
    ws = _workspace.acquire(None, signature, None, group, size, x.device, specs)
    table[signature] = ws
    _INFO[ws] = info = _Info(capacity)
    return ws, info


def _padded(num_experts: int) -> int:
    """Counts per box: a power of two, at least 16 (whole 16-byte groups of lines)."""
    return max(16, triton.next_power_of_2(num_experts))


def _some(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t``, or a one-element tensor of ``like``'s dtype where ``t`` is empty (a valid pointer)."""
    return t if t.numel() else like.new_zeros(1)


def moe_dispatch(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, *, group=None, config=None
) -> MoEDispatch:
    """Send each token of this rank to the ranks holding its experts, in one kernel.

    :param x: ``[T, H]`` tokens of this rank (bf16, fp16 or fp32; ``T`` may differ between
        ranks, ``H`` may not).
    :param topk_idx: ``[T, K]`` global expert ids (int64; int32 accepted), ``-1`` for a slot
        without an expert. Expert ``e`` lives on rank ``e // (num_experts // G)`` of the group.
    :param num_experts: experts over the group, divisible by the group size ``G``.
    :param group: torch.distributed group, or None for the world.
    :param config: a :class:`MoEConfig` (the receive buffer's capacity, programs, tiles).
    :returns: a :class:`MoEDispatch`: ``tokens`` (``[capacity, H]``, received rows ordered by
        local expert, source rank, token, slot; a token routed to several experts of one rank
        crosses the link once and is replicated there), ``expert_counts`` (int64, rows per
        local expert) and what :func:`moe_combine` needs.

    No host synchronisation: counts stay on the device, so the call can be captured in a
    CUDA graph (after a first call of the same signature made the workspace). A capacity
    overflow or an expert id out of range is recorded on the device and raised by
    :meth:`MoEDispatch.check` / :func:`iris.ops.check_errors` (at once where kernels are
    interpreted). Every rank of the group must call it, with the same ``H``, ``K``,
    ``num_experts``, dtype and config.
    """
    if torch.compiler.is_compiling():
        from . import _library

        return _library.compiled_moe_dispatch(x, topk_idx, num_experts, group, config)
    _check_config(config)
    ranks, index = _host.group_position(group)
    size = len(ranks)
    tokens_n, hidden, slots = _validate_dispatch(x, topk_idx, num_experts, size)
    caps = iris.mem.capabilities(x.device)
    cfg = resolve(config, hidden, caps)
    ws, info = _workspace_for(ranks, group, x, hidden, slots, num_experts, cfg)
    xk = x if x.stride(1) == 1 or hidden == 1 else x.contiguous()
    idx = topk_idx.contiguous()
    positions = torch.empty((tokens_n, slots), dtype=torch.int32, device=x.device)
    counts = torch.empty(num_experts // size, dtype=torch.int64, device=x.device)
    b = ws.buffers
    tokens = b["tokens"].view(info.capacity, hidden)
    ep = _padded(num_experts)
    itemsize = x.element_size()
    hint = 16 if (hidden * itemsize) % 16 == 0 and cfg.block * itemsize >= 16 else None
    runtime.launch(
        _moe_dispatch_kernel, cfg.programs, ws.sync, ws.buffers["state"],
        _some(xk, xk), _some(idx, idx), _some(positions, positions), counts, tokens, b["origin"], b["source"],
        b["boxes"], b["hist"], b["ready"], b["bad"], b["arrive"], b["meta"], b["errors"],
        tokens_n, hidden, max(xk.stride(0), 1), info.capacity,
        E=num_experts, K=slots, EP=ep, KP=triton.next_power_of_2(slots),
        BLOCK_S=max(16, min(256, 8192 // ep)), BLOCK_H=cfg.block, HINT=hint, num_warps=cfg.num_warps,
        programs=cfg.programs,
    )  # fmt: skip
    info.calls += 1
    if caps.interpreted:  # the kernel has finished: raise what it recorded now
        raise_recorded(ws)
    return MoEDispatch(tokens, counts, positions, topk_idx, num_experts, ws, info.calls, cfg, group)


def moe_combine(expert_out: torch.Tensor, d: MoEDispatch, topk_weights: torch.Tensor) -> torch.Tensor:
    """Bring the experts' outputs back to the tokens' ranks and sum them, in one kernel.

    :param expert_out: ``[n, H]`` with ``d.tokens``' dtype: row ``i`` is the expert output of
        row ``i`` of ``d.tokens`` (``n`` at least the rows received; ``d.tokens``' capacity
        always is).
    :param d: what this rank's latest :func:`moe_dispatch` of the same signature returned
        (one combine per dispatch).
    :param topk_weights: ``[T, K]`` floating-point weights of this rank's slots.
    :returns: ``[T, H]`` in ``expert_out``'s dtype: ``y[t] = sum_k topk_weights[t, k] *
        expert_out[row(t, k)]`` over the slots with an expert, accumulated in fp32.
    """
    if torch.compiler.is_compiling():
        from . import _library

        return _library.compiled_moe_combine(expert_out, d, topk_weights)
    op = "moe_combine"
    if not isinstance(d, MoEDispatch):
        raise TypeError(f"{op}: d must be what iris.ops.moe_dispatch returned, got {type(d).__name__}")
    ws = d._ws
    _host._tensor(expert_out, "expert_out", op, 2)
    _host._tensor(topk_weights, "topk_weights", op, 2)
    tokens_n, slots = d.positions.shape
    hidden = d.tokens.shape[1]
    if expert_out.dtype != d.tokens.dtype:
        raise TypeError(
            f"{op}: expert_out has dtype {expert_out.dtype} but d.tokens has {d.tokens.dtype}; they must "
            "match"
        )
    if expert_out.shape[1] != hidden or expert_out.shape[0] > d.tokens.shape[0]:
        raise ValueError(
            f"{op}: expert_out has shape {list(expert_out.shape)}; it must have {hidden} columns (d.tokens') "
            f"and at most {d.tokens.shape[0]} rows (d.tokens' capacity)"
        )
    if expert_out.device != d.tokens.device:
        raise ValueError(f"{op}: expert_out is on {expert_out.device} but d.tokens is on {d.tokens.device}")
    if not topk_weights.dtype.is_floating_point or topk_weights.dtype not in _host.DTYPES:
        raise TypeError(
            f"{op}: topk_weights must be floating point ({', '.join(map(str, _host.DTYPES))}), got "
            f"{topk_weights.dtype}"
        )
    if tuple(topk_weights.shape) != (tokens_n, slots):
        raise ValueError(
            f"{op}: topk_weights has shape {list(topk_weights.shape)}, expected {[tokens_n, slots]} "
            "(the shape of the topk_idx passed to moe_dispatch)"
        )
    if topk_weights.device != d.tokens.device:
        raise ValueError(
            f"{op}: topk_weights is on {topk_weights.device} but d.tokens is on {d.tokens.device}"
        )
    if ws is None or not ws.prepared or ws not in _INFO:
        raise RuntimeError(f"{op}: the workspace of this dispatch was released; dispatch again")
    info = _INFO[ws]
    if d._call != info.calls:
        raise RuntimeError(
            f"{op}: d is not the latest moe_dispatch of its signature (a later dispatch has reused its "
            "buffers); combine each dispatch before the next one"
        )
    if info.combined == d._call:
        raise RuntimeError(f"{op}: this dispatch was already combined; each dispatch is combined once")
    cfg = d._cfg
    eo = expert_out if expert_out.stride(1) == 1 or hidden == 1 else expert_out.contiguous()
    weights = topk_weights.contiguous()
    y = torch.empty((tokens_n, hidden), dtype=expert_out.dtype, device=expert_out.device)
    b = ws.buffers
    itemsize = eo.element_size()
    hint = 16 if (hidden * itemsize) % 16 == 0 and cfg.block * itemsize >= 16 else None
    runtime.launch(
        _moe_combine_kernel, cfg.programs, ws.sync, b["cstate"],
        _some(eo, eo), _some(weights, weights), _some(d.topk_idx.contiguous(), d.topk_idx), _some(y, y),
        b["back"], b["source"], b["done"], b["short"], b["meta"], b["errors"],
        tokens_n, hidden, eo.shape[0], max(eo.stride(0), 1), max(y.stride(0), 1),
        E=d.num_experts, K=slots, KP=triton.next_power_of_2(slots), BLOCK_H=cfg.block, HINT=hint,
        num_warps=cfg.num_warps, programs=cfg.programs,
    )  # fmt: skip
    info.combined = d._call
    if iris.mem.capabilities(y.device).interpreted:
        raise_recorded(ws)
    return y


__all__ = [
    "MAX_EXPERTS",
    "MoEConfig",
    "MoEDispatch",
    "check_errors",
    "moe_combine",
    "moe_dispatch",
    "resolve",
]
