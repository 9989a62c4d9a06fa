"""Shared fixtures of the iris-ops tests: every test must leave /dev/shm as it found it."""

import os

import pytest

SHM = "/dev/shm"


def _iris_segments() -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith("iris-")} if os.path.isdir(SHM) else set()


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = _iris_segments()
    yield
    leaked = sorted(_iris_segments() - before)
    assert not leaked, f"shared-memory segments leaked by this test: {leaked}"
