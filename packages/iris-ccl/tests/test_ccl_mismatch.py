"""Ranks that make different calls of one collective (element count, dtype, reduction,
collective, root) get a CallMismatchError on every rank naming both calls, with default
settings and no debug mode, instead of wrong values or a wait timeout; the group works again
at its next call."""

import os

import pytest
import torch

import iris.ccl
import iris.mem
from iris.ccl import Config
from iris.mem.testing import gpu_skip_reason, run_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
#: 3 ranks on both tiers (on GPUs on as many GPUs as there are, up to 3: ranks share the rest).
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


def _all_reduce(rank, heap, n, dtype=torch.float32, op="sum", variant=None):
    dev = _device()
    x = heap.ones(n, dtype=dtype) if heap is not None else torch.ones(n, dtype=dtype, device=dev)
    out = heap.zeros(n, dtype=dtype) if heap is not None else torch.zeros(n, dtype=dtype, device=dev)
    iris.ccl.all_reduce(out, x, op=op, config=Config(variant=variant) if variant else None)
    return out


def _case(rank, world_size, name, call):
    """Run ``call`` and surface what the device recorded (GPUs record, the CPU raises at
    once); the error text, or None when the call returned."""
    try:
        call()
        if BACKEND == "cuda":
            torch.cuda.synchronize()
        iris.ccl.check_errors()
    except iris.mem.CallMismatchError as e:
        return name, str(e)
    return name, None


def mismatch_body(rank, world_size):
    dev = _device()
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
                iris.ccl.all_gather(torch.zeros(3 * world_size, device=dev), torch.ones(3, device=dev))
                if first
                else _all_reduce(rank, None, 3)
            ),
        ),
        ("root", lambda: iris.ccl.broadcast(torch.ones(40, device=dev), src=0 if first else 1)),
    ]
    results = [_case(rank, world_size, name, call) for name, call in cases]
    # After each mismatch the group's state was rebuilt: a right call gives the right answer.
    out = _all_reduce(rank, None, 33)
    heap.close()
    return results, out.cpu().tolist()


def test_mismatched_calls_raise_on_every_rank_naming_both():
    ranks = run_world(mismatch_body, WORLD, timeout=240)
    for rank, (results, out) in enumerate(ranks):
        assert out == [float(WORLD)] * 33
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
                assert torch.equal(out.cpu(), torch.full((n,), float(world_size), dtype=dtype))
    heap.close()
    return True


@pytest.mark.full
def test_matched_calls_never_flagged():
    assert run_world(matched_body, WORLD, timeout=600) == [True] * WORLD


def _uneven(rank, world_size, dtype=torch.float32, width=5, variant=None, heap=None, rows_of=2):
    """An uneven all_to_all of ``rows_of`` rows per pair (small pairs: the ``ll`` way by
    default), rows of ``width`` elements; ``heap``: the output on it."""
    dev = _device()
    rows = [rows_of] * world_size
    inp = torch.full((sum(rows), width), float(rank), dtype=dtype, device=dev)
    shape = (sum(rows), width)
    out = heap.zeros(shape, dtype=dtype) if heap is not None else torch.zeros(shape, dtype=dtype, device=dev)
    iris.ccl.all_to_all(out, inp, rows, rows, config=Config(variant=variant) if variant else None)
    return out


def uneven_mismatch_body(rank, world_size):
    first = rank == 0
    cases = [
        ("dtype", lambda: _uneven(rank, world_size, torch.bfloat16 if first else torch.float32)),
        ("row width", lambda: _uneven(rank, world_size, width=4 if first else 5)),
        (
            "ll dtype",
            lambda: _uneven(rank, world_size, torch.int32 if first else torch.float32, variant="ll"),
        ),
        # bulk pairs too (rows above the ll limit of "auto"): headers and barriers both disagree
        ("bulk width", lambda: _uneven(rank, world_size, width=300 if first else 301, rows_of=400)),
    ]
    results = [_case(rank, world_size, name, call) for name, call in cases]
    out = _uneven(rank, world_size)  # the group works again
    want = torch.cat([torch.full((2, 5), float(i)) for i in range(world_size)])
    return results, bool(torch.equal(out.cpu(), want))


def test_uneven_all_to_all_mismatch_raises_on_every_rank():
    """Ranks that disagree on the dtype or the row width of an uneven all_to_all raise
    CallMismatchError on every rank, like the other collectives, also where every pair is
    small (the ll way: headers and tiles carry the call's signature in their flags); they
    got garbage or zero rows before."""
    for rank, (results, right) in enumerate(run_world(uneven_mismatch_body, WORLD, timeout=240)):
        assert right, f"rank {rank}: the call after the mismatches gave wrong rows"
        for name, message in results:
            assert message is not None, f"rank {rank}: the {name} mismatch returned"
            assert "all_to_all (uneven splits)(" in message, message
