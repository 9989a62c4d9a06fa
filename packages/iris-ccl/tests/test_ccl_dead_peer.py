"""A rank of a loop of iris.ccl collectives dies: the others end within seconds with an error
naming it (default settings: the wait timeout is 300 s); iris.ccl.abort() stops a collective
spinning on a peer that never comes. (The conftest fixture checks /dev/shm is left clean.)"""

import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

import iris.ccl
import iris.mem
from iris.mem.testing import launch_world, run_world

pytestmark = [pytest.mark.timeout(300)]


def all_reduce_loop_body(rank, world_size, victim, how, in_place):
    heap = iris.mem.init(1 << 20) if in_place else None
    n = 1037
    x = heap.ones(n) if in_place else torch.ones(n)
    out = heap.zeros(n) if in_place else torch.zeros(n)
    died = time.monotonic()
    for i in range(1000):
        if i == 3 and rank == victim:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("rank fails mid-loop on purpose")
        if i == 3:
            died = time.monotonic()
        try:
            iris.ccl.all_reduce(out, x)
        except iris.mem.AbortedError as e:
            seconds = time.monotonic() - died
            with pytest.raises(iris.mem.AbortedError):  # the group's collectives stay refused
                iris.ccl.all_reduce(out, x)
            return str(e), e.rank, seconds
        assert torch.equal(out, torch.full((n,), float(world_size)))
    return None


@pytest.mark.parametrize(
    "how, in_place", [("kill", False), ("raise", True)], ids=["sigkill-staged", "raise-in-place"]
)
def test_dead_rank_ends_the_survivors_within_seconds(how, in_place):
    results = launch_world(all_reduce_loop_body, 3, 2, how, in_place, timeout=240)
    assert results[2].exitcode != 0
    for r in results[:2]:
        assert r.ok, r.error
        assert r.value is not None, "the loop ended without the victim"
        message, rank, seconds = r.value
        assert rank == 2 and "rank 2 of the symmetric heap" in message, message
        if how == "raise":
            assert "raised RuntimeError: rank fails mid-loop on purpose" in message
        assert seconds < 10, f"{seconds:.1f} s"


def abort_body(rank, world_size):
    """Rank 1 skips a collective; rank 0's spins until a thread calls iris.ccl.abort()."""
    x = torch.ones(100)
    iris.ccl.all_reduce(x, x)
    result = None
    if rank == 0:
        timer = threading.Timer(1.0, iris.ccl.abort, kwargs={"reason": "the trainer gave up"})
        started = time.monotonic()
        timer.start()
        try:
            iris.ccl.all_reduce(x, x)
        except iris.mem.AbortedError as e:
            result = (str(e), time.monotonic() - started)
        timer.join()
        with pytest.raises(iris.mem.AbortedError, match="the trainer gave up"):
            iris.ccl.all_gather(torch.zeros(200), x)
    dist.barrier()
    return result


def test_abort_stops_a_collective_waiting_for_a_missing_peer():
    message, seconds = run_world(abort_body, 2, timeout=180)[0]
    assert "aborted (the trainer gave up)" in message
    assert 0.9 <= seconds < 5, seconds


def test_abort_without_a_process_group_is_a_no_op():
    iris.ccl.abort()


def last_send_body(rank, world_size):
    """Rank 1 sends and its program ends at once; rank 0 receives after rank 1 is gone: the
    message was delivered before, so the receive succeeds."""
    x = torch.arange(50, dtype=torch.float32)
    iris.ccl.all_reduce(x.clone(), x)  # make the group's state on both ranks
    if rank == 1:
        iris.ccl.send(x * 2, 0)
        return None
    time.sleep(3)  # rank 1 has exited and its watchdog report is in
    got = torch.zeros(50)
    iris.ccl.recv(got, 1)
    return got.tolist()


def test_receive_after_the_sender_ended_normally():
    got = run_world(last_send_body, 2, timeout=180)[0]
    assert got == [2.0 * i for i in range(50)]
