"""Repository-wide pytest hooks: the deadline report of multi-rank worlds, and longer test
timeouts where ranks share GPUs.

With ``IRIS_TEST_DURATIONS`` set (``nox -s tests`` and ``tests_full`` set it), every
multi-rank world of the run records its duration and deadline there
(:func:`iris.mem.testing.record_duration`); the summary then lists the worlds closest to
their deadline and warns about any that used more than a third of it. ``nox -s tests_full``
also fails on those (``.ci/check_deadlines.py``).

On the cuda backend with fewer GPUs than the largest world of the tests (4 ranks), ranks
share GPUs and each hand-off between them waits for the GPU to switch processes: every
test's ``timeout`` mark grows by the ranks per GPU of that world, as the worlds' own
deadlines do (:func:`iris.mem.testing.deadline_scale`).
"""

import importlib.util
import os
from pathlib import Path

import pytest


def _checker():
    path = Path(__file__).resolve().parent / ".ci" / "check_deadlines.py"
    spec = importlib.util.spec_from_file_location("check_deadlines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The largest world of the multi-rank tests.
LARGEST_WORLD = 4


def pytest_collection_modifyitems(config, items):
    if os.environ.get("IRIS_BACKEND") != "cuda":
        return
    from iris.mem.testing import deadline_scale  # optional here: only GPU runs need it

    scale = deadline_scale(LARGEST_WORLD)
    if scale == 1:
        return
    for item in items:
        mark = item.get_closest_marker("timeout")
        if mark is not None and mark.args:
            item.add_marker(pytest.mark.timeout(mark.args[0] * scale))


def pytest_terminal_summary(terminalreporter):
    path = os.environ.get("IRIS_TEST_DURATIONS")
    if not path:
        return
    checker = _checker()
    rows = checker.worst_per_test(checker.load(Path(path)))
    if not rows:
        return
    lines, tight = checker.report(rows, 3.0, 10)
    terminalreporter.section("deadlines of multi-rank worlds")
    for line in lines:
        terminalreporter.write_line(line, yellow=bool(tight))
