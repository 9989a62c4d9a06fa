"""``benchmarks/ops/bench_ops.py --smoke`` on the CPU backend: the benchmark script itself works.

The GPU numbers in docs/performance.md come from this script; here it runs end to end on
two CPU ranks (gloo, interpreted kernels, tiny shapes): every op checked against matmul +
the torch.distributed collective, timed through the interleaved timer, the table and
results.json written; and ``--tune`` for one op and shape. From an sdist (no benchmarks
folder) the tests skip.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iris.mem.testing import record_duration

pytestmark = pytest.mark.timeout(600)

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "ops" / "bench_ops.py"
OPS = {"matmul_all_reduce", "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_gather"}


def _run(args: list[str], timeout: float = 300.0) -> str:
    env = {**os.environ, "IRIS_BACKEND": "cpu", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(BENCH)]
    # A session of its own, so a deadline kills torchrun and both ranks together.
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    started = time.monotonic()
    proc = subprocess.Popen(cmd + args, env=env, start_new_session=True, **pipes)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        record_duration("torchrun", 2, timeout, time.monotonic() - started, "bench_ops.py", True)
        raise AssertionError(f"bench_ops.py {args} did not finish in {timeout:g} s:\n{output}") from None
    record_duration("torchrun", 2, timeout, time.monotonic() - started, "bench_ops.py")
    assert proc.returncode == 0, f"bench_ops.py {args} exited {proc.returncode}:\n{output}"
    return output


@pytest.mark.full  # about 30 s: the benchmark's own run, not a check of the ops
@pytest.mark.skipif(not BENCH.is_file(), reason=f"{BENCH} not found (not a source checkout)")
def test_bench_ops_smoke_runs_every_op(tmp_path):
    output = _run(["--smoke", "--reps", "2", "--out", str(tmp_path)])
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["failures"] == [], results["failures"]
    rows = results["rows"]
    assert {r["op"] for r in rows} == OPS, output
    assert len(rows) == 2 * len(OPS), rows
    for r in rows:
        times = r["times_us"]
        assert {"iris", "iris_gemm", "nccl", "matmul"} <= set(times), r
        assert all(t > 0 for t in times.values()), r
        assert r["bound"] == pytest.approx(times["nccl"] / times["matmul"]), r
    assert "| op | M | N | K | iris |" in output


@pytest.mark.full
@pytest.mark.skipif(not BENCH.is_file(), reason=f"{BENCH} not found (not a source checkout)")
def test_bench_ops_smoke_float8(tmp_path):
    """--dtype float8_e4m3fn: every op through iris.ops' scale_a / scale_b, checked against
    torch._scaled_mm + the collective."""
    _run(["--smoke", "--reps", "1", "--dtype", "float8_e4m3fn", "--out", str(tmp_path)])
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["failures"] == [], results["failures"]
    assert {r["op"] for r in results["rows"]} == OPS and results["meta"]["dtype"] == "float8_e4m3fn"


@pytest.mark.full
@pytest.mark.skipif(not BENCH.is_file(), reason=f"{BENCH} not found (not a source checkout)")
def test_bench_ops_tune_smoke(tmp_path):
    args = ["--smoke", "--tune", "--ops", "matmul_reduce_scatter", "--shapes", "4x40x24", "--reps", "1"]
    output = _run(args + ["--out", str(tmp_path)])
    with open(tmp_path / "tune.json") as f:
        tuned = json.load(f)
    assert len(tuned) == 1, tuned
    best = tuned[0]
    assert best["op"] == "matmul_reduce_scatter" and best["best_us"] > 0, best
    timed = [t for t, _, problem in best["all"] if problem is None]
    assert len(timed) >= 2 and best["best_us"] == min(timed), best
    assert "BEST matmul_reduce_scatter" in output


@pytest.mark.full
@pytest.mark.skipif(not BENCH.is_file(), reason=f"{BENCH} not found (not a source checkout)")
def test_bench_ops_tune_given_configs(tmp_path):
    """--configs times exactly the given Configs against the default (and checks them)."""
    args = ["--smoke", "--tune", "--ops", "matmul_all_reduce", "--shapes", "36x40x24", "--reps", "1"]
    _run(args + ["--configs", "order=spread,num_sms=2;block_n=32,tma=false", "--out", str(tmp_path)])
    with open(tmp_path / "tune.json") as f:
        (best,) = json.load(f)
    names = [name for _, name, _ in best["all"]]
    assert names == ["default", "num_sms=2,order=spread", "block_n=32,tma=False"], names
    assert all(problem is None for _, _, problem in best["all"]), best
