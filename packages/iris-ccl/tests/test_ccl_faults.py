"""A rank that stops taking part in collectives turns into an error on the others, never a
hang, and (conftest's autouse fixture) leaves nothing behind in /dev/shm.

On the CPU backend the collective itself raises; on GPUs a kernel's wait timeout is recorded
in device memory and ``iris.ccl.check_errors()`` (called here after each collective, as a
user would after a synchronisation point) raises it. Both tiers: 3 ranks (on GPUs, ranks
beyond the number of GPUs share them) and a wait timeout of 2 s.
"""

import json
import os
import signal
import time

import pytest
import torch

import iris.ccl
import iris.mem
from iris.mem.testing import gpu_skip_reason, launch_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
WORLD = 3
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(gpu_skip_reason(WORLD) is not None, reason=gpu_skip_reason(WORLD) or ""),
]

#: The wait timeout alone (the watchdog, which would see an exited peer first, is off:
#: test_ccl_dead_peer.py covers it).
SHORT_WAIT = {"IRIS_WAIT_TIMEOUT": "2", "IRIS_WATCHDOG": "0"}


def _device(rank: int) -> torch.device:
    """This rank's device: its GPU (LOCAL_RANK modulo the GPUs present), or the CPU."""
    device = iris.mem.default_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _collective(fn, *args, **kwargs) -> None:
    """Run a collective and surface a recorded wait timeout (GPUs record, the CPU raises)."""
    fn(*args, **kwargs)
    iris.ccl.check_errors()


def absent_body(rank, world_size, variant="auto"):
    cfg = iris.ccl.Config(variant=variant)
    x = torch.full((100,), float(rank + 1), device=_device(rank))
    _collective(iris.ccl.all_reduce, x, x, config=cfg)  # every rank: the communicators exist
    assert bool((x == world_size * (world_size + 1) // 2).all())
    if rank == world_size - 1:
        return "absent"  # never arrives at the second all_reduce, and exits
    started = time.monotonic()
    try:
        _collective(iris.ccl.all_reduce, x, x, config=cfg)
    except iris.mem.DeviceWaitTimeout as e:
        return str(e), time.monotonic() - started
    return "no error"


def one_shot_absent_body(rank, world_size):
    return absent_body(rank, world_size, "one_shot")


@pytest.mark.parametrize("body", [absent_body, one_shot_absent_body], ids=["auto", "one_shot"])
def test_absent_rank_times_out_the_others(body):
    results = launch_world(body, WORLD, timeout=120, env=SHORT_WAIT)
    assert results[WORLD - 1].ok and results[WORLD - 1].value == "absent", results[WORLD - 1].error
    for rank in range(WORLD - 1):
        assert results[rank].ok, results[rank].error
        message, seconds = results[rank].value
        assert f"rank {rank}: a collective gave up waiting for rank {WORLD - 1}" in message, message
        timeout = SHORT_WAIT["IRIS_WAIT_TIMEOUT"]
        assert f"IRIS_WAIT_TIMEOUT={timeout} s" in message, message
        assert float(timeout) <= seconds < 60, seconds  # waited the timeout, not a number of polls
        if body is one_shot_absent_body:
            # one program, slot 0: the second call's start barrier found the absent rank's
            # flag at the generation of its last barrier, below this rank's
            assert "sync slot 0, generation " in message, message
            generation = int(message.split("generation ")[1].split(" ")[0])
            published = json.loads(message.split("members published ")[1].split(")")[0])
            assert len(published) == WORLD and published[WORLD - 1] < generation, message
            assert published[rank] == generation, message


def killed_body(rank, world_size):
    x = torch.full((64,), float(rank + 1), device=_device(rank))
    out = torch.empty(world_size * 64, device=x.device)
    done = []
    started = time.monotonic()
    try:
        _collective(iris.ccl.all_reduce, x, x)
        done.append("all_reduce")
        _collective(iris.ccl.all_gather, out, x)
        done.append("all_gather")
        if rank == world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.monotonic()
        _collective(iris.ccl.all_reduce, x, x, op="max")
        done.append("all_reduce max")
    except iris.mem.DeviceWaitTimeout as e:
        return done, str(e), time.monotonic() - started
    return done, None, 0.0


def test_sigkilled_rank_mid_sequence():
    results = launch_world(killed_body, WORLD, timeout=120, env=SHORT_WAIT)
    assert results[WORLD - 1].exitcode == -signal.SIGKILL
    for rank in range(WORLD - 1):
        assert results[rank].ok, results[rank].error
        done, message, seconds = results[rank].value
        assert done == ["all_reduce", "all_gather"]
        assert message is not None and f"waiting for rank {WORLD - 1}" in message
        assert seconds < 60


def healthy_body(rank, world_size):
    x = torch.full((1000,), float(rank + 1), device=_device(rank))
    _collective(iris.ccl.all_reduce, x, x)
    return float(x[0])


def test_a_new_job_runs_normally_after_the_faults():
    """After the faulty worlds above (their survivors gave up, nothing spins on): a fresh
    job on the same devices runs a collective normally."""
    results = launch_world(healthy_body, WORLD, timeout=120)
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.value for r in results] == [WORLD * (WORLD + 1) / 2] * WORLD
