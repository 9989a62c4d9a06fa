"""Message-passing litmus test across processes: release/acquire flags at system scope.

Ranks form a ring: each rank produces for the next rank and consumes from the previous
one, for ROUNDS rounds inside ONE kernel launch. Round ``k`` (1-based):

* producer: wait until the consumer acknowledged round ``k - 1`` (acquire), write the
  round's data block into the consumer's heap (``put`` on even rounds, ``store`` on odd
  ones), then publish ``flag = k`` on the consumer with a release exchange at sys scope;
* consumer: spin (acquire, sys scope; ``atomic_add(0)`` or a no-op ``atomic_cas``) on its
  local flag until it reads ``k``, read the data block, count every element that is not
  this round's value (stale or torn), and acknowledge ``k`` to the producer (release).

Every wait draws on one budget for the whole kernel, so a lost flag ends in counted
timeouts instead of a hang; the world has a deadline too. On GPUs the budget is time on the
GPU's clock (``%globaltimer``), not a count of polls: where ranks share a GPU, a rank polls
only while the GPU runs its kernel, and each hand-off waits for the GPU to switch to the
peer, so the polls a hand-off takes say nothing about the time it took. In the interpreter
it is a count of polls (one poll there costs about a millisecond of host time).
"""

import pytest
import torch
import triton
import triton.language as tl
from mem_testutils import BACKEND, HEAP, require_world

import iris.mem
import iris.mem.triton as imt
from iris.mem.testing import run_world, shares_gpus
from iris.mem.triton import Context
from iris.mem.utils import global_timer

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

ROUNDS = 1000
#: Rounds in the interpreter, which runs the programs one after another (the GPU is where
#: the memory model is exercised; here the protocol and the checks).
INTERPRETED_ROUNDS = 300
#: Rounds where ranks share a GPU (each of the rounds' hand-offs costs up to a time slice).
SHARED_ROUNDS = 200
BLOCK = 64
# The budget of all waits of one kernel together. In the interpreter, poll iterations (a few
# thousand are used). On GPUs, nanoseconds of the GPU's clock: ranks may launch (and
# JIT-compile) seconds apart, and where ranks share a GPU each of the thousands of hand-offs
# may wait for a time slice, so two minutes, within the deadline.
TIMED = BACKEND != "cpu"
SPIN_BUDGET = 120_000_000_000 if TIMED else 200_000
STATS = ["mismatches", "timeouts", "rounds", "spins"]


@triton.jit
def _mp_kernel(
    context, heap_bases, data, flag, ack, staging, stats, budget,
    RANK: tl.constexpr, WORLD: tl.constexpr, ROUNDS: tl.constexpr, BLOCK: tl.constexpr, SALT: tl.constexpr,
    TIMED: tl.constexpr,
):  # fmt: skip
    """SALT shifts the values the consumer expects (0 for the real test; non-zero is the
    negative control, where every element must count as a mismatch). TIMED: ``budget`` is
    nanoseconds of :func:`global_timer` from the start (GPUs), else poll iterations."""
    ctx = Context.initialize(context, RANK, WORLD)
    deadline = budget
    if TIMED:
        deadline = global_timer() + budget
    nxt: tl.constexpr = (RANK + 1) % WORLD
    prv: tl.constexpr = (RANK + WORLD - 1) % WORLD
    offs = tl.arange(0, BLOCK)
    mismatches = 0
    timeouts = 0
    done = 0
    spins = 0
    for i in range(ROUNDS):
        k = i + 1
        # ---- producer side, towards nxt
        # (waits are written out inline: every nested @triton.jit call costs the
        # interpreter about a millisecond, and this loop runs a thousand times)
        seen = -1
        more = budget > 0
        while (seen < k - 1) & more:
            seen = ctx.atomic_add(ack, 0, RANK, sem="acquire", scope="sys")
            budget -= 1
            spins += 1
            if TIMED:
                more = global_timer() < deadline
            else:
                more = budget > 0
        if seen < k - 1:
            timeouts += 1
        values = k * 131 + offs + RANK * 100000
        if k % 2 == 0:
            tl.store(staging + offs, values)
            ctx.put(staging + offs, data + offs, nxt)
        else:
            imt.store(data + offs, values, RANK, nxt, heap_bases)
        if k % 3 == 0:
            imt.atomic_xchg(flag, k, RANK, nxt, heap_bases, sem="release", scope="sys")
        else:
            ctx.atomic_xchg(flag, k, nxt, sem="release", scope="sys")
        # ---- consumer side, from prv
        seen = -1
        more = budget > 0
        while (seen < k) & more:
            if k % 2 == 1:  # a CAS that never swaps (the flag is never -1) is an acquire read
                seen = ctx.atomic_cas(flag, -1, -1, RANK, sem="acquire", scope="sys")
            else:
                seen = ctx.atomic_add(flag, 0, RANK, sem="acquire", scope="sys")
            budget -= 1
            spins += 1
            if TIMED:
                more = global_timer() < deadline
            else:
                more = budget > 0
        if seen < k:
            timeouts += 1
        got = tl.load(data + offs)
        want = k * 131 + offs + prv * 100000 + SALT
        mismatches += tl.sum((got != want).to(tl.int32), axis=0)
        done += (seen == k).to(tl.int32)
        ctx.atomic_xchg(ack, k, prv, sem="release", scope="sys")
    tl.store(stats + 0, mismatches)
    tl.store(stats + 1, timeouts)
    tl.store(stats + 2, done)
    tl.store(stats + 3, spins)


def mp_body(rank: int, world: int, rounds: int, salt: int):
    heap = iris.mem.init(HEAP)
    try:
        data = heap.full((BLOCK,), -1, dtype=torch.int32)
        flag = heap.zeros(1, dtype=torch.int32)
        ack = heap.zeros(1, dtype=torch.int32)
        staging = heap.zeros(BLOCK, dtype=torch.int32)
        stats = torch.full((len(STATS),), -1, dtype=torch.int32, device=heap.device)
        heap.barrier()
        _mp_kernel[(1,)](
            heap.get_device_context(), heap.get_heap_bases(), data, flag, ack, staging, stats, SPIN_BUDGET,
            RANK=rank, WORLD=world, ROUNDS=rounds, BLOCK=BLOCK, SALT=salt, TIMED=TIMED,
        )  # fmt: skip
        heap.barrier()
        out = dict(zip(STATS, stats.tolist()))
        out.update(flag=int(flag.item()), ack=int(ack.item()), data=data.tolist())
        heap.barrier()
        return out
    finally:
        heap.close()


@pytest.mark.parametrize("world_size", [2, 3, 4] if TIMED else [2, 3])
def test_message_passing_release_acquire(world_size):
    require_world(world_size)
    # Spinning ranks slow down more than in proportion on a loaded machine: a wide margin.
    # Where ranks share a GPU every hand-off waits for the GPU to switch processes: fewer rounds.
    rounds = SHARED_ROUNDS if shares_gpus(world_size) else ROUNDS if TIMED else INTERPRETED_ROUNDS
    results = run_world(mp_body, world_size, rounds, 0, timeout=360)
    for rank, r in enumerate(results):
        prv = (rank - 1) % world_size
        assert r["timeouts"] == 0, f"rank {rank}: {r['timeouts']} waits ran out of budget ({r})"
        assert r["mismatches"] == 0, (
            f"rank {rank}: {r['mismatches']} stale or torn elements over {rounds} rounds"
        )
        assert r["spins"] >= 2 * rounds, f"rank {rank}: fewer wait iterations than waits: {r}"
        assert r["rounds"] == rounds, (
            f"rank {rank}: saw its flag at the round's value in {r['rounds']} rounds"
        )
        assert (r["flag"], r["ack"]) == (rounds, rounds), (
            f"rank {rank}: final flag/ack {r['flag']}/{r['ack']}"
        )
        assert r["data"] == [rounds * 131 + i + prv * 100000 for i in range(BLOCK)], (
            f"rank {rank}: final data"
        )


def test_message_passing_checker_detects_wrong_data():
    """Negative control: with the consumer expecting shifted values, every element of
    every round counts as a mismatch, so the real test's zero is meaningful."""
    require_world(2)
    rounds = 6
    results = run_world(mp_body, 2, rounds, 1, timeout=60)
    for rank, r in enumerate(results):
        assert r["mismatches"] == rounds * BLOCK, f"rank {rank}: {r}"
        assert (r["timeouts"], r["rounds"]) == (0, rounds), f"rank {rank}: {r}"
