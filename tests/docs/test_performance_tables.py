"""docs/performance.md and the benchmark READMEs hold the tables benchmarks/perf_tables.py
renders from the committed results (benchmarks/*/*-h200x2*.json); the page stays a reference
of at most 250 lines, also once every pending result is in; the rendering follows the
results; ``--collect`` takes an acceptance run's results.

After committing new results (or changing the renderer), refresh the pages with
``python benchmarks/perf_tables.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 250


def _tables():
    spec = importlib.util.spec_from_file_location(
        "perf_tables_of_docs", ROOT / "benchmarks" / "perf_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


pt = _tables()


def test_pages_hold_the_rendered_tables():
    for page in pt.pages():
        text = (ROOT / page).read_text()
        assert pt.rewrite(page, text) == text, (
            f"{page} does not hold the tables benchmarks/perf_tables.py renders from the committed "
            "results; refresh it with: python benchmarks/perf_tables.py"
        )


def test_page_is_a_reference_of_at_most_250_lines():
    text = (ROOT / pt.PAGE).read_text()
    assert len(text.splitlines()) <= MAX_LINES
    # a reference, not a run diary: no times of day (dates only, in each table's first line)
    assert not re.search(r"\b([01]\d|2[0-3]):[0-5]\d\b", text)


def _copy_committed(root: Path) -> None:
    """The pages and every committed result under ``root``, as in the repository."""
    for page in pt.pages():
        (root / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / page, root / page)
    for block in pt.BLOCKS.values():
        for source in block.sources:
            (root / source.committed).parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / source.committed).is_file():
                shutil.copyfile(ROOT / source.committed, root / source.committed)


def _write(root: Path, source, data: dict) -> None:
    (root / source.committed).write_text(json.dumps(data))


def _meta(dtype: str = "bf16") -> dict:
    return {
        "date": "2027-01-01 12:00:00",
        "gpus": ["NVIDIA H200"] * 2,
        "world_size": 2,
        "dtype": dtype,
        "torch": "2.11.0",
        "triton": "3.6.0",
        "nccl": "2.28.9",
        "iris_ops": "0.2.0",
        "command": "torchrun x",
    }


def _fill_pending(root: Path) -> None:
    """Results of the shapes the benchmarks write for every source not committed yet: what
    the pages look like once the acceptance run is in (made-up numbers, real layouts)."""
    ccl = json.loads((ROOT / pt.CCL.committed).read_text())
    ops = json.loads((ROOT / pt.OPS.committed).read_text())
    fp8 = copy.deepcopy(ccl)
    fp8["meta"]["dtype"] = "float8_e4m3fn"
    for r in fp8["rows"]:
        r["bytes"] //= 2
        r["dtype"] = "float8_e4m3fn"
    _write(root, pt.CCL_FP8, fp8)
    uneven = []
    for pattern in ("random", "skewed", "zeros"):
        for i in range(7):
            times = {
                "iris_ll": 10.0 + i,
                "iris_boxed": 9.0 + i,
                "iris_push": 8.0 + i,
                "iris_pull": 9.5 + i,
                "iris_auto": 8.1 + i,
                "nccl": 12.0 + i,
            }
            uneven.append(
                {
                    "collective": f"all_to_all_uneven/{pattern}",
                    "bytes": 65536 * 4**i,
                    "dtype": "bf16",
                    "times_us": times,
                    "iris_best_us": 8.0 + i,
                    "iris_best": "iris_push",
                    "busbw_GBps": 100.0,
                }
            )
    _write(root, pt.UNEVEN_RUN, {"meta": _meta(), "rows": uneven, "failures": []})
    fp8_ops = copy.deepcopy(ops)
    fp8_ops["rows"] = [r for r in fp8_ops["rows"] if r["M"] >= 1024]
    _write(root, pt.OPS_FP8, fp8_ops)
    rms = []
    for hidden in (4096, 8192):
        for tokens in (1, 8, 32, 128, 512, 2048, 8192):
            times = {
                k: 5.0 + tokens / 100
                for k in ("iris", "iris_ll", "iris_rs_ag", "nccl_eager", "nccl_compiled")
            }
            rms.append(
                {
                    "tokens": tokens,
                    "hidden": hidden,
                    "bytes": 2 * tokens * hidden,
                    "times_us": times,
                    "form": "ll",
                    "ccl_ar": 4.0,
                    "ccl_ar_variant": "ll",
                    "iris_over_ccl_ar": 1.2,
                    "nccl_eager_over_iris": 2.5,
                    "nccl_compiled_over_iris": 1.6,
                }
            )
    _write(root, pt.RMSNORM, {"meta": _meta(), "rows": rms, "failures": []})
    for source, dtype in zip(pt.MOE, ("bf16", "float8_e4m3fn")):
        results = [
            {
                "tokens": t,
                "problems": [],
                "iris_dispatch_us": 100.0,
                "torch_dispatch_us": 300.0,
                "torch_over_iris_dispatch": 3.0,
                "iris_combine_us": 90.0,
                "torch_combine_us": 200.0,
                "torch_over_iris_combine": 2.2,
                "dispatch_link_GBps": 320.0,
                "copy_engine_GBps": 390.0,
                "iris_bf16_dispatch_us": 170.0,
            }
            for t in (4096, 128)
        ]
        _write(root, source, {"meta": _meta(dtype), "args": {}, "results": results})
    for source in pt.DECODER:
        rows = []
        for phase, counts in (("decode", (1, 16, 64)), ("prefill", (2048, 8192))):
            for tokens in counts:
                for mode in ("eager", "compiled", "graphed"):
                    for form in (*pt.DECODER_FORMS, "local", "local_sp"):
                        rows.append(
                            {
                                "model": source.label,
                                "tokens": tokens,
                                "phase": phase,
                                "context": 1024,
                                "mode": mode,
                                "form": form,
                                "time_us": 100.0 + len(form),
                            }
                        )
        _write(root, source, {"meta": _meta(), "rows": rows, "failures": []})


def test_page_stays_within_250_lines_once_every_result_is_in(tmp_path):
    _copy_committed(tmp_path)
    _fill_pending(tmp_path)
    for name in pt.BLOCKS:
        assert "ending a run on 2 x H200" not in pt.render(name, tmp_path), name  # a table, no pending line
    text = pt.rewrite(pt.PAGE, (tmp_path / pt.PAGE).read_text(), root=tmp_path)
    assert len(text.splitlines()) <= MAX_LINES, len(text.splitlines())


def test_rendering_follows_the_results(tmp_path):
    """Negative control: a committed time changed changes the page, and --check would fail."""
    _copy_committed(tmp_path)
    text = (tmp_path / pt.PAGE).read_text()
    data = json.loads((tmp_path / pt.CCL.committed).read_text())
    row = next(r for r in data["rows"] if r["collective"] == "all_reduce" and r["bytes"] == 8192)
    row["times_us"]["iris_auto"] = 4.44
    _write(tmp_path, pt.CCL, data)
    new = pt.rewrite(pt.PAGE, text, root=tmp_path)
    assert new != text
    assert "| 8 KiB | 4.4 | 9.7 | 2.18 |" in new  # the time, NCCL's (9.66 us) and their ratio
    (tmp_path / pt.CCL.committed).unlink()  # no results: one pending line instead of the table
    pending = pt.rewrite(pt.PAGE, text, root=tmp_path)
    assert "Pending a run on 2 x H200: `benchmarks/ACCEPTANCE.md`, check `ccl-bf16`." in pending


def test_markers_must_come_in_pairs():
    text = (ROOT / pt.PAGE).read_text()
    broken = text.replace("<!-- table:ops end -->", "", 1)
    try:
        pt.rewrite(pt.PAGE, broken)
    except SystemExit as e:
        assert "table:ops" in str(e)
    else:
        raise AssertionError("a block without its end marker was rewritten")


def test_collect_takes_an_acceptance_runs_results(tmp_path):
    out, root = tmp_path / "out", tmp_path / "root"
    _copy_committed(root)
    (root / "docs" / "_static").mkdir(parents=True)
    (out / "ccl-bf16").mkdir(parents=True)
    new = json.loads((ROOT / pt.CCL.committed).read_text())
    new["meta"]["date"] = "2027-02-03 04:05:06"
    (out / "ccl-bf16" / "results.json").write_text(json.dumps(new))
    (out / "ccl-bf16" / "ccl_all_reduce.png").write_bytes(b"png")
    copied = pt.collect(out, root=root)
    assert sorted(copied) == ["benchmarks/ccl/results-h200x2.json", "docs/_static/ccl_all_reduce.png"]
    page = pt.rewrite(pt.PAGE, (root / pt.PAGE).read_text(), root=root)
    assert "bf16: measured 2027-02-03 on 2 x NVIDIA H200" in page and "04:05" not in page
