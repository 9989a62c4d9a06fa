"""GPU-only tests (``nox -s gpu_tests`` / ``pytest -m gpu`` with IRIS_BACKEND=cuda).

Litmus tests at full speed across GPUs, atomics under contention from every SM, and a heap
of tens of GiB. Skipped unless the run uses the cuda backend. The litmus tests need a GPU per
rank (100,000 hand-offs at full speed between two GPUs: where ranks share a GPU, each
hand-off waits for the GPU to switch processes, and what they check is the path between
GPUs); the others run with ranks sharing a GPU too.
"""

import os

import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris.mem
from iris.mem.testing import gpu_skip_reason, run_world, visible_gpus
from iris.mem.triton import Context

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(BACKEND != "cuda", reason="GPU-only test: run with IRIS_BACKEND=cuda"),
]
ROUNDS = 100_000
SPINS = 1 << 24  # per wait: far more than any healthy round needs, so a lost flag ends the test


#: Why the litmus tests need two GPUs: what they check is the path between GPUs, at full speed.
LITMUS = "a litmus test of 100,000 hand-offs at full speed between two GPUs"


def needs_gpus(n: int, separate: str | None = None):
    reason = gpu_skip_reason(n, separate)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


@triton.jit
def _wait_at_least(ptr, value, budget):
    """Spin (acquire, system scope) until ``*ptr >= value``; returns False on timeout.
    Layout-free (no ``tl.full``), so Gluon kernels call it too (test_mem_gluon)."""
    seen = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
    spins = budget * 0
    while (seen < value) & (spins < budget):
        seen = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
        spins += 1
    return seen >= value


@triton.jit
def message_rounds(ctx, data, flag, ack, offs, nxt, prv, rounds, budget):
    """``rounds`` rounds of message passing in a ring, in one launch: store round r's block
    into ``nxt``'s ``data`` (plain stores), raise its ``flag`` (release, sys), wait for the
    own flag (acquire, sys), count stale or torn elements, acknowledge to ``prv`` and wait
    for ``nxt``'s acknowledgement before overwriting its data. Returns the count (1e6 per
    wait that ran out of ``budget``). Layout-free: Gluon kernels call it too (test_mem_gluon)."""
    bad = rounds * 0
    for r in range(1, rounds + 1):
        ctx.store(data + offs, offs + r, nxt)
        ctx.atomic_xchg(flag, r, nxt, sem="release", scope="sys")
        if _wait_at_least(flag, r, budget):
            got = tl.load(data + offs, volatile=True)
            bad += tl.sum((got != offs + r).to(tl.int32), axis=0)
        else:
            bad += 1000000
        ctx.atomic_xchg(ack, r, prv, sem="release", scope="sys")  # the peer may overwrite data
        if not _wait_at_least(ack, r, budget):
            bad += 1000000
    return bad


@triton.jit
def _message_passing_kernel(
    context, data, flag, ack, errors, rounds, budget, RANK: tl.constexpr, WORLD: tl.constexpr
):
    """Both ranks at once, :func:`message_rounds` with the other rank."""
    ctx = Context.initialize(context, RANK, WORLD)
    tl.store(
        errors, message_rounds(ctx, data, flag, ack, tl.arange(0, 64), 1 - RANK, 1 - RANK, rounds, budget)
    )


def message_passing_body(rank, world_size):
    with iris.mem.init(1 << 26) as heap:
        data = heap.zeros(64, dtype=torch.int32)
        flag, ack, errors = (heap.zeros(1, dtype=torch.int32) for _ in range(3))
        heap.barrier()
        _message_passing_kernel[(1,)](
            heap.get_device_context(), data, flag, ack, errors, ROUNDS, SPINS, RANK=rank, WORLD=2
        )
        heap.barrier()
        return int(errors.item()), int(flag.item())


@needs_gpus(2, LITMUS)
def test_message_passing_never_reads_stale_data():
    for errors, last in run_world(message_passing_body, 2, timeout=300):
        assert errors == 0
        assert last == ROUNDS


@triton.jit
def _sc_fence():
    tl.inline_asm_elementwise("fence.sc.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _store_buffering_kernel(
    context, x, done, stale, rounds, budget, RANK: tl.constexpr, WORLD: tl.constexpr, FENCE: tl.constexpr
):
    """Round r: write x[RANK] = r on the peer, (fence), read the local x[peer]; record
    whether the peer's round-r write was not yet visible. Rounds are separated by a
    two-sided handshake so both ranks race within the same round."""
    ctx = Context.initialize(context, RANK, WORLD)
    peer = 1 - RANK
    for r in range(1, rounds + 1):
        ctx.atomic_xchg(x + RANK, r, peer, sem="relaxed", scope="sys")
        if FENCE:
            _sc_fence()
        seen = tl.atomic_add(x + peer, 0, sem="relaxed", scope="sys")
        tl.store(stale + r - 1, (seen < r).to(tl.int8))
        ctx.atomic_xchg(done, r, peer, sem="release", scope="sys")
        _wait_at_least(done, r, budget)


def store_buffering_body(rank, world_size, fence):
    with iris.mem.init(1 << 26) as heap:
        x = heap.zeros(2, dtype=torch.int32)
        done = heap.zeros(1, dtype=torch.int32)
        stale = heap.zeros(ROUNDS, dtype=torch.int8)
        heap.barrier()
        _store_buffering_kernel[(1,)](
            heap.get_device_context(), x, done, stale, ROUNDS, SPINS, RANK=rank, WORLD=2, FENCE=fence
        )
        heap.barrier()
        mine = stale.cpu()
        theirs = [None, None]
        dist.all_gather_object(theirs, mine)
        both_stale = int((theirs[0].bool() & theirs[1].bool()).sum())
        return both_stale, int(done.item())


@needs_gpus(2, LITMUS)
def test_store_buffering_is_forbidden_with_sc_fences():
    for both_stale, last in run_world(store_buffering_body, 2, True, timeout=300):
        assert last == ROUNDS
        assert both_stale == 0, f"{both_stale} of {ROUNDS} rounds saw neither store despite fence.sc.sys"


@triton.jit
def _contention_kernel(context, counters, iters, RANK: tl.constexpr, WORLD: tl.constexpr):
    ctx = Context.initialize(context, RANK, WORLD)
    for _ in range(iters):
        for peer in tl.static_range(WORLD):
            ctx.atomic_add(counters, 1, peer, sem="relaxed", scope="sys")
            ctx.atomic_add(counters + 1, 2, peer, sem="acq_rel", scope="sys")
            ctx.atomic_add(
                (counters + 2).to(tl.pointer_type(tl.float32), bitcast=True), 1.0, peer, scope="sys"
            )


def contention_body(rank, world_size, programs, iters):
    with iris.mem.init(1 << 26) as heap:
        counters = heap.zeros(3, dtype=torch.int32)
        heap.barrier()
        _contention_kernel[(programs,)](
            heap.get_device_context(), counters, iters, RANK=rank, WORLD=world_size
        )
        heap.barrier()
        values = counters.cpu()
        return int(values[0]), int(values[1]), float(values[2:3].view(torch.float32).item())


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_atomics_from_every_sm_are_exact(world_size):
    if gpu_skip_reason(world_size):
        pytest.skip(gpu_skip_reason(world_size))
    programs = torch.cuda.get_device_properties(0).multi_processor_count * 4
    iters = 200
    expected = world_size * programs * iters
    for ones, twos, floats in run_world(contention_body, world_size, programs, iters, timeout=300):
        assert ones == expected and twos == 2 * expected
        assert floats == float(expected)  # exact: below 2**24


@triton.jit
def _far_store_kernel(context, big, first, last, RANK: tl.constexpr, WORLD: tl.constexpr):
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.arange(0, 256)
    peer = (RANK + 1) % WORLD
    ctx.store(big + first + offs, offs.to(tl.int64) + RANK * 1000, peer)
    ctx.store(big + last - 255 + offs, offs.to(tl.int64) + RANK * 1000 + 7, peer)


def large_heap_body(rank, world_size, heap_gib):
    with iris.mem.init(heap_gib << 30) as heap:
        heap.zeros(1 << 20)  # push the big tensor away from offset 0
        numel = (heap.free_bytes - (1 << 20)) // 8
        big = heap.empty(numel, dtype=torch.int64)
        big[:256].zero_()
        big[-256:].zero_()
        heap.barrier()
        _far_store_kernel[(1,)](heap.get_device_context(), big, 0, numel - 1, RANK=rank, WORLD=world_size)
        heap.barrier()
        src = (rank - 1) % world_size
        ok_first = torch.equal(big[:256].cpu(), torch.arange(256) + src * 1000)
        ok_last = torch.equal(big[-256:].cpu(), torch.arange(256) + src * 1000 + 7)
        return ok_first, ok_last, big.numel() * 8 > (16 << 30)


@needs_gpus(1)
def test_heap_of_tens_of_gib_reaches_its_last_bytes():
    world = min(visible_gpus(), 2)  # 40 GiB per rank: one rank per GPU
    for ok_first, ok_last, beyond_16_gib in run_world(large_heap_body, world, 40, timeout=300):
        assert ok_first and ok_last and beyond_16_gib
