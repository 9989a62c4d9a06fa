"""Measure this machine and write the tuning table ``Config(variant="auto")`` reads.

Run it on every GPU of the group size you use (one process per GPU), then point
``IRIS_CCL_TABLE`` at the file::

    torchrun --nproc-per-node 8 -m iris.ccl.tune --out ~/iris-ccl-table.json
    export IRIS_CCL_TABLE=~/iris-ccl-table.json

For each collective and message size it times every variant that can be picked (the
slow reference forms and Gluon aside) on tensors of a symmetric heap, checks each result
against torch.distributed, and keeps the fastest. The rules go into the table under this
machine's GPU model and group size (other entries of an existing ``--out`` file are kept).
Times are device times of CUDA-graph replays where work is queued on streams, wall-clock
times otherwise; each variant is timed in interleaved rounds, median per rank, maximum over
ranks. ``--smoke`` runs the whole command on the CPU backend with tiny sizes, in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import iris.mem

from . import _tuning, variants

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
#: Variants a table never picks: the slow reference forms, and Gluon (one kernel form of
#: push, not every build has it).
LEFT_OUT = ("ring", "atomic", "spinlock", "gluon")
SIZES = [8 << 10, 32 << 10, 128 << 10, 512 << 10, 1 << 20, 2 << 20, 8 << 20, 32 << 20, 128 << 20]
SMOKE_SIZES = [1 << 10, 16 << 10]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_size(text: str) -> int:
    """``"256MiB"`` -> 268435456 (units B, KiB, MiB, GiB; a bare number is bytes)."""
    text = text.strip()
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def time_calls(
    fns: dict[str, Callable[[], object]], device: torch.device, rounds: int, calls: int, group=None
) -> dict[str, float]:
    """Microseconds per call of each of ``fns`` (every rank runs the same ``fns`` in the same
    order): ``rounds`` interleaved rounds of ``calls`` calls each, in an order shuffled the
    same way on every rank; the median over rounds per rank, the maximum over ranks.

    Where work is queued on streams (``iris.mem.capabilities(device).streams``) the calls of
    a round are one CUDA-graph replay timed with events (eager when capture fails); else
    wall-clock time. Each function is called once first (compiles, prepares workspaces)."""
    caps = iris.mem.capabilities(device)
    runners = {}
    for name, fn in fns.items():
        fn()
        runners[name] = _graph(fn, calls, device) if caps.streams else None
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    shuffle = random.Random(1234)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for name in order:
            dist.barrier(group=group)
            samples[name].append(_one_round(fns[name], runners[name], calls, device) / calls)
    medians = torch.tensor([statistics.median(samples[n]) for n in fns], dtype=torch.float64)
    medians = medians.to(device)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(fns, medians.cpu().tolist(), strict=True))


def _graph(fn, calls: int, device: torch.device):
    """A CUDA graph of ``calls`` calls of ``fn``, or None when it cannot be captured."""
    try:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        return graph
    except Exception:  # noqa: BLE001 - time it eagerly instead
        torch.cuda.synchronize(device)
        return None


def _one_round(fn, graph, calls: int, device: torch.device) -> float:
    caps = iris.mem.capabilities(device)
    if caps.streams:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph is not None:
            graph.replay()
        else:
            for _ in range(calls):
                fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3
    iris.mem.synchronize(device)
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    iris.mem.synchronize(device)
    return (time.perf_counter() - started) * 1e6


def candidates(collective: str, interpreted: bool, only: list[str] | None) -> list[str]:
    """The variants of ``collective`` to time (``only``: those of them)."""
    names = [
        name
        for (c, name), v in variants.registry().items()
        if c == collective and name not in LEFT_OUT and not (interpreted and v.compiled_only)
    ]
    return [n for n in names if n in only] if only else names


def _reference(collective: str, inp: torch.Tensor, world: int) -> torch.Tensor:
    if collective == "all_reduce":
        want = inp.clone()
        dist.all_reduce(want)
    elif collective == "all_gather":
        want = inp.new_empty(world * inp.numel())
        dist.all_gather_into_tensor(want, inp)
    elif collective == "reduce_scatter":
        want = inp.new_empty(inp.numel() // world)
        dist.reduce_scatter_tensor(want, inp)
    else:
        want = torch.empty_like(inp)
        dist.all_to_all_single(want, inp)
    return want


def measure(collective: str, nbytes: int, heap, dtype, names: list[str], rounds: int, calls: int):
    """``(times_us by variant, problems by variant)`` of ``collective`` on ``nbytes`` per rank."""
    import iris.ccl as ccl

    world, item = heap.world_size, torch.empty((), dtype=dtype).element_size()
    numel = max(world, nbytes // item // world * world)
    inp = heap.empty((numel,), dtype=dtype)
    gen = torch.Generator().manual_seed(heap.rank + 1)
    values = torch.randint(-8, 8, (numel,), generator=gen).to(dtype)  # exact sums in any dtype
    inp.copy_(values.to(inp.device))
    want = _reference(collective, inp, world)
    out = heap.empty(tuple(want.shape), dtype=dtype)
    fns, problems = {}, {}
    for name in names:
        cfg = ccl.Config(variant=name)

        def call(cfg=cfg):
            getattr(ccl, collective)(out, inp, config=cfg)

        try:
            out.fill_(0)
            call()
            iris.mem.synchronize(inp.device)
            if not torch.equal(out, want):
                problems[name] = "wrong result"
        except Exception as e:  # noqa: BLE001 - a variant that cannot run here is left out
            problems[name] = f"{type(e).__name__}: {e}"[:200]
        failed = torch.tensor([name in problems], dtype=torch.int32, device=inp.device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if failed.item():
            problems.setdefault(name, "failed on another rank")
        else:
            fns[name] = call
    times = time_calls(fns, inp.device, rounds, calls) if fns else {}
    del fns
    heap.free(inp, out)
    return times, problems


def table_size(collective: str, nbytes: int, world: int) -> int:
    """The size a rule of ``collective`` is keyed by for ``nbytes`` per rank: the output for
    all_gather, the input otherwise (what ``iris.ccl.config.select`` is given)."""
    return nbytes * world if collective == "all_gather" else nbytes


def write_table(path: str, model: str, world: int, rules: dict[str, list], note: str) -> None:
    """Put ``rules`` under ``model`` and ``world`` into the table at ``path`` (made, or
    updated keeping its other entries), checked as ``auto`` will read it."""
    about = "iris.ccl tuning table written by python -m iris.ccl.tune (iris.ccl._tuning)"
    write_table_file(path, about, _tuning.load, model, world, rules, note)


def write_table_file(path: str, about: str, load, model: str, world: int, rules: dict, note: str) -> None:
    r"""Put ``rules`` under ``tables[model][world]`` (and ``note`` under ``measured``) into the
    JSON table at ``path``, made or updated keeping its other entries; the file is replaced
    only once ``load`` (a ``functools.cache``\ d reader that raises on a bad table) has read
    the new one. For the tuning commands of iris.ccl and iris.ops."""
    table: dict = {}
    if os.path.exists(path):
        with open(path) as f:
            table = json.load(f)
    table.setdefault("about", about)
    table.setdefault("tables", {}).setdefault(model, {})[str(world)] = rules
    table.setdefault("measured", {}).setdefault(model, {})[str(world)] = note
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1)
    load.cache_clear()
    try:
        load(tmp)
    finally:
        load.cache_clear()
    os.replace(tmp, path)


def start_session(parser: argparse.ArgumentParser, args: argparse.Namespace) -> iris.mem.Capabilities:
    """What a tuning command does first: ``--smoke`` only on the CPU backend (one round of
    one call), this rank's GPU under a launcher (``LOCAL_RANK``), the process group; returns
    the device's capabilities."""
    caps = iris.mem.capabilities(iris.mem.default_device())
    if args.smoke:
        if not caps.interpreted:
            parser.error("--smoke runs on the CPU backend: set IRIS_BACKEND=cpu")
        args.rounds, args.calls = 1, 1
    if caps.streams:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        caps = iris.mem.capabilities(iris.mem.default_device())
    if not dist.is_initialized():
        dist.init_process_group("nccl" if caps.streams else "gloo")
    return caps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iris.ccl.tune", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the table file to write (updated when it exists)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--sizes", default="", help="bytes per rank: 8KiB,1MiB,64MiB (default 8 KiB-128 MiB)")
    parser.add_argument("--variants", default="", help="time only these variants")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="calls per timed round")
    parser.add_argument("--smoke", action="store_true", help="the CPU backend, tiny sizes, one round")
    args = parser.parse_args(argv)
    caps = start_session(parser, args)
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s] or (SMOKE_SIZES if args.smoke else SIZES)
    collectives = [c for c in args.collectives.split(",") if c]
    unknown = sorted(set(collectives) - set(COLLECTIVES))
    if unknown:
        parser.error(f"unknown collectives {unknown}; choose from {', '.join(COLLECTIVES)}")
    only = [v for v in args.variants.split(",") if v] or None
    if args.smoke and only is None:
        only = ["ll", "push", "two_shot", "pull"]
    dtype = DTYPES[args.dtype]
    heap = iris.mem.init(max(64 << 20, 4 * world * max(sizes) + (32 << 20)))
    model = _tuning.model_key(caps)
    rules: dict[str, list] = {}
    try:
        for collective in collectives:
            names = candidates(collective, caps.interpreted, only)
            points = []
            for nbytes in sizes:
                times, problems = measure(collective, nbytes, heap, dtype, names, args.rounds, args.calls)
                if rank == 0:
                    cells = ", ".join(f"{n} {t:.1f}" for n, t in times.items())
                    print(f"{collective} {nbytes} B: {cells} us", flush=True)
                    for n, p in problems.items():
                        print(f"  {n}: {p}", flush=True)
                if times:
                    best = min(times, key=times.get)
                    points.append((table_size(collective, nbytes, world), best, {}))
            if points:
                rules[collective] = _tuning.fold(points)
    finally:
        heap.close()
    if rank == 0:
        note = (
            f"{world} x {model}, {args.dtype}, NVLink {caps.nvlink}, torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d')}, sizes {sizes} B per rank, "
            f"{args.rounds} rounds of {args.calls} calls"
        )
        write_table(args.out, model, world, rules, note)
        print(f"wrote the rules for {world} x {model} to {args.out}: export IRIS_CCL_TABLE={args.out}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
