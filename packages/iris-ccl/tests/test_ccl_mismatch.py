"""Ranks that make different calls of one collective (element count, dtype, reduction,
collective, root) get a CallMismatchError on every rank naming both calls, with default
settings and no debug mode, instead of wrong values or a wait timeout; the group works again
at its next call."""

import pytest
import torch

import iris.ccl
import iris.mem
from iris.ccl import Config
from iris.mem.testing import run_world

pytestmark = [pytest.mark.timeout(300)]


def _all_reduce(rank, heap, n, dtype=torch.float32, op="sum", variant=None):
    x = heap.ones(n, dtype=dtype) if heap is not None else torch.ones(n, dtype=dtype)
    out = heap.zeros(n, dtype=dtype) if heap is not None else torch.zeros(n, dtype=dtype)
    iris.ccl.all_reduce(out, x, op=op, config=Config(variant=variant) if variant else None)
    return out


def _case(rank, world_size, name, call):
    """Run ``call``; the error text, or a note that the call returned."""
    try:
        call()
    except iris.mem.CallMismatchError as e:
        return name, str(e)
    return name, None


def mismatch_body(rank, world_size):
    heap = iris.mem.init(1 << 20)
    first = rank == 0
    cases = [
        # the example: 12 elements on rank 0, 15 elsewhere (small: the ll variant)
        ("count", lambda: _all_reduce(rank, None, 12 if first else 15)),
        ("dtype", lambda: _all_reduce(rank, None, 15, torch.bfloat16 if first else torch.float32)),
        # in place on the caller's heap, barrier-based variant
        ("op", lambda: _all_reduce(rank, heap, 15, op="max" if first else "sum", variant="one_shot")),
        (
            "collective",
            lambda: (
                iris.ccl.all_gather(torch.zeros(3 * world_size), torch.ones(3))
                if first
                else _all_reduce(rank, None, 3)
            ),
        ),
        ("root", lambda: iris.ccl.broadcast(torch.ones(40), src=0 if first else 1)),
    ]
    results = [_case(rank, world_size, name, call) for name, call in cases]
    # After each mismatch the group's state was rebuilt: a right call gives the right answer.
    out = _all_reduce(rank, None, 33)
    heap.close()
    return results, out.tolist()


def test_mismatched_calls_raise_on_every_rank_naming_both():
    ranks = run_world(mismatch_body, 3, timeout=240)
    for rank, (results, out) in enumerate(ranks):
        assert out == [3.0] * 33
        for name, message in results:
            assert message is not None, f"rank {rank}: the {name} mismatch returned"
            if name in ("count", "dtype", "op"):
                mine, theirs = {
                    "count": ("count=12", "count=15"),
                    "dtype": ("bfloat16", "float32"),
                    "op": ("op=max", "op=sum"),
                }[name]
                if rank != 0:
                    mine, theirs = theirs, mine
                assert "this rank called all_reduce(" in message and mine in message, message
                assert f"but rank {1 if rank == 0 else 0} called all_reduce(" in message, message
                assert theirs in message, message


def matched_body(rank, world_size):
    """Signatures never flag calls that agree: many sizes, dtypes, variants, in a row."""
    heap = iris.mem.init(1 << 20)
    for n in (1, 7, 300, 4099):
        for dtype in (torch.float32, torch.bfloat16):
            for variant in (None, "ll", "one_shot", "two_shot"):
                out = _all_reduce(rank, heap if n % 2 else None, n, dtype, variant=variant)
                assert torch.equal(out, torch.full((n,), float(world_size), dtype=dtype))
    heap.close()
    return True


@pytest.mark.full
def test_matched_calls_never_flagged():
    assert run_world(matched_body, 3, timeout=600) == [True] * 3
