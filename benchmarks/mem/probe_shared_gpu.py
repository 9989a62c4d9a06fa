"""Ranks sharing one GPU: does a kernel spinning on a flag make progress while the GPU runs
its peers' kernels in turns, and what does a hand-off between them cost?

Run on one GPU (on a machine with more, ``CUDA_VISIBLE_DEVICES=0`` makes it one)::

    IRIS_BACKEND=cuda torchrun --standalone --nproc-per-node 2 benchmarks/mem/probe_shared_gpu.py
    IRIS_BACKEND=cuda torchrun --standalone --nproc-per-node 3 benchmarks/mem/probe_shared_gpu.py --out p.json

Without MPS, the GPU runs the kernels of one process at a time and switches between the
processes that have work at the end of a time slice (compute preemption saves a running
kernel wherever it is, spinning or not). So a kernel spinning on a flag that only a later
kernel of another process sets should still finish: it is switched out at the end of its
slice, the peer's kernel runs and sets the flag, and the spinner sees it when it runs
again. This script checks that on the GPU, and measures what each hand-off costs. Every
wait is bounded (``--budget`` seconds on the GPU's clock): a case that does not progress is
reported as such, it never hangs.

Cases (each run ``--trials`` times after a warm-up that compiles every kernel):

``late_flag``
    Rank 0 launches a kernel that spins on a flag of its heap; the other ranks wait
    ``--delay`` seconds on the host (so the spinner surely holds the GPU), then launch a
    kernel that adds 1 to that flag (release, system scope). The hand-off is the time from
    the last peer's store to rank 0's observation, both read from ``%globaltimer``: the
    processes share one GPU, so they read one clock.
``full_grid``
    The same with every SM busy: rank 0's kernel has one spinning program per SM (the most a
    waiting kernel of Iris launches: ``capabilities.resident_programs``), and each peer's
    kernel as many programs, program ``p`` raising flag ``p``. The peers need the SMs that
    rank 0's programs hold; only a switch of process gives them.
``ring``
    ``--rounds`` rounds of a token passed around the ranks, each rank one kernel for all
    rounds (wait for the token, hand it on): the time per hand-off inside running kernels.
``device_barrier``
    ``heap.device_barrier()`` called ``--barriers`` times back to back: what a barrier of
    Iris (every collective has at least one) costs when the ranks share the GPU.

Prints a line per case on rank 0 and writes the results as JSON to ``--out`` (rank 0);
exits 1 when a case did not complete.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris.mem
from iris.mem.triton import Context
from iris.mem.utils import global_timer, wait_at_least

#: int64 words a waiting program writes per trial: when it stopped waiting, what it saw.
_SEEN_WORDS: tl.constexpr = tl.constexpr(2)


@triton.jit
def _wait_kernel(flags, seen, target, budget):
    """Program ``p`` spins (acquire, system scope) until the local ``flags[p] >= target`` or
    ``budget`` ns have passed, then records ``[%globaltimer, value seen]``."""
    pid = tl.program_id(0)
    value = wait_at_least(flags + pid, target, budget)
    tl.store(seen + _SEEN_WORDS * pid, global_timer())
    tl.store(seen + _SEEN_WORDS * pid + 1, value.to(tl.int64))


@triton.jit
def _raise_kernel(context, flags, stamps, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Program ``p`` adds 1 to ``flags[p]`` of rank 0 (release, system scope) and records
    when (``%globaltimer`` just before the store)."""
    ctx = Context.initialize(context, RANK, WORLD)
    pid = tl.program_id(0)
    tl.store(stamps + pid, global_timer())
    ctx.atomic_add(flags + pid, 1, 0, sem="release", scope="sys")


@triton.jit
def _ring_kernel(context, token, times, rounds, budget, RANK: tl.constexpr, WORLD: tl.constexpr):
    """``rounds`` rounds of a token around the ranks: in round ``r`` rank 0 waits for its
    local ``token >= r`` (r > 0), any other rank for ``token >= r + 1``; each then sets the
    next rank's token to ``r + 1`` (release, system scope). Records ``[start, end, rounds
    completed]`` (``%globaltimer``); a wait that runs out of ``budget`` ns ends the rounds."""
    ctx = Context.initialize(context, RANK, WORLD)
    nxt: tl.constexpr = (RANK + 1) % WORLD
    lag: tl.constexpr = 0 if RANK == 0 else 1  # rank 0 starts each round, the others follow
    start = global_timer()
    done = rounds * 0
    for r in range(rounds):
        if done == r:  # every earlier round completed
            target = r + lag
            seen = target
            if target > 0:
                seen = wait_at_least(token, target, budget)
            if seen >= target:
                ctx.atomic_xchg(token, r + 1, nxt, sem="release", scope="sys")
                done += 1
    tl.store(times + 0, start)
    tl.store(times + 1, global_timer())
    tl.store(times + 2, done.to(tl.int64))


def _gather(value):
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def _flag_case(heap, programs: int, delay: float, budget_ns: int) -> dict:
    """One trial of ``late_flag`` (``programs`` = 1) or ``full_grid``: every rank calls it."""
    rank, world = heap.rank, heap.world_size
    flags = heap.zeros(programs, dtype=torch.int32)
    seen = torch.zeros(programs * _SEEN_WORDS, dtype=torch.int64, device=heap.device)
    stamps = torch.zeros(programs, dtype=torch.int64, device=heap.device)
    heap.barrier()  # the flags are zero everywhere
    if rank == 0:
        _wait_kernel[(programs,)](flags, seen, world - 1, budget_ns)
    # A host barrier that does not wait for the device: rank 0's kernel is queued (and soon
    # spinning) before any peer launches.
    dist.barrier()
    if rank != 0:
        time.sleep(delay)
        _raise_kernel[(programs,)](heap.get_device_context(), flags, stamps, RANK=rank, WORLD=world)
    torch.cuda.synchronize()
    mine = {"seen": seen.view(programs, _SEEN_WORDS).tolist(), "stamps": stamps.tolist()}
    everyone = _gather(mine)
    heap.barrier()
    heap.free(flags)
    observed = everyone[0]["seen"]
    completed = all(value >= world - 1 for _, value in observed)
    if world == 1:
        return {"completed": completed, "handoff_us": None}
    # per program: from the last peer's store into flag p to rank 0's program p seeing it
    last_store = [max(everyone[r]["stamps"][p] for r in range(1, world)) for p in range(programs)]
    handoffs = [(observed[p][0] - last_store[p]) / 1e3 for p in range(programs)]
    return {"completed": completed, "handoff_us": max(handoffs)}


def _ring_case(heap, rounds: int, budget_ns: int) -> dict:
    rank, world = heap.rank, heap.world_size
    token = heap.zeros(1, dtype=torch.int32)
    times = torch.zeros(3, dtype=torch.int64, device=heap.device)
    heap.barrier()
    _ring_kernel[(1,)](heap.get_device_context(), token, times, rounds, budget_ns, RANK=rank, WORLD=world)
    torch.cuda.synchronize()
    everyone = _gather(times.tolist())
    heap.barrier()
    heap.free(token)
    completed = all(t[2] == rounds for t in everyone)
    span_ns = max(t[1] for t in everyone) - min(t[0] for t in everyone)
    return {"completed": completed, "per_handoff_us": span_ns / 1e3 / max(1, rounds * world)}


def _barrier_case(heap, calls: int) -> dict:
    heap.barrier()
    started = time.perf_counter()
    for _ in range(calls):
        heap.device_barrier()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    heap.barrier()  # raises a wait that gave up
    return {"completed": True, "per_call_us": max(_gather(seconds * 1e6 / calls))}


def probe(
    heap, trials: int = 5, rounds: int = 200, barriers: int = 100, delay: float = 0.2, budget: float = 60.0
) -> dict:
    """Every case of this module on ``heap`` (collective: every rank calls it); returns the
    results (the same on every rank). ``budget``: seconds any one wait may take."""
    caps = heap.capabilities
    budget_ns = int(budget * 1e9)
    results: dict = {
        "world": heap.world_size,
        "gpu": caps.name,
        "gpus_visible": torch.cuda.device_count(),
        "ranks_on_device": max(_gather(caps.ranks_on_device)),
        "resident_programs": caps.resident_programs,
        "trials": trials,
    }
    # warm-up: every kernel compiled on every rank before anything is timed
    _flag_case(heap, 1, 0.0, budget_ns)
    _ring_case(heap, 2, budget_ns)
    _barrier_case(heap, 2)
    for name, run in (
        ("late_flag", lambda: _flag_case(heap, 1, delay, budget_ns)),
        ("full_grid", lambda: _flag_case(heap, caps.resident_programs, delay, budget_ns)),
        ("ring", lambda: _ring_case(heap, rounds, budget_ns)),
        ("device_barrier", lambda: _barrier_case(heap, barriers)),
    ):
        runs = [run() for _ in range(trials)]
        case = {"completed": all(r["completed"] for r in runs)}
        for key in runs[0]:
            values = [r[key] for r in runs if r[key] is not None and key != "completed"]
            if values:
                case[key] = statistics.median(values)
                case[key + "_max"] = max(values)
        results[name] = case
    results["programs"] = caps.resident_programs
    results["rounds"], results["barriers"] = rounds, barriers
    return results


def _report(results: dict) -> list[str]:
    lines = [
        f"{results['world']} ranks, {results['ranks_on_device']} on this GPU ({results['gpu']}, "
        f"{results['gpus_visible']} visible), {results['trials']} trials, median (max):"
    ]
    for name, key, unit in (
        ("late_flag", "handoff_us", "us from the last peer's store to the spinner seeing it"),
        ("full_grid", "handoff_us", f"us, {results['programs']} spinning programs"),
        ("ring", "per_handoff_us", f"us per hand-off, {results['rounds']} rounds"),
        ("device_barrier", "per_call_us", f"us per barrier, {results['barriers']} back to back"),
    ):
        case = results[name]
        verdict = "completed" if case["completed"] else "DID NOT COMPLETE"
        value = f"{case[key]:.1f} ({case[key + '_max']:.1f}) {unit}" if key in case else "-"
        lines.append(f"  {name:15} {verdict}: {value}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="", help="JSON file for the results (rank 0)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=200, help="rounds of the token ring")
    parser.add_argument("--barriers", type=int, default=100, help="device barriers back to back")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the peers wait before raising")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds any one wait may take")
    args = parser.parse_args()
    with iris.mem.init(1 << 24) as heap:
        if heap.backend != "cuda":
            print("probe_shared_gpu.py measures GPUs: run it with IRIS_BACKEND=cuda", file=sys.stderr)
            return 2
        results = probe(heap, args.trials, args.rounds, args.barriers, args.delay, args.budget)
        if heap.rank == 0:
            print("\n".join(_report(results)), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    cases = ("late_flag", "full_grid", "ring", "device_barrier")
    return 0 if all(results[c]["completed"] for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
