"""Ranks that call a fused op with different shapes or dtypes get a CallMismatchError on every
rank naming both calls (default settings, no debug mode), not wrong values or a wait timeout."""

import pytest
import torch

import iris.mem
import iris.ops
from iris.mem.testing import run_world

pytestmark = [pytest.mark.timeout(300)]


def shapes_body(rank, world_size):
    k = 16 if rank == 0 else 24  # this rank's slice of K differs on rank 0
    m, n = 5, 7
    a, b = torch.ones(m, k), torch.ones(k, n)
    out = torch.zeros(m, n)
    try:
        iris.ops.matmul_all_reduce(out, a, b)
    except iris.mem.CallMismatchError as e:
        error = str(e)
    else:
        error = None
    # the right call afterwards
    a, b = torch.ones(m, 8), torch.ones(8, n)
    iris.ops.matmul_all_reduce(out, a, b)
    return error, out.tolist()


def test_fused_op_with_different_shapes_raises_on_every_rank():
    results = run_world(shapes_body, 3, timeout=240)
    for rank, (error, out) in enumerate(results):
        assert out == [[8.0 * 3] * 7] * 5
        assert error is not None, f"rank {rank}: the mismatched call returned"
        mine, theirs = ("(16, 7)", "(24, 7)") if rank == 0 else ("(24, 7)", "(16, 7)")
        assert "this rank called iris.ops.matmul_all_reduce(" in error and mine in error, error
        assert "but rank" in error and theirs in error, error
