"""Run the iris.ops examples (``examples/2[0-46]_*.py``) under torchrun; every rank must validate.

From an sdist (no examples folder) the tests skip. One odd world, 3 ranks, on the CPU
backend and on GPUs (ranks beyond the number of GPUs share them); ``nox -s examples`` also
runs every example with 1.
"""

from pathlib import Path

import pytest
from ops_testutils import require_world

from iris.mem.testing import run_example

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("2[0-46]_*.py")) if EXAMPLES_DIR.is_dir() else []
WORLD = 3
#: Examples of the default tier (a fused GEMM op, the fused norm, MoE); the other GEMM ops'
#: examples run in the full tier and the GPU tier.
DEFAULT = {"20_matmul_all_reduce", "24_all_reduce_rmsnorm", "26_moe_layer"}
CASES = [p if p.stem in DEFAULT else pytest.param(p, marks=pytest.mark.full) for p in EXAMPLES]


@pytest.mark.skipif(not EXAMPLES, reason=f"no examples found at {EXAMPLES_DIR} (not a source checkout)")
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_example(path: Path) -> None:
    require_world(WORLD)
    run_example(path, WORLD, timeout=300)


@pytest.mark.skipif(not EXAMPLES, reason=f"no examples found at {EXAMPLES_DIR} (not a source checkout)")
def test_every_op_has_an_example():
    names = {p.stem.split("_", 1)[1] for p in EXAMPLES}
    assert names == {
        "matmul_all_reduce",
        "all_gather_matmul",
        "matmul_all_gather",
        "matmul_reduce_scatter",
        "all_reduce_rmsnorm",
        "moe_layer",
    }, names
