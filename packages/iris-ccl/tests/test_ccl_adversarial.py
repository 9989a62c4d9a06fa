"""Cases found by trying to break iris.ccl on purpose (CPU backend, 2-3 ranks): each must end
with the right answer (compared with torch.distributed / gloo) or a clear error on every
rank, never wrong data, a hang or a leak (conftest.py checks /dev/shm around every test)."""

import gc
import os
import threading
import time
import weakref

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import make_input, mismatch, reduced

import iris.ccl
import iris.mem
from iris.mem.testing import run_world

pytestmark = [pytest.mark.timeout(300)]

#: Short waits; the watchdog off, so that a peer that already gave up and exited leaves the
#: others to their own wait timeout (test_ccl_dead_peer.py covers the watchdog).
SHORT_WAIT = {"IRIS_WAIT_TIMEOUT": "1", "IRIS_WATCHDOG": "0"}


# --------------------------------------------------------------------------- settings
STAGING_VALUES = ["3000", "1", "0", "-5", "lots"]


def staging_setting_body(rank, world_size):
    messages = []
    for value in STAGING_VALUES:  # read at every call
        os.environ["IRIS_CCL_STAGING_BYTES"] = value
        x = torch.ones(100)
        try:
            iris.ccl.all_reduce(x, x)  # staged: reads IRIS_CCL_STAGING_BYTES
        except ValueError as e:
            messages.append(str(e))
        else:
            messages.append(None)
    return messages


def test_staging_bytes_is_validated_with_its_minimum():
    """A staging size below 16 KiB (3000 used to fail in range(), 1 in a view) or not a
    positive number is refused on every rank when the setting is read, naming the variable."""
    for messages in run_world(staging_setting_body, 2, timeout=120):
        for value, message in zip(STAGING_VALUES, messages):
            assert message is not None and "IRIS_CCL_STAGING_BYTES" in message, (value, message)
            if value in ("3000", "1"):
                assert f"must be at least 16384 bytes, got {value!r}" in message, message


# --------------------------------------------------------------------------- groups
def crossed_groups_body(rank, world_size, on_heap):
    """Two groups with the same members, all_reduces issued in crossed order on them (rank
    0: A then B, rank 1: B then A) after a warm-up in the same order."""
    heap = iris.mem.init(1 << 22) if on_heap else None
    groups = {"A": dist.new_group([0, 1]), "B": dist.new_group([0, 1])}
    n = 1000

    def tensor(name):
        x = make_input((n,), torch.float32, rank, salt=ord(name))
        return heap.as_symmetric(x) if on_heap else x

    for name in "AB":  # warm-up: the groups' state is made by host collectives
        iris.ccl.all_reduce(tensor(name), tensor(name), group=groups[name])
    inputs = {name: tensor(name) for name in "AB"}
    wants = {name: reduced(x, "SUM") for name, x in inputs.items()}
    outcome = {}
    for name in "AB" if rank == 0 else "BA":
        x = inputs[name]
        try:
            iris.ccl.all_reduce(x, x, group=groups[name], async_op=True).wait()
        except iris.mem.DeviceWaitTimeout:
            outcome[name] = "timeout"  # the crossed calls wait for each other: both give up
            continue
        outcome[name] = mismatch(x, wants[name], f"group {name}") or "ok"
    if heap is not None:
        heap.close()
    return outcome


@pytest.mark.parametrize("on_heap", [False, True], ids=["staged", "in_place"])
def test_groups_with_the_same_members_keep_their_own_state(on_heap):
    """Each call gives the right sum or a DeviceWaitTimeout; never the other group's data
    (a shared state mixed them: rank 0's A reduced with rank 1's B)."""
    results = run_world(crossed_groups_body, 2, on_heap, env=SHORT_WAIT, timeout=180)
    for rank, outcome in enumerate(results):
        for name, what in outcome.items():
            assert what in ("ok", "timeout"), f"rank {rank}, group {name}: {what}"
    # crossed calls cannot all complete: each rank's first call waits for a peer that is in
    # the other group's call, so at least one gives up (which ones depends on timing: a call
    # whose peer already pushed its data before giving up completes correctly)
    assert "timeout" in (results[0]["A"], results[1]["B"]), results


# --------------------------------------------------------------------------- aliasing
#: The default and the variants that run on the caller's heap; the rest in tests_full.
OVERLAP_VARIANTS = ["auto", "one_shot", "two_shot", "ring"]
OVERLAP_VARIANTS_FULL = ["ll", "boxed", "two_shot_push", "atomic", "spinlock"]


def overlap_body(rank, world_size, variants):
    """all_reduce(out, inp) with ``out`` one element off ``inp`` in one buffer, both ways, on
    a heap and not; then ``out is inp`` on the heap, which must stay in place."""
    n = 3000  # several tiles of every variant, not a multiple of any
    bad = []
    with iris.mem.init(1 << 22) as heap:
        for variant in variants:
            cfg = iris.ccl.Config(variant=variant)
            for on_heap in (False, True):
                for shift in (1, -1):
                    buf = heap.zeros(n + 1) if on_heap else torch.zeros(n + 1)
                    inp, out = (buf[:n], buf[1:]) if shift == 1 else (buf[1:], buf[:n])
                    inp.copy_(make_input((n,), torch.float32, rank, salt=shift))
                    want = reduced(inp, "SUM")
                    iris.ccl.all_reduce(out, inp, config=cfg)
                    where = f"{variant}, {'heap' if on_heap else 'plain'}, out = inp shifted by {shift}"
                    if problem := mismatch(out, want, where):
                        bad.append(problem)
        own_before = iris.ccl._comm._communicators(None).get(None)
        x = heap.as_symmetric(make_input((n,), torch.float32, rank))
        want = reduced(x, "SUM")
        iris.ccl.all_reduce(x, x, config=iris.ccl.Config(variant="two_shot"))
        if problem := mismatch(x, want, "out is inp on the heap"):
            bad.append(problem)
        if iris.ccl._comm._communicators(None).get(None) is not own_before:
            bad.append("out is inp on the heap was staged")
    return bad


@pytest.mark.parametrize(
    "variants",
    [OVERLAP_VARIANTS, pytest.param(OVERLAP_VARIANTS_FULL, marks=pytest.mark.full)],
    ids=["main", "rest"],
)
def test_all_reduce_output_overlapping_its_input(variants):
    """Each variant gives torch's result for an output that partly overlaps the input (they
    were wrong at tile edges); the exact same memory (in place) still runs on the heap."""
    for rank, bad in enumerate(run_world(overlap_body, 3, variants, timeout=240)):
        assert not bad, f"rank {rank}: " + "\n".join(bad)


# --------------------------------------------------------------------------- lifetime
def _open_files_and_mappings() -> tuple[int, int]:
    with open("/proc/self/maps") as f:
        return len(os.listdir("/proc/self/fd")), sum(1 for _ in f)


def close_cycles_body(rank, world_size, cycles):
    """init / in-place collectives / close, again and again: what each cycle leaves open."""
    seen = []
    for _ in range(cycles):
        heap = iris.mem.init(1 << 22)
        x = heap.full((1000,), float(rank + 1))
        iris.ccl.all_reduce(x, x)
        iris.ccl.all_reduce(x, x, config=iris.ccl.Config(variant="two_shot"))  # in place
        right = bool((x == world_size * sum(range(1, world_size + 1))).all())
        heap.close()
        gone = weakref.ref(heap)
        del heap, x
        gc.collect()
        seen.append((*_open_files_and_mappings(), gone() is None, right))
    return seen


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts /proc/self/fd and /proc/self/maps")
def test_closing_a_heap_releases_what_collectives_kept_of_it():
    """A heap used in place is freed by close(): iris.ccl keeps nothing of it (its flags kept
    the mapping, its descriptor and its pages: +1 descriptor and mapping per cycle)."""
    cycles = 12
    for rank, seen in enumerate(run_world(close_cycles_body, 2, cycles, timeout=240)):
        assert all(right for *_, right in seen), f"rank {rank}: wrong sums {seen}"
        assert all(gone for _, _, gone, _ in seen), f"rank {rank}: closed heaps kept alive {seen}"
        (fds0, maps0, _, _), (fds, maps, _, _) = seen[1], seen[-1]  # cycle 0 makes iris.ccl's own heap
        assert fds <= fds0, (
            f"rank {rank}: open files grew from {fds0} to {fds} over {cycles - 2} cycles: {seen}"
        )
        assert maps <= maps0 + 2, (
            f"rank {rank}: mappings grew from {maps0} to {maps} over {cycles - 2} cycles"
        )


# --------------------------------------------------------------------------- threads
def two_threads_body(rank, world_size, calls):
    """Rank 0 serves two groups, {0, 1} and {0, 2}, from two threads at once; ranks 1 and 2
    each run their group's collectives from their main thread."""
    groups = [dist.new_group([0, 1]), dist.new_group([0, 2])]
    mine = [0, 1] if rank == 0 else [rank - 1]
    problems: list[str] = []

    def work(g):
        for k in range(calls):
            x = make_input((2000,), torch.float32, rank, salt=10 * g + k)
            want = reduced(x, "SUM", group=groups[g])  # gloo, on the group
            try:
                iris.ccl.all_reduce(x, x, group=groups[g])
            except Exception as e:  # noqa: BLE001 - reported to the test
                problems.append(f"group {g}, call {k}: {type(e).__name__}: {e}")
                return
            if problem := mismatch(x, want, f"group {g}, call {k}"):
                problems.append(problem)

    threads = [threading.Thread(target=work, args=(g,)) for g in mine]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return problems


def test_collectives_from_two_threads_of_a_rank():
    """Kernels of one process run one at a time where they are interpreted (Triton's
    interpreter keeps global state: two threads gave wrong sums, then interpreter errors):
    every call of both threads gives torch's result."""
    for rank, problems in enumerate(run_world(two_threads_body, 3, 6, env=SHORT_WAIT, timeout=240)):
        assert not problems, f"rank {rank}: " + "\n".join(problems)


def crossed_threads_body(rank, world_size):
    """Two groups with the same members, one thread each on both ranks, one all_reduce per
    thread: the threads' kernels run one at a time per process, in an order that may differ
    between the ranks."""
    groups = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    outcome = {}

    def work(g):
        x = make_input((1000,), torch.float32, rank, salt=g)
        want = reduced(x, "SUM", group=groups[g])
        try:
            iris.ccl.all_reduce(x, x, group=groups[g])
        except iris.mem.DeviceWaitTimeout:
            outcome[g] = "timeout"
        else:
            outcome[g] = mismatch(x, want, f"group {g}") or "ok"

    threads = [threading.Thread(target=work, args=(g,)) for g in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


@pytest.mark.full
def test_threads_on_groups_with_the_same_members():
    """Where the ranks ran the two threads' kernels in crossed order, both calls of that
    order wait for each other and give up (DeviceWaitTimeout); no call gives wrong data."""
    for rank, outcome in enumerate(run_world(crossed_threads_body, 2, env=SHORT_WAIT, timeout=240)):
        assert sorted(outcome) == [0, 1] and set(outcome.values()) <= {"ok", "timeout"}, (rank, outcome)


# --------------------------------------------------------------------------- tensor kinds
def _kind_call(heap, rank: int, odd: bool) -> torch.Tensor:
    """all_reduce of ones: a heap tensor where ``odd``, a plain tensor elsewhere (every rank
    allocates the heap tensor: allocation stays symmetric; two_shot: a variant that runs in
    place where it can)."""
    on_heap = heap.ones(500)
    x = on_heap if odd else torch.ones(500)
    iris.ccl.all_reduce(x, x, config=iris.ccl.Config(variant="two_shot"))
    return x


def kinds_body(rank, world_size, warm):
    """Rank 0 passes a heap tensor, the others plain tensors. ``warm``: every rank has run
    both kinds before (so both communicators exist)."""
    outcome = []
    with iris.mem.init(1 << 22) as heap:
        if warm:
            for odd in (True, False):
                _kind_call(heap, rank, odd)
        started = time.monotonic()
        try:
            _kind_call(heap, rank, rank == 0)
        except (ValueError, iris.mem.DeviceWaitTimeout) as e:
            outcome.append((type(e).__name__, str(e), time.monotonic() - started))
        else:
            outcome.append(None)
        if not outcome[0] or outcome[0][0] != "DeviceWaitTimeout":  # still in step: both kinds work
            for odd in (True, False):
                outcome.append(float(_kind_call(heap, rank, odd)[0]))
    return outcome


KIND_WORDS = "ranks [0] passed tensors on a symmetric heap spanning the group"


def test_heap_tensor_on_one_rank_plain_on_the_others():
    """The first call of a kind over a group agrees on the kind (a host exchange that making
    the group's state needs anyway): every rank raises the same clear error at once, instead
    of hanging in mismatched host collectives; matching calls work afterwards."""
    for rank, outcome in enumerate(run_world(kinds_body, 3, False, env=SHORT_WAIT, timeout=120)):
        assert outcome[0] is not None, f"rank {rank}: no error"
        kind, message, seconds = outcome[0]
        assert kind == "ValueError" and KIND_WORDS in message, (rank, message)
        assert "ranks [1, 2]" in message and seconds < 30, (rank, message, seconds)
        assert outcome[1:] == [3.0, 3.0], (rank, outcome)


def test_heap_tensor_on_one_rank_plain_on_the_others_debug():
    """Debug mode compares the kind at every call, like the other arguments: the same clear
    error on every rank even when both kinds ran before."""
    for warm in (False, True):
        env = {"IRIS_DEBUG": "1", **SHORT_WAIT}
        for rank, outcome in enumerate(run_world(kinds_body, 3, warm, env=env, timeout=180)):
            assert outcome[0] is not None, f"rank {rank}: no error"
            kind, message, _ = outcome[0]
            assert kind == "ValueError" and "ranks [0] called it with arguments that differ" in message, (
                message
            )
            assert "tensors: rank 0 'heap', rank 1 'staged'" in message, message
            assert outcome[1:] == [3.0, 3.0], (rank, outcome)


def test_heap_tensor_on_one_rank_plain_on_the_others_warm():
    """Both communicators made earlier: the two kinds wait on different flags, and every rank
    gives up after IRIS_WAIT_TIMEOUT naming the kind of tensors as a cause."""
    for rank, outcome in enumerate(run_world(kinds_body, 3, True, env=SHORT_WAIT, timeout=180)):
        assert outcome[0] is not None, f"rank {rank}: no error"
        kind, message, _ = outcome[0]
        assert kind == "DeviceWaitTimeout" and "tensors of the same kind" in message, (rank, message)


def crossed_checks_body(rank, world_size):
    """Debug mode, ranks at different checks: rank 0 allocates (the allocation check), the
    others call a collective (the argument check); both are host exchanges over the world."""
    with iris.mem.init(1 << 22) as heap:
        try:
            if rank == 0:
                heap.zeros(10)
            else:
                x = torch.ones(10)
                iris.ccl.all_reduce(x, x)
        except (ValueError, iris.mem.HeapMismatchError) as e:
            return type(e).__name__, str(e)
    return None


def test_debug_checks_of_ranks_at_different_calls():
    """Each check says that the ranks are at different calls (they failed with TypeError,
    AttributeError or garbage values)."""
    results = run_world(crossed_checks_body, 3, env={"IRIS_DEBUG": "1"}, timeout=120)
    for rank, outcome in enumerate(results):
        assert outcome is not None, f"rank {rank}: no error"
        kind, message = outcome
        assert kind == ("HeapMismatchError" if rank == 0 else "ValueError"), (rank, outcome)
        assert "ranks are at different calls" in message, (rank, message)
        assert "rank 0: heap allocation" in message and "rank 1: iris.ccl collective" in message, message


# --------------------------------------------------------------------------- uneven all_to_all
def _uneven_kind_call(heap, rank: int, world_size: int, odd: bool) -> torch.Tensor:
    """An uneven all_to_all (``push``: bulk pairs go straight into a heap output) whose output
    is a heap tensor where ``odd``, a plain tensor elsewhere (every rank allocates it:
    allocation stays symmetric). Rank ``i`` sends ``i + j + 1`` rows to rank ``j``."""
    rows = [rank + j + 1 for j in range(world_size)]
    back = [i + rank + 1 for i in range(world_size)]
    on_heap = heap.zeros(sum(back), 3)
    out = on_heap if odd else torch.zeros(sum(back), 3)
    inp = torch.full((sum(rows), 3), float(rank))
    iris.ccl.all_to_all(out, inp, back, rows, config=iris.ccl.Config(variant="push"))
    want = torch.cat([torch.full((n, 3), float(i)) for i, n in enumerate(back)])
    assert torch.equal(out, want), f"rank {rank}: wrong rows"
    return out


def uneven_kinds_body(rank, world_size):
    """Rank 0 passes a heap output, the others plain ones: first in a fresh world, then
    after both kinds ran."""
    outcome = []
    with iris.mem.init(1 << 22) as heap:
        for attempt in ("first", "warm"):
            started = time.monotonic()
            try:
                _uneven_kind_call(heap, rank, world_size, rank == 0)
            except (ValueError, iris.mem.CallMismatchError, iris.mem.DeviceWaitTimeout) as e:
                outcome.append((attempt, type(e).__name__, str(e), time.monotonic() - started))
            else:
                outcome.append((attempt, None, None, time.monotonic() - started))
            for odd in (True, False):  # matching calls of both kinds work
                _uneven_kind_call(heap, rank, world_size, odd)
    return outcome


def test_uneven_heap_output_on_one_rank_plain_on_the_others():
    """The first uneven call of a kind over a group agrees on it like the equal-split form:
    the same ValueError on every rank at once (rank 0 waited in a host exchange for the
    group's timeout, the others in the kernel); once both kinds ran, the call signature
    (which says whether bulk pairs move directly) makes every rank raise CallMismatchError
    instead of waiting for IRIS_WAIT_TIMEOUT."""
    for rank, outcome in enumerate(run_world(uneven_kinds_body, 3, env=SHORT_WAIT, timeout=60)):
        (_, kind, message, seconds), (_, warm_kind, warm_message, warm_seconds) = outcome
        assert kind == "ValueError" and KIND_WORDS in message, (rank, outcome)
        assert "ranks [1, 2]" in message and seconds < 10, (rank, message, seconds)
        assert warm_kind == "CallMismatchError" and "direct=" in warm_message, (rank, outcome)
        assert warm_seconds < 10, (rank, warm_seconds)


# --------------------------------------------------------------------------- aborted heaps
def aborted_heap_body(rank, world_size):
    """Every rank aborts its heap; then collectives that stage the heap's tensors (auto on a
    small message, ll, boxed, uneven all_to_all) and one that runs in place must refuse them
    before anything runs, as they refuse a closed heap's, and leave them unwritten."""
    heap = iris.mem.init(1 << 22)
    x = heap.full((100,), float(rank + 1))
    iris.ccl.all_reduce(x, x)  # fine while the heap lives
    heap.abort("the trainer gave up")
    x_before = x.clone()
    plain = torch.ones(100)
    rows = [2] * world_size
    heap_out = x[: 10 * world_size]
    calls = {
        "auto, heap input": lambda: iris.ccl.all_reduce(torch.zeros(100), x),
        "ll, heap output": lambda: iris.ccl.all_reduce(x, plain, config=iris.ccl.Config(variant="ll")),
        "boxed, heap output": lambda: iris.ccl.all_gather(
            heap_out, plain[:10], config=iris.ccl.Config(variant="boxed")
        ),
        "uneven, heap output": lambda: iris.ccl.all_to_all(
            x[: 2 * world_size], plain[: 2 * world_size], rows, rows
        ),
        "broadcast": lambda: iris.ccl.broadcast(x, src=0),
    }
    outcome = {}
    for what, call in calls.items():
        try:
            call()
        except iris.mem.AbortedError as e:
            outcome[what] = "the trainer gave up" in str(e)
        except Exception as e:  # noqa: BLE001 - reported to the test
            outcome[what] = f"{type(e).__name__}: {e}"
        else:
            outcome[what] = "no error"
    written = not torch.equal(x, x_before)
    heap.close()
    return outcome, written


def test_aborted_heap_tensors_are_refused():
    """heap.abort() is enforced for every collective, also those that only stage the
    heap's tensors through iris.ccl's own heap (they ran and wrote them)."""
    for rank, (outcome, written) in enumerate(run_world(aborted_heap_body, 2, timeout=120)):
        assert all(v is True for v in outcome.values()), f"rank {rank}: {outcome}"
        assert not written, f"rank {rank}: a refused call wrote the aborted heap's tensor"


# --------------------------------------------------------------------------- groups' lifetime
def _live_heaps() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, iris.mem.SymmetricHeap) and not o.closed)


def group_cycles_body(rank, world_size, cycles):
    """new_group / collectives on it / destroy_process_group(group), again and again: what
    each cycle leaves open (the group's communicator held a heap that held the group)."""
    seen = []
    groups = []
    for _ in range(cycles):
        group = dist.new_group(list(range(world_size)))
        x = torch.ones(1000)
        iris.ccl.all_reduce(x, x, group=group)
        right = bool((x == world_size).all())
        dist.destroy_process_group(group)
        groups.append(weakref.ref(group))
        del group
        gc.collect()
        alive = sum(g() is not None for g in groups)
        seen.append((*_open_files_and_mappings(), _live_heaps(), alive, right))
    return seen


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts /proc/self/fd and /proc/self/maps")
def test_destroyed_groups_release_their_communicators():
    """A group made with dist.new_group, used by iris.ccl and destroyed is released, with
    iris.ccl's heap for it, at the latest when the next group is first used: each cycle kept
    a heap (7 descriptors, 2 mappings, 4.5 MiB a rank)."""
    cycles = 6
    for rank, seen in enumerate(run_world(group_cycles_body, 2, cycles, timeout=120)):
        assert all(right for *_, right in seen), f"rank {rank}: wrong sums {seen}"
        (fds0, maps0, heaps0, _, _), (fds, maps, heaps, _, _) = seen[1], seen[-1]
        assert heaps <= heaps0, f"rank {rank}: open heaps grew from {heaps0} to {heaps}: {seen}"
        assert fds <= fds0, (
            f"rank {rank}: open files grew from {fds0} to {fds} over {cycles - 2} cycles: {seen}"
        )
        assert maps <= maps0 + 2, f"rank {rank}: mappings grew from {maps0} to {maps}: {seen}"
        assert all(alive <= 1 for *_, alive, _ in seen), f"rank {rank}: destroyed groups kept: {seen}"


# --------------------------------------------------------------------------- one budget per call
def late_two_shot_body(rank, world_size, budget):
    """Rank 1 skips a two_shot all_reduce that rank 0 makes (rank 1 stays alive): rank 0's
    call must end after about one IRIS_WAIT_TIMEOUT, not one per wait of the call."""
    x = torch.ones(5000)
    iris.ccl.all_reduce(x, x, config=iris.ccl.Config(variant="two_shot"))  # the group's state
    seconds = None
    if rank == 0:
        started = time.monotonic()
        with pytest.raises(iris.mem.DeviceWaitTimeout):
            iris.ccl.all_reduce(x, x, config=iris.ccl.Config(variant="two_shot"))
        seconds = time.monotonic() - started
    dist.barrier()  # rank 1 waits here (on the host) meanwhile
    return seconds


def test_a_call_waits_at_most_one_budget():
    """Every wait of a call gives up once the call has timed out (two_shot waited 4 budgets)."""
    budget = 1.5
    seconds = run_world(late_two_shot_body, 2, budget, env={**SHORT_WAIT, "IRIS_WAIT_TIMEOUT": str(budget)},
                        timeout=120)[0]  # fmt: skip
    assert budget <= seconds < 1.8 * budget, f"{seconds:.1f} s for a {budget} s budget"


def _host_collectives() -> tuple[dict, list]:
    """Count the host collectives of torch.distributed this process makes (patched in)."""
    counts: dict[str, int] = {}
    undo = []
    for name in ("barrier", "all_gather_object", "broadcast_object_list", "gather_object", "all_reduce"):
        real = getattr(dist, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*args, **kwargs)

        setattr(dist, name, counted)
        undo.append((name, real))
    return counts, undo


def first_uneven_body(rank, world_size):
    """After an equal all_to_all (which makes the group's state, with host collectives),
    the first uneven calls, staged and on heap outputs, make none."""
    with iris.mem.init(1 << 22) as heap:
        x = torch.ones(6 * world_size)
        iris.ccl.all_to_all(torch.empty_like(x), x)
        counts, undo = _host_collectives()
        try:
            for variant in ("auto", "boxed", "push"):
                rows = [rank + j + 1 for j in range(world_size)]
                back = [i + rank + 1 for i in range(world_size)]
                for out in (torch.zeros(sum(back), 3), heap.zeros(sum(back), 3)):
                    inp = torch.full((sum(rows), 3), float(rank))
                    iris.ccl.all_to_all(out, inp, back, rows, config=iris.ccl.Config(variant=variant))
                    want = torch.cat([torch.full((n, 3), float(i)) for i, n in enumerate(back)])
                    assert torch.equal(out, want), (variant, out)
        finally:
            for name, real in undo:
                setattr(dist, name, real)
        heap.barrier()
    return counts


def test_first_uneven_calls_make_no_host_collective():
    """The first uneven call ran a host barrier (zeroing a staging buffer) and, on heap
    tensors, a host exchange and a barrier (a communicator on the caller's heap)."""
    for rank, counts in enumerate(run_world(first_uneven_body, 3, timeout=120)):
        assert counts == {}, f"rank {rank}: host collectives {counts}"
