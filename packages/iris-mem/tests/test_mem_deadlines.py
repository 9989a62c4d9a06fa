"""Duration records of multi-rank worlds and the check of their deadlines.

``run_world`` appends a record to ``$IRIS_TEST_DURATIONS``; ``.ci/check_deadlines.py`` (run
by ``nox -s tests_full``) fails when a world took more than a third of its deadline. From
an sdist (no ``.ci`` folder) the checker tests skip.
"""

import importlib.util
import json
import os
from pathlib import Path

import pytest

from iris.mem.testing import run_world

pytestmark = pytest.mark.timeout(120)

CHECKER = Path(__file__).resolve().parents[3] / ".ci" / "check_deadlines.py"


def _sleep_body(rank, world_size, seconds):
    import time

    time.sleep(seconds)
    return rank


def test_run_world_records_its_duration_and_deadline(tmp_path, monkeypatch):
    log = tmp_path / "durations.jsonl"
    monkeypatch.setenv("IRIS_TEST_DURATIONS", str(log))
    assert run_world(_sleep_body, 2, 0.3, timeout=60) == [0, 1]
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["kind"] == "world" and record["what"] == "_sleep_body", record
    assert record["world_size"] == 2 and record["timeout"] == 60, record
    assert 0.3 <= record["seconds"] < 60 and not record["timed_out"], record
    assert record["test"].endswith("test_run_world_records_its_duration_and_deadline"), record


def test_nothing_is_recorded_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("IRIS_TEST_DURATIONS", raising=False)
    monkeypatch.chdir(tmp_path)
    run_world(_sleep_body, 1, 0.0, timeout=60)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not CHECKER.is_file(), reason=f"{CHECKER} not found (not a source checkout)")
def test_checker_fails_on_a_world_within_3x_of_its_deadline(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("check_deadlines", CHECKER)
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    log = tmp_path / "durations.jsonl"

    def write(*records):
        log.write_text("".join(json.dumps(r) + os.linesep for r in records))

    far = {"test": "t::far", "kind": "world", "what": "a", "world_size": 3, "timeout": 120, "seconds": 39.0}
    near = {"test": "t::near", "kind": "world", "what": "b", "world_size": 2, "timeout": 120, "seconds": 41.0}
    write(far)
    assert checker.main([str(log)]) == 0
    killed = {**near, "test": "t::killed", "seconds": 120.0, "timed_out": True}
    write(far, killed)  # a world killed at its deadline failed its test (or was meant to)
    assert checker.main([str(log)]) == 0
    write(far, near, {**near, "seconds": 1.0})  # the slowest record of a test counts
    assert checker.main([str(log)]) == 1
    assert "t::near (b, world 2) took 41.0 s of its 120 s deadline" in capsys.readouterr().out
    assert checker.main([str(log), "--warn-only"]) == 0
    assert checker.main([str(log), "--ratio", "2.5"]) == 0
    assert checker.main([str(tmp_path / "missing.jsonl")]) == 0
