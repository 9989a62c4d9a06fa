"""``iris.ops.all_gather_matmul`` against torch: ``torch.distributed.all_gather`` of every
rank's shard (along M, ``gather_dim=0``, or along K, ``gather_dim=1``), then the float64
matmul with this rank's ``b`` and bias.

One real world per test (``run_world``); its ranks loop over the cases: dtypes, odd shard
shapes, bias on or off (each rank its own ``b`` and bias, as in column-parallel layers),
and output kinds (the output is written locally).
"""

import pytest
import torch
from ops_testutils import (
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

# shard: this rank's (rows, columns) of A; n: columns of b.
CASES = {
    1: [
        dict(dtype=torch.float16, shard=(37, 43), n=29, bias=True, out_kind="plain", gather_dim=0),
        dict(dtype=torch.bfloat16, shard=(5, 20), n=70, bias=False, out_kind="heap", gather_dim=1),
        # 16-byte rows, more than 16 of them: on a GPU with TMA, A is read through a descriptor
        dict(dtype=torch.bfloat16, shard=(45, 72), n=70, bias=True, out_kind="plain", gather_dim=0),
    ],
    2: [
        dict(dtype=torch.bfloat16, shard=(13, 43), n=29, bias=True, out_kind="heap", gather_dim=0, repeat=2),
        dict(dtype=torch.float32, shard=(37, 11), n=29, bias=False, out_kind="strided", gather_dim=1),
        # decode: every gathered row fits in one tile row (the combined path, shard split by columns)
        dict(dtype=torch.bfloat16, shard=(3, 70), n=29, bias=True, out_kind="plain", gather_dim=0, repeat=3),
    ],
    3: [
        dict(dtype=torch.float32, shard=(13, 43), n=29, bias=False, out_kind="plain", gather_dim=0),
        dict(dtype=torch.float16, shard=(37, 11), n=29, bias=True, out_kind="heap", gather_dim=1, repeat=2),
        dict(dtype=torch.float16, shard=(5, 41), n=37, bias=False, out_kind="heap", gather_dim=0, repeat=2),
        dict(
            dtype=torch.bfloat16, shard=(16, 32), n=48, bias=True, out_kind="strided", gather_dim=0, tma=True
        ),
    ],
}


def agm_case(rank, world, case, heap, dtype, shard, n, bias, out_kind, gather_dim, repeat=1, tma=None):
    import iris.ops

    ms, ks = shard
    m, k = (world * ms, ks) if gather_dim == 0 else (ms, world * ks)
    out = make_out(out_kind, (m, n), dtype, heap)
    ws = iris.ops.Workspace()

    def one_call(i):
        a_shard = rand(shard, dtype, seed(rank, case, 3 * i))
        b = rand((k, n), dtype, seed(rank, case, 3 * i + 1))
        vec = rand((n,), dtype, seed(rank, case, 3 * i + 2)) if bias else None
        cfg = iris.ops.Config(tma=tma, path="fused")  # the kernel (test_ops_paths: the composed path)
        returned = iris.ops.all_gather_matmul(
            out, a_shard, b, vec, gather_dim=gather_dim, workspace=ws, config=cfg
        )
        want = gathered(a_shard, gather_dim).double() @ b.double() + (vec.double() if bias else 0)
        return returned, out, want, want.abs().max().item()

    what = f"world={world} {dtype_name(dtype)} shard={shard} n={n} bias={bias} {out_kind}"
    what += f" dim={gather_dim} tma={tma}"
    problems = check_calls(one_call, repeat, what)
    ws.close()
    return problems


def matrix_body(rank, world_size):
    return run_cases(agm_case, rank, world_size, CASES[world_size])


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_matches_torch(world_size):
    require_world(world_size)
    assert_clean(run_world(matrix_body, world_size, timeout=WORLD_TIMEOUT), len(CASES[world_size]))
