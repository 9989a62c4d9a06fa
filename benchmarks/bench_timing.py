"""Fair device timing of several contenders (``benchmarks/ops/bench_ops.py``, ``bench_gemm.py``).

``interleaved_us`` times a dict of callables the same way: each is warmed up (compiled, its
workspaces made), captured in a CUDA graph of a few calls (eager launches where it cannot
be captured), every graph is replayed once more to bring the clocks up, and then the
contenders are timed in rounds, one replay each per round, in an order shuffled from round
to round (seeded by the round, so every rank runs the same order), each replay started on
every device at the same moment (:func:`start_together`). So a contender is
neither favoured nor penalised by its place in the list (the first one timed after an idle
GPU used to run 15-20% slow on H200) or by the contender before it (with a fixed cyclic
order, the one after ``bench_ccl``'s slow ``spinlock`` all-reduce measured up to 30% slow),
and drift of the clocks over a run spreads over all of them. (Until 2026-11-30 its sweeps in
``bench_ccl.py`` hit stalls of exactly the device wait budget: a race in the collectives'
barrier, not in this timer; ``benchmarks/ccl/NOTES.md`` changes 16-17.) Result: per contender, the
median over the rounds of the device time of one call (CUDA events), maximum over ranks.

Every rank must pass the same contenders in the same order: the ranks agree on the number
of calls per graph and on which contenders failed (those are left out everywhere), so the
collectives inside the contenders stay matched.

Times mean nothing where ranks share a GPU (the GPU runs their kernels in turns): every
benchmark calls :func:`refuse_shared_gpu` once its process group is up, which exits with a
message instead of timing anything there.
"""

from __future__ import annotations

import os
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import iris.mem
from iris.ccl import tuning

#: ``--dtype`` of the benchmarks: its names and torch dtypes (the fp8 formats under torch's names).
DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
#: The repository's root: scripts are named relative to it in the results.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command_line() -> str:
    """This run's command as one would type it, for the results' ``meta``:
    ``torchrun --nproc-per-node N benchmarks/.../bench_x.py ARGS`` (with ``--nnodes`` when the
    job spans several agents), preceded by the settings that change what Iris runs
    (``IRIS_CCL_TABLE``, ``IRIS_OPS_TABLE``) when they are set."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    world = int(os.environ.get("WORLD_SIZE") or local)
    launcher = [
        "torchrun",
        *([f"--nnodes={world // local}"] if world != local else []),
        "--nproc-per-node",
        str(local),
    ]
    settings = [f"{k}={os.environ[k]}" for k in ("IRIS_CCL_TABLE", "IRIS_OPS_TABLE") if os.environ.get(k)]
    return shlex.join([*settings, *launcher, script, *sys.argv[1:]])


def use_rank_gpu() -> torch.device:
    """Make this rank's GPU current (``LOCAL_RANK`` modulo the GPUs present, as Iris maps
    ranks to GPUs) and return it."""
    device = iris.mem.default_device()
    torch.cuda.set_device(device)
    return device


def refuse_shared_gpu(caps: iris.mem.Capabilities | None = None) -> iris.mem.Capabilities:
    """Exit with a message (status 2; :func:`iris.ccl.tuning.refuse_timing`) when ranks share
    this rank's GPU, before anything is timed, written or compared; else return the
    capabilities. Without ``caps`` the ranks first compare their GPUs
    (:func:`iris.mem.node_layout`, collective: call it on every rank, after the process group
    is up)."""
    if caps is None:
        if dist.is_initialized():
            iris.mem.node_layout()
        caps = iris.mem.capabilities()
    tuning.refuse_timing(caps, os.path.relpath(os.path.abspath(sys.argv[0]), ROOT))
    return caps


def any_rank(flags: list[bool]) -> list[bool]:
    """``flags`` or-ed over the ranks (which contenders failed a check on some rank), so
    every rank leaves out the same ones."""
    return [bool(v) for v in _agree([float(f) for f in flags], dist.ReduceOp.MAX)]


def _agree(values: list[float], op) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    if dist.is_initialized():
        dist.all_reduce(t, op=op)
    return t.tolist()


def _device() -> str:
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


#: GPU cycles (about 100 us on H200) the stream sleeps before the ranks meet, so the host
#: has queued everything after the meeting before the GPU gets there.
_SLEEP_CYCLES = 200_000
_token: torch.Tensor | None = None


def start_together() -> None:
    """Let the ranks start the next work queued on the current stream at the same moment.

    On CUDA: a sleep kernel (the host queues what follows, the timed work included, while
    it runs), then a one-element NCCL all-reduce, which ends on every rank within about a
    microsecond: the timed work then starts together on the devices, not whenever each
    host got there (``dist.barrier()`` + ``synchronize()`` leaves the hosts' skew, tens of
    microseconds, which the first collective of a replay waits out and which a replay of a
    few calls spread over them). Elsewhere: ``dist.barrier()``.
    """
    global _token
    if _device() != "cuda":
        dist.barrier()
        return
    if _token is None:
        _token = torch.zeros(1, device="cuda")
    torch.cuda._sleep(_SLEEP_CYCLES)
    dist.all_reduce(_token)


class _Contender:
    """One callable, warmed up and, on CUDA, captured in a graph of ``calls`` calls."""

    def __init__(self, fn: Callable[[], object], calls: int, cuda: bool):
        self.fn, self.calls, self.cuda = fn, calls, cuda
        self.graph = None
        if cuda:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    for _ in range(calls):
                        fn()
                torch.cuda.synchronize()
                self.graph = graph
            except Exception:  # noqa: BLE001 - not capturable: time eager launches instead
                torch.cuda.synchronize()

    def replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            for _ in range(self.calls):
                self.fn()

    def sample_us(self) -> float:
        """Time per call of one replay."""
        if not self.cuda:
            dist.barrier()
            start = time.perf_counter()
            self.replay()
            return (time.perf_counter() - start) * 1e6 / self.calls
        start_together()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / self.calls


def _warm_up(fn: Callable[[], object], cuda: bool) -> float:
    """Two calls (compile, workspaces), outside any capture, then the time of a third (us)."""
    if not cuda:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0


def interleaved_us(
    fns: dict[str, Callable[[], object]],
    reps: int,
    *,
    calls: int | None = None,
    graph_us: float = 2000.0,
    errors: dict[str, str] | None = None,
    check: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Median device time of one call of each of ``fns`` in microseconds, maximum over the
    ranks, from ``reps`` interleaved rounds (see the module docstring).

    ``calls``: calls per graph; None chooses per contender from a timed call, enough for
    about ``graph_us`` per replay (1-20). A contender that raises while it is warmed up or
    captured on any rank is left out of the result on every rank, with its error (this
    rank's, or a note that another rank failed) in ``errors`` if given.
    """
    cuda = _device() == "cuda"
    ready: dict[str, _Contender] = {}
    for name, fn in fns.items():
        problem, count = None, 0
        try:
            took = _warm_up(fn, cuda)
            if check is not None:
                check()
            count = calls or max(1, min(20, int(graph_us / max(took, 1.0))))
        except Exception as e:  # noqa: BLE001 - a contender that fails is reported, not fatal
            problem = f"{type(e).__name__}: {e}"
        # Same calls on every rank (the fused ops count calls on the device); skipped everywhere
        # if any rank failed.
        agreed_calls, failed = _agree([-float(count), float(problem is not None)], dist.ReduceOp.MAX)
        if failed:
            if errors is not None:
                errors[name] = problem or "failed on another rank"
            continue
        ready[name] = _Contender(fn, int(-agreed_calls), cuda)
    for contender in ready.values():  # clocks up, caches warm
        contender.replay()
    names = list(ready)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        order = list(names)
        random.Random(r).shuffle(order)  # the same order on every rank (the calls are collectives)
        for name in order:
            samples[name].append(ready[name].sample_us())
    if check is not None:
        check()
    medians = _agree([statistics.median(samples[name]) for name in names], dist.ReduceOp.MAX)
    return dict(zip(names, medians))
