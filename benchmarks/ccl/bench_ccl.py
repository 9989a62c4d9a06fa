"""Collectives of iris.ccl beside NCCL and torch symmetric memory, in one run.

    torchrun --nproc_per_node=2 benchmarks/ccl/bench_ccl.py --out benchmarks/ccl/results

For each collective and per-rank input size from 8 KiB to 1 GiB (bf16 unless --dtype) it
checks iris.ccl's result against NCCL's, then times iris.ccl (every variant, on heap
tensors), NCCL (torch.distributed) and, for all_reduce, torch symm_mem's one_shot and
two_shot all-reduce. Times are device times from CUDA events around replays of a CUDA
graph of several calls, the contenders of a size timed in interleaved rounds
(``benchmarks/bench_timing.py``; ``--sequential``: each one after the other), median over
the rounds per rank, maximum over ranks. Prints a table with bus bandwidth and ratios;
writes results.json and ccl_<collective>.png.

``--dtype`` takes bf16, fp16, fp32 and the fp8 formats ``float8_e4m3fn`` and ``float8_e5m2``.
For fp8 the reference of the reductions is NCCL's fp32 result rounded once to the format
(iris.ccl accumulates in fp32 and rounds once), of the other collectives NCCL moving the same
bytes; the timed NCCL contender is NCCL's own fp8 reduction (left out, with its reason in the
row's ``not_timed``, where torch or NCCL has none) and NCCL moving the bytes otherwise.

``all_to_all_uneven`` is ``iris.ccl.all_to_all`` with split sizes beside NCCL's
``all_to_all_single`` with the same splits: rows of ``--hidden`` elements, split the way a
mixture-of-experts layer sends tokens (``--patterns``: random weights per rank, most rows to
rank 0, or random with some pairs empty), 64 KiB to 256 MiB of input per rank::

    torchrun --nproc_per_node=2 benchmarks/ccl/bench_ccl.py --collectives all_to_all_uneven
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import triton

import iris.ccl
import iris.mem

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_timing import DTYPES, any_rank, command_line, interleaved_us, refuse_shared_gpu, use_rank_gpu  # noqa: E402 - benchmarks/bench_timing.py

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: 8 KiB x 4**i up to 1 GiB, and 1 MiB (a target size of the all-reduce).
SIZES = sorted({8 * KiB * 4**i for i in range(9) if 8 * KiB * 4**i <= GiB} | {MiB, GiB})
#: Every variant of every collective iris.ccl has ("auto" picks one of them).
IRIS_VARIANTS = {c: tuple(v for v in vs if v != "auto") for c, vs in iris.ccl.VARIANTS.items()}
#: all_to_all with split sizes: its name here, its per-rank input sizes (64 KiB * 4**i up
#: to 256 MiB) and split patterns; copy_engine runs push when split sizes are given.
UNEVEN = "all_to_all_uneven"
UNEVEN_SIZES = [64 * KiB * 4**i for i in range(7)]
PATTERNS = ("random", "skewed", "zeros")


def _calls(nbytes: int) -> int:
    """Calls per CUDA graph: enough that a replay is not just launch overhead."""
    return 20 if nbytes < 16 * MiB else 5 if nbytes < 128 * MiB else 1


#: Variants whose launch shape (tile, warps, programs) --configs varies: the tiled Triton
#: kernels the table may pick (``ll`` tiles are words, measured separately; ``gluon`` is never
#: in the table; copy_engine and the slow forms keep their shapes).
SHAPED = ("boxed", "one_shot", "two_shot", "two_shot_push", "push", "pull")


def _parse_shapes(text: str) -> list[dict]:
    """``"4096x8,16384x32p66"`` -> launch fields per shape (BLOCKxWARPS, optionally pPROGRAMS)."""
    shapes = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        block, _, rest = item.partition("x")
        warps, _, programs = rest.partition("p")
        fields = {"block_size": int(block), "num_warps": int(warps)}
        if programs:
            fields["programs"] = int(programs)
        iris.ccl.Config(**fields)  # a clear error for a bad shape
        shapes.append(fields)
    return shapes


def _shape_label(shape: dict | None) -> str:
    if not shape:
        return ""
    label = f"@{shape['block_size']}x{shape['num_warps']}"
    return label + (f"p{shape['programs']}" if "programs" in shape else "")


def _best_shapes(row: dict, shapes: list[dict]) -> None:
    """Fold the ``iris_<variant>@<shape>`` contenders of ``row`` into ``iris_<variant>`` (its
    best time) and record which shape won in ``row["shapes"]`` (``{}``: the default)."""
    times = row["times_us"]
    row["shapes"], row["shape_times_us"] = {}, {}
    for name in [k for k in times if k.startswith("iris_") and "@" not in k and k != "iris_auto"]:
        tried = {name: {}} | {
            f"{name}{_shape_label(s)}": s for s in shapes if f"{name}{_shape_label(s)}" in times
        }
        if len(tried) == 1:
            continue
        best = min(tried, key=times.get)
        best_us = times[best]
        row["shapes"][name[5:]] = tried[best]
        row["shape_times_us"].update({k: times.pop(k) for k in tried if k != name})
        times[name] = best_us


def _fp8(dtype: torch.dtype) -> bool:
    """A 1-byte float format: no random fill, no NCCL data type of its own in every torch."""
    return dtype.is_floating_point and dtype.itemsize == 1


def _fill_random(t: torch.Tensor) -> torch.Tensor:
    """Fresh N(0, 1) values (torch draws none directly in fp8: drawn in fp32, then rounded)."""
    if _fp8(t.dtype):
        return t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype))
    return t.normal_()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` as NCCL moves it: fp8 as its bytes, other dtypes as they are."""
    return t.view(torch.uint8) if _fp8(t.dtype) else t


def _bus_factor(collective: str, world: int) -> float:
    return 2 * (world - 1) / world if collective == "all_reduce" else (world - 1) / world


class Buffers:
    """Heap tensors for iris, plain tensors for NCCL, symm_mem tensors for torch."""

    def __init__(self, heap, max_bytes: int, dtype: torch.dtype, world: int):
        n = max_bytes // dtype.itemsize
        self.inp = _fill_random(heap.empty(n, dtype=dtype))
        self.out = heap.empty(n * world, dtype=dtype)
        self.nccl_inp = _fill_random(torch.empty(n, dtype=dtype, device=heap.device))
        self.nccl_out = torch.empty(n * world, dtype=dtype, device=heap.device)
        self.symm = None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            self.symm = symm_mem.empty(n, dtype=dtype, device=heap.device)
            symm_mem.rendezvous(self.symm, group=dist.group.WORLD.group_name)
        except Exception as e:  # noqa: BLE001 - report and go on without the baseline
            if heap.rank == 0:
                print(f"torch symm_mem unavailable: {e}")


def _iris_call(collective: str, variant: str, b: Buffers, n: int, world: int, shape: dict | None = None):
    cfg = iris.ccl.Config(variant=variant, **(shape or {}))
    inp = b.inp[:n]
    if collective == "all_reduce":
        out = b.out[:n]
        return lambda: iris.ccl.all_reduce(out, inp, config=cfg), out
    if collective == "all_gather":
        out = b.out[: n * world]
        return lambda: iris.ccl.all_gather(out, inp, config=cfg), out
    if collective == "reduce_scatter":
        out = b.out[: n // world]
        return lambda: iris.ccl.reduce_scatter(out, inp, config=cfg), out
    out = b.out[:n]
    return lambda: iris.ccl.all_to_all(out, inp, config=cfg), out


def _nccl_call(collective: str, b: Buffers, n: int, world: int):
    """NCCL's collective: the reductions in the dtype itself (fp8 where torch and NCCL have
    it), the moving collectives on the bytes (what NCCL moves for any dtype)."""
    inp = b.nccl_inp[:n]
    if collective == "all_reduce":
        return lambda: dist.all_reduce(inp)
    if collective == "reduce_scatter":
        out = b.nccl_out[: n // world]
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if collective == "all_gather":
        out = _bytes(b.nccl_out[: n * world])
        return lambda: dist.all_gather_into_tensor(out, _bytes(inp))
    out = _bytes(b.nccl_out[:n])
    return lambda: dist.all_to_all_single(out, _bytes(inp))


def _reference(collective: str, b: Buffers, n: int, world: int) -> torch.Tensor:
    """NCCL's result on ``b.nccl_inp[:n]``; for fp8, reductions in fp32 rounded once to the
    format (the contract of iris.ccl's fp8 reductions)."""
    if not _fp8(b.nccl_inp.dtype) or collective in ("all_gather", "all_to_all"):
        _nccl_call(collective, b, n, world)()
        numel = {"all_reduce": n, "all_gather": n * world, "reduce_scatter": n // world, "all_to_all": n}
        return b.nccl_inp[:n] if collective == "all_reduce" else b.nccl_out[: numel[collective]]
    wide = b.nccl_inp[:n].float()
    if collective == "all_reduce":
        dist.all_reduce(wide)
        return wide.to(b.nccl_inp.dtype)
    out = torch.empty(n // world, dtype=torch.float32, device=wide.device)
    dist.reduce_scatter_tensor(out, wide)
    return out.to(b.nccl_inp.dtype)


def _check(
    collective: str, variant: str, b: Buffers, n: int, world: int, shape: dict | None = None
) -> str | None:
    """Compare iris's result with NCCL's on the same input (fresh random data): None when it
    matches, else what went wrong."""
    _fill_random(b.inp[:n])
    b.nccl_inp[:n].copy_(b.inp[:n])
    what = f"{collective}/{variant}{_shape_label(shape)} n={n}"
    fn, out = _iris_call(collective, variant, b, n, world, shape)
    fn()
    ref = _reference(collective, b, n, world)
    try:
        iris.ccl.check_errors()  # synchronises; raises if a device wait gave up
    except iris.mem.DeviceWaitTimeout as e:
        return f"{what}: {e}"
    err = (out.float() - ref.float()).abs()
    if collective not in ("all_reduce", "reduce_scatter"):
        bad = err.max().item()  # moved, not computed: exact
    elif _fp8(out.dtype):
        # Rounded once from fp32 on both sides, so equal; one step of the format allowed
        # where the two sums might round differently: 2**-3 of the value for e4m3, 2**-2 for
        # e5m2, and the smallest normal step (2**-6 for e4m3) near zero.
        bad = (err - ref.float().abs() / 4 - 2**-6).max().item()
    else:
        bad = err.max().item() - 0.1
    return None if bad <= 0 else f"{what}: max error {err.max().item()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/ccl/results")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--collectives", default=f"all_reduce,all_gather,reduce_scatter,all_to_all,{UNEVEN}")
    parser.add_argument(
        "--patterns", default=",".join(PATTERNS), help=f"split patterns of {UNEVEN}: {', '.join(PATTERNS)}"
    )
    parser.add_argument("--hidden", type=int, default=4096, help=f"elements per row of {UNEVEN}")
    parser.add_argument("--max-bytes", type=int, default=GiB)
    parser.add_argument(
        "--sizes",
        default="",
        help="comma-separated per-rank sizes instead of 8 KiB * 4**i up to 1 GiB and 1 MiB, e.g. 1MiB,256MiB",
    )
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument(
        "--variants", default="", help="comma-separated iris variants to time, auto among them (default: all)"
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="time the contenders of a size one after another (each warmed up right before it is timed) "
        "instead of in interleaved rounds (benchmarks/bench_timing.py); the first one timed after an idle "
        "GPU then runs slow",
    )
    parser.add_argument(
        "--configs",
        default="",
        metavar="SHAPES",
        help="also time every tiled variant (" + ", ".join(SHAPED) + ") with these launch shapes, "
        "BLOCKxWARPS[pPROGRAMS] comma-separated (e.g. 4096x8,8192x16,16384x32p66); a variant's time is "
        "its best shape's, which --write-table records in the table",
    )
    parser.add_argument(
        "--write-table",
        metavar="PATH",
        help="write the measured variant-by-size table (JSON) for Config(variant='auto'); use it with "
        "IRIS_CCL_TABLE=PATH",
    )
    args = parser.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    args.interleave = not args.sequential
    shapes = _parse_shapes(args.configs)
    use_rank_gpu()
    dist.init_process_group("nccl")
    refuse_shared_gpu()  # before anything is timed: ranks sharing a GPU measure nothing
    dtype = DTYPES[args.dtype]
    world = dist.get_world_size()
    explicit = sorted(_parse_size(v) for v in args.sizes.split(",") if v)
    sizes = [s for s in explicit or SIZES if s <= args.max_bytes]
    uneven_sizes = [s for s in explicit or UNEVEN_SIZES if s <= args.max_bytes]
    largest = max(sizes + uneven_sizes)
    heap = iris.mem.init(2 * largest * world + largest + (256 << 20))
    bufs = Buffers(heap, largest, dtype, world)
    rows, failures = [], []
    for collective in args.collectives.split(","):
        if collective == UNEVEN:
            _bench_uneven(args, bufs, world, dtype, uneven_sizes, rows, failures)
            continue
        if not hasattr(iris.ccl, collective):
            continue
        for nbytes in sizes:
            n = nbytes // dtype.itemsize
            n -= n % world
            row = {"collective": collective, "bytes": nbytes, "dtype": args.dtype, "times_us": {}}
            fns = {}
            variants = [v for v in IRIS_VARIANTS[collective] if not args.variants or v in args.variants]
            # (variant, launch shape; None: the default); "auto" is what Config() runs (the table)
            candidates = [(v, s) for v in variants for s in [None, *(shapes if v in SHAPED else ())]]
            candidates += [("auto", None)] if not args.variants or "auto" in args.variants else []
            failed: set[str] = set()
            for variant, shape in candidates:
                if variant in failed:
                    continue  # a variant whose default fails is not timed in any shape
                problem = _check(collective, variant, bufs, n, world, shape)
                if any_rank([problem is not None])[0]:  # the same contenders everywhere
                    problem = (
                        problem or f"{collective}/{variant}{_shape_label(shape)} n={n}: wrong on another rank"
                    )
                if problem:
                    failures.append(problem)
                    failed.update([variant] if shape is None else [])
                    continue
                fns[f"iris_{variant}{_shape_label(shape)}"] = _iris_call(
                    collective, variant, bufs, n, world, shape
                )[0]
            fns["nccl"] = _nccl_call(collective, bufs, n, world)
            if collective == "all_reduce" and bufs.symm is not None:
                group = dist.group.WORLD.group_name
                s = bufs.symm[:n]
                one, two = torch.ops.symm_mem.one_shot_all_reduce, torch.ops.symm_mem.two_shot_all_reduce_
                fns["symm_one_shot"] = lambda s=s, g=group, f=one: f(s, "sum", g)
                fns["symm_two_shot"] = lambda s=s, g=group, f=two: f(s, "sum", g)
            # interleaved rounds of all contenders, or (--sequential) each one's rounds in turn
            batches = [fns] if args.interleave else [{name: fn} for name, fn in fns.items()]
            errors: dict[str, str] = {}
            for batch in batches:
                row["times_us"].update(
                    interleaved_us(
                        batch, args.reps, calls=_calls(nbytes), errors=errors, check=iris.ccl.check_errors
                    )
                )
            for name, error in errors.items():  # every rank's own reason (e.g. no fp16 symm_mem kernel)
                print(f"rank {heap.rank}: {name} not timed: {error.splitlines()[0]}"[:400], flush=True)
            if errors:  # kept with the results: a baseline missing from a row says why
                row["not_timed"] = {k: e.splitlines()[0][:300] for k, e in errors.items()}
            iris.ccl.check_errors()  # a device wait that gave up while timed: stop, naming it
            _best_shapes(row, shapes)
            iris_times = [
                (v, k) for k, v in row["times_us"].items() if k.startswith("iris_") and k != "iris_auto"
            ]
            # --variants auto: what Config() runs is the only Iris contender (e.g. over nodes)
            iris_times = iris_times or [(v, k) for k, v in row["times_us"].items() if k == "iris_auto"]
            if not iris_times:
                continue
            iris_best = min(iris_times)
            row["iris_best_us"], row["iris_best"] = iris_best
            total = nbytes * (world if collective == "all_gather" else 1)
            row["busbw_GBps"] = _bus_factor(collective, world) * total / (iris_best[0] * 1e-6) / 1e9
            rows.append(row)
            if heap.rank == 0:  # what a run cut short has measured so far
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, "partial.json"), "w") as f:
                    json.dump({"rows": rows, "failures": failures}, f)
            if heap.rank == 0:  # progress, so a run cut short still shows what it measured
                times = ", ".join(f"{k} {v:.1f}" for k, v in row["times_us"].items())
                print(f"{collective} {_size(nbytes)}: {times} us", flush=True)
    if heap.rank == 0:
        _report(rows, failures, args, world)
        if args.write_table:
            _write_table(rows, args.write_table, world)
    heap.close()
    return 1 if failures else 0


def _moe_splits(pattern: str, rows: int, world: int, seed: int) -> list[list[int]]:
    """``m[i][j]``: rows rank ``i`` sends rank ``j`` (every rank draws the same matrix), each
    rank sending ``rows``: by random weights ("random"), about three quarters to rank 0, a
    hot expert ("skewed"), or by random weights with every even rank sending nothing to the
    next rank ("zeros")."""
    g = torch.Generator().manual_seed(seed)
    m = []
    for i in range(world):
        w = torch.rand(world, generator=g, dtype=torch.float64)
        if pattern == "skewed":
            w[0] += 3 * (w.sum() - w[0])
        elif pattern == "zeros" and i % 2 == 0:
            w[(i + 1) % world] = 0.0
        counts = (w / w.sum() * rows).floor().long()
        counts[int(w.argmax())] += rows - int(counts.sum())
        m.append(counts.tolist())
    return m


def _bench_uneven(args, bufs: Buffers, world: int, dtype, sizes, rows: list, failures: list) -> None:
    """iris.ccl.all_to_all with split sizes (every variant and "auto", heap tensors) beside
    NCCL's all_to_all_single with the same splits (plain tensors), per pattern and size:
    checked equal to NCCL's result, then timed. Appends to ``rows`` and ``failures``."""
    rank = dist.get_rank()
    variants = [v for v in IRIS_VARIANTS["all_to_all"] if v != "copy_engine"]
    variants = [v for v in variants if not args.variants or v in args.variants]
    variants += [] if args.variants else ["auto"]
    for pattern in [p for p in args.patterns.split(",") if p]:
        for nbytes in sizes:
            count = max(1, nbytes // (args.hidden * dtype.itemsize))  # rows this rank sends
            m = _moe_splits(pattern, count, world, nbytes)
            sends, receives = m[rank], [r[rank] for r in m]
            n_in, n_out = count * args.hidden, sum(receives) * args.hidden
            inp, out = bufs.inp[:n_in].view(count, -1), bufs.out[:n_out].view(-1, args.hidden)
            ninp, nout = bufs.nccl_inp[:n_in].view(count, -1), bufs.nccl_out[:n_out].view(-1, args.hidden)

            def iris_call(variant, out=out, inp=inp, receives=receives, sends=sends):
                cfg = iris.ccl.Config(variant=variant)
                return lambda: iris.ccl.all_to_all(out, inp, receives, sends, config=cfg)

            fns = {}
            _fill_random(inp)
            ninp.copy_(inp)
            dist.all_to_all_single(_bytes(nout), _bytes(ninp), receives, sends)
            for variant in variants:
                what = f"{UNEVEN}/{pattern}/{variant} {_size(nbytes)}"
                out.zero_()
                iris_call(variant)()
                try:
                    iris.ccl.check_errors()  # synchronises; raises if a device wait gave up
                    same = torch.equal(_bytes(out), _bytes(nout))
                    problem = None if same else f"{what}: differs from NCCL"
                except iris.mem.DeviceWaitTimeout as e:
                    problem = f"{what}: {e}"
                if any_rank([problem is not None])[0]:  # the same contenders everywhere
                    failures.append(problem or f"{what}: wrong on another rank")
                    continue
                fns[f"iris_{variant}"] = iris_call(variant)
            nccl_out, nccl_inp = _bytes(nout), _bytes(ninp)
            fns["nccl"] = lambda o=nccl_out, i=nccl_inp, r=receives, s=sends: dist.all_to_all_single(
                o, i, r, s
            )
            errors: dict[str, str] = {}
            times = interleaved_us(
                fns, args.reps, calls=_calls(nbytes), errors=errors, check=iris.ccl.check_errors
            )
            for name, error in errors.items():
                print(f"rank {rank}: {name} not timed: {error.splitlines()[0]}"[:400], flush=True)
            timed = [(t, k) for k, t in times.items() if k.startswith("iris_") and k != "iris_auto"]
            if not timed or "nccl" not in times:
                continue
            best = min(timed)
            row = {
                "collective": f"{UNEVEN}/{pattern}",
                "bytes": nbytes,
                "dtype": args.dtype,
                "times_us": times,
            }
            row.update(splits=m, iris_best_us=best[0], iris_best=best[1])
            row["busbw_GBps"] = _bus_factor(UNEVEN, world) * nbytes / (best[0] * 1e-6) / 1e9
            rows.append(row)
            if rank == 0:
                print(
                    f"{UNEVEN}/{pattern} {_size(nbytes)}: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in times.items())
                    + f" us; NCCL / iris auto {times['nccl'] / times.get('iris_auto', float('nan')):.2f}",
                    flush=True,
                )


def _write_table(rows, path: str, world: int) -> None:
    """The tuning table of this run: per collective, the fastest variant of each size,
    merged into ``[[max_bytes, variant], ..., [null, variant]]`` rules (sizes as
    ``iris.ccl.config.select`` sees them: the output for all_gather). World sizes this run
    did not measure keep the packaged table's rules."""
    from iris.ccl import config

    table = json.loads(json.dumps(config._load_table(str(config._PACKAGED_TABLE))))
    measured = {}
    # the table picks variants of equal-split collectives (split sizes: one kernel, see docs)
    for collective in dict.fromkeys(r["collective"] for r in rows if r["collective"] in IRIS_VARIANTS):
        rules: list[list] = []
        for r in sorted((r for r in rows if r["collective"] == collective), key=lambda r: r["bytes"]):
            # gluon needs a GPU: keep the table usable on every backend
            times = {
                k[5:]: v
                for k, v in r["times_us"].items()
                if k.startswith("iris_") and k not in ("iris_gluon", "iris_auto")
            }
            best = min(times, key=times.get)
            shape = r.get("shapes", {}).get(best)
            rule = [best, shape] if shape else [best]
            size = r["bytes"] * (world if collective == "all_gather" else 1)
            if rules and rules[-1][1:] == rule:
                rules[-1][0] = size
            else:
                rules.append([size, *rule])
        rules[-1][0] = None
        measured[collective] = rules
    table.setdefault("world_sizes", {})[str(world)] = measured
    table["measured"] = (
        f"{torch.cuda.get_device_name()} x {world}, {time.strftime('%Y-%m-%d')}, written by bench_ccl.py"
    )
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
    print(f"wrote the tuning table {path}: use it with IRIS_CCL_TABLE={path}")


def _parse_size(text: str) -> int:
    """``"256MiB"`` -> 268435456 (units B, KiB, MiB, GiB; a bare number is bytes)."""
    text = text.strip()
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB), ("B", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def _size(nbytes: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"


def _report(rows, failures, args, world) -> None:
    os.makedirs(args.out, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "world_size": world,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "iris_ccl": iris.ccl.__version__,
        "command": command_line(),
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "failures": failures}, f, indent=1)
    print(f"# iris.ccl vs NCCL / torch symm_mem, {args.dtype}, {world} x {meta['gpus'][0]} ({meta})")
    for collective in dict.fromkeys(r["collective"] for r in rows):
        sel = [r for r in rows if r["collective"] == collective]
        cols = list(dict.fromkeys(k for r in sel for k in r["times_us"]))
        print(f"\n## {collective} (us; busbw of the best iris variant)")
        print(
            "| size | " + " | ".join(cols) + " | iris best | busbw GB/s | NCCL / iris | symm 2shot / iris |"
        )
        print("|---" * (len(cols) + 5) + "|")
        for r in sel:
            t = r["times_us"]
            cells = " | ".join(f"{t[c]:.1f}" if c in t else "-" for c in cols)
            two = f"{t['symm_two_shot'] / r['iris_best_us']:.2f}" if "symm_two_shot" in t else "-"
            nccl = f"{t['nccl'] / r['iris_best_us']:.2f}" if "nccl" in t else "-"  # fp8: NCCL may have none
            best = f"{r['iris_best']} | {r['busbw_GBps']:.0f}"
            print(f"| {_size(r['bytes'])} | {cells} | {best} | {nccl} | {two} |")
    if failures:
        print("\nFAILED checks (not timed):\n  " + "\n  ".join(failures))
    try:
        _plot(rows, args.out)
    except ImportError:
        print("(matplotlib not installed: no plots)")


def _plot(rows, out) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for collective in dict.fromkeys(r["collective"] for r in rows):
        sel = [r for r in rows if r["collective"] == collective]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key in dict.fromkeys(k for r in sel for k in r["times_us"]):
            pts = [(r["bytes"], r["times_us"][key]) for r in sel if key in r["times_us"]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=key,
                    linestyle="-" if key.startswith("iris") else "--")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("per-rank input (bytes)")
        ax.set_ylabel("time (us)")
        ax.set_title(collective)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"ccl_{collective.replace('/', '_')}.png"), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
