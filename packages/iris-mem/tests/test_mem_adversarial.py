"""Cases found by trying to break iris.mem on purpose (CPU backend, 2-3 ranks): each must end
with the right result or a clear error on every rank, never a hang or a leak (the autouse
fixture of conftest.py checks /dev/shm around every test)."""

import pytest

import iris.mem
from iris.mem.runtime import SyncState
from iris.mem.testing import run_world

pytestmark = [pytest.mark.timeout(300)]


def tiny_heap_body(rank, world_size):
    try:
        iris.mem.init(100)
    except ValueError as e:
        return str(e)
    return None


def test_heap_too_small_for_bookkeeping_names_the_minimum():
    minimum = SyncState.heap_bytes(2, 1)
    for message in run_world(tiny_heap_body, 2, timeout=120):
        assert message is not None, "iris.mem.init(100) succeeded"
        assert f"heap_size=100 bytes is below the minimum heap size of {minimum} bytes" in message, message
        assert "requested" not in message, message
    with iris.mem.init(minimum) as heap:  # the minimum itself works (a world of one)
        assert heap.memory_stats().in_use_bytes == SyncState.heap_bytes(1, 1)
