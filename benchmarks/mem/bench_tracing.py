"""Cost of device tracing: an all-gather kernel traced, untraced, and written without tracing.

Run with one process per GPU::

    torchrun --nproc_per_node=2 benchmarks/mem/bench_tracing.py --out benchmarks/mem/results/tracing.json

The kernel is a push all-gather: every program puts its tile of the local input into every
rank's output (``ctx.put`` to each rank, one event per put when traced), followed by the
heap's device barrier. Three builds of the same kernel are timed for each per-rank size:

* ``functional``: the functional API (``iris.mem.triton.put``), which knows nothing of
  tracing: the cost of the all-gather before tracing existed;
* ``untraced``: ``Context`` with ``tracing=False`` (must match ``functional``: the recording
  compiles away);
* ``traced``: ``Context`` with ``tracing=True`` into a buffer large enough for every event.

Times are device times, measured like ``bench_rma.py`` does: CUDA events around replays of
a CUDA graph of several kernel-plus-barrier calls, median over repetitions per rank, maximum
over ranks. Every build's output is checked against
``torch.distributed.all_gather_into_tensor`` first. The table goes to stdout and the rows
to ``--out`` (JSON); ``--trace`` also exports the trace of the smallest size (merged Chrome
JSON) beside it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris.mem
import iris.mem.triton as imt
from iris.mem.triton import HEAP_BASES_OFFSET, Context

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_rma import _max_over_ranks, _median_time_us  # the same timing as the RMA benchmark
from bench_timing import command_line, refuse_shared_gpu  # benchmarks/bench_timing.py

KiB, MiB = 1 << 10, 1 << 20
SIZES = [16 * KiB, 256 * KiB, 4 * MiB, 64 * MiB]  # bytes per rank
BUILDS = ("functional", "untraced", "traced")
BLOCK = 2048  # elements per program


@triton.jit
def _all_gather_kernel(
    context, src, dst, n,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
    FUNCTIONAL: tl.constexpr, TRACE: tl.constexpr,
):  # fmt: skip
    """dst[RANK * n + i] on every rank <- src[i] here, one tile of BLOCK per program."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    at = dst + RANK * n + offs
    if FUNCTIONAL:
        bases = context + HEAP_BASES_OFFSET
        for i in tl.static_range(WORLD):
            imt.put(src + offs, at, RANK, (RANK + i) % WORLD, bases, mask=mask, hint=16)
    else:
        ctx = Context.initialize(context, RANK, WORLD, tracing=TRACE)
        for i in tl.static_range(WORLD):
            ctx.put(src + offs, at, (RANK + i) % WORLD, mask=mask, hint=16)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/mem/results/tracing.json", help="JSON file to write")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--trace", action="store_true", help="also export the smallest size's trace")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    heap = iris.mem.init(SIZES[-1] * (world + 1) + (64 << 20))  # input + output of the largest size
    refuse_shared_gpu(heap.capabilities)  # ranks sharing a GPU measure nothing
    rank = heap.rank
    src_all = heap.empty(SIZES[-1] // 2, dtype=torch.bfloat16)
    dst_all = heap.empty(SIZES[-1] // 2 * world, dtype=torch.bfloat16)
    rows, failures = [], []
    for nbytes in SIZES:
        n = nbytes // 2
        src, dst = src_all[:n], dst_all[: n * world]
        src.copy_(torch.randn(n, device=heap.device).to(torch.bfloat16))
        expected = torch.empty(n * world, dtype=torch.bfloat16, device=heap.device)
        dist.all_gather_into_tensor(expected, src)
        grid = (triton.cdiv(n, BLOCK),)
        events_per_call = grid[0] * world
        # Room for every event of the check, the warm-up and every replay (at most 50 calls each).
        heap.tracing.enable(max_events=events_per_call * (50 * args.reps + 8))
        row = {"bytes_per_rank": nbytes, "programs": grid[0], "events_per_call": events_per_call, "us": {}}

        def launch(build, src=src, dst=dst, n=n, grid=grid):
            _all_gather_kernel[grid](
                heap.get_device_context(), src, dst, n, RANK=rank, WORLD=world, BLOCK=BLOCK,
                FUNCTIONAL=build == "functional", TRACE=build == "traced",
            )  # fmt: skip
            heap.device_barrier()

        for build in BUILDS:
            call = functools.partial(launch, build)
            dst.zero_()
            heap.barrier()
            call()
            heap.barrier()
            if not torch.equal(dst, expected):
                failures.append(f"{build} at {nbytes} bytes/rank: output differs from all_gather_into_tensor")
                continue
            row["us"][build] = _max_over_ranks(_median_time_us(call, nbytes, args.reps))
        stats = heap.tracing.stats()
        row["trace"] = stats
        if stats["dropped"]:
            failures.append(f"{nbytes} bytes/rank: {stats['dropped']} events dropped, the traced time is low")
        us = row["us"]
        if "traced" in us and "untraced" in us and "functional" in us:
            row["traced_over_untraced"] = us["traced"] / us["untraced"]
            row["untraced_over_functional"] = us["untraced"] / us["functional"]
            row["busbw_GBps"] = (world - 1) * nbytes / (us["untraced"] * 1e-6) / 1e9
        rows.append(row)
        if args.trace and nbytes == SIZES[0]:
            heap.tracing.reset()
            launch("traced")
            path = os.path.join(os.path.dirname(args.out) or ".", "tracing_all_gather_trace.json")
            heap.tracing.export(path, merge=True)
        if rank == 0:
            print(
                f"{nbytes // KiB} KiB/rank: " + ", ".join(f"{k} {v:.2f} us" for k, v in us.items()),
                flush=True,
            )
    if rank == 0:
        _report(rows, failures, args, world)
    heap.close()
    return 1 if failures else 0


def _report(rows, failures, args, world) -> None:
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "world_size": world,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "iris_mem": iris.mem.__version__,
        "block": BLOCK,
        "reps": args.reps,
        "command": command_line(),
    }
    folder = os.path.dirname(args.out)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "failures": failures}, f, indent=1)
    print(f"\n# push all-gather + device barrier, bf16, {world} x {meta['gpus'][0]}: traced vs untraced")
    columns = [
        "bytes/rank",
        "events/call",
        *(f"{b} us" for b in BUILDS),
        "traced/untraced",
        "untraced/functional",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        us = r["us"]
        cells = " | ".join(f"{us[b]:.2f}" if b in us else "-" for b in BUILDS)
        ratios = (
            f"{r['traced_over_untraced']:.3f} | {r['untraced_over_functional']:.3f}"
            if "traced_over_untraced" in r
            else "- | -"
        )
        print(f"| {r['bytes_per_rank'] // KiB} KiB | {r['events_per_call']} | {cells} | {ratios} |")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
