"""Every check and measurement that needs GPUs, in parts of at most 10 minutes, with their
outcomes checked.

    python benchmarks/acceptance.py --list                         # the parts: commands, outcomes
    python benchmarks/acceptance.py --part 3 --out OUT --dry-run   # what part 3 would run
    python benchmarks/acceptance.py --part 3 --out OUT             # run part 3: logs, JSON, verdicts
    python benchmarks/acceptance.py --all --out OUT                # every part, one after another
    python benchmarks/acceptance.py --summary --out OUT            # pass / miss / fail of every check
    python benchmarks/acceptance.py --suite one-gpu --list         # ranks sharing one GPU
    python benchmarks/acceptance.py --write-list                   # rewrite benchmarks/ACCEPTANCE.md's lists

Two suites: ``two-gpu`` (a node of two GPUs: the GPU test tier, the examples, the multi-node
path as two nodes of one GPU, the soak, and every benchmark of ``docs/performance.md`` with
the targets the issues set) and ``one-gpu`` (several ranks sharing one GPU: the GPU test
tier at worlds 2-4 and the examples at 2 and 3 ranks). A step is a shell command (``$OUT`` is
the output folder; ``torchrun`` and ``python`` are this interpreter) with a time limit;
its output goes to ``OUT/logs/<step>.log``, its exit status and time to
``OUT/status/<step>.json``, the benchmarks' JSON under ``OUT``. A part runs its steps in
order and stops starting new ones before ``--budget`` seconds (570: under the 10 minutes one
command may take on the device machine), killing a step at its own limit. ``--summary``
reads what ``OUT`` holds, evaluates the mechanical targets (ratios from the JSON; recorded
tables from the committed results) and writes ``OUT/summary.md`` and ``OUT/summary.json``.

From a source checkout with nothing installed (the GPU machine has no network), the runner
puts ``packages/*/src`` on ``PYTHONPATH`` when ``iris.ops`` is not importable; with the
packages installed it uses them. Afterwards: ``python benchmarks/perf_tables.py --collect
OUT`` brings the results into the docs (after ``--summary``: the regression targets compare
with the committed results that ``--collect`` replaces).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("iris-mem", "iris-ccl", "iris-ops", "iris-compat")
#: Seconds a part may start steps in: the device machine allows 600 per command; the rest is
#: the interpreter's start and the summary.
PART_BUDGET = 570
#: Below this many seconds left in a part no step is started.
LEAST_STEP = 30
#: Within this factor of a recorded time a new one is unchanged (the run-to-run spread:
#: "ratios within about 5% of 1.0 are ties", docs/performance.md).
SPREAD = 1.05
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass
class Verdict:
    """One target of a step: ``ok`` None when it could not be evaluated (its data missing)."""

    target: str
    ok: bool | None
    measured: str


@dataclass(frozen=True)
class Step:
    id: str
    part: int
    what: str
    command: str  # as typed in a shell: $OUT is the output folder
    outcome: str  # what it must show
    timeout: int  # seconds
    minutes: float  # expected duration
    targets: Callable[[Path], list[Verdict]] | None = None
    needs: tuple[str, ...] = ()  # steps that must have passed first (their output is used)


# ---- reading results ---------------------------------------------------------------------------


def _load(path: Path) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _results(path: Path):
    """A step's results, or an empty dict when it wrote none: every target then comes back
    "nothing measured" under its own name (which is also how ``--list`` names them)."""
    data = _load(path)
    return {} if data is None else data


def _size(nbytes: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"


def _worst(target: str, items: list[tuple[str, float | None]], ok: Callable[[float], bool], low: bool = True):
    """A verdict over ``items`` (where, value): every value must satisfy ``ok``; the
    measurement names the worst one (the lowest when ``low``) and how many missed."""
    if not items:
        return Verdict(target, None, "nothing measured")
    absent = [w for w, v in items if v is None]
    values = [(v, w) for w, v in items if v is not None]
    if not values:
        return Verdict(target, None, f"not measured at {', '.join(absent[:4])}")
    worst_v, worst_w = min(values) if low else max(values)
    misses = [w for v, w in values if not ok(v)]
    text = f"worst {worst_v:.2f} at {worst_w}"
    if misses:
        text += f"; {len(misses)} of {len(values)} miss: {', '.join(misses[:6])}" + (
            " ..." if len(misses) > 6 else ""
        )
    if absent:
        text += f"; not measured at {', '.join(absent[:4])}"
    return Verdict(target, not misses and not absent, text)


def _rows(data: dict, collective: str) -> list[dict]:
    return [r for r in data.get("rows", []) if r.get("collective") == collective]


def _t(r: dict, key: str) -> float | None:
    return r.get("times_us", {}).get(key)


def _div(a, b):
    return None if a is None or b is None or b == 0 else a / b


EQUAL = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _faster_than_nccl(data: dict, sizes: list[int] | None = None) -> list[Verdict]:
    out = []
    for key, name in (("iris_auto", "auto"), (None, "the fastest variant")):
        items = []
        for c in EQUAL:
            for r in _rows(data, c):
                if sizes is None or r["bytes"] in sizes:
                    iris = _t(r, key) if key else r.get("iris_best_us")
                    items.append((f"{c} {_size(r['bytes'])}", _div(_t(r, "nccl"), iris)))
        out.append(
            _worst(f"{name} faster than NCCL at every size (NCCL / Iris > 1)", items, lambda v: v > 1.0)
        )
    return out


def _unchanged(new: dict, old: dict | None, what: str) -> list[Verdict]:
    """Each collective and size: ``auto`` and the fastest variant within the spread of the
    recorded run (new / recorded <= 1.05); at 8 KiB also ``ll``, where call signatures and the
    abort word would show."""
    if old is None:
        return [Verdict(f"not slower than {what}", None, f"{what} not found")]
    before = {(r["collective"], r["bytes"]): r for r in old.get("rows", [])}
    items, small = [], []
    for r in new.get("rows", []):
        o = before.get((r["collective"], r["bytes"]))
        if o is None or r["collective"] not in EQUAL:
            continue
        where = f"{r['collective']} {_size(r['bytes'])}"
        items.append((f"{where} auto", _div(_t(r, "iris_auto"), _t(o, "iris_auto"))))
        items.append((f"{where} best", _div(r.get("iris_best_us"), o.get("iris_best_us"))))
        if r["bytes"] == 8 * KiB:
            small.append((f"{where} ll", _div(_t(r, "iris_ll"), _t(o, "iris_ll"))))
    return [
        _worst(
            f"not slower than {what} beyond the spread (new / recorded <= {SPREAD})",
            items,
            lambda v: v <= SPREAD,
            low=False,
        ),
        _worst(
            f"call signatures and the abort word cost nothing at 8 KiB (ll new / recorded <= {SPREAD})",
            small,
            lambda v: v <= SPREAD,
            low=False,
        ),
    ]


def targets_ccl_bf16(out: Path) -> list[Verdict]:
    data = _results(out / "ccl-bf16" / "results.json")
    verdicts = _faster_than_nccl(data)
    ar = {r["bytes"]: r for r in _rows(data, "all_reduce")}
    symm = [(_size(n), _div(_t(r, "symm_two_shot"), r.get("iris_best_us"))) for n, r in ar.items()]
    verdicts.append(
        _worst("all_reduce faster than torch symm_mem two_shot at every size", symm, lambda v: v >= 1.0)
    )
    for nbytes, limit in ((8 * KiB, 5.0), (MiB, 8.0)):
        auto = _t(ar.get(nbytes, {}), "iris_auto")
        items = [(_size(nbytes), auto)] if ar else []
        verdicts.append(
            _worst(
                f"all_reduce auto <= {limit:g} us at {_size(nbytes)} (us)", items, lambda v, m=limit: v <= m
            )
        )
    bus = [("1 GiB", ar[GiB].get("busbw_GBps"))] if GiB in ar else []
    verdicts.append(_worst("all_reduce >= 370 GB/s bus bandwidth at 1 GiB (GB/s)", bus, lambda v: v >= 370))
    old = _load(ROOT / "benchmarks" / "ccl" / "results-h200x2.json")
    return verdicts + _unchanged(data, old, "the recorded table (benchmarks/ccl/results-h200x2.json)")


def targets_ccl_dtype(dtype: str) -> Callable[[Path], list[Verdict]]:
    def targets(out: Path) -> list[Verdict]:
        return _faster_than_nccl(_results(out / f"ccl-{dtype}" / "results.json"))

    return targets


def targets_ccl_uneven(out: Path) -> list[Verdict]:
    data = _results(out / "ccl-uneven" / "results.json")
    items = [
        (f"{r['collective'].split('/', 1)[1]} {_size(r['bytes'])}", _div(_t(r, "nccl"), _t(r, "iris_auto")))
        for r in data.get("rows", [])
        if r["collective"].startswith("all_to_all_uneven/")
    ]
    return [
        _worst(
            "faster than NCCL's all_to_all_single at every size and pattern (auto)", items, lambda v: v > 1.0
        )
    ]


def targets_ccl_fp8(out: Path) -> list[Verdict]:
    fp8 = _results(out / "ccl-fp8" / "results.json")
    bf16 = _results(out / "ccl-bf16" / "results.json")  # the bf16 run of this acceptance run
    by16 = {(r["collective"], r["bytes"]): r for r in bf16.get("rows", [])}
    verdicts = []
    for c in ("all_gather", "all_to_all"):
        items = [
            (_size(r["bytes"]), _div(_t(by16.get((c, 2 * r["bytes"]), {}), "iris_auto"), _t(r, "iris_auto")))
            for r in _rows(fp8, c)
            if r["bytes"] > MiB
        ]
        verdicts.append(
            _worst(f"fp8 {c} >= 1.8x bf16 at the same elements above 1 MiB (auto)", items, lambda v: v >= 1.8)
        )
    items = []
    for r in _rows(fp8, "all_reduce"):
        why = r.get("not_timed", {}).get("nccl")
        items.append(
            (
                _size(r["bytes"]) + (f" (NCCL: {why[:60]})" if why else ""),
                _div(_t(r, "nccl"), _t(r, "iris_auto")),
            )
        )
    verdicts.append(
        _worst("fp8 all_reduce faster than NCCL's fp8 all_reduce at every size", items, lambda v: v > 1.0)
    )
    return verdicts


def _ops_rows(data: dict) -> dict[tuple, dict]:
    return {(r["op"], r["M"], r["N"], r["K"]): r for r in data.get("rows", [])}


def targets_ops(out: Path) -> list[Verdict]:
    rows = _ops_rows(_results(out / "ops" / "results.json"))
    name = lambda k: f"{k[0]} {k[1]}x{k[2]}x{k[3]}"  # noqa: E731
    every = [(name(k), _div(_t(r, "nccl"), _t(r, "iris"))) for k, r in rows.items()]
    verdicts = [_worst("every op >= 1.0x matmul + NCCL at every shape (auto)", every, lambda v: v >= 1.0)]
    big = []
    for k, r in rows.items():
        if (k[1], k[2], k[3]) in ((8192, 8192, 4096), (1024, 8192, 4096)):
            # all_gather_matmul at 8192: within its bound where the bound is below 1.3x
            need = (
                min(1.3, r.get("bound", 1.3) / SPREAD)
                if k[0] == "all_gather_matmul" and k[1] == 8192
                else 1.3
            )
            big.append((f"{name(k)} (needs {need:.2f})", _div(_div(_t(r, "nccl"), _t(r, "iris")), need)))
    verdicts.append(
        _worst(
            "every op >= 1.3x matmul + NCCL at M = 8192 and 1024 (value: ratio / needed)",
            big,
            lambda v: v >= 1.0,
        )
    )
    symm = [
        (name(k), _div(_t(r, "symm"), _t(r, "iris")))
        for k, r in rows.items()
        if k[0] in ("all_gather_matmul", "matmul_reduce_scatter")
    ]
    verdicts.append(
        _worst(
            "all_gather_matmul, matmul_reduce_scatter >= 1.0x torch's fused ops at every shape",
            symm,
            lambda v: v >= 1.0,
        )
    )
    return verdicts


def targets_ops_tma(out: Path) -> list[Verdict]:
    data = _load(out / "ops-tma" / "tune.json") or []
    items = []
    for r in data:
        times = {name: t for t, name, _ in r["all"]}
        items.append(
            (
                f"{r['M']}x{r['N']}x{r['K']}",
                _div(times.get("path=fused,tma=False") or times.get("tma=False"), times.get("default")),
            )
        )
    return [
        _worst(
            "all_gather_matmul reading A through TMA not slower than pointer loads (pointer / TMA >= 0.95)",
            items,
            lambda v: v >= 1 / SPREAD,
        )
    ]


def targets_ops_fp8(out: Path) -> list[Verdict]:
    fp8, bf16 = _results(out / "ops-fp8" / "results.json"), _results(out / "ops" / "results.json")
    key = ("all_gather_matmul", 8192, 8192, 4096)
    r8, r16 = _ops_rows(fp8).get(key), _ops_rows(bf16).get(key)
    items = [("8192x8192x4096", _div(_t(r16, "iris"), _t(r8, "iris")))] if r8 and r16 else []
    return [
        _worst(
            "all_gather_matmul with fp8 A >= 1.2x the bf16 op at M = 8192 (bf16 / fp8)",
            items,
            lambda v: v >= 1.2,
        )
    ]


def targets_rmsnorm(out: Path) -> list[Verdict]:
    rows = _results(out / "ops-rmsnorm" / "results.json").get("rows", [])
    small = [r for r in rows if r["tokens"] <= 128 and r["hidden"] <= 8192]
    where = lambda r: f"{r['tokens']}x{r['hidden']}"  # noqa: E731
    return [
        _worst(
            "<= 1.3x iris.ccl's fastest all_reduce up to 128 x 8192",
            [(where(r), r.get("iris_over_ccl_ar")) for r in small],
            lambda v: v <= 1.3,
            low=False,
        ),
        _worst(
            ">= 2x NCCL + eager norm up to 128 x 8192",
            [(where(r), r.get("nccl_eager_over_iris")) for r in small],
            lambda v: v >= 2.0,
        ),
        _worst(
            ">= 1.5x NCCL + compiled norm up to 128 x 8192",
            [(where(r), r.get("nccl_compiled_over_iris")) for r in small],
            lambda v: v >= 1.5,
        ),
        _worst(
            "never slower than NCCL + compiled norm",
            [(where(r), r.get("nccl_compiled_over_iris")) for r in rows],
            lambda v: v >= 1.0,
        ),
    ]


def _moe_results(path: Path) -> dict[int, dict]:
    return {r["tokens"]: r for r in _results(path).get("results", []) if not r.get("problems")}


def _at(rows: dict, tokens: int, value) -> list[tuple[str, float | None]]:
    return [(f"{tokens} tokens", value(rows[tokens]))] if tokens in rows else []


def targets_moe(out: Path) -> list[Verdict]:
    rows = _moe_results(out / "ops-moe.json")
    verdicts = []
    for tokens, need in ((4096, 1.5), (128, 2.0)):
        for part in ("dispatch", "combine"):
            items = _at(rows, tokens, lambda r, p=part: r.get(f"torch_over_iris_{p}"))
            verdicts.append(
                _worst(f"{part} >= {need}x the NCCL path at {tokens} tokens", items, lambda v, n=need: v >= n)
            )
    share = _at(rows, 4096, lambda r: _div(r.get("dispatch_link_GBps"), r.get("copy_engine_GBps")))
    verdicts.append(
        _worst(
            "dispatch's link bytes at >= 80% of the copy engine's rate at 4096 tokens",
            share,
            lambda v: v >= 0.8,
        )
    )
    return verdicts


def targets_moe_fp8(out: Path) -> list[Verdict]:
    rows = _moe_results(out / "ops-moe-fp8.json")
    items = _at(rows, 4096, lambda r: _div(r.get("iris_bf16_dispatch_us"), r.get("iris_dispatch_us")))
    return [
        _worst(
            "fp8 dispatch >= 1.6x the bf16 dispatch at 4096 tokens (bf16 / fp8)", items, lambda v: v >= 1.6
        )
    ]


IRIS_FORMS = ("iris", "fused", "iris_sp", "fused_sp")


def targets_decoder(model: str, need: float | None) -> Callable[[Path], list[Verdict]]:
    """The decoder layer, CUDA-graphed: every Iris form faster than NCCL's of its layout at
    every decode shape, the best one at least ``need`` times (where given), and the best no
    slower than NCCL at prefill."""

    def targets(out: Path) -> list[Verdict]:
        data = _results(out / f"ops-decoder-{model}" / "results.json")
        cases: dict[tuple, dict[str, float]] = {}
        for r in data.get("rows", []):
            if r["mode"] == "graphed":
                cases.setdefault((r["phase"], r["tokens"]), {})[r["form"]] = r["time_us"]
        every, best_decode, best_prefill = [], [], []
        for (phase, tokens), t in cases.items():
            ratios = {
                f: _div(t.get("nccl_sp" if f.endswith("_sp") else "nccl"), t[f]) for f in IRIS_FORMS if f in t
            }
            ratios = {f: v for f, v in ratios.items() if v is not None}
            if not ratios:
                continue
            best = max(ratios, key=ratios.get)
            if phase == "decode":
                every += [(f"{tokens} {f}", v) for f, v in ratios.items()]
                best_decode.append((f"{tokens} ({best})", ratios[best]))
            else:
                best_prefill.append((f"{tokens} ({best})", ratios[best]))
        verdicts = [
            _worst(
                f"{model}, CUDA graphs: every Iris form faster than NCCL's layout at every decode shape",
                every,
                lambda v: v > 1.0,
            ),
            _worst(
                f"{model}, CUDA graphs: the best Iris form no slower than NCCL at prefill (ties within 5%)",
                best_prefill,
                lambda v: v >= 1 / SPREAD,
            ),
        ]
        if need is not None:
            target = f"{model}, CUDA graphs: the best Iris form >= {need}x NCCL at every decode shape"
            verdicts.insert(1, _worst(target, best_decode, lambda v: v >= need))
        return verdicts

    return targets


def _unchanged_rma(out: Path) -> list[Verdict]:
    new = _results(out / "mem-rma" / "results.json")
    old = _load(ROOT / "benchmarks" / "mem" / "results-h200x2.json") or {"bandwidth": []}
    before = {(r["both"], r["op"], r["bytes"], r["src"], r["dst"]): r["GBps"] for r in old["bandwidth"]}
    items = []
    for r in new.get("bandwidth", []):
        key = (r["both"], r["op"], r["bytes"], r["src"], r["dst"])
        if (
            key in before
            and r["bytes"] >= 16 * MiB
            and r["op"] in ("put", "get", "copy_engine")
            and (r["src"], r["dst"]) == (0, 1)
        ):
            items.append(
                (f"{'both ' if r['both'] else ''}{r['op']} {_size(r['bytes'])}", _div(before[key], r["GBps"]))
            )
    return [
        _worst(
            f"from 16 MiB not below the recorded table beyond the spread (recorded / new <= {SPREAD})",
            items,
            lambda v: v <= SPREAD,
            low=False,
        )
    ]


def targets_soak(seed: int) -> Callable[[Path], list[Verdict]]:
    def targets(out: Path) -> list[Verdict]:
        data = _load(out / f"soak-seed{seed}.json")
        target = f"{SOAK_SECONDS} s of random collectives without a failure"
        if data is None:
            return [Verdict(target, None, "nothing measured")]
        ok = data.get("failure") is None and data.get("seconds", 0) >= 0.9 * SOAK_SECONDS
        return [
            Verdict(
                target,
                ok,
                f"{data.get('steps')} steps in {data.get('seconds')} s, failure {data.get('failure')}",
            )
        ]

    return targets


def targets_log_count(step: str, text: str, count: int) -> Callable[[Path], list[Verdict]]:
    def targets(out: Path) -> list[Verdict]:
        target = f"{count} ranks print {text!r}"
        try:
            seen = (out / "logs" / f"{step}.log").read_text(errors="replace").count(text)
        except OSError:
            return [Verdict(target, None, "nothing measured")]
        return [Verdict(target, seen >= count, f"{seen} printed")]

    return targets


def targets_tables(out: Path) -> list[Verdict]:
    verdicts = []
    for name in ("iris-ccl", "iris-ops"):
        path = out / "tune" / f"{name}.json"
        text = path.read_text() if path.is_file() else ""
        ok = None if not text else ("H200" in text)
        measured = f"{len(text)} bytes" if text else "nothing measured"
        verdicts.append(Verdict(f"{name} table written with rules for this GPU model (H200)", ok, measured))
    return verdicts


# ---- the two-GPU suite -------------------------------------------------------------------------

TORCHRUN2 = "torchrun --standalone --nproc-per-node 2"
BENCH_CCL = f"{TORCHRUN2} benchmarks/ccl/bench_ccl.py"
#: The examples of the last round's features (uneven all_to_all, all_reduce_rmsnorm, the
#: decoder layer, MoE); the tutorials are added by a glob.
EXAMPLES = " ".join(
    f"examples/{e}.py" for e in ("13_all_to_all", "24_all_reduce_rmsnorm", "25_tp_decoder", "26_moe_layer")
)
PYTEST = "python -m pytest -m gpu -q -p no:cacheprovider"
CCL_TESTS = "packages/iris-ccl/tests"
OPS_TESTS = "packages/iris-ops/tests"
FAULT_FILES = (
    f"{CCL_TESTS}/test_ccl_dead_peer.py {CCL_TESTS}/test_ccl_mismatch.py {CCL_TESTS}/test_ccl_faults.py "
    "packages/iris-mem/tests/test_mem_watchdog.py"
)
#: The collectives' own test files (the rest of iris-ccl's GPU tests run in another part).
CCL_CORE = " ".join(
    f"{CCL_TESTS}/test_ccl_{n}.py"
    for n in (
        "gpu",
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "all_to_all_uneven",
        "copy_engine",
        "ll",
    )
)
OPS_FUSED = " ".join(
    f"{OPS_TESTS}/test_ops_{n}.py"
    for n in (
        "gpu",
        "paths",
        "all_gather_matmul",
        "matmul_all_reduce",
        "matmul_reduce_scatter",
        "matmul_all_gather",
    )
)
#: Two halves of the 10-minute GPU soak, each in a part of its own.
SOAK_SECONDS = 300
EQUAL_ARG = "--collectives all_reduce,all_gather,reduce_scatter,all_to_all"
FP8_SIZES = "4KiB,16KiB,64KiB,256KiB,512KiB,1MiB,4MiB,16MiB,64MiB,256MiB,512MiB"
#: Two torchrun agents on this machine, one GPU each: a job of 2 nodes of 1 GPU (NCCL between
#: them); the exit status is the first failing agent's.
MULTINODE = (
    "pids=; for i in 0 1; do CUDA_VISIBLE_DEVICES=$i torchrun --nnodes=2 --nproc-per-node 1 --node-rank=$i "
    '--master-addr=127.0.0.1 --master-port={port} {script} & pids="$pids $!"; done; '
    "rc=0; for p in $pids; do wait $p || rc=$?; done; exit $rc"
)


def _ignore(folder: str, *paths: str) -> str:
    """pytest's ``--ignore`` for each of ``paths`` inside ``folder`` (the rest of it runs)."""
    return " ".join(f"--ignore={p}" for p in " ".join(paths).split() if p.startswith(folder))


TWO_GPU = [
    # part 1: iris-mem and iris-compat GPU tiers; failure handling, twice
    Step(
        "gpu-mem",
        1,
        "iris-mem and iris-compat GPU tests (2 ranks on 2 GPUs included)",
        f"{PYTEST} packages/iris-mem/tests packages/iris-compat/tests",
        "passes (exit 0)",
        270,
        4,
    ),
    Step(
        "faults",
        1,
        "dead peer (SIGKILL, exception, abort), call-signature mismatches, wait timeouts, the watchdog",
        f"{PYTEST} {FAULT_FILES}",
        "passes: survivors raise errors naming the dead rank, mismatches raise on every rank",
        140,
        1.5,
    ),
    Step(
        "faults-again",
        1,
        "the same command right after",
        f"{PYTEST} {FAULT_FILES}",
        "passes: a new job on the same GPUs runs normally after the killed ones",
        140,
        1.5,
    ),
    # part 2: the collectives' GPU tests
    Step(
        "gpu-ccl",
        2,
        "the collectives' GPU tests: CUDA graphs, 64 MiB, back to back, uneven all_to_all, ll, copy engine",
        f"{PYTEST} {CCL_CORE}",
        "passes (exit 0)",
        560,
        8,
    ),
    # part 3: the rest of iris-ccl's GPU tests, the examples
    Step(
        "gpu-ccl-rest",
        3,
        "iris-ccl's other GPU tests: p2p, rooted, Gluon, custom ops under inductor, the iris backend",
        f"{PYTEST} {CCL_TESTS} {_ignore(CCL_TESTS, CCL_CORE, FAULT_FILES, f'{CCL_TESTS}/test_ccl_soak.py')}",
        "passes (exit 0)",
        360,
        5,
    ),
    Step(
        "examples",
        3,
        "the examples of the last round and the tutorials at 2 ranks",
        f'set -e; for e in {EXAMPLES} examples/3[0-3]_*.py; do echo "== $e"; {TORCHRUN2} $e; done',
        "every example validates and exits 0",
        200,
        3,
    ),
    # part 4: iris-ops GPU tests
    Step(
        "gpu-ops",
        4,
        "the fused ops' GPU tests: real shapes, CUDA graphs, the composed path, TMA all_gather_matmul",
        f"{PYTEST} {OPS_FUSED}",
        "passes (exit 0)",
        300,
        4.5,
    ),
    Step(
        "gpu-ops-rest",
        4,
        "iris-ops' other GPU tests: all_reduce_rmsnorm, MoE (graphs with fresh routing), decoder layer",
        f"{PYTEST} {OPS_TESTS} {_ignore(OPS_TESTS, OPS_FUSED)}",
        "passes (exit 0)",
        260,
        3.5,
    ),
    # part 5 and 6: the soak, 2 x 5 minutes
    Step(
        "soak-1",
        5,
        f"random collectives, variants, sizes, dtypes for {SOAK_SECONDS} s (seed 1)",
        f"IRIS_SOAK_SECONDS={SOAK_SECONDS} IRIS_SOAK_SEED=1 IRIS_SOAK_RESULT=$OUT/soak-seed1.json "
        f"{PYTEST} -s {CCL_TESTS}/test_ccl_soak.py::test_soak_gpu",
        "passes; the summary records no failure",
        SOAK_SECONDS + 150,
        6,
        targets_soak(1),
    ),
    Step(
        "multinode",
        5,
        "every collective and fused op as 2 nodes of 1 GPU (NCCL between them)",
        MULTINODE.format(port=29650, script=f"{CCL_TESTS}/ccl_multinode_checks.py 1 --ops"),
        "both ranks print CHECKS OK",
        120,
        1.5,
        targets_log_count("multinode", "CHECKS OK", 2),
    ),
    Step(
        "soak-2",
        6,
        f"the soak again for {SOAK_SECONDS} s (seed 2)",
        f"IRIS_SOAK_SECONDS={SOAK_SECONDS} IRIS_SOAK_SEED=2 IRIS_SOAK_RESULT=$OUT/soak-seed2.json "
        f"{PYTEST} -s {CCL_TESTS}/test_ccl_soak.py::test_soak_gpu",
        "passes; the summary records no failure",
        SOAK_SECONDS + 150,
        6,
        targets_soak(2),
    ),
    Step(
        "mem-tracing",
        6,
        "the cost of device tracing",
        f"{TORCHRUN2} benchmarks/mem/bench_tracing.py --out $OUT/mem-tracing.json",
        "every build checked; exit 0",
        100,
        1,
    ),
    # part 7: remote access and the collectives in bf16, fp32, fp16
    Step(
        "mem-rma",
        7,
        "remote load/store/get/put/copy beside the copy engine, 4 KiB - 1 GiB",
        f"{TORCHRUN2} benchmarks/mem/bench_rma.py --out $OUT/mem-rma",
        "not below the recorded table",
        150,
        2,
        _unchanged_rma,
    ),
    Step(
        "ccl-bf16",
        7,
        "every collective and variant, bf16, 8 KiB - 1 GiB, beside NCCL and torch symm_mem",
        f"{BENCH_CCL} {EQUAL_ARG} --out $OUT/ccl-bf16",
        "faster than NCCL at every size; the all_reduce targets; no slower than the recorded table",
        330,
        5,
        targets_ccl_bf16,
    ),
    Step(
        "ccl-fp32",
        7,
        "fp32 at 1 MiB and 256 MiB",
        f"{BENCH_CCL} --dtype fp32 --sizes 1MiB,256MiB {EQUAL_ARG} --out $OUT/ccl-fp32",
        "faster than NCCL",
        45,
        0.6,
        targets_ccl_dtype("fp32"),
    ),
    Step(
        "ccl-fp16",
        7,
        "fp16 at 1 MiB and 256 MiB",
        f"{BENCH_CCL} --dtype fp16 --sizes 1MiB,256MiB {EQUAL_ARG} --out $OUT/ccl-fp16",
        "faster than NCCL",
        45,
        0.6,
        targets_ccl_dtype("fp16"),
    ),
    # part 8: uneven all_to_all, fp8 collectives, the staged path's benchmark
    Step(
        "ccl-uneven",
        8,
        "all_to_all with split sizes (random, skewed, zeros), 64 KiB - 256 MiB",
        f"{BENCH_CCL} --collectives all_to_all_uneven --out $OUT/ccl-uneven",
        "faster than NCCL's all_to_all_single at every size",
        200,
        2.5,
        targets_ccl_uneven,
    ),
    Step(
        "ccl-fp8",
        8,
        "the collectives in float8_e4m3fn at half of each bf16 size (the same elements)",
        f"{BENCH_CCL} --dtype float8_e4m3fn --sizes {FP8_SIZES} {EQUAL_ARG} --out $OUT/ccl-fp8",
        "all_gather, all_to_all >= 1.8x bf16 above 1 MiB; all_reduce faster than NCCL's fp8",
        240,
        3.5,
        targets_ccl_fp8,
        ("ccl-bf16",),
    ),
    Step(
        "ccl-2x1",
        8,
        "the collectives as 2 nodes of 1 GPU (the staged path) beside flat NCCL",
        MULTINODE.format(
            port=29651,
            script=f"benchmarks/ccl/bench_ccl.py {EQUAL_ARG} --sizes 8KiB,1MiB,64MiB "
            "--variants auto --out $OUT/ccl-2x1",
        ),
        "runs and prints both; the staged collectives' time beside flat NCCL's (no target)",
        120,
        1.5,
    ),
    # part 9: tuning tables
    Step(
        "tune",
        9,
        "the tuning tables auto reads: iris.ccl variants per size, iris.ops fused or composed per shape",
        f"set -e; mkdir -p $OUT/tune; {TORCHRUN2} -m iris.ccl.tune --out $OUT/tune/iris-ccl.json; "
        f"{TORCHRUN2} -m iris.ops.tune --out $OUT/tune/iris-ops.json",
        "both tables written (then copied into iris/ccl/tuning.json and iris/ops/tuning.json)",
        480,
        7,
        targets_tables,
    ),
    # part 10: the fused ops with the tables, TMA, fp8
    Step(
        "ops",
        10,
        "the four fused ops at 7 shapes: auto, fused and composed paths beside matmul + NCCL and torch",
        f"IRIS_CCL_TABLE=$OUT/tune/iris-ccl.json IRIS_OPS_TABLE=$OUT/tune/iris-ops.json {TORCHRUN2} "
        "benchmarks/ops/bench_ops.py --plot --out $OUT/ops",
        ">= 1.0x matmul + NCCL everywhere, >= 1.3x at M = 8192 and 1024, >= 1.0x torch's fused ops",
        300,
        4,
        targets_ops,
        ("tune",),
    ),
    Step(
        "ops-tma",
        10,
        "all_gather_matmul reading A through TMA against pointer loads",
        f"{TORCHRUN2} benchmarks/ops/bench_ops.py --ops all_gather_matmul --tune --configs tma=False "
        "--shapes 8192x8192x4096,16384x3584x8192 --out $OUT/ops-tma",
        "TMA not slower than pointer loads",
        120,
        1.5,
        targets_ops_tma,
    ),
    Step(
        "ops-fp8",
        10,
        "the fused ops with fp8 inputs at the prefill shapes",
        f"{TORCHRUN2} benchmarks/ops/bench_ops.py --dtype float8_e4m3fn "
        "--shapes 8192x8192x4096,1024x8192x4096,16384x3584x8192 --out $OUT/ops-fp8",
        "all_gather_matmul with fp8 A >= 1.2x the bf16 op at M = 8192",
        150,
        2,
        targets_ops_fp8,
        ("ops",),
    ),
    # part 11: all_reduce + RMSNorm, MoE
    Step(
        "ops-rmsnorm",
        11,
        "all_reduce_rmsnorm beside NCCL + eager / compiled norm and iris.ccl's all_reduce",
        f"{TORCHRUN2} benchmarks/ops/bench_rmsnorm.py --out $OUT/ops-rmsnorm",
        "<= 1.3x the all_reduce alone, >= 2x / 1.5x NCCL + eager / compiled norm up to 128 x 8192",
        300,
        4,
        targets_rmsnorm,
    ),
    Step(
        "ops-moe",
        11,
        "MoE dispatch and combine, bf16, 4096 and 128 tokens, beside the NCCL path and the copy engine",
        f"{TORCHRUN2} benchmarks/ops/bench_moe.py --out $OUT/ops-moe.json",
        ">= 1.5x the NCCL path at 4096 tokens, 2x at 128; dispatch >= 80% of the copy engine",
        120,
        1.5,
        targets_moe,
    ),
    Step(
        "ops-moe-fp8",
        11,
        "MoE dispatch of fp8 tokens with block scales, beside the bf16 dispatch",
        f"{TORCHRUN2} benchmarks/ops/bench_moe.py --dtype float8_e4m3fn --out $OUT/ops-moe-fp8.json",
        "fp8 dispatch >= 1.6x the bf16 dispatch at 4096 tokens",
        120,
        1.5,
        targets_moe_fp8,
    ),
    # parts 12 and 13: the decoder layer
    Step(
        "ops-decoder-8b",
        12,
        "the tensor-parallel decoder layer at Llama-3-8B shapes, eager / compiled / CUDA-graphed",
        f"{TORCHRUN2} benchmarks/ops/bench_decoder.py --models 8b --out $OUT/ops-decoder-8b",
        "CUDA-graphed Iris forms faster than NCCL at every decode shape, >= 1.15x; no slower at prefill",
        560,
        6,
        targets_decoder("8b", 1.15),
    ),
    Step(
        "ops-decoder-70b",
        13,
        "the same at Llama-3-70B shapes",
        f"{TORCHRUN2} benchmarks/ops/bench_decoder.py --models 70b --out $OUT/ops-decoder-70b",
        "CUDA-graphed Iris forms faster than NCCL at every decode shape; no slower at prefill",
        560,
        7,
        targets_decoder("70b", None),
    ),
]

# ---- the one-GPU suite (several ranks sharing a GPU) -------------------------------------------


def targets_worlds(step_id: str, sizes: tuple[int, ...] = (2, 3, 4)) -> Callable[[Path], list[Verdict]]:
    """The multi-rank worlds a pytest step ran (``$OUT/worlds-<step>.jsonl``, the durations
    ``IRIS_TEST_DURATIONS`` records): at least one of each of ``sizes`` ranks; the measurement
    counts them per package and world size."""

    def targets(out: Path) -> list[Verdict]:
        target = f"worlds of {', '.join(map(str, sizes))} ranks ran, not skipped (per package and size)"
        path = out / f"worlds-{step_id}.jsonl"
        try:
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            return [Verdict(target, None, "nothing measured")]
        counts: dict[str, dict[int, int]] = {}
        for r in records:
            test = str(r.get("test", ""))
            package = test.split("/")[1] if test.startswith("packages/") else (test.split("/")[0] or "-")
            by_size = counts.setdefault(package, {})
            by_size[r["world_size"]] = by_size.get(r["world_size"], 0) + 1
        seen = {n for by_size in counts.values() for n in by_size}
        table = "; ".join(
            f"{package}: " + ", ".join(f"{n} ranks x{c}" for n, c in sorted(by_size.items()))
            for package, by_size in sorted(counts.items())
        )
        return [Verdict(target, all(n in seen for n in sizes), table or "no world ran")]

    return targets


#: The cases of benchmarks/mem/probe_shared_gpu.py, with the figure each reports.
PROBE_CASES = {
    "late_flag": "handoff_us",
    "full_grid": "handoff_us",
    "ring": "per_handoff_us",
    "device_barrier": "per_call_us",
}


def targets_probe(worlds: tuple[int, ...]) -> Callable[[Path], list[Verdict]]:
    def targets(out: Path) -> list[Verdict]:
        verdicts = []
        for world in worlds:
            data = _load(out / f"probe-{world}.json")
            shared = f"{world} ranks on one GPU: every wait of the probe completed"
            if data is None:
                verdicts.append(Verdict(shared, None, "nothing measured"))
                continue
            cases = [data.get(c, {}) for c in PROBE_CASES]
            figures = ", ".join(
                f"{c} {data.get(c, {}).get(k, float('nan')):.0f} us" for c, k in PROBE_CASES.items()
            )
            ok = data.get("ranks_on_device") == world and all(c.get("completed") for c in cases)
            verdicts.append(Verdict(shared, ok, f"{data.get('ranks_on_device')} ranks on the GPU; {figures}"))
        return verdicts

    return targets


def _tests_of(step_id: str) -> str:
    """pytest for a step of the one-GPU suite, recording its worlds in ``$OUT/worlds-<step>.jsonl``."""
    return f"rm -f $OUT/worlds-{step_id}.jsonl; IRIS_TEST_DURATIONS=$OUT/worlds-{step_id}.jsonl {PYTEST}"


MEM_WATCHDOG = "packages/iris-mem/tests/test_mem_watchdog.py"
SOAK_FILE = f"{CCL_TESTS}/test_ccl_soak.py"

#: Together the pytest steps are ``pytest -m gpu packages tests`` (each file in one step);
#: ranks beyond the one GPU share it, so the steps take longer than on two GPUs.
ONE_GPU = [
    Step(
        "one-gpu-probe",
        1,
        "a kernel spinning on a flag that a peer's later kernel sets, at 2 and 3 ranks on one GPU: it "
        "completes (also with every SM held), and what a hand-off costs",
        "set -e; for n in 2 3; do torchrun --standalone --nproc-per-node $n "
        "benchmarks/mem/probe_shared_gpu.py --out $OUT/probe-$n.json; done",
        "every case completes at 2 and 3 ranks (exit 0); the hand-off times are recorded",
        240,
        2,
        targets_probe((2, 3)),
    ),
    Step(
        "one-gpu-faults",
        1,
        "SIGKILL of one of three ranks, exceptions, heap.abort() and iris.ccl.abort(), call-signature "
        "mismatches at world 3, wait timeouts, the watchdog: ranks sharing one GPU",
        f"{_tests_of('one-gpu-faults')} {FAULT_FILES}",
        "passes: survivors raise errors naming the dead rank, mismatches raise on every rank",
        300,
        4,
        targets_worlds("one-gpu-faults", (2, 3)),
    ),
    Step(
        "one-gpu-mem",
        2,
        "iris-mem and iris-compat GPU tests (but the watchdog's), multi-rank cases at worlds 2-4 on one GPU",
        f"{_tests_of('one-gpu-mem')} packages/iris-mem/tests packages/iris-compat/tests tests "
        f"--ignore={MEM_WATCHDOG}",
        "passes; the multi-rank cases run (not skipped)",
        500,
        7,
        targets_worlds("one-gpu-mem"),
    ),
    Step(
        "one-gpu-ccl",
        3,
        "the collectives' GPU tests (every variant, uneven all_to_all, ll, copy engine, CUDA graphs) at "
        "worlds 2-4 on one GPU",
        f"{_tests_of('one-gpu-ccl')} {CCL_CORE}",
        "passes; the multi-rank cases run",
        560,
        9,
        targets_worlds("one-gpu-ccl"),
    ),
    Step(
        "one-gpu-ccl-rest",
        4,
        "iris-ccl's other GPU tests: p2p, rooted, Gluon, custom ops under inductor, the iris backend with "
        "a DTensor TP MLP, autograd, the examples",
        f"{_tests_of('one-gpu-ccl-rest')} {CCL_TESTS} {_ignore(CCL_TESTS, CCL_CORE, FAULT_FILES, SOAK_FILE)}",
        "passes; the multi-rank cases run",
        560,
        9,
        targets_worlds("one-gpu-ccl-rest"),
    ),
    Step(
        "one-gpu-ops",
        5,
        "the fused ops fused and composed (TMA on), real shapes, CUDA graphs, at worlds 2-4 on one GPU",
        f"{_tests_of('one-gpu-ops')} {OPS_FUSED}",
        "passes; the multi-rank cases run",
        560,
        9,
        targets_worlds("one-gpu-ops"),
    ),
    Step(
        "one-gpu-ops-rest",
        6,
        "all_reduce_rmsnorm (both forms), MoE (CUDA graphs with fresh routing), torch.ops.iris under "
        "inductor, the decoder layer, the examples, on one GPU",
        f"{_tests_of('one-gpu-ops-rest')} {OPS_TESTS} {_ignore(OPS_TESTS, OPS_FUSED)}",
        "passes; the multi-rank cases run",
        560,
        9,
        targets_worlds("one-gpu-ops-rest"),
    ),
    Step(
        "one-gpu-soak",
        8,
        "the GPU soak (random collectives, 2 ranks) for 180 s on one GPU",
        f"IRIS_SOAK_RESULT=$OUT/soak-one-gpu.json {PYTEST} -s {SOAK_FILE}::test_soak_gpu",
        "passes; the summary records no failure",
        400,
        4,
    ),
    Step(
        "one-gpu-examples",
        7,
        "the decoder-layer and MoE examples at 3 ranks, the tutorials at 2 and 3, on one GPU",
        'set -e; run() { echo "== $2 at $1 ranks"; torchrun --standalone --nproc-per-node $1 $2; }; '
        "for e in examples/25_tp_decoder.py examples/26_moe_layer.py; do run 3 $e; done; "
        "for n in 2 3; do for e in examples/3[0-3]_*.py; do run $n $e; done; done",
        "every example validates and exits 0",
        500,
        6,
        targets_log_count("one-gpu-examples", "validated", 3 + 3 + 4 * (2 + 3)),
    ),
]

#: Visible GPUs each suite needs: the two-GPU suite times and compares, which means nothing
#: where ranks share a GPU.
SUITE_GPUS = {"two-gpu": 2, "one-gpu": 1}


def suite_refusal(suite: str, gpus: int) -> str | None:
    """Why ``suite`` cannot run on a machine with ``gpus`` visible GPUs, or None."""
    needed = SUITE_GPUS[suite]
    if gpus >= needed:
        return None
    if suite == "two-gpu":
        return (
            f"the two-gpu suite needs {needed} GPUs, {gpus} visible: with fewer its ranks would share a GPU, "
            "where the benchmarks refuse to time and no ratio means anything. Run --suite one-gpu"
        )
    return f"the {suite} suite needs a GPU, none is visible"


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use: ``CUDA_VISIBLE_DEVICES``' entries when set, else the
    GPUs ``nvidia-smi -L`` lists (0 without it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


SUITES = {
    # every rank on its own GPU
    "two-gpu": (TWO_GPU, {"IRIS_BACKEND": "cuda"}),
    # one GPU seen by every rank, whatever the machine has
    "one-gpu": (ONE_GPU, {"IRIS_BACKEND": "cuda", "CUDA_VISIBLE_DEVICES": "0"}),
}


def parts(steps: list[Step]) -> dict[int, list[Step]]:
    out: dict[int, list[Step]] = {}
    for step in steps:
        out.setdefault(step.part, []).append(step)
    return dict(sorted(out.items()))


# ---- running -----------------------------------------------------------------------------------


def environment(out: Path, extra: dict[str, str], source: bool | None) -> dict[str, str]:
    """The steps' environment: the suite's settings, ``$OUT``, the packages' sources on
    ``PYTHONPATH`` where they are not installed (or ``--source``), and ``torchrun`` /
    ``python`` running this interpreter."""
    env = {**os.environ, **extra, "OUT": str(out)}
    if source is None:
        source = importlib.util.find_spec("iris") is None or not _importable("iris.ops")
    if source:
        paths = [str(ROOT / "packages" / p / "src") for p in PACKAGES]
        env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH", "")] if p])
    shims = out / ".bin"
    shims.mkdir(parents=True, exist_ok=True)
    for name, line in (
        ("python", f'exec {shlex.quote(sys.executable)} "$@"'),
        ("torchrun", f'exec {shlex.quote(sys.executable)} -m torch.distributed.run "$@"'),
    ):
        shim = shims / name
        shim.write_text(f"#!/usr/bin/env bash\n{line}\n")
        shim.chmod(0o755)
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    return env


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def run_step(step: Step, out: Path, env: dict[str, str], limit: float) -> dict:
    """Run ``step`` in its own process group, killed at ``limit`` seconds; record its status."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "status").mkdir(parents=True, exist_ok=True)
    log = out / "logs" / f"{step.id}.log"
    started = time.monotonic()
    timed_out = False
    with open(log, "w") as f:
        f.write(f"$ {step.command}\n")
        f.flush()
        proc = subprocess.Popen(
            ["bash", "-c", step.command],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the step's whole process group: torchrun and its ranks
            rc = proc.wait()
    status = {
        "id": step.id,
        "rc": rc,
        "seconds": round(time.monotonic() - started, 1),
        "timed_out": timed_out,
        "limit": round(limit),
        "command": step.command,
    }
    with open(out / "status" / f"{step.id}.json", "w") as f:
        json.dump(status, f, indent=1)
    return status


def _status(out: Path, step_id: str) -> dict | None:
    return _load(out / "status" / f"{step_id}.json")


def run_part(steps: list[Step], out: Path, env: dict[str, str], budget: float, dry_run: bool) -> bool:
    started = time.monotonic()
    ok = True
    for step in steps:
        left = budget - (time.monotonic() - started)
        command = step.command.replace("$OUT", str(out))
        if dry_run:
            limit = min(step.timeout, budget)
            print(f"[{step.id}] limit {limit:.0f} s, about {step.minutes:g} min:\n  {command}")
            continue
        unmet = [n for n in step.needs if (_status(out, n) or {}).get("rc") != 0]
        if unmet:
            print(f"[{step.id}] not run: needs {', '.join(unmet)} to have passed first", flush=True)
            ok = False
            continue
        if left < LEAST_STEP:
            print(f"[{step.id}] not run: {left:.0f} s left of the part's {budget:.0f} s", flush=True)
            ok = False
            continue
        print(f"[{step.id}] {command}", flush=True)
        status = run_step(step, out, env, min(step.timeout, left))
        verdict = verdict_of(step, out, status)
        print(f"[{step.id}] {verdict['status']} in {status['seconds']:.0f} s{verdict['note']}", flush=True)
        ok = ok and verdict["status"] == "pass"
    return ok


# ---- the summary -------------------------------------------------------------------------------


def _pytest_line(out: Path, step_id: str) -> str:
    """pytest's closing line (``80 passed, 12 skipped in 300s``) from the step's log, if any."""
    try:
        lines = (out / "logs" / f"{step_id}.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    tail = [line.strip("= ") for line in lines if " in " in line and ("passed" in line or "failed" in line)]
    return tail[-1] if tail else ""


def verdict_of(step: Step, out: Path, status: dict | None) -> dict:
    """``status``: pass (exit 0 and every target met), miss (exit 0, a target missed or not
    measured), fail (non-zero exit or killed at its limit), not run."""
    if status is None:
        return {"id": step.id, "part": step.part, "status": "not run", "note": "", "targets": []}
    verdicts = step.targets(out) if step.targets else []
    if status["rc"] != 0:
        state = "fail"
        note = (
            f" (killed at its limit of {status['limit']} s)"
            if status["timed_out"]
            else f" (exit {status['rc']})"
        )
    else:
        state = "pass" if all(v.ok for v in verdicts) else "miss"
        note = ""
    line = _pytest_line(out, step.id)
    note += f": {line}" if line else ""
    return {
        "id": step.id,
        "part": step.part,
        "status": state,
        "note": note,
        "seconds": status["seconds"],
        "targets": [{"target": v.target, "ok": v.ok, "measured": v.measured} for v in verdicts],
    }


def summary(steps: list[Step], out: Path) -> tuple[str, list[dict], bool]:
    results = [verdict_of(s, out, _status(out, s.id)) for s in steps]
    lines = ["| part | step | status | seconds | target | met | measured |", "|---|---|---|---|---|---|---|"]
    for r in results:
        first = f"| {r['part']} | `{r['id']}` | {r['status']}{r['note']} | {r.get('seconds', '-')} |"
        if not r["targets"]:
            lines.append(f"{first} - | - | - |")
        for i, v in enumerate(r["targets"]):
            met = {True: "yes", False: "MISS", None: "not measured"}[v["ok"]]
            lead = first if i == 0 else "| | | | |"
            lines.append(f"{lead} {v['target']} | {met} | {v['measured']} |")
    counts = {s: sum(r["status"] == s for r in results) for s in ("pass", "miss", "fail", "not run")}
    lines += ["", ", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(results)} steps."]
    return "\n".join(lines), results, counts["pass"] == len(results)


# ---- the list as Markdown (benchmarks/ACCEPTANCE.md) ------------------------------------------

DOC = ROOT / "benchmarks" / "ACCEPTANCE.md"


def markdown(suite: str) -> str:
    """The list of ``suite``: per part, each step's command, outcome and mechanical targets."""
    steps, env = SUITES[suite]
    setting = " ".join(f"{k}={v}" for k, v in env.items())
    total = sum(s.minutes for s in steps)
    lines = [
        f"Every step runs with `{setting}`; `$OUT` is the folder given with `--out`. About "
        f"{total:.0f} minutes in {len(parts(steps))} parts (estimates; a part starts no step after "
        f"{PART_BUDGET} s)."
    ]
    for number, members in parts(steps).items():
        minutes = sum(s.minutes for s in members)
        lines += ["", f"### Part {number} (about {minutes:.0f} minutes)", ""]
        for s in members:
            needs = f" After `{'`, `'.join(s.needs)}`." if s.needs else ""
            lines += [f"- **`{s.id}`**: {s.what}.{needs}", f"  `{s.command}`", f"  Must show: {s.outcome}."]
            lines += [f"  - {name}" for name in _target_names(s)]
    return "\n".join(lines)


def _target_names(step: Step) -> list[str]:
    """The mechanical targets of ``step``, named as the summary names them (evaluated on a
    folder without results: each comes back "nothing measured" under its name)."""
    empty = Path("/nonexistent-acceptance-output")
    return [v.target for v in step.targets(empty)] if step.targets else []


def rewrite_list(text: str) -> str:
    """``text`` (benchmarks/ACCEPTANCE.md) with each suite's list rendered anew between its
    markers ``<!-- list:SUITE begin -->`` and ``<!-- list:SUITE end -->``."""
    for suite in SUITES:
        begin, end = f"<!-- list:{suite} begin -->", f"<!-- list:{suite} end -->"
        if text.count(begin) != 1 or text.count(end) != 1:
            raise SystemExit(f"{DOC.relative_to(ROOT)} must hold {begin!r} and {end!r} once each")
        head, rest = text.split(begin)
        _, tail = rest.split(end)
        text = f"{head}{begin}\n{markdown(suite)}\n{end}{tail}"
    return text


def _select(steps: list[Step], args, parser) -> list[Step]:
    """The steps ``--all`` / ``--part`` / ``--step`` name (``--step`` alone, or within the parts)."""
    unknown = sorted(set(args.step or []) - {s.id for s in steps})
    if unknown:
        parser.error(f"unknown steps {unknown}; see --list")
    chosen = [s for s in steps if args.all or (args.part and s.part in args.part)]
    if args.step:
        chosen = [s for s in (chosen if (args.all or args.part) else steps) if s.id in args.step]
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="two-gpu")
    parser.add_argument("--out", type=Path, help="the output folder (logs, status, results)")
    parser.add_argument("--part", type=int, action="append", help="run this part (repeatable)")
    parser.add_argument("--step", action="append", help="run only this step (repeatable)")
    parser.add_argument("--all", action="store_true", help="run every part, one after another")
    parser.add_argument("--list", action="store_true", help="print the parts, their commands and outcomes")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    parser.add_argument("--summary", action="store_true", help="evaluate what --out holds")
    parser.add_argument(
        "--write-list", action="store_true", help=f"rewrite the lists in {DOC.relative_to(ROOT)}"
    )
    parser.add_argument("--budget", type=float, default=PART_BUDGET, help="seconds a part may start steps in")
    parser.add_argument(
        "--step-limit",
        type=float,
        help="seconds each chosen step may run instead of its own limit (still within --budget); "
        "for a step killed at its limit on a slower machine",
    )
    parser.add_argument(
        "--source",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="put packages/*/src on PYTHONPATH (default: when iris.ops is not importable)",
    )
    args = parser.parse_args(argv)
    steps, suite_env = SUITES[args.suite]
    if args.write_list:
        DOC.write_text(rewrite_list(DOC.read_text()))
        return 0
    if args.list:
        print(markdown(args.suite))
        return 0
    if args.out is None:
        parser.error("--out DIR is needed to run, dry-run or summarise")
    out = args.out.resolve()
    chosen = _select(steps, args, parser)
    if not chosen and not args.summary:
        parser.error("choose --part N, --step ID or --all (or --summary); see --list")
    ok = True
    if chosen and not args.dry_run:
        refusal = suite_refusal(args.suite, visible_gpus())
        if refusal is not None:
            parser.exit(2, f"acceptance.py: {refusal}\n")
    if chosen:
        env = {} if args.dry_run else environment(out, suite_env, args.source)
        for number, members in parts(chosen).items():
            print(f"== part {number} of the {args.suite} suite", flush=True)
            if args.step_limit:
                members = [dataclasses.replace(s, timeout=int(args.step_limit)) for s in members]
            ok = run_part(members, out, env, args.budget, args.dry_run) and ok
    if args.dry_run:
        return 0
    # the files always cover every step of the suite (what OUT holds so far); the printed
    # table, the steps just run (or every step with --summary)
    text, results, all_passed = summary(steps, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text + "\n")
    with open(out / "summary.json", "w") as f:
        json.dump(results, f, indent=1)
    print("\n" + (text if args.summary else summary(chosen, out)[0]))
    return 0 if (all_passed if args.summary else ok) else 1


if __name__ == "__main__":
    sys.exit(main())
