"""Fused GEMM + communication ops of iris.ops beside torch.matmul + NCCL, in one run.

    torchrun --nproc-per-node 2 benchmarks/ops/bench_ops.py --out benchmarks/ops/results --plot
    torchrun --nproc-per-node 2 benchmarks/ops/bench_ops.py --quick            # 3 shapes
    torchrun --nproc-per-node 2 benchmarks/ops/bench_ops.py --tune --quick     # try configs
    torchrun --nproc-per-node 2 benchmarks/ops/bench_ops.py --tune --configs "order=spread;block_n=128"
    torchrun --nproc-per-node 2 benchmarks/ops/bench_ops.py --shapes 1024x8192x4096 --ops matmul_all_reduce
    python benchmarks/ops/bench_ops.py --replot benchmarks/ops/results/results.json
    IRIS_BACKEND=cpu torchrun --nproc-per-node 2 benchmarks/ops/bench_ops.py --smoke  # no GPU

For each op and shape (bf16 unless --dtype) it checks iris.ops' result against the
baseline's, then times:

* ``iris``: the op with the default ``Config()`` (``path="auto"``: the fused kernel or the
  composed path, whichever the tuning table or the heuristic picks), output on a symmetric heap;
* ``iris_fused``: the fused kernel (``Config(path="fused")``);
* ``iris_composed``: torch.matmul and the iris.ccl collective (``Config(path="composed")``);
* ``iris_gemm``: the fused kernel on a group of one rank (no communication): our GEMM alone;
* ``nccl``: torch.matmul followed by the NCCL collective (the collective before the matmul
  for all_gather_matmul);
* ``matmul``: torch.matmul alone, at the size the op multiplies on one rank;
* ``symm``: torch symm_mem's ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``
  where one exists.

Shapes are ``(M, N, K)`` with M the rows of the full output: matmul_all_reduce multiplies
``(M, K) @ (K, N)`` on every rank and sums; all_gather_matmul gathers ``(M/G, K)`` shards
then multiplies by ``(K, N)``; matmul_reduce_scatter multiplies ``(M, K) @ (K, N)`` and
keeps ``M/G`` rows; matmul_all_gather multiplies ``(M/G, K) @ (K, N)`` and gathers.
Times are device times from CUDA events around replays of a CUDA graph of several calls
(eager launches where a baseline cannot be captured), the contenders of one op and shape
timed in interleaved rounds (``benchmarks/bench_timing.py``), median over the rounds per
rank, maximum over ranks. Prints a table with ratios; writes results.json (and PNGs with --plot).
``bound`` is (matmul + NCCL) / matmul: the most any fused op can gain over matmul + NCCL
with a GEMM as fast as torch.matmul's and all of the communication hidden.
``--dtype float8_e4m3fn`` (or ``float8_e5m2``) gives every op fp8 inputs, each quantized
from N(0, 1) values with a per-tensor scale passed as iris.ops' ``scale_a`` / ``scale_b`` (as
``torch._scaled_mm`` takes them) and a bf16 output; the baselines multiply with
``torch._scaled_mm`` and move the fp8 bytes (all_gather_matmul) or the bf16 products through
NCCL; torch's fused ops are left out. all_gather_matmul's shards share one scale here (iris.ops
would carry each shard's own) so that the baseline's gathered A is one ``torch._scaled_mm``.
``--tune`` tries a few Configs per op and shape and prints the fastest (``--configs``: the
given ones against the default instead). ``--smoke`` runs the
whole script on the CPU backend (gloo, tiny shapes, wall-clock times) to check it without GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_timing import DTYPES, any_rank, command_line, interleaved_us, refuse_shared_gpu, use_rank_gpu  # noqa: E402 - benchmarks/bench_timing.py

SHAPES = [(8192, 8192, 4096), (1024, 8192, 4096), (16384, 3584, 8192)]
DECODE = [(m, 8192, 4096) for m in (1, 16, 64, 128)]
QUICK = [(8192, 8192, 4096), (1024, 8192, 4096), (128, 8192, 4096)]
SMOKE = [(64, 48, 40), (2, 40, 24)]
OPS = ("matmul_all_reduce", "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_gather")
#: (block_m, block_n, block_k, num_warps, num_stages) candidates for --tune, besides the
#: default: for prefill shapes (more than 128 rows of output tiles) and for decode shapes.
PREFILL_TILES = [
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 8, 5),
    (256, 128, 64, 8, 3),
    (64, 256, 64, 4, 4),
]
DECODE_TILES = [
    (16, 64, 256, 4, 4),
    (16, 128, 256, 4, 3),
    (32, 64, 256, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 64, 128, 4, 6),
    (128, 64, 128, 4, 4),
    (64, 128, 128, 4, 4),
    (64, 32, 128, 4, 4),
]


#: Where the run's tensors live: "cuda", or "cpu" with --smoke.
DEVICE = "cuda"
#: --configs: the Configs --tune times against the default instead of its own candidates.
CONFIGS = None


@dataclasses.dataclass
class Case:
    """One op at one shape: ``fused(config)`` makes the call of iris.ops, the other fields
    are the baselines; ``out`` and ``ref`` hold the fused op's and the baseline's output."""

    fused: object
    out: torch.Tensor
    nccl: object
    ref: torch.Tensor
    matmul: object
    alone: object  # the fused kernel on a group of one rank: our GEMM alone
    symm: object = None


class Bench:
    """Groups of the run, and the inputs and heap of one op and shape at a time."""

    def __init__(self, dtype: torch.dtype):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.dtype = dtype
        #: fp8 inputs (one byte, a float): scaled GEMMs with a bf16 output
        self.fp8 = dtype.is_floating_point and dtype.itemsize == 1
        self.out_dtype = torch.bfloat16 if self.fp8 else dtype
        singles = [dist.new_group([r]) for r in range(self.world)]  # collective: every rank makes all
        self.single = singles[self.rank]
        self.group_name = dist.group.WORLD.group_name
        self.symm_ok = DEVICE == "cuda" and not self.fp8 and self._enable_symm()
        self.heap = None

    def _enable_symm(self) -> bool:
        try:
            import warnings

            import torch.distributed._symmetric_memory as symm_mem

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                symm_mem.enable_symm_mem_for_group(self.group_name)
            return hasattr(torch.ops.symm_mem, "fused_all_gather_matmul")
        except Exception as e:  # noqa: BLE001 - report and go on without the baseline
            if self.rank == 0:
                print(f"torch symm_mem unavailable: {e}")
            return False

    def open(self, heap_bytes: int) -> None:
        """A fresh symmetric heap for the next op and shape (outputs and workspaces)."""
        import iris.mem

        self.close()
        self.heap = iris.mem.init(heap_bytes)

    def close(self) -> None:
        import iris.ops

        if self.heap is not None:
            self.heap.barrier()
            iris.ops.release_workspaces()
            self.heap.close()
            self.heap = None
            if DEVICE == "cuda":
                torch.cuda.empty_cache()

    def randn(self, *shape, shared: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An input of fresh N(0, 1) values and its scale: None, or for fp8 the per-tensor
        scale it was quantized with (``value = fp8 * scale``, the largest at the format's max;
        ``shared``: one scale for every rank's part, as the shards of one gathered A have)."""
        x = torch.empty(shape, dtype=torch.float32 if self.fp8 else self.dtype, device=DEVICE).normal_()
        if not self.fp8:
            return x, None
        amax = x.abs().max().reshape(1)
        if shared:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX)
        scale = amax / torch.finfo(self.dtype).max
        return (x / scale).to(self.dtype), scale

    def empty(self, *shape, heap=False, dtype=None):
        dtype = dtype or self.out_dtype
        if heap:
            return self.heap.empty(shape, dtype=dtype)
        return torch.empty(shape, dtype=dtype, device=DEVICE)

    def matmul(self, b: torch.Tensor, sb):
        """``mm(a, sa, out)``: torch.matmul, or for fp8 ``torch._scaled_mm`` (B column-major,
        made once here, outside what is timed)."""
        if not self.fp8:
            return lambda a, sa, out: torch.matmul(a, b, out=out)
        b_cols = b.t().contiguous().t()
        return lambda a, sa, out: torch._scaled_mm(
            a, b_cols, scale_a=sa, scale_b=sb, out_dtype=self.out_dtype, out=out
        )

    def scales(self, sa, sb) -> dict:
        """The fp8 scales as iris.ops takes them (nothing for other dtypes)."""
        return {"scale_a": sa, "scale_b": sb} if self.fp8 else {}

    def gather(self, full: torch.Tensor, shard: torch.Tensor) -> None:
        """NCCL's all-gather of ``shard`` into ``full`` (fp8 as its bytes)."""
        if self.fp8:
            full, shard = full.view(torch.uint8), shard.view(torch.uint8)
        dist.all_gather_into_tensor(full, shard)

    def case(self, op: str, m: int, n: int, k: int) -> Case | None:
        """The callables of ``op`` at ``(M, N, K)`` (None when M is not divisible by the
        group size where the op needs it); outputs peers write are on the heap."""
        import iris.ops

        g, one = self.world, self.single
        FUSED = iris.ops.Config(path="fused")  # noqa: N806
        if op == "matmul_all_reduce":
            (a, sa), (b, sb) = self.randn(m, k), self.randn(k, n)
            mm, kw = self.matmul(b, sb), self.scales(sa, sb)
            out, ref, alone = self.empty(m, n, heap=True), self.empty(m, n), self.empty(m, n)
            return Case(
                fused=lambda cfg: lambda: iris.ops.matmul_all_reduce(out, a, b, config=cfg, **kw), out=out,
                nccl=lambda: (mm(a, sa, ref), dist.all_reduce(ref)), ref=ref,
                matmul=lambda: mm(a, sa, ref),
                alone=lambda: iris.ops.matmul_all_reduce(alone, a, b, group=one, config=FUSED, **kw),
            )  # fmt: skip
        if m % g:
            return None
        if op == "all_gather_matmul":
            (shard, sa), (b, sb) = self.randn(m // g, k, shared=True), self.randn(k, n)
            mm, kw = self.matmul(b, sb), self.scales(sa, sb)
            out, ref, full = self.empty(m, n), self.empty(m, n), self.empty(m, k, dtype=self.dtype)
            symm = None
            if self.symm_ok:
                fused_ag = torch.ops.symm_mem.fused_all_gather_matmul
                symm = lambda: fused_ag(shard, [b], 0, self.group_name, return_A=False)  # noqa: E731
            ag = iris.ops.all_gather_matmul
            return Case(
                fused=lambda cfg: lambda: ag(out, shard, b, config=cfg, **kw), out=out,
                nccl=lambda: (self.gather(full, shard), mm(full, sa, ref)), ref=ref,
                matmul=lambda: mm(full, sa, ref), symm=symm,
                alone=lambda: iris.ops.all_gather_matmul(ref, full, b, group=one, config=FUSED, **kw),
            )  # fmt: skip
        if op == "matmul_reduce_scatter":
            (a, sa), (b, sb) = self.randn(m, k), self.randn(k, n)
            mm, kw = self.matmul(b, sb), self.scales(sa, sb)
            out, ref, prod = self.empty(m // g, n), self.empty(m // g, n), self.empty(m, n)
            symm = None
            if self.symm_ok:
                fused_rs = torch.ops.symm_mem.fused_matmul_reduce_scatter
                symm = lambda: fused_rs(a, b, "sum", 0, self.group_name)  # noqa: E731
            rs = iris.ops.matmul_reduce_scatter
            return Case(
                fused=lambda cfg: lambda: rs(out, a, b, config=cfg, **kw), out=out,
                nccl=lambda: (mm(a, sa, prod), dist.reduce_scatter_tensor(ref, prod)), ref=ref,
                matmul=lambda: mm(a, sa, prod), symm=symm,
                alone=lambda: iris.ops.matmul_reduce_scatter(prod, a, b, group=one, config=FUSED, **kw),
            )  # fmt: skip
        (a, sa), (b, sb) = self.randn(m // g, k), self.randn(k, n)
        mm, kw = self.matmul(b, sb), self.scales(sa, sb)
        out, ref, prod = self.empty(m, n, heap=True), self.empty(m, n), self.empty(m // g, n)
        return Case(
            fused=lambda cfg: lambda: iris.ops.matmul_all_gather(out, a, b, config=cfg, **kw), out=out,
            nccl=lambda: (mm(a, sa, prod), dist.all_gather_into_tensor(ref, prod)), ref=ref,
            matmul=lambda: mm(a, sa, prod),
            alone=lambda: iris.ops.matmul_all_gather(prod, a, b, group=one, config=FUSED, **kw),
        )  # fmt: skip


def heap_bytes(m: int, n: int, k: int, configs: int) -> int:
    """Heap for one op and shape: the output and one workspace per config (with slack)."""
    item = 2
    return (m * n + configs * max(m * n, m * k)) * item + (256 << 20)


def _check(fused, case: Case, what: str) -> str | None:
    """Run the fused op and the baseline on the same inputs; compare (relative to the
    baseline's largest element: both round to the dtype, at different points)."""
    fused()
    case.nccl()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    got, want = case.out.float(), case.ref.float()
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    ok = err <= 0.02 * scale + 1e-3 and not torch.isnan(got).any()
    return None if ok else f"{what}: max error {err:.4g} (baseline max {scale:.4g})"


def run(bench: Bench, ops, shapes, reps: int) -> tuple[list[dict], list[str]]:
    rows, failures = [], []
    for op in ops:
        for m, n, k in shapes:
            bench.open(heap_bytes(m, n, k, 3))
            case = bench.case(op, m, n, k)
            if case is None:
                continue
            what = f"{op} M={m} N={n} K={k}"
            import iris.ops

            fused = case.fused(None)
            fns = {"iris": fused}
            for path in ("fused", "composed") if DEVICE == "cuda" else ("composed",):  # smoke: auto is fused
                fns[f"iris_{path}"] = case.fused(iris.ops.Config(path=path))
            problems = [_check(fn, case, f"{what} {name}") for name, fn in fns.items()]
            bad = any_rank([p is not None for p in problems])
            if any(bad):
                mine = [p for p in problems if p is not None]
                failures.append(mine[0] if mine else f"{what}: wrong result on another rank")
                continue
            for name in ("alone", "nccl", "matmul", "symm"):
                if (fn := getattr(case, name)) is not None:
                    fns["iris_gemm" if name == "alone" else name] = fn
            errors: dict[str, str] = {}
            times = interleaved_us(fns, reps, errors=errors)
            for name, error in errors.items():  # a baseline that fails is reported, not fatal
                if bench.rank == 0:
                    print(f"{what}: {name} failed: {error}"[:300], flush=True)
            if "iris" not in times:
                failures.append(f"{what}: {errors['iris']}")
                continue
            row = {"op": op, "M": m, "N": n, "K": k, "times_us": times}
            row["nccl_over_iris"] = times["nccl"] / times["iris"]
            row["iris_over_matmul"] = times["iris"] / times["matmul"]
            # What a fused op could reach at most against matmul + NCCL: a GEMM as fast as
            # torch.matmul's with all of the communication hidden under it.
            row["bound"] = times["nccl"] / times["matmul"]
            if "symm" in times:
                row["symm_over_iris"] = times["symm"] / times["iris"]
            rows.append(row)
            if bench.rank == 0:
                cells = ", ".join(f"{key} {v:.1f}" for key, v in times.items())
                print(f"{what}: {cells} us; NCCL/iris {row['nccl_over_iris']:.2f}", flush=True)
            del case, fused
    bench.close()
    return rows, failures


def parse_configs(text: str) -> list:
    """``"order=spread;block_n=128,num_stages=4"``: one Config per ``;``-separated item of
    ``field=value`` pairs (ints, ``true``/``false``, or strings)."""
    import iris.ops

    def value(v: str):
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        return int(v) if v.lstrip("-").isdigit() else v

    configs = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        fields = dict(pair.split("=", 1) for pair in item.split(","))
        configs.append(iris.ops.Config(**{k.strip(): value(v.strip()) for k, v in fields.items()}))
    return configs


def _candidates(op: str, m: int, world: int):
    """Configs --tune times for ``op`` at ``m`` output rows: the default, other tiles with
    and without TMA, and the op's own knobs."""
    import iris.ops

    if CONFIGS is not None:
        return [None, *CONFIGS]
    rows = m if op in ("matmul_all_reduce", "matmul_reduce_scatter") else m // world
    tiles = PREFILL_TILES if rows > 128 else DECODE_TILES
    out = [None]
    for tma in (False, True):
        for bm, bn, bk, w, st in tiles:
            tile = dict(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=st)
            out.append(iris.ops.Config(**tile, tma=tma))
    out += [iris.ops.Config(group_m=g) for g in (4, 16)]
    if op == "matmul_all_reduce":
        out += [iris.ops.Config(split="m"), iris.ops.Config(split="n")]
    if op in ("matmul_all_reduce", "matmul_reduce_scatter"):
        out += [iris.ops.Config(order=o) for o in ("peers_first", "spread")]
    if op == "all_gather_matmul":
        out += [iris.ops.Config(comm_sms=c) for c in (8, 32)]
    return [out[0]] + [dataclasses.replace(c, path="fused") for c in out[1:]]  # the kernel's knobs


def _short(config) -> str:
    """The fields of ``config`` that differ from the defaults ("default" for None)."""
    if config is None:
        return "default"
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    return ",".join(f"{k}={v}" for k, v in fields.items() if v != defaults[k])


def tune(bench: Bench, ops, shapes, reps: int) -> list[dict]:
    """Time every candidate config of every op and shape; return the best of each."""
    results = []
    for op in ops:
        for m, n, k in shapes:
            candidates = _candidates(op, m, bench.world)
            bench.open(heap_bytes(m, n, k, len(candidates)))
            case = bench.case(op, m, n, k)
            if case is None:
                continue
            fns, problems = {}, {}
            for config in candidates:
                fused = None
                try:
                    fused = case.fused(config)
                    problem = _check(fused, case, f"{op} {config}")
                except Exception as e:  # noqa: BLE001 - a config that fails to compile or run
                    problem = f"{type(e).__name__}: {e}"[:200]
                fns[_short(config)] = fused
                if problem is not None:
                    problems[_short(config)] = problem
            for name, bad in zip(list(fns), any_rank([name in problems for name in fns])):
                if bad:
                    problems.setdefault(name, "failed on another rank")
                    del fns[name]
            # Every candidate that passed, timed in interleaved rounds (no place in the order
            # is favoured); those failing on any rank are left out on all.
            times = interleaved_us(fns, reps, errors=problems)
            names = [_short(config) for config in candidates]
            timed = [(times.get(name, float("inf")), name, problems.get(name)) for name in names]
            if bench.rank == 0:
                for t, name, problem in timed:
                    print(f"  {op} M={m} N={n} K={k} {name}: {t:.1f} us {problem or ''}", flush=True)
            best = min(timed)
            results.append(
                {"op": op, "M": m, "N": n, "K": k, "best_us": best[0], "best": best[1], "all": timed}
            )
            if bench.rank == 0:
                print(f"BEST {op} M={m} N={n} K={k}: {best[1]} {best[0]:.1f} us (default {timed[0][0]:.1f})")
    bench.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/ops/results")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--quick", action="store_true", help="3 shapes (two prefill, one decode)")
    parser.add_argument(
        "--tune", action="store_true", help="try a few Configs per op and shape, print the best"
    )
    parser.add_argument(
        "--shapes", default="", help="comma-separated MxNxK shapes instead of the defaults, e.g. 1x4096x512"
    )
    parser.add_argument(
        "--configs",
        default="",
        help='with --tune, time these against the default: "order=spread;block_n=128"',
    )
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--plot", action="store_true", help="write PNG plots (needs matplotlib)")
    parser.add_argument("--replot", metavar="RESULTS_JSON", help="only redraw the plots of an earlier run")
    parser.add_argument(
        "--smoke", action="store_true", help="check the script on the CPU backend, tiny shapes"
    )
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            _plot(json.load(f)["rows"], os.path.dirname(args.replot))
        return 0
    global DEVICE, CONFIGS
    if args.configs:
        CONFIGS = parse_configs(args.configs)
    if args.smoke:
        DEVICE = "cpu"
        dist.init_process_group("gloo")
    else:
        use_rank_gpu()
        dist.init_process_group("nccl")
    refuse_shared_gpu()  # before anything is timed: ranks sharing a GPU measure nothing
    bench = Bench(DTYPES[args.dtype])
    ops = [op for op in args.ops.split(",") if op]
    shapes = SMOKE if args.smoke else QUICK if args.quick else SHAPES + DECODE
    if args.shapes:
        shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",") if shape]
    if args.tune:
        tuned = tune(bench, ops, shapes, args.reps)
        if bench.rank == 0:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "tune.json"), "w") as f:
                json.dump(tuned, f, indent=1)
        failures = []
    else:
        rows, failures = run(bench, ops, shapes, args.reps)
        if bench.rank == 0:
            _report(rows, failures, args, bench.world)
    dist.destroy_process_group()
    return 1 if failures else 0


def _report(rows, failures, args, world) -> None:
    import triton

    import iris.ops

    os.makedirs(args.out, exist_ok=True)
    cuda = DEVICE == "cuda"
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else ["cpu"],
        "world_size": world,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "iris_ops": iris.ops.__version__,
        "command": command_line(),
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "failures": failures}, f, indent=1)
    print(f"\n# iris.ops vs torch.matmul + NCCL, {args.dtype}, {world} x {meta['gpus'][0]} ({meta})")
    columns = ("iris", "iris_fused", "iris_composed", "iris_gemm", "nccl", "matmul", "symm")
    header = (
        "iris | fused | composed | iris GEMM alone | matmul+NCCL | matmul | symm fused | NCCL/iris | bound"
        " | symm/iris | iris/matmul"
    )
    print(f"| op | M | N | K | {header} |")
    print("|---" * 15 + "|")
    for r in rows:
        cells = " | ".join(f"{r['times_us'][c]:.1f}" if c in r["times_us"] else "-" for c in columns)
        symm = f"{r['symm_over_iris']:.2f}" if "symm_over_iris" in r else "-"
        ratios = f"{r['nccl_over_iris']:.2f} | {r['bound']:.2f} | {symm} | {r['iris_over_matmul']:.2f}"
        print(f"| {r['op']} | {r['M']} | {r['N']} | {r['K']} | {cells} | {ratios} |")
    if failures:
        print("\nFAILED checks (not timed):\n  " + "\n  ".join(failures))
    if args.plot:
        try:
            _plot(rows, args.out)
        except ImportError:
            print("(matplotlib not installed: no plots; rerun with --replot where it is)")


def _plot(rows, out) -> None:
    """One PNG per op: device time of each implementation per shape (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for op in dict.fromkeys(r["op"] for r in rows):
        sel = [r for r in rows if r["op"] == op]
        keys = list(dict.fromkeys(k for r in sel for k in r["times_us"]))
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(sel)), 4.5))
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            xs = [j + i * width for j, r in enumerate(sel) if key in r["times_us"]]
            ax.bar(xs, [r["times_us"][key] for r in sel if key in r["times_us"]], width, label=key)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sel))])
        ax.set_xticklabels([f"{r['M']}x{r['N']}x{r['K']}" for r in sel], rotation=20, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("time (us)")
        ax.set_title(f"{op} (M x N x K)")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"ops_{op}.png"), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
