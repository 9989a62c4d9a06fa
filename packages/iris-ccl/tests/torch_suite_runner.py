"""Run tests of PyTorch's own process-group suite on the ``iris`` backend, as PyTorch runs it
for gloo (``test/distributed/test_distributed_spawn.py``): ``BACKEND``, ``WORLD_SIZE`` and
``TEMP_DIR`` set before ``torch.testing._internal.distributed.distributed_test`` is imported,
``DistributedTest._DistTestBase`` mixed with ``TestDistBackend``, one process per rank and
test, every rank making its default group with ``init_process_group(backend="iris")``. On
the CPU backend the ranks are forked (this process has imported torch, Triton and Iris once,
so a test starts in a fraction of a second); on GPUs they are spawned (CUDA does not survive
a fork), as PyTorch does.

Usage: ``python torch_suite_runner.py WORLD_SIZE --list`` prints the tests PyTorch does not
skip for this backend when it loads them (one per line); ``python torch_suite_runner.py
WORLD_SIZE TEST [TEST ...] [TEST=REASON ...]`` runs tests and prints one line
``RESULTS <json>``: for each test its outcome ("passed", "skipped", "failed"), the skip
reason or the failure's text, and its seconds. ``TEST=REASON`` skips a test with a reason
(those that must be skipped for Iris: see docs/pytorch.md).
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

if os.environ.get("BACKEND") == "iris":  # the runner's process, or a rank it spawned
    import torch

    # the backend is registered before the suite is loaded (it asks for it at import)
    importlib.import_module("iris.ccl")
    _suite = importlib.import_module("torch.testing._internal.distributed.distributed_test")

    class TestIrisBackend(_suite.TestDistBackend, _suite.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            start = "spawn" if os.environ.get("IRIS_BACKEND") == "cuda" else "fork"
            self._start_processes(torch.multiprocessing.get_context(start).Process)


def main(argv: list[str]) -> int:
    world, rest = argv[1], argv[2:]
    temp = tempfile.mkdtemp(prefix="iris-torch-suite-")
    os.makedirs(os.path.join(temp, "barrier"))
    os.environ.update(BACKEND="iris", WORLD_SIZE=world, TEMP_DIR=temp)
    try:
        runner = importlib.import_module("torch_suite_runner")  # this file, with the suite loaded
        base = runner._suite.DistributedTest._DistTestBase
        if rest == ["--list"]:
            names = sorted(n for n in dir(base) if n.startswith("test_"))
            print("\n".join(n for n in names if not getattr(getattr(base, n), "__unittest_skip__", False)))
            return 0
        names = [a for a in rest if "=" not in a]
        for name, reason in (a.split("=", 1) for a in rest if "=" in a):
            setattr(runner.TestIrisBackend, name, unittest.skip(reason)(getattr(base, name)))
        results = _run(unittest.TestSuite(runner.TestIrisBackend(n) for n in names))
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
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv))
