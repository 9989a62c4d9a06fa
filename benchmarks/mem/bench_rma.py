"""Remote-memory-access bandwidth and latency between every pair of GPUs.

Run with one process per GPU::

    torchrun --nproc_per_node=2 benchmarks/mem/bench_rma.py --out results/

For each ordered pair of ranks (src -> dst) and each message size from 4 KiB to 1 GiB it
times, in the same run: Iris kernels doing remote ``load``, ``store``, ``get``, ``put`` and
``copy`` (one direction, and every rank at once), the copy engine moving the same bytes
(``Tensor.copy_`` between the two GPUs' heaps), and a local HBM copy. It also measures the
one-way latency of a flag handed back and forth between two GPUs. Times are device times
(CUDA events around replays of a CUDA graph of several launches), the median
of the repetitions on each rank, then the maximum over ranks. The table goes to stdout and
``results.json`` (and ``rma_bandwidth.png`` with matplotlib) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris.mem
from iris.mem.triton import Context

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_timing import command_line, refuse_shared_gpu  # noqa: E402 - benchmarks/bench_timing.py

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SIZES = [4 * KiB * 4**i for i in range(11) if 4 * KiB * 4**i <= GiB]  # 4 KiB .. 1 GiB
OPS = ("load", "store", "get", "put", "copy")
#: Experimental: the same put/get through Hopper's bulk tensor copy engine (TMA) with
#: host-built descriptors over the heaps' IPC mappings, to see what a bulk mechanism gains.
TMA_OPS = ("put_tma", "get_tma")
TMA_COLS = 256  # int32 words per row of the 2-D view TMA needs (a box side is at most 256)


@triton.jit
def _rma_kernel(
    context,
    src,
    dst,
    sink,
    peer,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
    TILES: tl.constexpr,
):
    """Each program moves TILES consecutive tiles of BLOCK int32 words (sizes are exact
    multiples, so no masks: the accesses stay 16-byte vectors)."""
    ctx = Context.initialize(context, RANK, WORLD)
    base = tl.program_id(0) * BLOCK * TILES
    acc = tl.zeros([BLOCK], tl.int32)
    for t in tl.static_range(TILES):
        offs = base + t * BLOCK + tl.arange(0, BLOCK)
        if OP == "load":  # remote read only; fold into registers, one word written per program
            acc += ctx.load(src + offs, peer, hint=16)
        elif OP == "store":  # remote write only, of values made in registers
            ctx.store(dst + offs, offs, peer, hint=16)
        elif OP == "get":
            ctx.get(src + offs, dst + offs, peer, hint=16)
        elif OP == "put":
            ctx.put(src + offs, dst + offs, peer, hint=16)
        else:  # copy, this rank's buffer into the peer's
            ctx.copy(src + offs, dst + offs, RANK, peer, hint=16)
    if OP == "load":
        tl.store(sink + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def _tma_copy_kernel(src_desc, dst_desc, BLOCK_R: tl.constexpr, TILES: tl.constexpr):
    """Copy TILES boxes of [BLOCK_R, TMA_COLS] words from ``src_desc`` to ``dst_desc``."""
    base = tl.program_id(0) * BLOCK_R * TILES
    for t in tl.static_range(TILES):
        box = src_desc.load([base + t * BLOCK_R, 0])
        dst_desc.store([base + t * BLOCK_R, 0], box)


def _tma_launcher(src: torch.Tensor, dst: torch.Tensor, words: int):
    """A launch of ``_tma_copy_kernel`` moving ``words`` int32 from ``src`` to ``dst``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = words // TMA_COLS
    block_r = min(16, rows)
    tiles = 2 if rows >= 64 * block_r else 1
    src_desc = TensorDescriptor.from_tensor(src[:words].view(rows, TMA_COLS), [block_r, TMA_COLS])
    dst_desc = TensorDescriptor.from_tensor(dst[:words].view(rows, TMA_COLS), [block_r, TMA_COLS])
    grid = (rows // (block_r * tiles),)

    def launch():
        _tma_copy_kernel[grid](src_desc, dst_desc, BLOCK_R=block_r, TILES=tiles, num_warps=4)

    return launch


@triton.jit
def _ping_pong_kernel(context, flag, rounds, RANK: tl.constexpr, WORLD: tl.constexpr, PEER: tl.constexpr):
    """Rank 0 and PEER hand a counter back and forth: each waits (acquire, system scope)
    for its local flag to reach the next value, then writes the peer's (release)."""
    ctx = Context.initialize(context, RANK, WORLD)
    first = RANK == 0
    for i in range(rounds):
        mine = 2 * i + (0 if first else 1)
        if not first or i > 0:
            while tl.atomic_add(flag, 0, sem="acquire", scope="sys") < mine:
                pass
        ctx.atomic_xchg(flag, mine + 1, PEER if first else 0, sem="release", scope="sys")


def _config(nbytes: int) -> tuple[int, int, int]:
    """(BLOCK words, TILES per program, num_warps) for a message of ``nbytes``."""
    words = nbytes // 4
    if words <= 4096:
        return 1024, 1, 4
    if words <= 1 << 18:
        return 2048, 1, 8
    return 4096, 2, 8


def _median_time_us(launch, nbytes: int, reps: int) -> float:
    """Median device time of one ``launch()`` in microseconds, from replays of a CUDA graph
    of several back-to-back launches (so launch overhead is not what is measured)."""
    calls = 50 if nbytes < MiB else 10 if nbytes < 64 * MiB else 2
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()  # warm-up and compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            launch()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        dist.barrier()  # start every rank together, so "both" really overlaps
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(samples)


def _max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


@dataclasses.dataclass
class Buffers:
    """Heap buffers of the benchmark (int32 words)."""

    src: torch.Tensor
    dst: torch.Tensor
    sink: torch.Tensor
    flag: torch.Tensor

    @classmethod
    def allocate(cls, heap) -> Buffers:
        n = SIZES[-1] // 4
        return cls(
            src=heap.randint(-1000, 1000, (n,), dtype=torch.int32),
            dst=heap.zeros(n, dtype=torch.int32),
            sink=heap.zeros(1 << 20, dtype=torch.int32),
            flag=heap.zeros(1, dtype=torch.int32),
        )


def _idle(reps: int) -> float:
    """Take part in the per-repetition barriers of a measurement this rank sits out."""
    for _ in range(reps):
        dist.barrier()
    return 0.0


def bench_bandwidth(heap, bufs: Buffers, src_rank: int, dst_rank: int, both: bool, reps: int) -> list[dict]:
    """All ops and sizes for the pair (src_rank -> dst_rank); with ``both`` the pair runs
    the mirror-image transfer at the same time."""
    rank = heap.rank
    rows = []
    src, dst, sink = bufs.src, bufs.dst, bufs.sink
    active = rank in (src_rank, dst_rank) if both else rank == src_rank
    peer = dst_rank if rank == src_rank else src_rank
    for nbytes in SIZES:
        words = nbytes // 4
        block, tiles, warps = _config(nbytes)
        grid = (words // (block * tiles),)
        for op in OPS + TMA_OPS + ("copy_engine", "local_copy"):
            # For "load"/"get" the data flows peer -> this rank; the initiator is the reader.
            if op in ("load", "get", "get_tma"):
                runs = rank == dst_rank or (both and rank == src_rank)
                target = src_rank if rank == dst_rank else dst_rank
            else:
                runs = active
                target = peer
            if op == "put_tma":
                launch = _tma_launcher(src, heap.peer_tensor(dst, target), words)
            elif op == "get_tma":
                launch = _tma_launcher(heap.peer_tensor(src, target), dst, words)
            elif op == "copy_engine":
                there = heap.peer_tensor(dst[:words], target)

                def launch(there=there, words=words):
                    there.copy_(src[:words])

            elif op == "local_copy":

                def launch(words=words):
                    dst[:words].copy_(src[:words])

                runs = active
            else:

                def launch(op=op, grid=grid, block=block, tiles=tiles, warps=warps, target=target):
                    _rma_kernel[grid](
                        heap.get_device_context(), src, dst, sink, target,
                        RANK=rank, WORLD=heap.world_size, OP=op, BLOCK=block, TILES=tiles, num_warps=warps,
                    )  # fmt: skip

            t = _max_over_ranks(_median_time_us(launch, nbytes, reps) if runs else _idle(reps))
            rows.append(
                {
                    "src": src_rank,
                    "dst": dst_rank,
                    "both": both,
                    "op": op,
                    "bytes": nbytes,
                    "time_us": t,
                    "GBps": nbytes / (t * 1e-6) / 1e9 if t > 0 else 0.0,
                }
            )
    return rows


def bench_latency(heap, bufs: Buffers, peer: int, rounds: int = 2000) -> float | None:
    """One-way latency in microseconds between rank 0 and ``peer`` (a flag ping-pong)."""
    rank = heap.rank
    flag = bufs.flag
    flag.zero_()
    heap.barrier()
    us = None
    if rank in (0, peer):
        args = (heap.get_device_context(), flag, rounds)
        _ping_pong_kernel[(1,)](*args, RANK=rank, WORLD=heap.world_size, PEER=peer)  # warm-up
    heap.barrier()
    flag.zero_()
    heap.barrier()
    if rank in (0, peer):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _ping_pong_kernel[(1,)](*args, RANK=rank, WORLD=heap.world_size, PEER=peer)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1000.0 / (2 * rounds)
    heap.barrier()
    return us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/mem/results", help="folder for results.json and plots")
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions per point")
    args = parser.parse_args()
    heap = iris.mem.init(4 * GiB)
    refuse_shared_gpu(heap.capabilities)  # ranks sharing a GPU measure nothing
    rank, world = heap.rank, heap.world_size
    if heap.backend != "cuda" or world < 2:
        print("bench_rma needs the cuda backend and at least 2 ranks (torchrun --nproc_per_node=2)")
        heap.close()
        return 2
    bufs = Buffers.allocate(heap)
    heap.barrier()
    # Check before timing: every rank puts its whole source buffer into the next rank's.
    n = bufs.src.numel()
    ctx = heap.get_device_context()
    grid = (n // (4096 * 2),)
    meta = dict(RANK=rank, WORLD=world, OP="put", BLOCK=4096, TILES=2, num_warps=8)
    _rma_kernel[grid](ctx, bufs.src, bufs.dst, bufs.sink, (rank + 1) % world, **meta)
    heap.barrier()
    sums = [None] * world
    dist.all_gather_object(sums, (int(bufs.src.sum()), int(bufs.dst.sum())))
    if any(sums[r][1] != sums[(r - 1) % world][0] for r in range(world)):
        raise SystemExit(f"validation failed: put did not deliver the source buffers (sums {sums})")
    rows = []
    for src_rank in range(world):
        for dst_rank in range(world):
            if src_rank == dst_rank:
                continue
            rows += bench_bandwidth(heap, bufs, src_rank, dst_rank, both=False, reps=args.reps)
            if src_rank < dst_rank:
                rows += bench_bandwidth(heap, bufs, src_rank, dst_rank, both=True, reps=args.reps)
    latency = {p: bench_latency(heap, bufs, p) for p in range(1, world)}
    if rank == 0:
        meta = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "world_size": world,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "iris_mem": iris.mem.__version__,
            "python": platform.python_version(),
            "command": command_line(),
        }
        _report(rows, latency, meta, args.out)
    heap.close()
    return 0


def _report(rows: list[dict], latency: dict, meta: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "bandwidth": rows, "latency_us": latency}, f, indent=1)
    print(f"# iris.mem RMA bandwidth, GB/s per direction ({meta['gpus'][0]}, torch {meta['torch']}, "
          f"triton {meta['triton']})")  # fmt: skip
    for both in (False, True):
        sel = [r for r in rows if r["both"] == both and r["src"] == 0 and r["dst"] == 1]
        print(f"\n## 0 -> 1{' and 1 -> 0 at once' if both else ', one direction'}")
        cols = OPS + TMA_OPS + ("copy_engine", "local_copy")
        print("| size | " + " | ".join(cols) + " | put/CE | get/CE |")
        print("|---" * (len(cols) + 3) + "|")
        for nbytes in SIZES:
            by_op = {r["op"]: r["GBps"] for r in sel if r["bytes"] == nbytes}
            ce = by_op.get("copy_engine") or float("nan")
            cells = " | ".join(f"{by_op.get(c, 0):.1f}" for c in cols)
            print(f"| {_size(nbytes)} | {cells} | {by_op['put'] / ce:.2f} | {by_op['get'] / ce:.2f} |")
    print(
        "\n## one-way flag latency (us): " + ", ".join(f"0<->{p}: {v:.2f}" for p, v in latency.items() if v)
    )
    try:
        _plot(rows, out)
    except ImportError:
        print("(matplotlib not installed: no plots; run benchmarks/mem/plot_rma.py on results.json)")


def _size(nbytes: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"


def _plot(rows: list[dict], out: str) -> None:
    from plot_rma import plot

    plot(rows, os.path.join(out, "rma_bandwidth.png"))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
