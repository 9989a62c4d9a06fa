"""docs/scaling.md holds the current output of benchmarks/ccl/scaling_model.py, and the
model is wired to what it cites: the staged all_reduce's piece size is iris.ccl's, and on one
node of 2 GPUs the model reproduces the measured rows it was fitted to and stays near the
ones it was not.

After changing the model (or iris.ccl._staged.PIECE_ELEMENTS), refresh the page with
``python tests/docs/test_scaling_model.py --write``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ccl" / "scaling_model.py"
PAGE = ROOT / "docs" / "scaling.md"
BEGIN = "% BEGIN OUTPUT of benchmarks/ccl/scaling_model.py"
END = "% END OUTPUT"


def _model():
    spec = importlib.util.spec_from_file_location("scaling_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _output() -> str:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _split(text: str) -> tuple[str, str, str]:
    """``(before, between, after)`` the page's markers (the marker lines stay outside)."""
    head, sep, rest = text.partition(BEGIN)
    assert sep, f"{PAGE} has no line starting with {BEGIN!r}"
    line_end = rest.index("\n") + 1
    between, sep, tail = rest[line_end:].partition(END)
    assert sep, f"{PAGE} has no {END!r} after {BEGIN!r}"
    return head + BEGIN + rest[:line_end], between, END + tail


def test_page_holds_the_scripts_output():
    _, between, _ = _split(PAGE.read_text())
    want = _output()
    assert between.strip() == want.strip(), (
        "docs/scaling.md does not hold the output of benchmarks/ccl/scaling_model.py; "
        "refresh it with: python tests/docs/test_scaling_model.py --write"
    )


def test_piece_size_is_iris_ccls():
    from iris.ccl import _staged

    assert _model().PIECE_ELEMENTS == _staged.PIECE_ELEMENTS


def test_model_on_one_node_of_two_gpus():
    m = _model()
    for coll, fitted in m.IRIS_1GIB_US.items():
        # the rows the rates come from come back (plus the latency, under 0.5%)
        assert abs(m.iris_intra(coll, m.GiB, 2) / fitted - 1) < 0.005, coll
        assert abs(m.nccl_flat(coll, m.GiB, 2, 1)[0] / m.NCCL_1GIB_US[coll] - 1) < 0.01, coll
    for (coll, size), (iris_us, nccl_us) in m.MEASURED_2.items():
        # and the rows between the fitted ones stay within a factor of 2
        assert 0.5 < m.iris_intra(coll, size, 2) / iris_us < 2, (coll, size)
        assert 0.5 < m.nccl_flat(coll, size, 2, 1)[0] / nccl_us < 2, (coll, size)


def test_bytes_per_nic():
    """On 2 nodes both flat NCCL and the staged step between nodes are rings: flat, each of 8
    NICs carries 2 (n-1)/n of the input / 8; staged, each rank's shard (1/8 of every 8 MiB
    piece) goes through an all-reduce among the 2 nodes: 2 (N-1)/N of it."""
    m = _model()
    size, k, nodes = 64 * m.MiB, m.GPUS_PER_NODE, 2
    n = k * nodes
    time, algo, nic = m.nccl_flat("all_reduce", size, k, nodes)
    assert algo.startswith("ring") and abs(nic - 2 * (n - 1) / n * size / k) < 1
    staged = m.staged("all_reduce", size, k, nodes)
    assert abs(staged["nic"] - 2 * (nodes - 1) / nodes * size / k) < 1
    assert staged["total"] > staged["inter"] > 0 and time > 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write  (rewrites the model's tables in {PAGE})")
    before, _, after = _split(PAGE.read_text())
    PAGE.write_text(before + "\n" + _output() + "\n" + after)
