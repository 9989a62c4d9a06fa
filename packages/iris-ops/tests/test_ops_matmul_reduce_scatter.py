"""``iris.ops.matmul_reduce_scatter`` against torch: the float64 ``a @ b`` of every rank
summed with ``torch.distributed.all_reduce``, plus the bias, then this rank's slice of rows
(``scatter_dim=0``) or columns (``scatter_dim=1``).

One real world per test (``run_world``); its ranks loop over the cases: dtypes, odd shapes
whose scattered dimension is a multiple of the group size only, bias on or off, output
kinds (the output is written locally, so any tensor is used as it is), both tile orders
(``Config.order``) and partials streamed or stored at once (``Config.stream``).
"""

import pytest
import torch
from ops_testutils import (
    assert_clean,
    check_calls,
    dtype_name,
    make_out,
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

# (M, N, K) per group size G: the scattered dimension is G times an odd number (or 2).
CASES = {
    1: [
        dict(dtype=torch.bfloat16, shape=(37, 29, 43), bias=True, out_kind="plain", scatter_dim=0),
        dict(dtype=torch.float32, shape=(5, 70, 20), bias=False, out_kind="heap", scatter_dim=1),
    ],
    2: [
        dict(
            dtype=torch.float16,
            shape=(26, 29, 43),
            bias=True,
            out_kind="heap",
            scatter_dim=0,
            repeat=2,
            order="peers_first",
            stream=False,
        ),
        dict(dtype=torch.bfloat16, shape=(37, 2 * 11, 43), bias=False, out_kind="strided", scatter_dim=1),
        # The "spread" order, 3 programs for 12 tiles: several tiles each, odd ones backwards.
        dict(
            dtype=torch.bfloat16,
            shape=(2 * 20, 40, 43),
            bias=True,
            out_kind="strided",
            scatter_dim=0,
            order="spread",
            sms=3,
            repeat=2,
        ),
    ],
    3: [
        dict(
            dtype=torch.bfloat16,
            shape=(39, 29, 43),
            bias=True,
            out_kind="plain",
            scatter_dim=0,
            repeat=2,
            order="peers_first",
        ),
        dict(dtype=torch.float32, shape=(37, 3 * 11, 43), bias=True, out_kind="heap", scatter_dim=1),
        dict(
            dtype=torch.float16,
            shape=(3 * 2, 48, 32),
            bias=False,
            out_kind="strided",
            scatter_dim=0,
            tma=True,
        ),
        dict(
            dtype=torch.float16,
            shape=(37, 3 * 13, 20),
            bias=True,
            out_kind="plain",
            scatter_dim=1,
            order="spread",
            sms=3,
        ),
    ],
}


def rs_case(
    rank, world, case, heap, dtype, shape, bias, out_kind, scatter_dim, repeat=1, tma=None, order="auto",
    sms=0, stream=None,
):  # fmt: skip
    import iris.ops

    m, n, k = shape
    rows, cols = (m // world, n) if scatter_dim == 0 else (m, n // world)
    out = make_out(out_kind, (rows, cols), dtype, heap)
    ws = iris.ops.Workspace()

    def one_call(i):
        a = rand((m, k), dtype, seed(rank, case, 3 * i))
        b = rand((k, n), dtype, seed(rank, case, 3 * i + 1))
        vec = rand((n,), dtype, seed(0, case, 3 * i + 2)) if bias else None  # the same on every rank
        cfg = iris.ops.Config(tma=tma, order=order, num_sms=sms, stream=stream, path="fused")
        returned = iris.ops.matmul_reduce_scatter(
            out, a, b, vec, scatter_dim=scatter_dim, workspace=ws, config=cfg
        )
        partial = a.double() @ b.double()
        full = summed(partial) + (vec.double() if bias else 0)
        want = full.chunk(world, dim=scatter_dim)[rank]
        return returned, out, want, world * peak(partial) + full.abs().max().item()

    what = f"world={world} {dtype_name(dtype)} {shape} bias={bias} {out_kind} dim={scatter_dim} tma={tma}"
    what += f" order={order} stream={stream}"
    problems = check_calls(one_call, repeat, what)
    ws.close()
    return problems


def matrix_body(rank, world_size):
    return run_cases(rs_case, rank, world_size, CASES[world_size])


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_matches_torch(world_size):
    require_world(world_size)
    assert_clean(run_world(matrix_body, world_size, timeout=WORLD_TIMEOUT), len(CASES[world_size]))
