"""Device tracing: see which program of which rank talked to which peer, and when.

Every rank gathers every rank's block (a push all-gather) and then sums what it gathered,
in two kernels built with ``Context.initialize(..., tracing=True)``:

* ``push``: each program puts its tile into every rank's ``gathered`` buffer (``ctx.put``,
  recorded automatically), inside a user region named "push" that the kernel records
  itself, then raises a counter on every peer (``ctx.atomic_add``, recorded too);
* ``reduce``: after a barrier, each program sums the gathered tiles inside a "reduce" region.

The host enables tracing (``heap.tracing.enable``), exports one Chrome/Perfetto JSON file per
rank and a merged one with the ranks' clocks aligned, and rank 0 draws the merged trace as
a PNG when matplotlib is installed. Open the JSON in https://ui.perfetto.dev or
``chrome://tracing``. The script checks the data against torch and the trace against what
the kernels did (event counts, ranks, targets and bytes).

Run: ``torchrun --nproc_per_node=3 examples/06_tracing.py [OUT_DIR]`` (no GPU needed); the
files go to OUT_DIR, or to a temporary folder removed at the end when none is given.
"""

import json
import os
import shutil
import sys
import tempfile

import torch
import triton
import triton.language as tl

import iris.mem  # before defining kernels: it decides whether they run in the interpreter
import iris.mem.tracing
from iris.mem.triton import Context

NAME = "tracing"
N = 300  # elements per rank, not a multiple of BLOCK
BLOCK = 128
PROGRAMS = triton.cdiv(N, BLOCK)


@triton.jit
def push(context, src, gathered, counter, n, PUSH: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
         BLOCK: tl.constexpr):  # fmt: skip
    """gathered[RANK * n + i] on every rank <- src[i] here; then count one arrival on each."""
    ctx = Context.initialize(context, RANK, WORLD, tracing=True)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    region = ctx.tracing.record_event_start(PUSH, address=src + offs, mask=mask)
    for i in tl.static_range(WORLD):
        ctx.put(src + offs, gathered + RANK * n + offs, (RANK + i) % WORLD, mask=mask)
    ctx.tracing.record_event_end(region)
    for i in tl.static_range(WORLD):
        ctx.atomic_add(counter, 1, (RANK + i) % WORLD, sem="release", scope="sys")


@triton.jit
def reduce(context, gathered, total, n, REDUCE: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
           BLOCK: tl.constexpr):  # fmt: skip
    """total[i] = sum over ranks r of gathered[r * n + i] (all local)."""
    ctx = Context.initialize(context, RANK, WORLD, tracing=True)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    region = ctx.tracing.record_event_start(REDUCE, address=gathered + offs, mask=mask)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):
        acc += tl.load(gathered + r * n + offs, mask=mask, other=0.0)
    tl.store(total + offs, acc, mask=mask)
    ctx.tracing.record_event_end(region)


def report(rank: int, world: int, errors: list[str], note: str = "") -> int:
    """Print this rank's verdict as one line (one write, so ranks' lines do not interleave)."""
    verdict = f"FAILED: {'; '.join(errors)}" if errors else f"validated {note}".rstrip()
    sys.stdout.write(f"[rank {rank}/{world}] {NAME}: {verdict}\n")
    sys.stdout.flush()
    return 1 if errors else 0


def check_trace(path: str, rank: int, world: int, lanes: list[int]) -> list[str]:
    """What this rank's exported file must hold: per program one push region, WORLD puts
    (one per target) of 4 bytes per lane, WORLD atomic adds and one reduce region."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    errors = []
    counts = {}
    for e in events:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
        if e["pid"] != rank:
            errors.append(f"event {e['name']} has pid {e['pid']}, expected rank {rank}")
    expected = {"push": PROGRAMS, "put": PROGRAMS * world, "atomic_add": PROGRAMS * world, "reduce": PROGRAMS}
    if counts != expected:
        errors.append(f"event counts {counts}, expected {expected}")
    puts = sorted((e["args"]["target"], e["tid"], e["args"]["bytes"]) for e in events if e["name"] == "put")
    want = sorted((t, p, 4 * lanes[p]) for t in range(world) for p in range(PROGRAMS))
    if puts != want:
        errors.append(f"put (target, program, bytes) {puts[:4]}..., expected {want[:4]}...")
    return errors


def main() -> int:
    errors: list[str] = []
    out_dir = sys.argv[1] if len(sys.argv) > 1 else None
    keep = out_dir is not None
    with iris.mem.init(heap_size=1 << 24) as heap:
        rank, world, device = heap.rank, heap.world_size, heap.device
        if out_dir is None:  # one folder for all ranks: rank 0 makes it
            out_dir = heap.broadcast(tempfile.mkdtemp(prefix="iris-trace-") if rank == 0 else None)
        context = heap.get_device_context()
        push_id, reduce_id = heap.tracing.register("push"), heap.tracing.register("reduce")

        src = heap.as_symmetric(torch.arange(N, dtype=torch.float32, device=device) + 1000.0 * rank)
        gathered = heap.zeros(world * N, dtype=torch.float32)
        counter = heap.zeros(1, dtype=torch.int32)
        total = torch.zeros(N, dtype=torch.float32, device=device)  # local only
        heap.tracing.enable(max_events=10_000)  # collective, like every heap.tracing setup
        heap.barrier()

        grid = (PROGRAMS,)
        push[grid](context, src, gathered, counter, N, PUSH=push_id, RANK=rank, WORLD=world, BLOCK=BLOCK)
        heap.barrier()  # every rank's tiles have landed
        reduce[grid](context, gathered, total, N, REDUCE=reduce_id, RANK=rank, WORLD=world, BLOCK=BLOCK)
        heap.barrier()

        base = torch.arange(N, dtype=torch.float32, device=device)
        expected = world * base + 1000.0 * sum(range(world))
        if not torch.equal(total, expected):
            errors.append(f"sum of the gathered blocks differs from torch, first values {total[:3].tolist()}")
        if counter.item() != world * PROGRAMS:
            errors.append(f"{counter.item()} arrivals counted, expected {world * PROGRAMS}")

        stats = heap.tracing.stats()
        per_rank = heap.tracing.export(os.path.join(out_dir, "trace.json"))  # trace_rank{r}.json
        merged = heap.tracing.export(os.path.join(out_dir, "trace.json"), merge=True)  # rank 0 only
        lanes = [min(BLOCK, N - p * BLOCK) for p in range(PROGRAMS)]
        errors += check_trace(per_rank, rank, world, lanes)
        if stats["dropped"]:
            errors.append(f"{stats['dropped']} events dropped")
        note = f"({stats['recorded']} events, {os.path.basename(per_rank)})"
        if merged is not None:
            try:
                picture = iris.mem.tracing.render(merged, os.path.join(out_dir, "trace.png"))
                note += f"; merged and drawn: {os.path.basename(merged)}, {os.path.basename(picture)}"
            except ImportError:
                note += f"; merged: {os.path.basename(merged)} (install matplotlib to draw it)"
        heap.barrier()
        if rank == 0:
            note += f" in {out_dir}" if keep else " (pass OUT_DIR to keep the files)"
            if not keep:
                shutil.rmtree(out_dir, ignore_errors=True)

    return report(rank, world, errors, note)


if __name__ == "__main__":
    sys.exit(main())
