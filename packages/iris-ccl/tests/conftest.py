"""Shared fixtures of the iris-ccl tests: leak checks of /dev/shm around every test."""

import os

import pytest


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Every test must leave /dev/shm as it found it."""

    def segments():
        try:
            return {n for n in os.listdir("/dev/shm") if n.startswith("iris-")}
        except FileNotFoundError:
            return set()

    before = segments()
    yield
    leaked = segments() - before
    assert not leaked, f"shared-memory segments leaked by this test: {sorted(leaked)}"
