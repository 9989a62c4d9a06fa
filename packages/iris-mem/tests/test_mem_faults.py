"""Failures end in errors, never hangs, and leave nothing behind in /dev/shm.

The autouse fixture in conftest.py fails any test that leaves a segment of ours behind.
"""

import os
import signal
import time

import pytest
import torch
from mem_testutils import BACKEND, HEAP, MULTI_WORLD, require_world

import iris.mem
from iris.mem.testing import launch_world, run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
#: The wait timeout alone (the watchdog, which would see the missing peer exit first, is off:
#: test_mem_watchdog.py covers it).
SHORT_WAIT = {"IRIS_WAIT_TIMEOUT": "2", "IRIS_WATCHDOG": "0"}


def killed_after_init_body(rank, world_size):
    heap = iris.mem.init(HEAP)
    heap.zeros(1000).fill_(rank)
    heap.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    heap.close()
    return "survived"


def test_sigkilled_rank_leaves_no_segment():
    require_world(MULTI_WORLD)
    results = launch_world(killed_after_init_body, MULTI_WORLD, timeout=60)
    assert results[1].exitcode == -signal.SIGKILL
    for rank in set(range(MULTI_WORLD)) - {1}:
        assert results[rank].value == "survived", results[rank].error


def missing_peer_body(rank, world_size, kill):
    with iris.mem.init(HEAP) as heap:
        heap.barrier()
        if rank == world_size - 1:
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            return "absent"  # never arrives at the device barrier
        started = time.monotonic()
        try:
            heap.device_barrier()  # on the CPU backend, raises at once
            if BACKEND == "cuda":  # on GPUs, the host reads the wait's status after the kernel
                torch.cuda.synchronize()
                heap.check_device_errors()
        except iris.mem.DeviceWaitTimeout as e:
            return str(e), time.monotonic() - started
        return "no error"


@pytest.mark.parametrize("kill", [False, True], ids=["absent", "sigkilled"])
def test_missing_peer_turns_into_an_error(kill):
    world = MULTI_WORLD
    require_world(world)
    results = launch_world(missing_peer_body, world, kill, timeout=90, env=SHORT_WAIT)
    for rank in range(world - 1):
        assert results[rank].ok, results[rank].error
        message, seconds = results[rank].value
        assert f"rank {rank}: device_barrier gave up waiting for rank {world - 1}" in message
        assert "IRIS_WAIT_TIMEOUT=2 s" in message and "flag at 0x" in message and "sync slot 0" in message
        assert 2 <= seconds < 60, seconds  # waited the timeout (device clock), not a number of polls
    if kill:
        assert results[world - 1].exitcode == -signal.SIGKILL


def sleeper_body(rank, world_size):
    if rank == 0:
        time.sleep(3600)
    return rank


def test_hung_rank_is_killed_at_the_deadline():
    started = time.monotonic()
    results = launch_world(sleeper_body, 2, timeout=5)
    elapsed = time.monotonic() - started
    assert results[0].timed_out and not results[0].ok and "killed" in results[0].error
    assert results[1].ok and results[1].value == 1
    assert elapsed < 30


def raising_body(rank, world_size):
    if rank == 1:
        raise ValueError("boom from rank 1")
    return rank


def test_run_world_reports_the_failing_rank():
    with pytest.raises(Exception, match="boom from rank 1") as info:
        run_world(raising_body, 2, timeout=60)
    assert "rank 1" in str(info.value)
