"""A rank of a loop of iris.ccl collectives dies: the others end within seconds with an error
naming it (default settings: the wait timeout is 300 s); iris.ccl.abort() stops a collective
spinning on a peer that never comes. (The conftest fixture checks /dev/shm is left clean.)
3 ranks on both tiers (on GPUs, ranks beyond the number of GPUs share them)."""

import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

import iris.ccl
import iris.mem
from iris.mem.testing import gpu_skip_reason, launch_world, run_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
#: Ranks of the dead-rank worlds: 3, on any number of GPUs (ranks share them beyond it).
WORLD = 3
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(gpu_skip_reason(WORLD) is not None, reason=gpu_skip_reason(WORLD) or ""),
]


def _device() -> torch.device:
    """This rank's device: its GPU (LOCAL_RANK modulo the GPUs present), or the CPU."""
    device = iris.mem.default_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _finish(x: torch.Tensor) -> None:
    """Surface what the device recorded (GPUs record; the CPU backend raises at once)."""
    if x.is_cuda:
        torch.cuda.synchronize()
    iris.ccl.check_errors()


def all_reduce_loop_body(rank, world_size, victim, how, in_place):
    dev = _device()
    heap = iris.mem.init(1 << 20) if in_place else None
    n = 1037
    x = heap.ones(n) if in_place else torch.ones(n, device=dev)
    out = heap.zeros(n) if in_place else torch.zeros(n, device=dev)
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
            _finish(out)
        except iris.mem.AbortedError as e:
            seconds = time.monotonic() - died
            with pytest.raises(iris.mem.AbortedError):  # the group's collectives stay refused
                iris.ccl.all_reduce(out, x)
                _finish(out)
            return str(e), e.rank, seconds
        assert torch.equal(out.cpu(), torch.full((n,), float(world_size)))
    return None


@pytest.mark.parametrize(
    "how, in_place", [("kill", False), ("raise", True)], ids=["sigkill-staged", "raise-in-place"]
)
def test_dead_rank_ends_the_survivors_within_seconds(how, in_place):
    victim = WORLD - 1
    results = launch_world(all_reduce_loop_body, WORLD, victim, how, in_place, timeout=240)
    assert results[victim].exitcode != 0
    for r in results[:victim]:
        assert r.ok, r.error
        assert r.value is not None, "the loop ended without the victim"
        message, rank, seconds = r.value
        assert rank == victim and f"rank {victim} of the symmetric heap" in message, message
        if how == "raise":
            assert "raised RuntimeError: rank fails mid-loop on purpose" in message
        assert seconds < 10, f"{seconds:.1f} s"


def abort_body(rank, world_size):
    """Rank 1 skips a collective; rank 0's spins until a thread calls iris.ccl.abort()."""
    dev = _device()
    x = torch.ones(100, device=dev)
    iris.ccl.all_reduce(x, x)
    _finish(x)
    result = None
    if rank == 0:
        timer = threading.Timer(1.0, iris.ccl.abort, kwargs={"reason": "the trainer gave up"})
        started = time.monotonic()
        timer.start()
        try:
            iris.ccl.all_reduce(x, x)
            _finish(x)
        except iris.mem.AbortedError as e:
            result = (str(e), time.monotonic() - started)
        timer.join()
        with pytest.raises(iris.mem.AbortedError, match="the trainer gave up"):
            iris.ccl.all_gather(torch.zeros(200, device=dev), x)
    dist.barrier()
    return result


def test_abort_stops_a_collective_waiting_for_a_missing_peer():
    message, seconds = run_world(abort_body, 2, timeout=180)[0]
    assert "aborted (the trainer gave up)" in message
    assert 0.9 <= seconds < 5, seconds


@pytest.mark.skipif(BACKEND == "cuda", reason="checked on the CPU tier")
def test_abort_without_a_process_group_is_a_no_op():
    iris.ccl.abort()


def last_send_body(rank, world_size):
    """Rank 1 sends and its program ends at once; rank 0 receives after rank 1 is gone: the
    message was delivered before, so the receive succeeds."""
    dev = _device()
    x = torch.arange(50, dtype=torch.float32, device=dev)
    iris.ccl.all_reduce(x.clone(), x)  # make the group's state on both ranks
    _finish(x)
    if rank == 1:
        iris.ccl.send(x * 2, 0)
        _finish(x)
        return None
    time.sleep(3)  # rank 1 has exited and its watchdog report is in
    got = torch.zeros(50, device=dev)
    iris.ccl.recv(got, 1)
    _finish(got)
    return got.cpu().tolist()


def test_receive_after_the_sender_ended_normally():
    got = run_world(last_send_body, 2, timeout=180)[0]
    assert got == [2.0 * i for i in range(50)]


def uneven_after_all_reduces_body(rank, world_size, victim, how, on_heap):
    """An uneven all_to_all, two small all_reduces (they write the staging buffer that holds
    the uneven call's headers), then an uneven all_to_all that rank ``victim`` never enters: it is killed, it
    raises, or (``how == "late"``) it comes later than the wait budget. The others must end
    with an error, within the bounds of docs/failure-modes.md, never spin or crash on the
    all_reduces' data left where the victim's header should be."""
    dev = _device()
    heap = iris.mem.init(1 << 20) if on_heap else None
    rows = [(rank + j) % 3 + 1 for j in range(world_size)]  # rows sent to each rank
    back = [(i + rank) % 3 + 1 for i in range(world_size)]  # rows received from each rank
    inp = torch.full((sum(rows), 5), float(rank), device=dev)
    out = heap.full((sum(back), 5), -1.0) if on_heap else torch.full((sum(back), 5), -1.0, device=dev)
    variant = iris.ccl.Config(variant="push" if on_heap else "auto")
    iris.ccl.all_to_all(out, inp, back, rows, config=variant)  # every rank: the group's state is made
    for _ in range(2):  # 16 ll tiles per peer: they cover every box's header slot
        x = torch.ones(16384, device=dev)
        iris.ccl.all_reduce(x, x, config=iris.ccl.Config(variant="ll"))
    _finish(x)
    if rank == victim:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "raise":
            raise RuntimeError("rank fails before the uneven call on purpose")
        time.sleep(2.5 * iris.mem.wait_timeout())  # late: the others give up first
    started = time.monotonic()
    try:
        iris.ccl.all_to_all(out, inp, back, rows, config=variant)
        _finish(out)
    except (iris.mem.AbortedError, iris.mem.DeviceWaitTimeout) as e:
        return type(e).__name__, str(e), time.monotonic() - started
    want = torch.cat([torch.full((n, 5), float(i)) for i, n in enumerate(back)])
    return "ok", bool(torch.equal(out.cpu(), want)), time.monotonic() - started


@pytest.mark.skipif(BACKEND == "cuda", reason="checked on the CPU tier")
@pytest.mark.parametrize(
    "how, on_heap",
    # The dead-peer cases run in tests_full: on a loaded 2-core machine the survivors' abort
    # has come 20-30 s after the death, once not within 100 s (an open problem, see
    # docs/failure-modes.md); the late peer's budget path stays in the default tier.
    [pytest.param("kill", False, marks=pytest.mark.full), pytest.param("raise", True, marks=pytest.mark.full),
     ("late", False)],
    ids=["sigkill-auto-plain", "raise-push-heap", "late-auto-plain"],
)  # fmt: skip
def test_uneven_all_to_all_after_small_all_reduces_with_a_dead_or_late_peer(how, on_heap):
    """Every survivor raises: AbortedError naming the dead rank within 40 s of its death (the
    watchdog's, in a third of the 120 s budget: about a second on an idle machine, up to 20 s
    seen on a loaded 2-core one), or for a peer later than IRIS_WAIT_TIMEOUT (2 s
    here) DeviceWaitTimeout after about one budget; the late rank itself ends too (its data
    arrived, or an error). They spun for ever on the all_reduces' data taken as the dead
    peer's header (1077936128 rounds), or died of SIGSEGV pushing to the offsets in it."""
    victim = WORLD - 1
    env = {"IRIS_WAIT_TIMEOUT": "2" if how == "late" else "120"}
    results = launch_world(uneven_after_all_reduces_body, WORLD, victim, how, on_heap, env=env, timeout=100)
    if how != "late":
        assert results[victim].exitcode != 0
    for r in results:
        if r.rank == victim and how != "late":
            continue
        assert r.ok, f"rank {r.rank}: {r.error}"
        kind, detail, seconds = r.value
        if r.rank == victim:  # late: it finds every peer's data, or a peer that gave up
            assert kind in ("ok", "DeviceWaitTimeout", "AbortedError"), r.value
            assert kind != "ok" or detail is True, f"late rank {victim}: wrong rows"
            continue
        if how == "late":
            assert kind == "DeviceWaitTimeout" and f"rank {victim}" in detail, r.value
            assert seconds < 2 * 2, f"rank {r.rank}: {seconds:.1f} s for a 2 s budget"
        else:
            assert kind == "AbortedError" and f"rank {victim} of the symmetric heap" in detail, r.value
            assert seconds < 40, f"rank {r.rank}: {seconds:.1f} s"
