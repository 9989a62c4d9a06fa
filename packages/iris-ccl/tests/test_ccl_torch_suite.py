"""PyTorch's own process-group tests on the ``iris`` backend.

``torch.testing._internal.distributed.distributed_test`` holds the tests PyTorch runs against
every process-group backend (``DistributedTest._DistTestBase``: collectives, groups, objects,
point to point, coalescing, DDP on CPU, ...). For a backend outside PyTorch's own list it skips
the tests of features it only knows gloo, NCCL or UCC to have; the others run here, as
PyTorch runs them for gloo, with ``BACKEND=iris`` (``torch_suite_runner.py``, in a process of
its own per world size, since the suite reads its environment when it is imported).

On GPUs (``IRIS_BACKEND=cuda``, the GPU tier) the ranks are spawned and the suite's CUDA cases
run too, on the GPUs the world has (one per rank).

The default tier runs a representative quarter of them at world size 3 (:data:`DEFAULT`:
every collective, point to point with and without tags and profilers, groups, DDP on CPU);
the ``full`` tier runs all of them at world sizes 2, 3 and 4. A test must pass, or be skipped
by the suite itself for a reason that is not Iris's (:data:`TORCH_SKIPS`: no GPU, a world
smaller than the test needs), or be one of :data:`IRIS_SKIPS`, which docs/pytorch.md lists
with the same reasons.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(3600)]

RUNNER = Path(__file__).with_name("torch_suite_runner.py")

#: Tests skipped on the iris backend, with the reason (the same text as in docs/pytorch.md).
ANY_SOURCE = "a receive from any source is not supported (NCCL refuses it too)"
IRIS_SKIPS = {
    "test_send_recv_any_source": ANY_SOURCE,
    "test_send_recv_any_source_autograd_profiler": ANY_SOURCE,
    "test_send_recv_any_source_torch_profiler": ANY_SOURCE,
}
#: Beginnings of the reasons the suite itself skips tests for on a CPU machine.
TORCH_SKIPS = ("CUDA is not available", "Need at least", "Skipped due to small world size")
#: The default tier's quarter of the suite (world size 3): every kind of call once.
DEFAULT = (
    "test_all_reduce_sum_async", "test_all_reduce_product", "test_all_reduce_full_group_min",
    "test_all_reduce_complex_unsupported_ops", "test_all_gather_complex", "test_all_gather_coalesced_simple",
    "test_broadcast", "test_reduce_product", "test_scatter_checks", "test_gather_checks",
    "test_barrier_full_group", "test_send_recv_with_tag", "test_isend", "test_irecv",
    "test_send_recv_torch_profiler", "test_get_rank_size_full_group", "test_destroy_full_group",
    "test_get_backend", "test_Backend_enum_class", "test_DistributedDataParallelCPU",
)  # fmt: skip


def _runner(world: int, *args: str, timeout: float, env: dict | None = None) -> str:
    """The runner's output (a process of its own: the suite reads BACKEND when imported)."""
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(world), *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(
            f"the runner failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        )
    return done.stdout


def _run(world: int, names, timeout: float, env: dict | None = None) -> dict:
    skips = [f"{n}={IRIS_SKIPS[n]}" for n in names if n in IRIS_SKIPS]
    out = _runner(world, *names, *skips, timeout=timeout, env=env)
    line = next(line for line in out.splitlines() if line.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS "))


def _check(results: dict, names) -> dict:
    """Every test passed, or was skipped by the suite for a reason not Iris's, or is one of
    IRIS_SKIPS; the counts by outcome."""
    missing = [n for n in names if n not in results]
    assert not missing, f"no result for {missing}"
    bad = []
    for name, r in results.items():
        if r["outcome"] == "failed":
            bad.append(f"{name} failed:\n{r['info'][-2000:]}")
        elif r["outcome"] == "skipped":
            reason = r["info"]
            if name in IRIS_SKIPS:
                if reason != IRIS_SKIPS[name]:
                    bad.append(f"{name} skipped for {reason!r}, not {IRIS_SKIPS[name]!r}")
            elif not reason.startswith(TORCH_SKIPS):
                bad.append(f"{name} skipped for an unexpected reason: {reason!r}")
    assert not bad, "\n\n".join(bad)
    counts = {"passed": 0, "skipped": 0}
    for r in results.values():
        counts[r["outcome"]] += 1
    return counts


def test_torch_suite_default_share():
    """A quarter of PyTorch's process-group tests pass on the iris backend at world size 3."""
    counts = _check(_run(3, DEFAULT, timeout=1200.0), DEFAULT)
    assert counts["passed"] >= len(DEFAULT) - 3, counts  # every one runs; the suite may skip a few itself


@pytest.mark.full
@pytest.mark.parametrize("world", [2, 3, 4])
def test_torch_suite(world):
    """Every test of PyTorch's process-group suite that runs for a backend outside PyTorch's
    list passes on the iris backend (or is skipped: see the module docstring). The DDP
    logging test broadcasts a 3-million-parameter model, which takes minutes under Triton's
    interpreter: the suite's per-test limit is raised to 20 minutes."""
    names = _runner(world, "--list", timeout=300.0).split()
    assert len(names) > 80, names
    results = _run(world, names, timeout=3500.0, env={"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "1200"})
    counts = _check(results, names)
    assert counts["passed"] >= 50, counts
