"""Debug mode (``IRIS_DEBUG=1``): every collective compares its arguments across ranks.

Before launching anything, each rank exchanges the call's signature (collective, shapes,
dtypes, op, variant, root) over torch.distributed; a mismatch raises the same ValueError on
every rank, naming the differing ranks and fields. One world runs every case in turn: an
error leaves no collective half done, so the next case starts clean.
"""

import pytest
import torch
import torch.distributed as dist

import iris.ccl
import iris.mem
from iris.mem.testing import run_world

pytestmark = [pytest.mark.timeout(300)]

WORLD = 3
DEBUG = {"IRIS_DEBUG": "1"}


def _call(case: str, rank: int) -> None:
    """One collective call whose arguments differ between ranks according to ``case``."""
    shape = [5] if case == "shapes" and rank == 2 else [4]
    dtype = torch.int32 if case == "dtypes" and rank == 1 else torch.float32
    x = torch.ones(shape, dtype=dtype)
    if case == "op":
        iris.ccl.all_reduce(x, x, op="max" if rank == 0 else "sum")
    elif case == "variant":
        variant = "ring" if rank == 2 else "one_shot"
        iris.ccl.all_reduce(x, x, config=iris.ccl.Config(variant=variant))
    elif case == "root":
        iris.ccl.broadcast(x, src=1 if rank == 1 else 0)
    elif case == "collective":
        if rank == 2:
            iris.ccl.barrier()
        else:
            iris.ccl.all_reduce(x, x)
    else:
        iris.ccl.all_reduce(x, x)


CASES = ["shapes", "dtypes", "op", "variant", "root", "collective"]


def debug_body(rank, world_size):
    assert iris.mem.debug_enabled()
    messages = {}
    for case in CASES:
        try:
            _call(case, rank)
        except ValueError as e:
            messages[case] = str(e)
        else:
            messages[case] = None
    # A matching call still works after the errors (and goes through the exchange).
    x = torch.full((1000,), float(rank + 1))
    iris.ccl.all_reduce(x, x)
    ok = bool((x == sum(range(1, world_size + 1))).all())
    iris.ccl.broadcast(x, src=2)
    return messages, ok


#: case -> (the rank whose arguments differ, how the field list starts)
EXPECTED = {
    "shapes": (2, "shapes:"),
    "dtypes": (1, "dtypes:"),
    "op": (0, "op:"),
    "variant": (2, "variant:"),
    "root": (1, "root:"),
    "collective": (2, "collective,"),  # a barrier passes no shapes...: those differ too
}


def test_mismatched_arguments_raise_on_every_rank():
    results = run_world(debug_body, WORLD, env=DEBUG, timeout=240)
    for rank, (messages, ok) in enumerate(results):
        assert ok, f"rank {rank}: the matching call gave a wrong result"
        for case, (odd, fields) in EXPECTED.items():
            message = messages[case]
            assert message is not None, f"rank {rank}: case {case!r} raised nothing"
            others = [r for r in range(WORLD) if r != odd]
            want = f"ranks [{odd}] called it with arguments that differ from ranks {others} in {fields}"
            assert want in message, (case, message)
        assert messages == results[0][0], "every rank raises the same error"


def debug_off_body(rank, world_size):
    assert not iris.mem.debug_enabled()
    x = torch.full((1000,), float(rank + 1))
    iris.ccl.all_reduce(x, x)  # makes iris.ccl's heap for the world
    exchanged = []
    real = dist.all_gather_object
    dist.all_gather_object = lambda *a, **k: exchanged.append(1) or real(*a, **k)
    try:
        y = torch.full((7,), float(rank))
        iris.ccl.all_reduce(y, y, op="max")
        iris.ccl.broadcast(x, src=0)
    finally:
        dist.all_gather_object = real
    return bool((y == world_size - 1).all()) and bool((x == 6).all()), len(exchanged)


def test_debug_off_exchanges_nothing():
    for ok, exchanges in run_world(debug_off_body, WORLD, env={"IRIS_DEBUG": "0"}, timeout=240):
        assert ok and exchanges == 0


def freed_body(rank, world_size):
    """A heap tensor freed and then handed to a collective is refused (debug mode); the same
    call on a live tensor works."""
    with iris.mem.init(1 << 20) as heap:
        x = heap.full((300,), float(rank + 1))
        heap.free(x)
        caught = []
        for call in (lambda: iris.ccl.all_reduce(x, x), lambda: iris.ccl.broadcast(x[1:], src=0)):
            try:
                call()
            except iris.mem.UseAfterFreeError as e:
                caught.append(str(e))
        y = heap.full((300,), float(rank + 1))  # reuses x's range: live again
        iris.ccl.all_reduce(y, y)
        return caught, bool((y == sum(range(1, world_size + 1))).all())


def test_freed_heap_tensors_are_refused():
    for caught, ok in run_world(freed_body, WORLD, env=DEBUG, timeout=240):
        assert ok
        assert len(caught) == 2 and all("freed" in c for c in caught), caught
