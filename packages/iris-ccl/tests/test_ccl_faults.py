"""A rank that stops taking part in collectives turns into an error on the others, never a
hang, and (conftest's autouse fixture) leaves nothing behind in /dev/shm.

CPU tier only: on GPUs a collective's wait timeout is recorded in device memory, and the
host does not read it back after every launch.
"""

import os
import signal
import time

import pytest
import torch

import iris.ccl
import iris.mem
from iris.mem.testing import launch_world

pytestmark = [pytest.mark.timeout(300)]

WORLD = 3
SHORT_SPIN = {"IRIS_SPIN_LIMIT": "20000"}


def absent_body(rank, world_size):
    x = torch.full((100,), float(rank + 1))
    iris.ccl.all_reduce(x, x)  # every rank: the communicators exist
    assert bool((x == 6).all())
    if rank == world_size - 1:
        return "absent"  # never arrives at the second all_reduce, and exits
    started = time.monotonic()
    try:
        iris.ccl.all_reduce(x, x)
    except iris.mem.DeviceWaitTimeout as e:
        return str(e), time.monotonic() - started
    return "no error"


def test_absent_rank_times_out_the_others():
    results = launch_world(absent_body, WORLD, timeout=120, env=SHORT_SPIN)
    assert results[WORLD - 1].ok and results[WORLD - 1].value == "absent", results[WORLD - 1].error
    for rank in range(WORLD - 1):
        assert results[rank].ok, results[rank].error
        message, seconds = results[rank].value
        assert f"rank {rank}: a collective gave up waiting for rank {WORLD - 1}" in message, message
        assert "IRIS_SPIN_LIMIT" in message
        assert seconds < 60


def killed_body(rank, world_size):
    x = torch.full((64,), float(rank + 1))
    out = torch.empty(world_size * 64)
    done = []
    started = time.monotonic()
    try:
        iris.ccl.all_reduce(x, x)
        done.append("all_reduce")
        iris.ccl.all_gather(out, x)
        done.append("all_gather")
        if rank == world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.monotonic()
        iris.ccl.all_reduce(x, x, op="max")
        done.append("all_reduce max")
    except iris.mem.DeviceWaitTimeout as e:
        return done, str(e), time.monotonic() - started
    return done, None, 0.0


def test_sigkilled_rank_mid_sequence():
    results = launch_world(killed_body, WORLD, timeout=120, env=SHORT_SPIN)
    assert results[WORLD - 1].exitcode == -signal.SIGKILL
    for rank in range(WORLD - 1):
        assert results[rank].ok, results[rank].error
        done, message, seconds = results[rank].value
        assert done == ["all_reduce", "all_gather"]
        assert message is not None and f"waiting for rank {WORLD - 1}" in message
        assert seconds < 60
