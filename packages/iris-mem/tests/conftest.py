"""Shared fixtures of the iris-mem tests: leak checks of /dev/shm around every test."""

import os

import pytest

SHM = "/dev/shm"


def iris_segments() -> set[str]:
    """Names of shared-memory segments made by the CPU backend that exist now."""
    try:
        return {n for n in os.listdir(SHM) if n.startswith("iris-")}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Every test must leave /dev/shm as it found it."""
    before = iris_segments()
    yield
    leaked = iris_segments() - before
    assert not leaked, f"shared-memory segments leaked by this test: {sorted(leaked)}"
