"""``iris.ops.all_reduce_rmsnorm`` beside the unfused ways of doing the same, in one run.

    torchrun --nproc-per-node 2 benchmarks/ops/bench_rmsnorm.py --out benchmarks/ops/results-rmsnorm
    torchrun --nproc-per-node 2 benchmarks/ops/bench_rmsnorm.py --quick          # 4 shapes
    torchrun --nproc-per-node 2 benchmarks/ops/bench_rmsnorm.py --tokens 1,128 --hidden 8192
    IRIS_BACKEND=cpu torchrun --nproc-per-node 2 benchmarks/ops/bench_rmsnorm.py --smoke  # no GPU

What every contender computes, per shape ``tokens x hidden`` (bf16 unless --dtype), with
``x`` this rank's partial sums and ``residual`` the residual stream (the same on every
rank): ``s = all_reduce(x) + residual`` and ``out = rmsnorm(s) * weight``, ``s`` kept as
the new residual stream. Contenders:

* ``iris``: ``iris.ops.all_reduce_rmsnorm``, the form chosen by size (outputs on a
  symmetric heap); ``iris_ll`` / ``iris_rs_ag``: each form forced (``ll`` up to 32 MiB),
  to check the size at which ``"auto"`` switches;
* ``nccl_eager``: ``dist.all_reduce`` (NCCL), then ``x + residual`` and
  ``torch.nn.functional.rms_norm`` in eager PyTorch;
* ``nccl_compiled``: the same all-reduce, the add and norm through ``torch.compile``;
* ``ccl_compiled``: ``iris.ccl.all_reduce`` (in place on the heap, ``"auto"``), then the
  compiled add and norm;
* ``ccl_ar``: ``iris.ccl.all_reduce`` alone, the fastest of ``"auto"``, ``ll``, ``boxed``
  and ``two_shot`` at this size (the bytes of the exchange alone, with no norm).

Times are device times from CUDA events around replays of a CUDA graph of several calls
(eager launches where a contender cannot be captured), the contenders of one shape timed in
interleaved rounds (``benchmarks/bench_timing.py``), median over the rounds per rank,
maximum over ranks. Every contender's result is checked against the eager baseline first.
Prints a table with ``iris / ccl_ar`` (the fused op against the all-reduce alone) and the
baselines' times over ``iris``; writes results.json. ``--smoke`` runs the whole script on the
CPU backend (gloo, tiny shapes, wall-clock times, no torch.compile) to check it without GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_timing import any_rank, command_line, interleaved_us, refuse_shared_gpu, use_rank_gpu  # noqa: E402 - benchmarks/bench_timing.py

TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
HIDDEN = (4096, 8192)
QUICK = [(1, 8192), (32, 8192), (128, 8192), (2048, 8192)]
SMOKE = [(1, 40), (5, 72)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: iris.ccl all_reduce variants timed for ``ccl_ar`` besides "auto" (the fastest is kept).
CCL_VARIANTS = ("ll", "boxed", "two_shot")
#: Largest input the forced ``ll`` form is timed at (it doubles the bytes on the link).
LL_FORCED_MAX_BYTES = 32 << 20
EPS = 1e-6
DEVICE = "cuda"


def _norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
    s = x + residual
    return F.rms_norm(s, (s.shape[-1],), weight, EPS), s


class Shape:
    """Inputs, outputs and contenders of one shape."""

    def __init__(self, heap, tokens: int, hidden: int, dtype: torch.dtype, compiled):
        import iris.ccl
        import iris.ops

        self.rank = dist.get_rank()
        g = torch.Generator(device="cpu").manual_seed(1 + self.rank)
        same = torch.Generator(device="cpu").manual_seed(0)
        shape = (tokens, hidden)
        self.x = torch.randn(shape, generator=g).to(dtype).to(DEVICE)
        self.residual = torch.randn(shape, generator=same).to(dtype).to(DEVICE)
        self.weight = (1 + 0.1 * torch.randn(hidden, generator=same)).to(dtype).to(DEVICE)
        self.out, self.rout = heap.empty(shape, dtype=dtype), heap.empty(shape, dtype=dtype)
        self.buf = torch.empty_like(self.x)  # NCCL's in-place all-reduce works on a copy
        self.ccl_buf = heap.empty(shape, dtype=dtype)
        self.nbytes = self.x.numel() * self.x.element_size()
        self.fns = {}

        def fused(form):
            cfg = iris.ops.AllReduceRMSNormConfig(form=form)
            return lambda: iris.ops.all_reduce_rmsnorm(
                self.out, self.x, self.weight, EPS, residual=self.residual, residual_out=self.rout, config=cfg
            )

        self.fns["iris"] = fused("auto")
        if self.nbytes <= LL_FORCED_MAX_BYTES:
            self.fns["iris_ll"] = fused("ll")
        self.fns["iris_rs_ag"] = fused("rs_ag")
        self.fns["nccl_eager"] = lambda: (
            dist.all_reduce(self.buf),
            _norm(self.buf, self.residual, self.weight),
        )
        if compiled is not None:
            self.fns["nccl_compiled"] = lambda: (
                dist.all_reduce(self.buf),
                compiled(self.buf, self.residual, self.weight),
            )
            self.fns["ccl_compiled"] = lambda: (
                iris.ccl.all_reduce(self.ccl_buf, self.ccl_buf),
                compiled(self.ccl_buf, self.residual, self.weight),
            )
        for variant in ("auto", *CCL_VARIANTS):
            cfg = iris.ccl.Config(variant=variant)
            self.fns[f"ccl_ar_{variant}"] = lambda cfg=cfg: iris.ccl.all_reduce(
                self.ccl_buf, self.ccl_buf, config=cfg
            )

    def check(self, name: str) -> str | None:
        """Run contender ``name`` once on fresh inputs; compare with the eager baseline."""
        if name.startswith("ccl_ar_"):
            self.ccl_buf.copy_(self.x)
            self.fns[name]()
            self.buf.copy_(self.x)
            dist.all_reduce(self.buf)
            got, want = self.ccl_buf, self.buf
        else:
            self.buf.copy_(self.x)
            self.ccl_buf.copy_(self.x)
            result = self.fns[name]()
            if name.startswith("iris"):
                got = self.out
            else:
                got = result[1][0]
            self.buf.copy_(self.x)
            dist.all_reduce(self.buf)
            want = _norm(self.buf, self.residual, self.weight)[0]
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        err = (got.float() - want.float()).abs().max().item()
        scale = want.float().abs().max().item()
        ok = err <= 0.03 * scale + 1e-3 and not torch.isnan(got).any()
        return None if ok else f"{name}: max error {err:.4g} (baseline max {scale:.4g})"


def run(shapes, dtype: torch.dtype, reps: int, compile_norm: bool) -> tuple[list[dict], list[str]]:
    import iris.mem
    import iris.ops

    rank = dist.get_rank()
    compiled = None
    if compile_norm:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        compiled = torch.compile(_norm, dynamic=False)
    rows, failures = [], []
    for tokens, hidden in shapes:
        what = f"tokens={tokens} hidden={hidden}"
        nbytes = tokens * hidden * dtype.itemsize
        slack = (256 << 20) if DEVICE == "cuda" else (16 << 20)
        with iris.mem.init(8 * nbytes + slack) as heap:
            shape = Shape(heap, tokens, hidden, dtype, compiled)
            problems = {}
            for name in list(shape.fns):
                try:
                    problem = shape.check(name)
                except Exception as e:  # noqa: BLE001 - a contender that fails is reported, not fatal
                    problem = f"{name}: {type(e).__name__}: {e}"[:300]
                if problem is not None:
                    problems[name] = problem
            for name, bad in zip(list(shape.fns), any_rank([n in problems for n in shape.fns])):
                if bad:
                    failures.append(f"{what}: {problems.get(name, f'{name}: failed on another rank')}")
                    del shape.fns[name]
            errors: dict[str, str] = {}
            times = interleaved_us(shape.fns, reps, errors=errors) if "iris" in shape.fns else {}
            failures += [
                f"{what}: {name} failed while timed: {error}"[:300] for name, error in errors.items()
            ]
            heap.barrier()
            iris.ops.release_workspaces()
            del shape
        if "iris" not in times:
            continue
        ccl = {k: v for k, v in times.items() if k.startswith("ccl_ar_")}
        row = {"tokens": tokens, "hidden": hidden, "bytes": nbytes, "times_us": times}
        row["form"] = _auto_form(tokens, hidden, dtype)
        if ccl:
            row["ccl_ar"] = min(ccl.values())
            row["ccl_ar_variant"] = min(ccl, key=ccl.get)[len("ccl_ar_") :]
            row["iris_over_ccl_ar"] = times["iris"] / row["ccl_ar"]
        for base in ("nccl_eager", "nccl_compiled", "ccl_compiled"):
            if base in times:
                row[f"{base}_over_iris"] = times[base] / times["iris"]
        rows.append(row)
        if rank == 0:
            cells = ", ".join(f"{k} {v:.1f}" for k, v in times.items())
            print(f"{what} ({row['form']}): {cells} us", flush=True)
    return rows, failures


def _auto_form(tokens: int, hidden: int, dtype: torch.dtype) -> str:
    from iris.ops.all_reduce_rmsnorm import choose_form

    return choose_form(tokens, hidden, dtype.itemsize, dist.get_world_size())


def _report(rows, failures, args, world: int) -> None:
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
    print(f"\n# all_reduce + residual add + RMSNorm, {args.dtype}, {world} x {meta['gpus'][0]} ({meta})")
    columns = ("iris", "iris_ll", "iris_rs_ag", "nccl_eager", "nccl_compiled", "ccl_compiled")
    print(
        "| tokens | hidden | form | " + " | ".join(columns) + " | ccl all_reduce (variant) | iris/ccl_ar"
        " | nccl_eager/iris | nccl_compiled/iris | ccl_compiled/iris |"
    )
    print("|---" * (len(columns) + 8) + "|")
    for r in rows:
        t = r["times_us"]
        cells = " | ".join(f"{t[c]:.1f}" if c in t else "-" for c in columns)
        ccl = f"{r['ccl_ar']:.1f} ({r['ccl_ar_variant']})" if "ccl_ar" in r else "-"
        ratios = " | ".join(
            f"{r[k]:.2f}" if k in r else "-"
            for k in (
                "iris_over_ccl_ar",
                "nccl_eager_over_iris",
                "nccl_compiled_over_iris",
                "ccl_compiled_over_iris",
            )
        )
        print(f"| {r['tokens']} | {r['hidden']} | {r['form']} | {cells} | {ccl} | {ratios} |")
    if failures:
        print("\nFAILED (not timed):\n  " + "\n  ".join(failures))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/ops/results-rmsnorm")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated token counts")
    parser.add_argument("--hidden", default=",".join(map(str, HIDDEN)), help="comma-separated hidden sizes")
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK}")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile baselines")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check the script on the CPU backend, tiny shapes, no torch.compile",
    )
    return parser.parse_args(argv)


def shapes_of(args: argparse.Namespace) -> list[tuple[int, int]]:
    if args.smoke:
        return SMOKE
    if args.quick:
        return QUICK
    tokens = [int(v) for v in args.tokens.split(",") if v]
    return [(t, h) for h in (int(v) for v in args.hidden.split(",") if v) for t in tokens]


def main() -> int:
    global DEVICE
    args = parse_args()
    if args.smoke:
        DEVICE = "cpu"
        dist.init_process_group("gloo")
    else:
        use_rank_gpu()
        dist.init_process_group("nccl")
    refuse_shared_gpu()  # before anything is timed: ranks sharing a GPU measure nothing
    rows, failures = run(shapes_of(args), DTYPES[args.dtype], args.reps, not (args.smoke or args.no_compile))
    if dist.get_rank() == 0:
        _report(rows, failures, args, dist.get_world_size())
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
