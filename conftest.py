"""Repository-wide pytest hooks: the deadline report of multi-rank worlds.

With ``IRIS_TEST_DURATIONS`` set (``nox -s tests`` and ``tests_full`` set it), every
multi-rank world of the run records its duration and deadline there
(:func:`iris.mem.testing.record_duration`); the summary then lists the worlds closest to
their deadline and warns about any that used more than a third of it. ``nox -s tests_full``
also fails on those (``.ci/check_deadlines.py``).
"""

import importlib.util
import os
from pathlib import Path


def _checker():
    path = Path(__file__).resolve().parent / ".ci" / "check_deadlines.py"
    spec = importlib.util.spec_from_file_location("check_deadlines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
