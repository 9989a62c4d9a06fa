"""Run the iris-mem examples (``examples/0*.py``) under torchrun; every rank must validate.

The examples live in ``examples/`` at the repository root; from an sdist (no examples
folder) the tests skip. Each example runs on the backend of ``IRIS_BACKEND``: on cpu at
world sizes 1 and 3, on cuda at 1 and 2 (one GPU per rank).
"""

from pathlib import Path

import pytest
from mem_testutils import MULTI_WORLD, require_world

from iris.mem.testing import run_example

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("0[0-9]_*.py")) if EXAMPLES_DIR.is_dir() else []
#: Examples of the default tier; the others run in the full tier and the GPU tier.
DEFAULT = {"01_heap_basics", "02_load_store", "05_message_passing", "07_gluon_all_gather"}
CASES = [p if p.stem in DEFAULT else pytest.param(p, marks=pytest.mark.full) for p in EXAMPLES]


@pytest.mark.skipif(not EXAMPLES, reason=f"no examples found at {EXAMPLES_DIR} (not a source checkout)")
@pytest.mark.parametrize("world", (pytest.param(1, marks=pytest.mark.full), MULTI_WORLD))
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_example(path: Path, world: int) -> None:
    require_world(world)
    run_example(path, world)
