"""Run tests of PyTorch's own process-group suite on the ``iris`` backend, as PyTorch runs it
for gloo (``test/distributed/test_distributed_spawn.py``): ``BACKEND``, ``WORLD_SIZE`` and
``TEMP_DIR`` set before ``torch.testing._internal.distributed.distributed_test`` is imported,
``DistributedTest._DistTestBase`` mixed with ``TestDistBackend``, one process per rank and
test. The ranks are forked (not spawned: this process has imported torch, Triton and Iris
once, so a test starts in a fraction of a second), and every rank makes its default group
with ``init_process_group(backend="iris")``.

Usage: ``python torch_suite_runner.py WORLD_SIZE --list`` prints the tests PyTorch does not
skip for this backend when it loads them (one per line); ``python torch_suite_runner.py
WORLD_SIZE TEST [TEST ...] [--skip TEST=REASON ...]`` runs tests and prints one line
``RESULTS <json>``: for each test its outcome ("passed", "skipped", "failed"), the skip
reason or the failure's text, and its seconds. ``--skip`` skips a test with a reason (those
that must be skipped for Iris: see docs/pytorch.md).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import unittest


def main(argv: list[str]) -> int:
    world, rest = argv[1], argv[2:]
    temp = tempfile.mkdtemp(prefix="iris-torch-suite-")
    os.makedirs(os.path.join(temp, "barrier"))
    os.environ.update(BACKEND="iris", WORLD_SIZE=world, TEMP_DIR=temp)
    try:
        import torch

        # the backend is registered before the suite is loaded (it asks for it at import)
        importlib.import_module("iris.ccl")
        suite = importlib.import_module("torch.testing._internal.distributed.distributed_test")
        DistributedTest, TestDistBackend = suite.DistributedTest, suite.TestDistBackend  # noqa: N806

        base = DistributedTest._DistTestBase
        if rest == ["--list"]:
            names = sorted(n for n in dir(base) if n.startswith("test_"))
            print("\n".join(n for n in names if not getattr(getattr(base, n), "__unittest_skip__", False)))
            return 0
        names = [a for a in rest if "=" not in a and a != "--skip"]
        skips = dict(a.split("=", 1) for a in rest if "=" in a)

        class TestIrisBackend(TestDistBackend, base):
            def setUp(self):
                super().setUp()
                self._start_processes(torch.multiprocessing.get_context("fork").Process)

        for name, reason in skips.items():
            setattr(TestIrisBackend, name, unittest.skip(reason)(getattr(base, name)))
        results = _run(unittest.TestSuite(TestIrisBackend(n) for n in names))
        print("RESULTS " + json.dumps(results), flush=True)
        return 0
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _run(suite: unittest.TestSuite) -> dict:
    results: dict = {}

    class Collect(unittest.TestResult):
        def startTest(self, test):  # noqa: N802 - unittest's name
            self._started = time.monotonic()
            super().startTest(test)

        def _record(self, test, outcome: str, info: str = "") -> None:
            seconds = round(time.monotonic() - self._started, 2)
            results[test._testMethodName] = {"outcome": outcome, "info": info, "seconds": seconds}

        def addSuccess(self, test):  # noqa: N802
            self._record(test, "passed")

        def addSkip(self, test, reason):  # noqa: N802
            self._record(test, "skipped", reason)

        def addFailure(self, test, err):  # noqa: N802
            self._record(test, "failed", self._exc_info_to_string(err, test)[-4000:])

        addError = addFailure  # noqa: N815

    suite.run(Collect())
    return results


if __name__ == "__main__":
    sys.exit(main(sys.argv))
