"""Cases found by trying to break iris.mem on purpose (CPU backend, 2-3 ranks): each must end
with the right result or a clear error on every rank, never a hang or a leak (the autouse
fixture of conftest.py checks /dev/shm around every test)."""

import os
import signal
import subprocess
import sys
import time

import pytest

import iris.mem
from iris.mem.runtime import SyncState
from iris.mem.testing import launch_world, run_world

pytestmark = [pytest.mark.timeout(300)]


def iris_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("iris-")}


cpu_only = pytest.mark.skipif(
    os.environ.get("IRIS_BACKEND", "cpu") != "cpu", reason="shared-memory segments of the cpu backend"
)


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


class _DieAtMapping:
    """Stands in for the mmap module in the cpu backend of the rank to kill: the rank SIGKILLs
    itself at its first mapping, right after creating its segment, before the ranks exchange
    the segments' names."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def mmap(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)


def killed_in_init_body(rank, world_size, victims):
    if rank in victims:
        import iris.mem.backends.cpu as cpu

        cpu.mmap = _DieAtMapping(cpu.mmap)
    started = time.monotonic()
    try:
        iris.mem.init(1 << 20)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, time.monotonic() - started
    return None


def _dead_or_unnamed(names: set[str]) -> set[str]:
    """The segments of ``names`` that no live process owns (other jobs on the machine may
    hold segments of their own for a moment while they make their heaps)."""
    from iris.mem._process import exited, pid_namespace

    namespace = pid_namespace()
    owned = {n for n in names if n.startswith(f"iris-{namespace}-") and n.split("-")[2].isdigit()}
    return (names - owned) | {n for n in owned if exited(int(n.split("-")[2]))}


@cpu_only
def test_rank_killed_inside_init_leaves_no_segment():
    """The survivors fail (gloo notices the dead peer) and remove the segment the dead rank
    made before anyone knew its name; nothing stays in /dev/shm."""
    before = iris_segments()
    results = launch_world(killed_in_init_body, 3, [1], timeout=120)
    assert results[1].exitcode == -signal.SIGKILL, results[1]
    for rank in (0, 2):
        assert results[rank].ok and results[rank].value is not None, results[rank]
        error, seconds = results[rank].value
        assert seconds < 60, results[rank]
    assert _dead_or_unnamed(iris_segments() - before) == set()


_ORPHAN = """
import os, signal
import _posixshmem
from iris.mem.backends.cpu import segment_name
name = segment_name()
os.close(_posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600))
print(name, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@cpu_only
def test_a_later_heap_removes_segments_of_processes_killed_in_init():
    """A process killed with its segment's name still in /dev/shm, and no peer left to clean
    up (every rank killed): the next heap made on the machine by the same user removes it."""
    env = {**os.environ, "IRIS_BACKEND": "cpu", "TRITON_INTERPRET": "1"}
    made = subprocess.run([sys.executable, "-c", _ORPHAN], env=env, capture_output=True, text=True)
    assert made.returncode == -signal.SIGKILL, made.stderr
    orphan = made.stdout.strip().lstrip("/")
    assert orphan.startswith("iris-") and orphan in iris_segments()
    with iris.mem.init(1 << 20):
        assert orphan not in iris_segments()
