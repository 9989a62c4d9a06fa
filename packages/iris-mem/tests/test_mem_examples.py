"""Run every example of the repository under torchrun and check each rank validated.

The examples live in ``examples/`` at the repository root; from an sdist (no examples
folder) the tests skip. Each example runs on the backend of ``IRIS_BACKEND``: on cpu at
world sizes 1 and 3, on cuda at 1 and 2 (one GPU per rank).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mem_testutils import BACKEND, MULTI_WORLD, require_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("[0-9]*.py")) if EXAMPLES_DIR.is_dir() else []
WORLDS = (1, MULTI_WORLD)
TIMEOUT_S = 180


def _example_name(path: Path) -> str:
    """The name an example prints: its ``NAME`` constant."""
    match = re.search(r'^NAME = "([^"]+)"', path.read_text(), re.MULTILINE)
    assert match, f"{path.name} defines no NAME constant"
    return match.group(1)


@pytest.mark.skipif(not EXAMPLES, reason=f"no examples found at {EXAMPLES_DIR} (not a source checkout)")
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example(path: Path, world: int) -> None:
    require_world(world)
    env = {**os.environ, "IRIS_BACKEND": BACKEND, "OMP_NUM_THREADS": "1"}
    if BACKEND == "cpu":
        env["TRITON_INTERPRET"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(world),
        str(path),
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=EXAMPLES_DIR.parent, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{path.name} with {world} rank(s) did not finish in {TIMEOUT_S} s:\n{exc.stdout}\n{exc.stderr}"
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{path.name} with {world} rank(s) exited {proc.returncode}:\n{output}"
    name = _example_name(path)
    for rank in range(world):
        line = f"[rank {rank}/{world}] {name}: validated"
        assert line in proc.stdout, f"rank {rank} did not print {line!r}:\n{output}"
    assert "FAILED" not in proc.stdout, output
