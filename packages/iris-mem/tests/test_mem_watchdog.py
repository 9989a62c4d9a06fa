"""The watchdog and heap.abort(): a peer process that exits, or an abort on request, stops
the device-side waits of the heap at once, with an error naming what happened; a peer that
is only late is waited for. (The conftest fixture checks that /dev/shm is left clean.)

The tests marked ``gpu`` run on the cuda backend too (``-m gpu``), where the waits are
kernels spinning on the GPU, whatever the number of GPUs: ranks beyond it share GPUs."""

import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist
import triton

import iris.mem
from iris.mem import watchdog
from iris.mem.runtime import SyncState
from iris.mem.testing import launch_world, run_world
from iris.mem.utils import record_timeout, wait_at_least

pytestmark = [pytest.mark.timeout(300)]


def device_barrier(heap):
    """``heap.device_barrier()`` waited for: the barrier is ordered on the stream (on GPUs the
    call returns at its launch), so synchronise and raise what its wait recorded."""
    heap.device_barrier()
    iris.mem.synchronize(heap.device)
    heap.check_device_errors()


def barrier_loop_body(rank, world_size, victim, how):
    """Device barriers in a loop; at the 4th, rank ``victim`` dies ``how``. The others return
    (error text, seconds from the death to the error)."""
    heap = iris.mem.init(1 << 16)
    for i in range(1000):
        if i == 3 and rank == victim:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("the victim gives up on purpose")
        if i == 3:
            died = time.monotonic()
        try:
            device_barrier(heap)
        except iris.mem.AbortedError as e:
            seconds = time.monotonic() - died
            # The heap refuses any further use, with the same explanation.
            with pytest.raises(iris.mem.AbortedError, match=f"rank {victim} of the symmetric heap"):
                heap.zeros(4)
            heap.close()  # still releases everything
            return str(e), e.rank, seconds
    return None


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["kill", "raise"])
def test_dead_peer_stops_the_waits_within_seconds(how):
    """1 of 3 ranks SIGKILLed or raising mid-loop: the others end with an AbortedError
    naming it within 10 s (the wait timeout is the default 300 s)."""
    results = launch_world(barrier_loop_body, 3, 1, how, timeout=240)
    assert results[1].exitcode != 0
    for r in (results[0], results[2]):
        assert r.ok, r.error
        assert r.value is not None, "the loop ended without the victim"
        message, rank, seconds = r.value
        assert rank == 1
        assert "rank 1 of the symmetric heap" in message and "exited" in message, message
        if how == "raise":
            assert "raised ValueError: the victim gives up on purpose" in message, message
        assert seconds < 10, f"took {seconds:.1f} s"


def late_peer_body(rank, world_size, delay):
    heap = iris.mem.init(1 << 16)
    device_barrier(heap)
    if rank == 1:
        time.sleep(delay)
    started = time.monotonic()
    for _ in range(3):
        device_barrier(heap)
    waited = time.monotonic() - started
    heap.close()
    return waited


@pytest.mark.gpu
def test_late_peer_is_waited_for():
    """A peer that is alive but sleeps before its next barrier is not taken for dead."""
    waited = run_world(late_peer_body, 2, 4.0, timeout=180)
    assert waited[0] >= 3.5


@pytest.mark.full
def test_peer_late_by_20_seconds_is_waited_for():
    waited = run_world(late_peer_body, 3, 20.0, timeout=300)
    assert min(waited[0], waited[2]) >= 19


def abort_body(rank, world_size):
    """Rank 1 never reaches the barrier; rank 0 aborts its heap from another thread while
    its barrier kernel spins."""
    heap = iris.mem.init(1 << 16)
    device_barrier(heap)
    result = None
    if rank == 0:
        timer = threading.Timer(1.0, heap.abort, args=("the framework gave up",))
        started = time.monotonic()
        timer.start()
        try:
            device_barrier(heap)
        except iris.mem.AbortedError as e:
            result = (str(e), e.reason, time.monotonic() - started, heap.aborted)
        timer.join()
        for use in (lambda: heap.zeros(1), heap.barrier, heap.device_barrier, lambda: heap.free()):
            with pytest.raises(iris.mem.AbortedError, match="the framework gave up"):
                use()
        heap.abort()  # idempotent
    dist.barrier()  # rank 1 lives on until rank 0 is done (its exit would abort the heap too)
    heap.close()
    heap.close()
    return result


@pytest.mark.gpu
# 3 ranks on GPUs too (one of them, or two, on a GPU shared with rank 0); 2 on the CPU tier
@pytest.mark.parametrize("world_size", [2, 3] if os.environ.get("IRIS_BACKEND") == "cuda" else [2])
def test_abort_stops_a_spinning_kernel_and_the_heap_refuses_use(world_size):
    message, reason, seconds, aborted = run_world(abort_body, world_size, timeout=180)[0]
    assert "aborted (the framework gave up)" in message and reason == "the framework gave up"
    assert aborted
    assert 0.9 <= seconds < 5, seconds


def report_body(rank, world_size):
    """How a peer's end is told: its report through the store, else /proc."""
    heap = iris.mem.init(1 << 16)
    assert watchdog.watching() == (world_size > 1 and iris.mem.settings.watchdog())
    peer = watchdog.Peer(rank, rank, os.getpid(), None)
    before = watchdog.how_it_ended(peer)  # alive and silent: the generic text, not clean
    watchdog.report_exit(watchdog.describe_exception(KeyError("x" * 400)))
    after = watchdog.how_it_ended(peer)
    heap.close()
    return before, after


def test_exit_reports():
    (before, clean_before), (after, clean_after) = run_world(report_body, 1, timeout=120)[0]
    assert "without a word" in before and not clean_before
    assert after.startswith("raised KeyError: ") and after.endswith("...") and len(after) < 330
    assert not clean_after


def off_body(rank, world_size):
    heap = iris.mem.init(1 << 16)
    running = watchdog.watching()
    heap.close()
    return running


def test_watchdog_can_be_turned_off():
    assert run_world(off_body, 2, timeout=120, env={"IRIS_WATCHDOG": "0"}) == [False, False]
    with pytest.raises(ValueError, match="IRIS_WATCHDOG_INTERVAL"):
        os.environ["IRIS_WATCHDOG_INTERVAL"] = "0"
        try:
            iris.mem.settings.watchdog_interval()
        finally:
            del os.environ["IRIS_WATCHDOG_INTERVAL"]


@triton.jit
def _spin_kernel(flag, status, budget):
    """Wait for a flag nobody sets (as a kernel does on a peer that is gone)."""
    if wait_at_least(flag, 1, budget, status) < 1:
        record_timeout(status, 0, 0, flag)


def spin_body(rank, world_size):
    """A kernel spins on a flag of the heap's sync state; heap.abort() from another thread
    stops it (on GPUs while it runs: the stop does not wait for it)."""
    heap = iris.mem.init(1 << 16)
    state = SyncState(heap, [0], 1, "a spinning test kernel", "nothing to advise")
    flag = heap.ones(1, dtype=torch.int32)
    _spin_kernel[(1,)](flag, state.status, iris.mem.wait_budget_ns())  # compiled now, not below
    iris.mem.synchronize(heap.device)
    flag.zero_()
    timer = threading.Timer(0.5, heap.abort, args=("stopped by the test",))
    started = time.monotonic()
    timer.start()
    _spin_kernel[(1,)](flag, state.status, iris.mem.wait_budget_ns())
    iris.mem.synchronize(heap.device)
    seconds = time.monotonic() - started
    timer.join()
    with pytest.raises(iris.mem.AbortedError, match="stopped by the test"):
        state.check()
    heap.close()
    return seconds


@pytest.mark.gpu
def test_abort_stops_a_spinning_kernel_within_a_second():
    seconds = run_world(spin_body, 1, timeout=180)[0]
    assert 0.4 <= seconds < 1.5, seconds


def clean_exit_body(rank, world_size):
    """Rank 1's program ends normally while rank 0 waits for it at a barrier it never
    reaches: only that wait stops (the heap stays usable for what needs no rank 1)."""
    heap = iris.mem.init(1 << 16)
    device_barrier(heap)
    if rank == 1:
        return None
    started = time.monotonic()
    with pytest.raises(
        iris.mem.AbortedError, match="rank 1 of the symmetric heap .* exited: its Python program ended"
    ):
        device_barrier(heap)
    seconds = time.monotonic() - started
    assert not heap.aborted
    heap.zeros(4)  # local use goes on
    heap.close()
    return seconds


@pytest.mark.gpu
def test_peer_that_ended_normally_stops_only_unmet_waits():
    seconds = run_world(clean_exit_body, 2, timeout=180)[0]
    assert seconds < 10, seconds
