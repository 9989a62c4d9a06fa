"""``iris.ops.matmul_all_reduce`` against torch: the float64 matmul of each rank's operands,
then ``torch.distributed.all_reduce``, then the bias.

Each test starts one real world (``run_world``) and loops over its cases inside the ranks;
a case is a dtype, a shape (none of M, N, K a multiple of any block, or all of them), bias
on or off, the ownership split, and the kind of output (plain, strided, on a heap).
"""

import pytest
import torch
from ops_testutils import (
    DTYPES,
    SHAPES,
    assert_clean,
    check_calls,
    dtype_name,
    make_out,
    mismatch,
    peak,
    rand,
    require_world,
    run_cases,
    seed,
    summed,
)

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
WORLD_TIMEOUT = 240.0

# Every dtype, shape, split and output kind appears at each world size of 2 and 3.
CASES = {
    1: [
        dict(dtype=torch.float32, shape=SHAPES[0], bias=True, out_kind="plain"),
        dict(dtype=torch.bfloat16, shape=SHAPES[1], bias=False, out_kind="strided"),
        dict(dtype=torch.float16, shape=SHAPES[2], bias=True, out_kind="heap"),
    ],
    2: [
        dict(dtype=torch.bfloat16, shape=SHAPES[0], bias=True, out_kind="heap", split="m"),
        dict(dtype=torch.float32, shape=SHAPES[2], bias=False, out_kind="plain", split="n"),
        dict(dtype=torch.float16, shape=SHAPES[1], bias=True, out_kind="strided", split="auto", tma=True),
        dict(
            dtype=torch.float32,
            shape=(40, 45, 20),
            bias=True,
            out_kind="plain",
            split="m",
            order="spread",
            sms=3,
            repeat=2,
        ),
    ],
    3: [
        dict(dtype=torch.bfloat16, shape=SHAPES[0], bias=True, out_kind="plain", split="m", repeat=2),
        dict(dtype=torch.float32, shape=SHAPES[0], bias=False, out_kind="heap", split="n", repeat=2),
        dict(dtype=torch.float16, shape=SHAPES[2], bias=True, out_kind="heap", split="m"),
        # M = 2 < 3 ranks: chunk 2 owns no rows.
        dict(dtype=torch.bfloat16, shape=(2, 40, 24), bias=False, out_kind="strided", split="m"),
        # The "spread" order with 3 programs for 12-15 tiles: every program walks several
        # tiles (odd ones backwards) and parks own tiles; the output staged or in place.
        dict(
            dtype=torch.bfloat16,
            shape=(45, 40, 43),
            bias=True,
            out_kind="heap",
            split="m",
            order="spread",
            sms=3,
        ),
        dict(
            dtype=torch.float16,
            shape=(37, 50, 24),
            bias=False,
            out_kind="strided",
            split="n",
            order="spread",
            sms=3,
            repeat=2,
            stream=False,
        ),
        dict(
            dtype=torch.bfloat16,
            shape=(37, 40, 24),
            bias=True,
            out_kind="plain",
            split="m",
            sms=3,
            stream=False,
        ),
    ],
}


def ar_case(
    rank, world, case, heap, dtype, shape, bias, out_kind, split="auto", repeat=1, group=None, tma=None,
    order="auto", sms=0, stream=None,
):  # fmt: skip
    """``repeat`` calls on one workspace against the reference; returns the problems found."""
    import iris.ops

    m, n, k = shape
    out = make_out(out_kind, (m, n), dtype, heap)
    ws = iris.ops.Workspace()

    def one_call(i):
        a = rand((m, k), dtype, seed(rank, case, 3 * i))
        b = rand((k, n), dtype, seed(rank, case, 3 * i + 1))
        vec = rand((n,), dtype, seed(0, case, 3 * i + 2)) if bias else None  # the same on every rank
        cfg = iris.ops.Config(split=split, tma=tma, order=order, num_sms=sms, stream=stream, path="fused")
        returned = iris.ops.matmul_all_reduce(out, a, b, vec, config=cfg, group=group, workspace=ws)
        partial = a.double() @ b.double()
        want = summed(partial, group) + (vec.double() if bias else 0)
        return returned, out, want, world * peak(partial, group) + want.abs().max().item()

    what = f"world={world} {dtype_name(dtype)} {shape} bias={bias} {out_kind} split={split} tma={tma} {order}"
    what += f" stream={stream}"
    problems = check_calls(one_call, repeat, what)
    ws.close()
    return problems


def matrix_body(rank, world_size):
    return run_cases(ar_case, rank, world_size, CASES[world_size])


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_matches_torch(world_size):
    require_world(world_size)
    assert_clean(run_world(matrix_body, world_size, timeout=WORLD_TIMEOUT), len(CASES[world_size]))


def test_cases_cover_every_dtype_and_split():
    """The matrix above meets every dtype, split, output kind and order at worlds 2 and 3,
    with and without streaming (at world 3)."""
    for world in (2, 3):
        assert {c["dtype"] for c in CASES[world]} == set(DTYPES)
        assert {c["out_kind"] for c in CASES[world]} == {"plain", "strided", "heap"}
        assert "spread" in {c.get("order") for c in CASES[world]}
    assert {None, False} <= {c.get("stream") for c in CASES[3]}
    assert {"m", "n"} <= {c["split"] for c in CASES[3]}


def reuse_body(rank, world_size):
    """One workspace, three calls with fresh data (heap output, used in place): nothing is
    allocated after the first; an async call returns a handle; a negative control shows the
    tolerance catches a missing rank; a call with another shape is refused."""
    import torch.distributed as dist
    from ops_testutils import setup_rank

    import iris.mem
    import iris.ops

    setup_rank()
    bad, cases = [], 0
    dtype, (m, n, k) = torch.bfloat16, SHAPES[0]
    with iris.mem.init(1 << 23) as heap:
        ws = iris.ops.Workspace()
        out = heap.empty((m, n), dtype=dtype)
        used = None
        for call in range(3):
            a = rand((m, k), dtype, seed(rank, 50 + call, 0))
            b = rand((k, n), dtype, seed(rank, 50 + call, 1))
            work = iris.ops.matmul_all_reduce(out, a, b, workspace=ws, async_op=call == 2)
            if call == 2:
                if not isinstance(work, iris.ops.Work) or not work.wait():
                    bad.append(f"async call returned {work!r}")
            partial = a.double() @ b.double()
            want = summed(partial)
            scale = world_size * peak(partial) + want.abs().max().item()
            if (msg := mismatch(out, want, scale, f"reuse call {call}")) is not None:
                bad.append(msg)
            if call == 0:
                used = heap.used_bytes
                # Negative control: a reference without the last rank's partial must fail.
                partial_dropped = partial * (0.0 if rank == world_size - 1 else 1.0)
                if world_size > 1 and mismatch(out, summed(partial_dropped), scale, "control") is None:
                    bad.append("negative control: a reference missing a rank was not caught")
            elif heap.used_bytes != used:
                bad.append(f"call {call} allocated {heap.used_bytes - used} heap bytes")
            cases += 1
        try:
            other = heap.empty((m + 1, n), dtype=dtype)
            iris.ops.matmul_all_reduce(other, rand((m + 1, k), dtype, 1), b, workspace=ws)
            bad.append("a workspace prepared for another shape was accepted")
        except ValueError as e:
            if "prepared for" not in str(e):
                bad.append(f"unexpected error text: {e}")
        ws.close()
        iris.ops.release_workspaces()
        dist.barrier()
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [2, 3])
def test_repeated_calls_reuse_one_workspace(world_size):
    require_world(world_size)
    assert_clean(run_world(reuse_body, world_size, timeout=WORLD_TIMEOUT), 3)


def subgroup_body(rank, world_size):
    """Ranks 0 and 2 of a world of 3 run the op over their own group; rank 1 stays out."""
    import torch.distributed as dist

    import iris.ops

    group = dist.new_group([0, 2])
    bad = []
    if rank != 1:
        bad = ar_case(rank, 2, 7, None, torch.float32, SHAPES[0], True, "plain", group=group)
        iris.ops.release_workspaces()
    dist.barrier()
    return {"bad": bad, "cases": 1}


def test_subgroup():
    require_world(3)
    results = run_world(subgroup_body, 3, timeout=WORLD_TIMEOUT)
    assert_clean([results[0], results[2]], 1)
