"""Cases found by trying to break iris.ops on purpose (CPU backend, 2-3 ranks): each must end
with the right answer (compared with a float64 matmul and torch.distributed) or a clear
error on every rank, never wrong data, a hang or a leak (conftest.py checks /dev/shm around
every test)."""

import gc
import os
import time
import weakref

import pytest
import torch
from ops_testutils import mismatch, peak, rand, require_world, seed, summed

from iris.mem.testing import run_world

pytestmark = [pytest.mark.timeout(300)]

#: Short waits; the watchdog off, so that a peer that already gave up and exited leaves the
#: others to their own wait timeout.
SHORT_WAIT = {"IRIS_WAIT_TIMEOUT": "1", "IRIS_WATCHDOG": "0"}
#: (M, N, K): no dimension a multiple of any block, small enough to interpret quickly.
SHAPE = (13, 11, 9)


def _operands(rank: int, case: int, dtype=torch.float32):
    m, n, k = SHAPE
    return rand((m, k), dtype, seed(rank, case, 0)), rand((k, n), dtype, seed(rank, case, 1))


def _check(out, a, b, what: str) -> str | None:
    """None when ``out`` is the all-reduced ``a @ b`` over the world (gloo), else why not."""
    partial = a.double() @ b.double()
    want = summed(partial)
    return mismatch(out, want, 2 * peak(partial) + want.abs().max().item(), what)


# --------------------------------------------------------------------------- groups
def same_members_body(rank, world_size, on_heap):
    """Two groups with the same members: calls alternating between them, a workspace of one
    passed to the other, then an async call issued in crossed order (rank 0 on A, rank 1 on
    B)."""
    import torch.distributed as dist

    import iris.mem
    import iris.ops

    groups = {"A": dist.new_group([0, 1]), "B": dist.new_group([0, 1])}
    m, n, _ = SHAPE
    heap = iris.mem.init(1 << 22)
    outs = {g: heap.zeros((m, n)) if on_heap else torch.zeros(m, n) for g in "AB"}
    bad = []
    for case, g in enumerate("AB"):  # alternating, the same order on both ranks
        a, b = _operands(rank, case)
        iris.ops.matmul_all_reduce(outs[g], a, b, group=groups[g])
        if problem := _check(outs[g], a, b, f"alternating call {case}, group {g}"):
            bad.append(problem)
    ws = iris.ops.Workspace()
    a, b = _operands(rank, 50)
    iris.ops.matmul_all_reduce(outs["A"], a, b, group=groups["A"], workspace=ws)
    try:
        iris.ops.matmul_all_reduce(outs["B"], a, b, group=groups["B"], workspace=ws)
        bad.append("a workspace prepared for group A was accepted for group B (same members)")
    except ValueError as e:
        if "another process group" not in str(e):
            bad.append(f"unexpected error text: {e}")
    ws.close()
    # Crossed: each rank's call waits for a peer that is in the other group's call. The
    # calls that would follow are not made: after a wait timeout a group's members are out
    # of step (docs/failure-modes.md), so what they return is not defined.
    first = "A" if rank == 0 else "B"
    a, b = _operands(rank, 100)
    try:
        iris.ops.matmul_all_reduce(outs[first], a, b, group=groups[first], async_op=True).wait()
    except iris.mem.DeviceWaitTimeout:
        outcome = "timeout"
    else:
        outcome = _check(outs[first], a, b, f"crossed call, group {first}") or "ok"
    dist.barrier()  # no rank leaves (and exits) while its peer's call still waits for it
    iris.ops.release_workspaces()
    heap.close()
    return bad, outcome


@pytest.mark.parametrize(
    "on_heap", [pytest.param(False, marks=pytest.mark.full), True], ids=["staged", "in_place"]
)
def test_groups_with_the_same_members_keep_their_own_workspaces(on_heap):
    """Workspaces belong to the group object: alternating calls are right, a workspace is
    refused for another group with the same members, and crossed calls give up with a
    DeviceWaitTimeout, never the other group's data (a workspace shared by member list
    paired rank 0's call on A with rank 1's on B: wrong sums)."""
    results = run_world(same_members_body, 2, on_heap, env=SHORT_WAIT, timeout=240)
    for rank, (bad, outcome) in enumerate(results):
        assert not bad, f"rank {rank}: " + "\n".join(bad)
        assert outcome in ("ok", "timeout"), f"rank {rank}, first crossed call: {outcome}"
    assert "timeout" in (results[0][1], results[1][1]), results


# --------------------------------------------------------------------------- lifetime
def _open_files_and_mappings() -> tuple[int, int]:
    with open("/proc/self/maps") as f:
        return len(os.listdir("/proc/self/fd")), sum(1 for _ in f)


def close_cycles_body(rank, world_size, cycles):
    """init / fused ops with the output on the heap (the ops' own workspace and a caller's
    workspace kept across cycles) / close, again and again: what each cycle leaves open."""
    import iris.mem
    import iris.ops

    m, n, _ = SHAPE
    kept = iris.ops.Workspace()  # outlives every heap
    seen = []
    for cycle in range(cycles):
        heap = iris.mem.init(1 << 22)
        out = heap.zeros((m, n))
        a, b = _operands(rank, cycle)
        iris.ops.matmul_all_reduce(out, a, b)  # the op's own workspace, on the heap
        right = _check(out, a, b, f"cycle {cycle}") is None
        iris.ops.matmul_all_reduce(out, a, b, workspace=kept)
        right = right and _check(out, a, b, f"cycle {cycle}, kept workspace") is None
        heap.close()
        forgot = kept.heap is None and not kept.buffers and not kept.prepared
        gone = weakref.ref(heap)
        del heap, out
        for _ in range(20):  # another thread (iris.mem's watchdog) may hold it for a moment
            gc.collect()
            if gone() is None:
                break
            time.sleep(0.05)
        seen.append((*_open_files_and_mappings(), gone() is None, right and forgot))
    return seen


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts /proc/self/fd and /proc/self/maps")
def test_closing_a_heap_releases_what_fused_ops_kept_of_it():
    """A heap holding fused ops' workspaces is freed by close(): the workspaces forget it
    (they kept its mapping, descriptor and pages: +1 descriptor and mapping per cycle)."""
    cycles = 5
    for rank, seen in enumerate(run_world(close_cycles_body, 2, cycles, timeout=240)):
        assert all(ok for *_, ok in seen), f"rank {rank}: wrong results or a workspace kept its heap {seen}"
        assert all(gone for _, _, gone, _ in seen), f"rank {rank}: closed heaps kept alive {seen}"
        (fds0, maps0, _, _), (fds, maps, _, _) = seen[1], seen[-1]
        assert fds <= fds0, (
            f"rank {rank}: open files grew from {fds0} to {fds} over {cycles - 2} cycles: {seen}"
        )
        assert maps <= maps0 + 2, (
            f"rank {rank}: mappings grew from {maps0} to {maps} over {cycles - 2} cycles"
        )


def closed_heap_body(rank, world_size):
    """Tensors of a closed heap passed to fused ops (and a collective): refused at once."""
    import iris.ccl
    import iris.mem
    import iris.ops

    m, n, k = SHAPE
    heap = iris.mem.init(1 << 22)
    out = heap.zeros((m, n))
    a_heap, b = heap.as_symmetric(_operands(rank, 1)[0]), _operands(rank, 1)[1]
    iris.ops.matmul_all_reduce(out, a_heap, b)  # fine while open
    iris.ops.release_workspaces()
    heap.close()
    calls = {
        "out on a closed heap": lambda: iris.ops.matmul_all_reduce(out, *_operands(rank, 2)),
        "a on a closed heap": lambda: iris.ops.matmul_all_reduce(torch.zeros(m, n), a_heap, b),
        "all_gather_matmul": lambda: iris.ops.all_gather_matmul(torch.zeros(m * world_size, n), a_heap, b),
        "iris.ccl.all_reduce": lambda: iris.ccl.all_reduce(out, out),
    }
    outcome = {}
    for what, call in calls.items():
        try:
            call()
        except iris.mem.UseAfterFreeError as e:
            outcome[what] = "closed" if "closed" in str(e) else f"unclear: {e}"
        except Exception as e:  # noqa: BLE001 - reported to the test
            outcome[what] = f"{type(e).__name__}: {e}"
        else:
            outcome[what] = "ran"
    iris.ops.release_workspaces()
    return outcome


@pytest.mark.parametrize("world_size", [1, 3])
def test_fused_op_on_tensors_of_a_closed_heap_raises(world_size):
    """A closed heap's tensors (still readable in this process on the CPU backend; freed
    device memory on GPUs) are refused with an error saying so, on every rank; they ran."""
    require_world(world_size)
    for rank, outcome in enumerate(run_world(closed_heap_body, world_size, timeout=120)):
        assert set(outcome.values()) == {"closed"}, f"rank {rank}: {outcome}"
