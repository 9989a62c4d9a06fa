"""Fused GEMM + all-reduce with ``iris.ops.matmul_all_reduce`` (a row-parallel linear layer).

Every rank holds its slice of the K dimension: ``a`` (M, K_r) and ``b`` (K_r, N). One kernel
computes the partial product and sums it over the ranks, pushing each partial tile to the
rank that reduces it while the next tile is computed; the bias is added once. Checked
against ``torch.matmul`` followed by ``torch.distributed.all_reduce``.

Run: ``torchrun --nproc_per_node=3 examples/20_matmul_all_reduce.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.mem
import iris.ops

NAME = "ops_matmul_all_reduce"


def main() -> int:
    rank, world, device = setup()
    gpu = device.type == "cuda"
    m, n, k = (1000, 4096, 2048) if gpu else (37, 40, 24)  # any shape, not only block multiples
    dtype = torch.bfloat16 if gpu else torch.float32
    g = torch.Generator(device=device).manual_seed(rank)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    b = torch.randn(k, n, generator=g, device=device).to(dtype)
    bias = torch.full((n,), 0.5, dtype=dtype, device=device)  # the same on every rank
    want = a.float() @ b.float()
    dist.all_reduce(want)
    want += bias.float()
    tol = 0.02 * want.abs().max().item() if gpu else 1e-3
    errors: list[str] = []

    out = torch.empty(m, n, dtype=dtype, device=device)  # any tensor: written through the workspace
    iris.ops.matmul_all_reduce(out, a, b, bias)
    check(errors, "plain output", out, want, atol=tol)

    # An output on a symmetric heap is written in place by every rank; one Workspace serves
    # every later call with the same shapes (nothing is allocated or reset again).
    with iris.mem.init(1 << 26) as heap:
        out = heap.empty((m, n), dtype=dtype)
        workspace = iris.ops.Workspace()
        for _ in range(3):
            iris.ops.matmul_all_reduce(out, a, b, bias, workspace=workspace)
        check(errors, "heap output, reused workspace", out, want, atol=tol)
        heap.barrier()
    iris.ops.release_workspaces()
    return report(NAME, errors, f"({m}x{k} @ {k}x{n} summed over {world} ranks)")


if __name__ == "__main__":
    sys.exit(main())
