"""Remote atomics: contention, per-op semantics with masks, and a CAS spinlock.

Every wait in these kernels is bounded (an iteration budget, with failures counted into
an output), and every world has a deadline, so a broken atomic fails instead of hanging.
"""

import zlib

import pytest
import torch
import triton
import triton.language as tl
from mem_testutils import BACKEND, HEAP, WORLD_SIZES, require_world

import iris.mem
import iris.mem.triton as imt
from iris.mem.testing import run_world
from iris.mem.triton import Context
from iris.mem.utils import global_timer

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

# --------------------------------------------------------------------------- (a) contention

PROGRAMS = 4
ITERS = 32


@triton.jit
def _contention_kernel(
    context, heap_bases, c32, c64, cf32, log,
    RANK: tl.constexpr, WORLD: tl.constexpr, ITERS: tl.constexpr,
):  # fmt: skip
    """Every program adds to the three counters of every rank, ITERS times: 1 to the
    int32 counter (logging the old value, so the set of old values can be checked) and
    RANK + 1 to the int64 and fp32 ones (so a write landing on the wrong rank shows)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ctx = Context.initialize(context, RANK, WORLD)
    for i in range(ITERS):
        for t in tl.static_range(WORLD):
            if pid % 2 == 0:
                old = ctx.atomic_add(c32, 1, t, sem="acq_rel", scope="sys")
                ctx.atomic_add(c64, RANK + 1, t, scope="sys")
                ctx.atomic_add(cf32, RANK + 1.0, t, sem="relaxed")
            else:
                old = imt.atomic_add(c32, 1, RANK, t, heap_bases)
                imt.atomic_add(c64, RANK + 1, RANK, t, heap_bases, sem="relaxed", scope="gpu")
                imt.atomic_add(cf32, RANK + 1.0, RANK, t, heap_bases, sem="acq_rel", scope="sys")
            tl.store(log + (t * nprog + pid) * ITERS + i, old)


def contention_body(rank: int, world: int):
    heap = iris.mem.init(HEAP)
    try:
        c32 = heap.zeros(1, dtype=torch.int32)
        c64 = heap.zeros(1, dtype=torch.int64)
        cf32 = heap.zeros(1, dtype=torch.float32)
        log = torch.full((world, PROGRAMS, ITERS), -1, dtype=torch.int32, device=heap.device)
        heap.barrier()
        _contention_kernel[(PROGRAMS,)](
            heap.get_device_context(), heap.get_heap_bases(), c32, c64, cf32, log,
            RANK=rank, WORLD=world, ITERS=ITERS,
        )  # fmt: skip
        heap.barrier()
        counts = (int(c32.item()), int(c64.item()), float(cf32.item()))
        heap.barrier()
        return counts, log.cpu()
    finally:
        heap.close()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_atomic_add_contention(world_size):
    require_world(world_size)
    results = run_world(contention_body, world_size, timeout=120)
    total = world_size * PROGRAMS * ITERS
    weighted = PROGRAMS * ITERS * sum(r + 1 for r in range(world_size))
    for rank, (counts, _) in enumerate(results):
        want = (total, weighted, float(weighted))
        assert counts == want, f"rank {rank}: counters (int32, int64, fp32) {counts}, want {want}"
    # Every add saw a distinct old value: on each target the old values returned to all
    # callers are exactly 0 .. total-1 (a lost or duplicated update would break this).
    for target in range(world_size):
        olds = torch.cat([log[target].flatten() for _, log in results])
        assert sorted(olds.tolist()) == list(range(total)), f"old values returned by rank {target}'s counter"


# --------------------------------------------------------------------------- (b) semantics

BLOCK = 64
N = 50  # lanes >= N are masked off, and every 3rd lane below
OPS = ["add", "sub", "xchg", "xor", "and", "or", "min", "max"]
OP_ID = {name: i for i, name in enumerate(OPS)}
INT_DTYPES = [torch.int32, torch.int64]
CTX, FUN = 0, 1


@triton.jit
def _rmw_kernel(
    context, heap_bases, target, vals, old_out, n, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr, MODE: tl.constexpr,
):  # fmt: skip
    offs = tl.arange(0, BLOCK)
    mask = (offs < n) & (offs % 3 != 1)
    v = tl.load(vals + offs)
    p = target + offs
    ctx = Context.initialize(context, RANK, WORLD)
    if MODE == 0:
        if OP == 0:
            old = ctx.atomic_add(p, v, peer, mask=mask, sem="acq_rel", scope="sys")
        elif OP == 1:
            old = ctx.atomic_sub(p, v, peer, mask=mask, sem="release", scope="gpu")
        elif OP == 2:
            old = ctx.atomic_xchg(p, v, peer, mask=mask, sem="acquire", scope="sys")
        elif OP == 3:
            old = ctx.atomic_xor(p, v, peer, mask=mask, sem="relaxed", scope="cta")
        elif OP == 4:
            old = ctx.atomic_and(p, v, peer, mask=mask, sem="acq_rel", scope="sys")
        elif OP == 5:
            old = ctx.atomic_or(p, v, peer, mask=mask, scope="sys")
        elif OP == 6:
            old = ctx.atomic_min(p, v, peer, mask=mask, sem="release", scope="sys")
        else:
            old = ctx.atomic_max(p, v, peer, mask=mask, sem="acquire", scope="gpu")
    else:
        if OP == 0:
            old = imt.atomic_add(p, v, RANK, peer, heap_bases, mask=mask)
        elif OP == 1:
            old = imt.atomic_sub(p, v, RANK, peer, heap_bases, mask=mask, sem="acq_rel", scope="sys")
        elif OP == 2:
            old = imt.atomic_xchg(p, v, RANK, peer, heap_bases, mask=mask, sem="relaxed")
        elif OP == 3:
            old = imt.atomic_xor(p, v, RANK, peer, heap_bases, mask=mask, scope="sys")
        elif OP == 4:
            old = imt.atomic_and(p, v, RANK, peer, heap_bases, mask=mask)
        elif OP == 5:
            old = imt.atomic_or(p, v, RANK, peer, heap_bases, mask=mask, sem="release", scope="gpu")
        elif OP == 6:
            old = imt.atomic_min(p, v, RANK, peer, heap_bases, mask=mask)
        else:
            old = imt.atomic_max(p, v, RANK, peer, heap_bases, mask=mask, sem="acq_rel", scope="cta")
    tl.store(old_out + offs, old, mask=mask)


@triton.jit
def _cas_kernel(
    context, heap_bases, target, cmps, vals, old_out, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr,
):  # fmt: skip
    offs = tl.arange(0, BLOCK)
    c = tl.load(cmps + offs)
    v = tl.load(vals + offs)
    if MODE == 0:
        ctx = Context.initialize(context, RANK, WORLD)
        old = ctx.atomic_cas(target + offs, c, v, peer, sem="acq_rel", scope="sys")
    else:
        old = imt.atomic_cas(target + offs, c, v, RANK, peer, heap_bases)
    tl.store(old_out + offs, old)


def _mask() -> torch.Tensor:
    offs = torch.arange(BLOCK)
    return (offs < N) & (offs % 3 != 1)


def _data(dtype: torch.dtype, kind: str, rank: int, op: str, salt: int) -> torch.Tensor:
    """Deterministic operands: full-width bits for bitwise ops, signed small numbers
    (both signs) for arithmetic and min/max, exact halves for fp32."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((kind, str(dtype), rank, op, salt)).encode()))
    if dtype.is_floating_point:
        return torch.randint(-400, 400, (BLOCK,), generator=g).to(dtype) / 2
    if op in ("xor", "and", "or", "xchg"):
        bits = torch.iinfo(dtype).bits - 2  # sign bit and high bits both vary
        return (
            torch.randint(-(1 << bits), 1 << bits, (BLOCK,), generator=g, dtype=dtype) * 2
            + 1
            - (torch.arange(BLOCK) % 2).to(dtype)
        )
    return torch.randint(-100000, 100000, (BLOCK,), generator=g, dtype=dtype)


def _apply(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return {
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "xchg": lambda: b.clone(),
        "xor": lambda: a ^ b,
        "and": lambda: a & b,
        "or": lambda: a | b,
        "min": lambda: torch.minimum(a, b),
        "max": lambda: torch.maximum(a, b),
    }[op]()


def _cases():
    """(op, dtype) pairs checked. fp32 has add only here: Triton 3.6's interpreter
    rejects ``atomic_xchg`` on fp32 ("Unsupported data type"), so the fp32 exchange is
    covered by test_mem_compile.py (compiled for sm_90) instead."""
    cases = [(op, dt) for dt in INT_DTYPES for op in OPS]
    return cases + [("add", torch.float32)]


def semantics_body(rank: int, world: int) -> list[str]:
    """Each rank applies every op to every peer (itself included) on a buffer only it
    writes; each rank then checks what landed in its heap against torch."""
    heap = iris.mem.init(HEAP)
    failures: list[str] = []
    ranks = range(world)
    m = _mask()
    try:
        ctx_t, bases = heap.get_device_context(), heap.get_heap_bases()
        common = dict(RANK=rank, WORLD=world, BLOCK=BLOCK)
        # Targets: [case][mode][writer], initialised with this rank's data.
        targets, cas_targets = {}, {}
        for op, dt in _cases():
            targets[op, dt] = [
                [heap.as_symmetric(_data(dt, "init", rank, op, 10 * mode + w)) for w in ranks]
                for mode in (CTX, FUN)
            ]
        for dt in INT_DTYPES:
            cas_targets[dt] = [
                [heap.as_symmetric(_data(dt, "init", rank, "cas", 10 * mode + w)) for w in ranks]
                for mode in (CTX, FUN)
            ]
        heap.barrier()
        olds = {}
        for op, dt in _cases():
            for mode in (CTX, FUN):
                for p in ranks:
                    vals = _data(dt, "val", rank, op, 10 * mode + p).to(heap.device)
                    old = torch.zeros(BLOCK, dtype=dt, device=heap.device)
                    _rmw_kernel[(1,)](
                        ctx_t, bases, targets[op, dt][mode][rank], vals, old, N, p,
                        OP=OP_ID[op], MODE=mode, **common,
                    )  # fmt: skip
                    olds[op, dt, mode, p] = old
        for dt in INT_DTYPES:
            for mode in (CTX, FUN):
                for p in ranks:
                    init = _data(dt, "init", p, "cas", 10 * mode + rank)
                    # Even lanes compare equal (swap), odd lanes compare unequal (keep).
                    cmps = torch.where(torch.arange(BLOCK) % 2 == 0, init, init + 1).to(heap.device)
                    vals = _data(dt, "val", rank, "cas", 10 * mode + p).to(heap.device)
                    old = torch.zeros(BLOCK, dtype=dt, device=heap.device)
                    _cas_kernel[(1,)](
                        ctx_t, bases, cas_targets[dt][mode][rank], cmps, vals, old, p, MODE=mode, **common
                    )
                    olds["cas", dt, mode, p] = old
        heap.barrier()
        # Returned old values: the peer's initial data, on the masked-on lanes.
        for (op, dt, mode, p), old in olds.items():
            old = old.cpu()
            init = _data(dt, "init", p, op, 10 * mode + rank)
            lanes = torch.ones(BLOCK, dtype=torch.bool) if op == "cas" else m
            if not torch.equal(old[lanes], init[lanes]):
                failures.append(f"{op} {dt} mode {mode}: rank {rank} -> {p}: returned old values differ")
        # Final values here: written by every writer w.
        for op, dt in _cases():
            for mode in (CTX, FUN):
                for w in ranks:
                    init = _data(dt, "init", rank, op, 10 * mode + w)
                    vals = _data(dt, "val", w, op, 10 * mode + rank)
                    want = torch.where(m, _apply(op, init, vals), init)
                    got = targets[op, dt][mode][w].cpu()
                    if not torch.equal(got, want):
                        bad = (got != want).nonzero().flatten().tolist()
                        failures.append(
                            f"{op} {dt} mode {mode}: {w} -> {rank}: {len(bad)} wrong lanes, first {bad[0]}: "
                            f"got {got[bad[0]].item()}, want {want[bad[0]].item()} "
                            f"(init {init[bad[0]].item()}, val {vals[bad[0]].item()}, on: {bool(m[bad[0]])})"
                        )
        for dt in INT_DTYPES:
            for mode in (CTX, FUN):
                for w in ranks:
                    init = _data(dt, "init", rank, "cas", 10 * mode + w)
                    vals = _data(dt, "val", w, "cas", 10 * mode + rank)
                    want = torch.where(torch.arange(BLOCK) % 2 == 0, vals, init)
                    got = cas_targets[dt][mode][w].cpu()
                    if not torch.equal(got, want):
                        failures.append(f"cas {dt} mode {mode}: {w} -> {rank}: final values differ")
                    # Negative control: the swap really changed the even lanes.
                    if torch.equal(got, init):
                        failures.append(f"cas {dt} mode {mode}: {w} -> {rank}: nothing was swapped")
        heap.barrier()
    finally:
        heap.close()
    return failures


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_atomic_semantics(world_size):
    require_world(world_size)
    failures = [f for r in run_world(semantics_body, world_size, timeout=120) for f in r]
    assert failures == [], "\n".join(failures[:40])


def test_atomic_reference_model_is_discriminating():
    """Negative control of the reference model: operands really exercise sign and bits,
    so a wrong op (unsigned min, or instead of xor, ...) would not match by accident."""
    for dt in INT_DTYPES:
        a, b = _data(dt, "init", 0, "min", 0), _data(dt, "val", 1, "min", 0)
        assert (a < 0).any() and (b > 0).any()
        assert not torch.equal(_apply("min", a, b), _apply("max", a, b))
        x, y = _data(dt, "init", 0, "xor", 0), _data(dt, "val", 1, "xor", 0)
        assert not torch.equal(_apply("xor", x, y), _apply("or", x, y))
        assert not torch.equal(_apply("and", x, y), _apply("xchg", x, y))


# --------------------------------------------------------------------------- (c) spinlock

LOCK_PROGRAMS = 3
LOCK_ITERS = 20
#: The lock's budget is time on the GPU's clock there (ns), attempts in the interpreter: where
#: ranks share a GPU, a holder switched out with the lock keeps it for a time slice, during
#: which a waiter's attempts say nothing about the time.
TIMED = BACKEND != "cpu"
#: (budget of the real lock, of the lock nobody releases): 10 s and 20 us, or attempts.
LOCK_BUDGETS = (10_000_000_000, 20_000) if TIMED else (500_000, 20)


@triton.jit
def _spinlock_kernel(
    context, heap_bases, lock, counter, fails, budget,
    RANK: tl.constexpr, WORLD: tl.constexpr, ITERS: tl.constexpr, TIMED: tl.constexpr,
):  # fmt: skip
    """ITERS critical sections per program: take the lock on rank 0 with an acquire CAS,
    increment rank 0's counter non-atomically, release with a release exchange. A lock
    not taken within ``budget`` (ns of :func:`global_timer` when TIMED, else attempts) is
    counted in ``fails`` (and not released)."""
    pid = tl.program_id(0)
    ctx = Context.initialize(context, RANK, WORLD)
    for _ in range(ITERS):
        spins = 0
        deadline = spins + budget
        if TIMED:
            deadline = global_timer() + budget
        if pid % 2 == 0:
            old = ctx.atomic_cas(lock, 0, 1, 0, sem="acquire", scope="sys")
        else:
            old = imt.atomic_cas(lock, 0, 1, RANK, 0, heap_bases, sem="acquire", scope="sys")
        more = spins < budget
        while (old != 0) & more:
            if pid % 2 == 0:
                old = ctx.atomic_cas(lock, 0, 1, 0, sem="acquire", scope="sys")
            else:
                old = imt.atomic_cas(lock, 0, 1, RANK, 0, heap_bases, sem="acquire", scope="sys")
            spins += 1
            if TIMED:
                more = global_timer() < deadline
            else:
                more = spins < budget
        if old == 0:
            if pid % 2 == 0:
                v = ctx.load(counter, 0)
                ctx.store(counter, v + 1, 0)
                ctx.atomic_xchg(lock, 0, 0, sem="release", scope="sys")
            else:
                v = imt.load(counter, RANK, 0, heap_bases)
                imt.store(counter, v + 1, RANK, 0, heap_bases)
                imt.atomic_xchg(lock, 0, RANK, 0, heap_bases, sem="release", scope="sys")
        else:
            tl.atomic_add(fails, 1)


def spinlock_body(rank: int, world: int):
    heap = iris.mem.init(HEAP)
    try:
        ctx_t, bases = heap.get_device_context(), heap.get_heap_bases()
        lock = heap.zeros(1, dtype=torch.int32)
        counter = heap.zeros(1, dtype=torch.int32)
        held = heap.zeros(1, dtype=torch.int32)  # negative control: a lock nobody releases
        held_counter = heap.zeros(1, dtype=torch.int32)
        if rank == 0:
            held.fill_(1)
        fails = torch.zeros(1, dtype=torch.int32, device=heap.device)
        held_fails = torch.zeros(1, dtype=torch.int32, device=heap.device)
        heap.barrier()
        args = dict(RANK=rank, WORLD=world, ITERS=LOCK_ITERS, TIMED=TIMED)
        budget, held_budget = LOCK_BUDGETS
        _spinlock_kernel[(LOCK_PROGRAMS,)](ctx_t, bases, lock, counter, fails, budget, **args)
        # A held lock: every attempt gives up after a short budget and is counted.
        _spinlock_kernel[(LOCK_PROGRAMS,)](ctx_t, bases, held, held_counter, held_fails, held_budget, **args)
        heap.barrier()
        out = (int(fails.item()), int(held_fails.item()), int(counter.item()), int(held_counter.item()))
        out += (int(lock.item()), int(held.item()))
        heap.barrier()
        return out
    finally:
        heap.close()


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_cas_spinlock_mutual_exclusion(world_size):
    require_world(world_size)
    results = run_world(spinlock_body, world_size, timeout=120)
    sections = LOCK_PROGRAMS * LOCK_ITERS
    for rank, (fails, held_fails, *_rest) in enumerate(results):
        assert fails == 0, f"rank {rank}: {fails} lock acquisitions ran out of spins"
        assert held_fails == sections, f"rank {rank}: held lock was taken {sections - held_fails} times"
    _, _, counter, held_counter, lock, held = results[0]
    assert counter == world_size * sections, f"counter {counter}, want {world_size * sections}: lost updates"
    assert lock == 0, "lock left taken"
    assert (held_counter, held) == (0, 1), "the never-released lock was entered"
