"""Measure this machine and write the table ``Config(path="auto")`` of iris.ops reads.

Run it on every GPU of the group size you use (one process per GPU), then point
``IRIS_OPS_TABLE`` at the file::

    torchrun --nproc-per-node 2 -m iris.ops.tune --out ~/iris-ops-table.json
    export IRIS_OPS_TABLE=~/iris-ops-table.json

For each op and shape ``M x N x K`` (M the rows of the full output, as in
``benchmarks/ops/bench_ops.py``) it times the fused kernel and the composed path
(``Config(path="fused")`` and ``Config(path="composed")``, outputs on a symmetric heap),
checks that they agree, and records the faster one by the work of the GEMM one rank computes
(``M x N x K`` multiply-adds of this rank's product). The rules go into the table under this
machine's GPU model and group size; other entries of an existing ``--out`` file are kept.
Timing as ``python -m iris.ccl.tune`` does it. ``--smoke``: the CPU backend, tiny shapes.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import iris.mem
import iris.ops
from iris.ccl import tuning

from . import _select

SHAPES = [(m, 8192, 4096) for m in (1, 16, 64, 128, 256, 512, 1024, 4096, 8192)]
SMOKE_SHAPES = [(6, 40, 24), (12, 48, 40)]


def problem(op: str, m: int, n: int, k: int, world: int, heap, dtype):
    """``(call(config), out, work)`` of ``op`` at the global shape, or None when M is not
    divisible by the group where the op needs it."""
    dev = heap.device

    def rand(*shape):
        return torch.randn(shape, dtype=torch.float32, device=dev).to(dtype)

    if op == "matmul_all_reduce":
        a, b, out = rand(m, k), rand(k, n), heap.zeros((m, n), dtype=dtype)
        work = m * n * k
    elif m % world:
        return None
    elif op == "all_gather_matmul":
        a, b, out = rand(m // world, k), rand(k, n), heap.zeros((m, n), dtype=dtype)
        work = m * n * k
    elif op == "matmul_reduce_scatter":
        a, b, out = rand(m, k), rand(k, n), heap.zeros((m // world, n), dtype=dtype)
        work = m * n * k
    else:
        a, b, out = rand(m // world, k), rand(k, n), heap.zeros((m, n), dtype=dtype)
        work = (m // world) * n * k
    fn = getattr(iris.ops, op)
    return (lambda cfg: lambda: fn(out, a, b, config=cfg)), out, work


def measure(op, shape, world, heap, dtype, rounds, calls) -> tuple[int, dict[str, float], list[str]]:
    """``(work, times_us by path, problems)`` of ``op`` at ``shape``; the workspaces the
    calls made are released."""
    try:
        return _measure(op, shape, world, heap, dtype, rounds, calls)
    finally:
        iris.ops.release_workspaces()


def _measure(op, shape, world, heap, dtype, rounds, calls) -> tuple[int, dict[str, float], list[str]]:
    made = problem(op, *shape, world, heap, dtype)
    if made is None:
        return 0, {}, ["M not divisible by the group size"]
    call, out, work = made
    fns, results, trouble = {}, {}, None
    for path in ("fused", "composed"):
        fns[path] = call(iris.ops.Config(path=path))
        try:
            fns[path]()
            iris.mem.synchronize(out.device)
            results[path] = out.float().clone()
        except Exception as e:  # noqa: BLE001 - reported, the shape is left out
            trouble = f"{path}: {type(e).__name__}: {e}"[:300]
    if trouble is None:
        err = (results["fused"] - results["composed"]).abs().max().item() if out.numel() else 0.0
        scale = results["composed"].abs().max().item() if out.numel() else 0.0
        if not err <= 0.03 * scale + 1e-2:
            trouble = f"the paths disagree by {err:.3g} (largest element {scale:.3g})"
    failed = torch.tensor([trouble is not None], dtype=torch.int32, device=out.device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item():
        return work, {}, [trouble or "failed on another rank"]
    return work, tuning.time_calls(fns, out.device, rounds, calls), []


def main(argv: list[str] | None = None) -> int:
    parser = tuning.command_parser("python -m iris.ops.tune", __doc__, calls=10)
    parser.add_argument("--ops", default=",".join(_select.OPS))
    parser.add_argument("--shapes", default="", help="MxNxK,... (default: M = 1-8192 of 8192 x 4096)")
    args = parser.parse_args(argv)
    caps = tuning.start_session(parser, args)
    world = dist.get_world_size()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    shapes = shapes or (SMOKE_SHAPES if args.smoke else SHAPES)
    ops = [op for op in args.ops.split(",") if op]
    unknown = sorted(set(ops) - set(_select.OPS))
    if unknown:
        parser.error(f"unknown ops {unknown}; choose from {', '.join(_select.OPS)}")
    dtype = tuning.DTYPES[args.dtype]
    item = torch.empty((), dtype=dtype).element_size()
    largest = max(max(m * n, m * k) for m, n, k in shapes) * item
    with iris.mem.init(4 * largest + (64 << 20)) as heap:

        def timed(op: str, shape: tuple[int, int, int]) -> tuple[int, dict[str, float], list[str]]:
            return measure(op, shape, world, heap, dtype, args.rounds, args.calls)

        rules = tuning.measure_rules(ops, shapes, timed, label=lambda shape: "x".join(map(str, shape)))
    return tuning.finish_session(_select.TABLES, args, caps, rules, f"shapes {shapes}")


if __name__ == "__main__":
    sys.exit(main())
