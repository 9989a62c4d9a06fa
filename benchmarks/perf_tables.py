"""The tables of ``docs/performance.md`` (and the benchmark READMEs), rendered from the
benchmarks' JSON results.

    python benchmarks/perf_tables.py                  # rewrite the tables of every page
    python benchmarks/perf_tables.py --check          # exit 1, showing the difference, if a page is stale
    python benchmarks/perf_tables.py --show ccl       # print one block
    python benchmarks/perf_tables.py --collect OUT    # take an acceptance run's results first

Each table sits between two marker lines, ``<!-- table:NAME begin -->`` and
``<!-- table:NAME end -->``; this script rewrites what lies between them and nothing else, so
the pages are regenerated from the committed results (``benchmarks/*/*-h200x2*.json``),
never edited by hand. ``docs/performance.md`` gets compact tables (what ``Config()`` runs
beside the baselines); ``benchmarks/ccl/README.md`` and ``benchmarks/ops/README.md`` get
every variant and mode, for tuning. Each block starts with where its numbers come from: the
date of the run (no time of day), the machine, the versions and the command, read from the
JSON's ``meta`` (older files that do not record their command get the command that
reproduces them, ``Source.command``). A block's first source is required: without it the
block is one line naming the check of ``benchmarks/ACCEPTANCE.md`` that measures it; its
other sources are optional (fp8 beside bf16, the 70B layer beside the 8B one) and a missing
one is named as pending under the table.

``--collect OUT`` copies the results of ``benchmarks/acceptance.py --out OUT`` over the
committed files (``Source.run`` -> ``Source.committed``) and the plots the benchmarks drew
into ``docs/_static``, then renders the pages. ``tests/docs/test_performance_tables.py``
fails when a page differs from what this script renders from the committed results.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = "docs/performance.md"
CCL_README = "benchmarks/ccl/README.md"
OPS_README = "benchmarks/ops/README.md"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass(frozen=True)
class Source:
    """One results file: where it is committed, where an acceptance run writes it (relative
    to the run's ``--out``), and the command that reproduces it when its JSON does not say."""

    committed: str
    run: str
    command: str
    label: str = ""  # names the source where a block has several ("fp32", "8b")
    check: str = ""  # the check of benchmarks/ACCEPTANCE.md that measures it (an optional source)


@dataclass(frozen=True)
class Block:
    sources: tuple[Source, ...]
    #: the lines of the table(s) from the sources' JSON (None where an optional one is missing)
    render: Callable[[list[dict | None]], list[str]]
    check: str  # the check of benchmarks/ACCEPTANCE.md that measures it
    page: str = PAGE
    #: plots an acceptance run draws: (file in the run's folder, file in docs/_static)
    plots: tuple[tuple[str, str], ...] = ()


# ---- formatting --------------------------------------------------------------------------------


def size(nbytes: int) -> str:
    """``8192`` -> ``8 KiB`` (the unit the benchmarks print)."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(*cells) -> list[str]:
    return [row(*cells), "|" + "---|" * len(cells)]


def num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(a, b) -> str:
    """``a / b`` to two digits, ``-`` when either is missing."""
    return "-" if a is None or b is None else f"{a / b:.2f}"


def span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}x" if values else "-"


def _command(meta: dict, source: Source) -> str:
    """The run's command without the arguments that only say where output goes."""
    kept, skip = [], False
    for word in shlex.split(meta.get("command") or source.command):
        if skip:
            skip = False
        elif word in ("--out", "--plot"):
            skip = word == "--out"
        elif not word.startswith("--out="):
            kept.append(word)
    return shlex.join(kept)


def _where(meta: dict) -> str:
    """``2 x NVIDIA H200 (torch ..., triton ..., NCCL ..., iris-ccl 0.1.0)``"""
    gpus = meta.get("gpus") or []
    where = f"{meta.get('world_size') or len(gpus)} x {gpus[0]}" if gpus else "an unnamed machine"
    versions = [f"{name} {meta[key]}" for key, name in (("torch", "torch"), ("triton", "triton"),
                ("nccl", "NCCL"), ("cuda", "CUDA")) if meta.get(key)]  # fmt: skip
    versions += [f"{k.replace('_', '-')} {v}" for k, v in meta.items() if k.startswith("iris_") and v]
    return where + (f" ({', '.join(versions)})" if versions else "")


def provenance(runs: list[tuple[Source, dict]]) -> list[str]:
    """Where a block's numbers come from, one line per date and machine:
    ``fp32 and fp16: measured 2026-11-30 on 2 x NVIDIA H200 (...): `command`; `command`.``"""
    groups: dict[tuple[str, str, str], list[Source]] = {}
    for source, data in runs:
        meta = data.get("meta", {})
        # the day only: no time of day on the pages
        key = (str(meta.get("date") or "")[:10], _where(meta), meta.get("note", ""))
        groups.setdefault(key, []).append((source, meta))
    lines = []
    for (date, where, note), members in groups.items():
        labels = [s.label for s, _ in members if s.label]
        lead = f"{' and '.join(labels)}: measured" if labels else "Measured"
        commands = "; ".join(f"`{_command(meta, s)}`" for s, meta in members)
        lines.append(f"{lead} {date} on {where}: {commands}." + (f" {note}" if note else ""))
    return lines


def _label(key: str) -> str:
    """A contender's column: ``iris_ll`` -> ``ll``, ``symm_two_shot`` -> ``symm two_shot``."""
    if key.startswith("iris_"):
        return key[5:]
    return "symm " + key[5:] if key.startswith("symm_") else key


# ---- iris.mem ----------------------------------------------------------------------------------


def render_rma(datas: list[dict | None]) -> list[str]:
    """GPU 0 -> 1, one direction and both at once; GB/s per direction and ratios to the copy engine."""
    data = datas[0]
    rates = {
        (r["both"], r["op"], r["bytes"]): r["GBps"]
        for r in data["bandwidth"]
        if (r["src"], r["dst"]) == (0, 1)
    }
    one_ops = ("load", "store", "get", "put", "copy", "copy_engine")
    lines = header(
        "size", "load", "store", "get", "put", "copy", "CE", "put / CE", "get / CE",
        "both: put", "both: get", "both: CE", "both: put / CE", "both: get / CE",
    )  # fmt: skip
    for n in sorted({key[2] for key in rates}):
        one = {op: rates.get((False, op, n)) for op in one_ops}
        two = {op: rates.get((True, op, n)) for op in ("put", "get", "copy_engine")}
        lines.append(
            row(
                size(n),
                *(num(one[op]) for op in one_ops),
                ratio(one["put"], one["copy_engine"]),
                ratio(one["get"], one["copy_engine"]),
                *(num(two[op]) for op in ("put", "get", "copy_engine")),
                ratio(two["put"], two["copy_engine"]),
                ratio(two["get"], two["copy_engine"]),
            )  # fmt: skip
        )
    latency = data.get("latency_us", {}).get("1")
    if latency is not None:
        lines += [
            "",
            f"A flag handed back and forth (release store, acquire poll) takes **{latency:.2f} us** one way.",
        ]
    return lines


def render_tracing(datas: list[dict | None]) -> list[str]:
    lines = header(
        "bytes/rank", "events/call", "functional us", "untraced us", "traced us",
        "traced / untraced", "untraced / functional",
    )  # fmt: skip
    for r in datas[0]["rows"]:
        us = r["us"]
        lines.append(
            row(
                f"{r['bytes_per_rank'] // KiB} KiB",
                r["events_per_call"],
                *(num(us.get(b), 2) for b in ("functional", "untraced", "traced")),
                ratio(us.get("traced"), us.get("untraced")),
                ratio(us.get("untraced"), us.get("functional")),
            )  # fmt: skip
        )
    return lines


# ---- iris.ccl ----------------------------------------------------------------------------------

EQUAL = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _by_key(data: dict | None) -> dict[tuple[str, int], dict]:
    return {(r["collective"], r["bytes"]): r for r in data["rows"]} if data else {}


def render_ccl(datas: list[dict | None]) -> list[str]:
    """The page's table: per size, each collective's ``auto`` (what ``Config()`` runs), NCCL's
    time and their ratio (and torch symmetric memory's two_shot's); with an fp8 run, fp8 beside bf16
    at the same number of elements (the fp8 row of half the bytes) and beside NCCL's fp8."""
    bf16, fp8 = datas
    rows, eight = _by_key(bf16), _by_key(fp8)
    cols = ["all_reduce", "NCCL", "NCCL / Iris", "symm / Iris"]
    for c in EQUAL[1:]:
        cols += [c, "NCCL", "NCCL / Iris"]
    if fp8:
        cols += ["fp8 all_reduce NCCL / Iris", "fp8 all_gather bf16 / fp8", "fp8 all_to_all bf16 / fp8"]
    lines = header("size", *cols)
    auto_ratios, best_ratios = [], []
    for n in sorted({key[1] for key in rows}):
        cells = []
        for c in EQUAL:
            r = rows.get((c, n))
            t = r["times_us"] if r else {}
            auto = t.get("iris_auto")
            cells += [num(auto), num(t.get("nccl")), ratio(t.get("nccl"), auto)]
            cells += [ratio(t.get("symm_two_shot"), auto)] if c == "all_reduce" else []
            if r and auto:
                auto_ratios.append(t["nccl"] / auto)
                best_ratios.append(t["nccl"] / r["iris_best_us"])
        if fp8:
            same = {c: eight.get((c, n // 2), {}).get("times_us", {}) for c in EQUAL}
            cells.append(ratio(same["all_reduce"].get("nccl"), same["all_reduce"].get("iris_auto")))
            for c in ("all_gather", "all_to_all"):
                cells.append(
                    ratio(rows.get((c, n), {}).get("times_us", {}).get("iris_auto"), same[c].get("iris_auto"))
                )
        lines.append(row(size(n), *cells))
    lines += [
        "",
        f"NCCL / Iris over every collective and size: {span(auto_ratios)} with `auto`, "
        f"{span(best_ratios)} with the fastest variant (every variant: `{CCL_README}`).",
    ]
    return lines


def render_ccl_variants(datas: list[dict | None]) -> list[str]:
    """One table per equal-split collective: every contender's time, the best variant, ratios."""
    lines: list[str] = []
    for collective in EQUAL:
        sel = [r for r in datas[0]["rows"] if r["collective"] == collective]
        if not sel:
            continue
        cols = list(dict.fromkeys(k for r in sel for k in r["times_us"]))
        symm = "symm_two_shot" in cols
        extra = ["best", "NCCL / best", *(["symm two_shot / best"] if symm else []), "busbw GB/s"]
        lines += [f"**{collective}** (us)", "", *header("size", *map(_label, cols), *extra)]
        for r in sel:
            t = r["times_us"]
            tail = [_label(r["iris_best"]), ratio(t["nccl"], r["iris_best_us"])]
            tail += [ratio(t.get("symm_two_shot"), r["iris_best_us"])] if symm else []
            lines.append(
                row(size(r["bytes"]), *(num(t.get(c)) for c in cols), *tail, f"{r['busbw_GBps']:.0f}")
            )
        lines.append("")
    return lines[:-1]


def render_ccl_dtypes(datas: list[dict | None]) -> list[str]:
    """The page's table of other dtypes: ``auto`` and NCCL / Iris per collective, dtype and size."""
    present = [d for d in datas if d]
    sizes = sorted({r["bytes"] for d in present for r in d["rows"]})
    cols = []
    for d in present:
        cols += [x for n in sizes for x in (f"{d['rows'][0]['dtype']} {size(n)}", "NCCL / Iris")]
    lines = header("collective", *cols)
    for c in EQUAL:
        cells = []
        for d in present:
            t_of = {r["bytes"]: r["times_us"] for r in d["rows"] if r["collective"] == c}
            for n in sizes:
                t = t_of.get(n, {})
                cells += [num(t.get("iris_auto")), ratio(t.get("nccl"), t.get("iris_auto"))]
        lines.append(row(c, *cells))
    return lines


def render_ccl_dtypes_variants(datas: list[dict | None]) -> list[str]:
    """fp32 and fp16 side by side: best variant, auto and NCCL per collective and size."""
    present = [d for d in datas if d]
    by = [_by_key(d) for d in present]
    cols = [
        x
        for d in present
        for x in (f"{d['rows'][0]['dtype']} {c}" for c in ("best", "auto", "NCCL", "NCCL / best"))
    ]
    lines = header("collective", "size", *cols)
    symm = []
    for key in by[0]:
        cells = []
        for rows in by:
            r = rows.get(key)
            if r is None:
                cells += ["-"] * 4
                continue
            t = r["times_us"]
            cells += [
                f"{r['iris_best_us']:.1f} (`{_label(r['iris_best'])}`)",
                num(t.get("iris_auto")),
                num(t["nccl"]),
            ]
            cells.append(ratio(t["nccl"], r["iris_best_us"]))
            if "symm_two_shot" in t:
                symm.append(f"{r['dtype']} {size(r['bytes'])} {t['symm_two_shot'] / r['iris_best_us']:.2f}x")
        lines.append(row(key[0], size(key[1]), *cells))
    if symm:
        lines += [
            "",
            "all_reduce against torch symmetric memory's two_shot (symm / best): " + ", ".join(symm) + ".",
        ]
    return lines


UNEVEN = "all_to_all_uneven/"


def render_uneven(datas: list[dict | None]) -> list[str]:
    """The page's table: per size, each split pattern's ``auto`` and NCCL / Iris."""
    sel = [r for r in datas[0]["rows"] if r["collective"].startswith(UNEVEN)]
    patterns = list(dict.fromkeys(r["collective"][len(UNEVEN) :] for r in sel))
    t = {(r["collective"][len(UNEVEN) :], r["bytes"]): r["times_us"] for r in sel}
    lines = header("size", *(x for p in patterns for x in (p, "NCCL / Iris")))
    for n in sorted({r["bytes"] for r in sel}):
        cells = []
        for p in patterns:
            times = t.get((p, n), {})
            cells += [num(times.get("iris_auto")), ratio(times.get("nccl"), times.get("iris_auto"))]
        lines.append(row(size(n), *cells))
    return lines


def render_uneven_variants(datas: list[dict | None]) -> list[str]:
    """all_to_all with split sizes: per pattern and size, every variant, auto and NCCL."""
    sel = [r for r in datas[0]["rows"] if r["collective"].startswith(UNEVEN)]
    cols = list(dict.fromkeys(k for r in sel for k in r["times_us"]))
    lines = header("pattern", "size", *map(_label, cols), "NCCL / auto", "NCCL / best", "busbw GB/s")
    for r in sel:
        t = r["times_us"]
        tail = [
            ratio(t["nccl"], t.get("iris_auto")),
            ratio(t["nccl"], r["iris_best_us"]),
            f"{r['busbw_GBps']:.0f}",
        ]
        lines.append(
            row(r["collective"][len(UNEVEN) :], size(r["bytes"]), *(num(t.get(c)) for c in cols), *tail)
        )
    return lines


# ---- iris.ops ----------------------------------------------------------------------------------


def _shape(r: dict) -> str:
    return f"{r['M']} x {r['N']} x {r['K']}"


def render_ops(datas: list[dict | None]) -> list[str]:
    """The fused ops: Iris (auto; the fused and composed paths where the run has them), the
    GEMM alone, the baselines and ratios; with an fp8 run, the op with fp8 inputs beside it."""
    bf16, fp8 = datas
    rows = bf16["rows"]
    paths = any("iris_fused" in r["times_us"] for r in rows)
    # Runs before Config.path timed the fused kernel as "iris": named so on the page.
    first = ["iris (auto)", "fused", "composed"] if paths else ["iris fused"]
    keys = ["iris", "iris_fused", "iris_composed"] if paths else ["iris"]
    eight = {(r["op"], _shape(r)): r["times_us"] for r in fp8["rows"]} if fp8 else {}
    lines = header(
        "op", "M x N x K", *first, "GEMM alone", "matmul + NCCL", "torch.matmul", "symm fused",
        "NCCL / iris", "bound", "symm / iris", "iris / matmul", *(["fp8 iris", "bf16 / fp8"] if fp8 else []),
    )  # fmt: skip
    for r in rows:
        t = r["times_us"]
        cells = [num(t.get(k)) for k in (*keys, "iris_gemm", "nccl", "matmul", "symm")]
        cells += [ratio(t["nccl"], t["iris"]), ratio(t["nccl"], t["matmul"])]
        cells += [ratio(t.get("symm"), t["iris"]), ratio(t["iris"], t["matmul"])]
        if fp8:
            f = eight.get((r["op"], _shape(r)), {}).get("iris")
            cells += [num(f), ratio(t["iris"], f)]
        lines.append(row(r["op"], _shape(r), *cells))
    return lines


def render_rmsnorm(datas: list[dict | None]) -> list[str]:
    """The page's table: per token count, for each hidden size, the fused op's time and its
    ratios to iris.ccl's fastest all_reduce alone and to NCCL + the eager / compiled norm."""
    sel = datas[0]["rows"]
    hiddens = list(dict.fromkeys(r["hidden"] for r in sel))
    by = {(r["tokens"], r["hidden"]): r for r in sel}
    cols = [
        x
        for h in hiddens
        for x in (f"iris ({h})", "iris / ccl all_reduce", "NCCL eager / iris", "NCCL compiled / iris")
    ]
    lines = header("tokens", *cols)
    for tokens in dict.fromkeys(r["tokens"] for r in sel):
        cells = []
        for h in hiddens:
            r = by.get((tokens, h), {})
            cells.append(num(r.get("times_us", {}).get("iris")))
            cells += [
                num(r.get(k), 2)
                for k in ("iris_over_ccl_ar", "nccl_eager_over_iris", "nccl_compiled_over_iris")
            ]
        lines.append(row(tokens, *cells))
    return lines


def render_rmsnorm_variants(datas: list[dict | None]) -> list[str]:
    cols = ("iris", "iris_ll", "iris_rs_ag", "nccl_eager", "nccl_compiled", "ccl_compiled")
    ratios = ("iris_over_ccl_ar", "nccl_eager_over_iris", "nccl_compiled_over_iris", "ccl_compiled_over_iris")
    lines = header(
        "tokens x hidden", "form", *cols, "ccl all_reduce", "iris / ccl_ar",
        "nccl_eager / iris", "nccl_compiled / iris", "ccl_compiled / iris",
    )  # fmt: skip
    for r in datas[0]["rows"]:
        t = r["times_us"]
        ccl = f"{r['ccl_ar']:.1f} (`{r['ccl_ar_variant']}`)" if "ccl_ar" in r else "-"
        cells = [*(num(t.get(c)) for c in cols), ccl, *(num(r.get(k), 2) for k in ratios)]
        lines.append(row(f"{r['tokens']} x {r['hidden']}", r["form"], *cells))
    return lines


def render_moe(datas: list[dict | None]) -> list[str]:
    lines = header(
        "dtype", "tokens", "dispatch iris", "dispatch NCCL path", "NCCL / iris", "combine iris",
        "combine NCCL path", "NCCL / iris", "dispatch GB/s", "copy engine GB/s", "dispatch / CE",
        "bf16 / fp8 dispatch",
    )  # fmt: skip
    for data in filter(None, datas):
        dtype = data.get("meta", {}).get("dtype", "bf16")
        for r in data["results"]:
            if r.get("problems"):
                continue
            ce = r.get("copy_engine_GBps")
            lines.append(
                row(
                    dtype,
                    r["tokens"],
                    num(r["iris_dispatch_us"]),
                    num(r["torch_dispatch_us"]),
                    num(r["torch_over_iris_dispatch"], 2),
                    num(r["iris_combine_us"]),
                    num(r["torch_combine_us"]),
                    num(r["torch_over_iris_combine"], 2),
                    num(r["dispatch_link_GBps"]),
                    num(ce),
                    ratio(r["dispatch_link_GBps"], ce),
                    ratio(r.get("iris_bf16_dispatch_us"), r["iris_dispatch_us"]),
                )  # fmt: skip
            )
    return lines


#: The decoder layer's forms, in the order of the tables.
DECODER_FORMS = ("nccl", "iris", "fused", "nccl_sp", "iris_sp", "fused_sp")


def _decoder_rows(datas: list[dict | None], modes: tuple[str, ...]) -> list[str]:
    """Per model, phase, tokens and mode: every form's time and the best Iris form against
    NCCL's of the same layout (``nccl_sp`` for the sequence-parallel forms)."""
    lines = []
    for data in filter(None, datas):
        cases: dict[tuple, dict[str, float]] = {}
        for r in data["rows"]:
            if r["mode"] in modes:
                cases.setdefault((r["model"], r["phase"], r["tokens"], r["mode"]), {})[r["form"]] = r[
                    "time_us"
                ]
        for key, t in cases.items():
            iris_forms = {f: t[f] for f in DECODER_FORMS if f in t and not f.startswith("nccl")}
            best = min(iris_forms, key=iris_forms.get) if iris_forms else None
            base = t.get("nccl_sp" if best and best.endswith("_sp") else "nccl")
            tail = [best, ratio(base, iris_forms[best])] if best else ["-", "-"]
            lines.append(row(*key, *(num(t.get(f)) for f in DECODER_FORMS), *tail))
    return lines


def render_decoder(datas: list[dict | None]) -> list[str]:
    """The page's table: the CUDA-graphed layer (the mode the targets are about), per token
    count and model: the best Iris form, and the NCCL form of its layout (``nccl`` or
    ``nccl_sp``) beside it."""
    models: dict[str, dict[tuple, dict[str, float]]] = {}
    for data in filter(None, datas):
        for r in data["rows"]:
            if r["mode"] == "graphed":
                cases = models.setdefault(r["model"], {})
                cases.setdefault((r["phase"], r["tokens"]), {})[r["form"]] = r["time_us"]
    cols = [x for m in models for x in (f"{m} NCCL (same layout)", f"{m} best Iris", "NCCL / best")]
    lines = header("phase", "tokens", *cols)
    for case in dict.fromkeys(c for cases in models.values() for c in cases):
        cells = []
        for cases in models.values():
            t = cases.get(case, {})
            iris_forms = {f: t[f] for f in DECODER_FORMS if f in t and not f.startswith("nccl")}
            best = min(iris_forms, key=iris_forms.get) if iris_forms else None
            base = t.get("nccl_sp" if best and best.endswith("_sp") else "nccl")
            cells += [num(base), f"{iris_forms[best]:.1f} (`{best}`)" if best else "-"]
            cells.append(ratio(base, iris_forms[best]) if best else "-")
        lines.append(row(*case, *cells))
    return lines


def render_decoder_variants(datas: list[dict | None]) -> list[str]:
    modes = ("eager", "compiled", "graphed")
    head = header("model", "phase", "tokens", "mode", *DECODER_FORMS, "best Iris form", "NCCL / best")
    return head + _decoder_rows(datas, modes)


# ---- the blocks --------------------------------------------------------------------------------

RUN2 = "torchrun --nproc-per-node 2 benchmarks"
EQUAL_CCL = "--collectives " + ",".join(EQUAL)
#: fp8 per-rank sizes: half of each bf16 size, so each meets the bf16 row of as many elements.
FP8_SIZES = "4KiB,16KiB,64KiB,256KiB,512KiB,1MiB,4MiB,16MiB,64MiB,256MiB,512MiB"
FP8_SHAPES = "8192x8192x4096,1024x8192x4096,16384x3584x8192"
FUSED = ("matmul_all_reduce", "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_gather")

MEM = Source("benchmarks/mem/results-h200x2.json", "mem-rma/results.json", f"{RUN2}/mem/bench_rma.py")
TRACING = Source("benchmarks/mem/tracing-h200x2.json", "mem-tracing.json", f"{RUN2}/mem/bench_tracing.py")
CCL = Source(
    "benchmarks/ccl/results-h200x2.json",
    "ccl-bf16/results.json",
    f"{RUN2}/ccl/bench_ccl.py {EQUAL_CCL}",
    "bf16",
)
CCL_FP8 = Source(
    "benchmarks/ccl/results-h200x2-fp8.json",
    "ccl-fp8/results.json",
    f"{RUN2}/ccl/bench_ccl.py --dtype float8_e4m3fn --sizes {FP8_SIZES} {EQUAL_CCL}",
    "fp8",
    "ccl-fp8",
)
DTYPES = tuple(
    Source(
        f"benchmarks/ccl/results-h200x2-{d}.json",
        f"ccl-{d}/results.json",
        f"{RUN2}/ccl/bench_ccl.py --dtype {d} --sizes 1MiB,256MiB {EQUAL_CCL}",
        d,
        f"ccl-{d}",
    )
    for d in ("fp32", "fp16")
)
UNEVEN_RUN = Source(
    "benchmarks/ccl/results-uneven-h200x2.json",
    "ccl-uneven/results.json",
    f"{RUN2}/ccl/bench_ccl.py --collectives all_to_all_uneven",
)
OPS = Source("benchmarks/ops/results-h200x2.json", "ops/results.json", f"{RUN2}/ops/bench_ops.py", "bf16")
OPS_FP8 = Source(
    "benchmarks/ops/results-h200x2-fp8.json",
    "ops-fp8/results.json",
    f"{RUN2}/ops/bench_ops.py --dtype float8_e4m3fn --shapes {FP8_SHAPES}",
    "fp8",
    "ops-fp8",
)
RMSNORM = Source(
    "benchmarks/ops/results-rmsnorm-h200x2.json", "ops-rmsnorm/results.json", f"{RUN2}/ops/bench_rmsnorm.py"
)
MOE = tuple(
    Source(
        f"benchmarks/ops/results-moe{s}-h200x2.json", f"ops-moe{s}.json", f"{RUN2}/ops/bench_moe.py{a}", d, c
    )
    for s, a, d, c in (("", "", "bf16", "ops-moe"), ("-fp8", " --dtype float8_e4m3fn", "fp8", "ops-moe-fp8"))
)
DECODER = tuple(
    Source(
        f"benchmarks/ops/results-decoder-{m}-h200x2.json",
        f"ops-decoder-{m}/results.json",
        f"{RUN2}/ops/bench_decoder.py --models {m}",
        m,
        f"ops-decoder-{m}",
    )
    for m in ("8b", "70b")
)

BLOCKS: dict[str, Block] = {
    # docs/performance.md
    "mem-rma": Block(
        (MEM,), render_rma, "mem-rma", plots=(("mem-rma/rma_bandwidth.png", "rma_bandwidth.png"),)
    ),
    "ccl": Block(
        (CCL, CCL_FP8),
        render_ccl,
        "ccl-bf16",
        plots=tuple((f"ccl-bf16/ccl_{c}.png", f"ccl_{c}.png") for c in EQUAL),
    ),
    "ccl-dtypes": Block(DTYPES, render_ccl_dtypes, "ccl-fp32"),
    "ccl-uneven": Block((UNEVEN_RUN,), render_uneven, "ccl-uneven"),
    "ops": Block(
        (OPS, OPS_FP8),
        render_ops,
        "ops",
        plots=tuple((f"ops/ops_{o}.png", f"ops_{o}.png") for o in FUSED),
    ),
    "ops-rmsnorm": Block((RMSNORM,), render_rmsnorm, "ops-rmsnorm"),
    "ops-moe": Block(MOE, render_moe, "ops-moe"),
    "ops-decoder": Block(DECODER, render_decoder, "ops-decoder-8b"),
    "mem-tracing": Block((TRACING,), render_tracing, "mem-tracing"),
    # benchmarks/ccl/README.md: every variant
    "ccl-variants": Block((CCL,), render_ccl_variants, "ccl-bf16", CCL_README),
    "ccl-dtypes-variants": Block(DTYPES, render_ccl_dtypes_variants, "ccl-fp32", CCL_README),
    "ccl-uneven-variants": Block((UNEVEN_RUN,), render_uneven_variants, "ccl-uneven", CCL_README),
    "ccl-fp8-variants": Block((CCL_FP8,), render_ccl_variants, "ccl-fp8", CCL_README),
    # benchmarks/ops/README.md: every form and mode
    "ops-rmsnorm-variants": Block((RMSNORM,), render_rmsnorm_variants, "ops-rmsnorm", OPS_README),
    "ops-decoder-variants": Block(DECODER, render_decoder_variants, "ops-decoder-8b", OPS_README),
}


def load(path: Path) -> dict | None:
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


def render(name: str, root: Path = ROOT) -> str:
    """The lines between block ``name``'s markers, from the results committed under ``root``."""
    block = BLOCKS[name]
    datas = [load(root / s.committed) for s in block.sources]
    if datas[0] is None:
        return f"Pending a run on 2 x H200: `benchmarks/ACCEPTANCE.md`, check `{block.check}`."
    lines = provenance([(s, d) for s, d in zip(block.sources, datas) if d is not None])
    lines += ["", *block.render(datas)]
    for source, data in zip(block.sources, datas):
        if data is None:  # an optional source: fp8 beside bf16, the 70B layer beside the 8B one
            where = f"`benchmarks/ACCEPTANCE.md`, check `{source.check}`"
            lines += ["", f"{source.label}: pending a run on 2 x H200 ({where})."]
    return "\n".join(lines)


def markers(name: str) -> tuple[str, str]:
    return f"<!-- table:{name} begin -->", f"<!-- table:{name} end -->"


def rewrite(page: str, text: str, root: Path = ROOT) -> str:
    """``text`` (the page ``page``) with each of its blocks rendered anew between its markers.
    A block's markers missing or doubled, or a marker this script does not know, is an error."""
    for name, block in BLOCKS.items():
        if block.page != page:
            continue
        begin, end = markers(name)
        if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
            raise SystemExit(f"{page} must hold {begin!r} and then {end!r}, once each")
        head, rest = text.split(begin)
        _, tail = rest.split(end)
        # No blank line next to a marker: a comment line ends a table or a paragraph in
        # Markdown, and the page stays short.
        text = f"{head}{begin}\n{render(name, root)}\n{end}{tail}"
    known = {m for name, b in BLOCKS.items() if b.page == page for m in markers(name)}
    unknown = [line for line in text.splitlines() if line.startswith("<!-- table:") and line not in known]
    if unknown:
        raise SystemExit(f"{page}: unknown table markers {unknown}")
    return text


def pages() -> list[str]:
    return list(dict.fromkeys(b.page for b in BLOCKS.values()))


def collect(out: Path, root: Path = ROOT) -> list[str]:
    """Copy an acceptance run's results (and plots) over the committed ones; returns what was copied."""
    copied = []
    for block in BLOCKS.values():
        pairs = [(s.run, s.committed) for s in block.sources]
        pairs += [(src, f"docs/_static/{dst}") for src, dst in block.plots]
        for src, dst in pairs:
            if (out / src).is_file() and dst not in copied:
                shutil.copyfile(out / src, root / dst)
                copied.append(dst)
    return copied


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a page differs")
    parser.add_argument("--show", metavar="NAME", choices=sorted(BLOCKS), help="print one block")
    parser.add_argument(
        "--collect", metavar="OUT", type=Path, help="first copy the results of acceptance.py --out OUT"
    )
    args = parser.parse_args(argv)
    if args.show:
        print(render(args.show))
        return 0
    if args.collect:
        for path in collect(args.collect):
            print(f"copied {path}")
    stale = 0
    for page in pages():
        text = (ROOT / page).read_text()
        new = rewrite(page, text)
        if new == text:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(
                difflib.unified_diff(text.splitlines(True), new.splitlines(True), page, "rendered")
            )
        else:
            (ROOT / page).write_text(new)
            print(f"rewrote the tables of {page}")
    if stale:
        print(f"\n{stale} page(s) stale: python benchmarks/perf_tables.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
