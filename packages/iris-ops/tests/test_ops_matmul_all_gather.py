"""``iris.ops.matmul_all_gather`` against torch: each rank's float64 ``a @ b + bias``, then
``torch.distributed.all_gather`` along M.

One real world per test (``run_world``); its ranks loop over the cases: dtypes, shapes
(odd ones, block multiples, M below a block), bias on or off (each rank its own bias), and
the kind of output (plain and strided outputs go through the workspace, heap outputs are
written in place by the peers).
"""

import pytest
import torch
from ops_testutils import (
    SHAPES,
    assert_clean,
    check_calls,
    dtype_name,
    gathered,
    make_out,
    rand,
    require_world,
    run_cases,
    seed,
)

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
WORLD_TIMEOUT = 240.0

CASES = {
    1: [
        dict(dtype=torch.float32, shape=SHAPES[0], bias=True, out_kind="heap"),
        dict(dtype=torch.float16, shape=SHAPES[2], bias=False, out_kind="strided"),
    ],
    2: [
        dict(dtype=torch.bfloat16, shape=SHAPES[0], bias=True, out_kind="plain", repeat=2),
        dict(dtype=torch.float16, shape=SHAPES[1], bias=False, out_kind="heap", tma=True),
    ],
    3: [
        dict(dtype=torch.float32, shape=SHAPES[2], bias=True, out_kind="heap", repeat=2),
        dict(dtype=torch.bfloat16, shape=SHAPES[0], bias=False, out_kind="strided"),
        dict(dtype=torch.float16, shape=SHAPES[0], bias=True, out_kind="plain"),
    ],
}


def mag_case(rank, world, case, heap, dtype, shape, bias, out_kind, repeat=1, tma=None):
    import iris.ops

    m, n, k = shape
    out = make_out(out_kind, (world * m, n), dtype, heap)
    ws = iris.ops.Workspace()

    def one_call(i):
        a = rand((m, k), dtype, seed(rank, case, 3 * i))
        b = rand((k, n), dtype, seed(rank, case, 3 * i + 1))
        vec = rand((n,), dtype, seed(rank, case, 3 * i + 2)) if bias else None  # each rank its own
        cfg = iris.ops.Config(tma=tma, path="fused")  # the kernel (test_ops_paths: the composed path)
        returned = iris.ops.matmul_all_gather(out, a, b, vec, workspace=ws, config=cfg)
        mine = a.double() @ b.double() + (vec.double() if bias else 0)
        want = gathered(mine, 0)
        return returned, out, want, want.abs().max().item()

    what = f"world={world} {dtype_name(dtype)} {shape} bias={bias} {out_kind} tma={tma}"
    problems = check_calls(one_call, repeat, what)
    ws.close()
    return problems


def matrix_body(rank, world_size):
    return run_cases(mag_case, rank, world_size, CASES[world_size])


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_matches_torch(world_size):
    require_world(world_size)
    assert_clean(run_world(matrix_body, world_size, timeout=WORLD_TIMEOUT), len(CASES[world_size]))
