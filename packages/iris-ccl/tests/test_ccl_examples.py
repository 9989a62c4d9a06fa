"""Run the iris.ccl examples (``examples/1*.py``) under torchrun; every rank must validate.

From an sdist (no examples folder) the tests skip. At world sizes 1 and 3 on either backend
(on GPUs, ranks beyond the number of GPUs share them).
"""

from pathlib import Path

import pytest
from ccl_testutils import require_world

from iris.mem.testing import run_example

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("1[0-9]_*.py")) if EXAMPLES_DIR.is_dir() else []
#: Examples of the default tier (one per kind of call: a reduction, a gather, an exchange,
#: point to point); the others run in the full tier and the GPU tier (each about 7 s here).
DEFAULT = {"10_all_reduce", "11_all_gather", "13_all_to_all", "18_send_recv"}
CASES = [p if p.stem in DEFAULT else pytest.param(p, marks=pytest.mark.full) for p in EXAMPLES]


@pytest.mark.skipif(not EXAMPLES, reason=f"no examples found at {EXAMPLES_DIR} (not a source checkout)")
@pytest.mark.parametrize("world", (pytest.param(1, marks=pytest.mark.full), 3))
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_example(path: Path, world: int) -> None:
    require_world(world)
    run_example(path, world)
