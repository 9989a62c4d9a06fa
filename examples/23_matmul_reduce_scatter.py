"""GEMM + reduce-scatter with ``iris.ops.matmul_reduce_scatter``.

Every rank computes its partial product ``a @ b`` (a slice of K each); each output tile is
summed over the ranks by the rank that keeps it, as soon as the partials are computed:
rows ``[r*M/G, (r+1)*M/G)`` stay on rank ``r`` (``scatter_dim=0``), or columns with
``scatter_dim=1``. Checked against ``torch.matmul`` followed by
``torch.distributed.all_reduce`` and this rank's slice.

Run: ``torchrun --nproc_per_node=3 examples/23_matmul_reduce_scatter.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.ops

NAME = "ops_matmul_reduce_scatter"


def main() -> int:
    rank, world, device = setup()
    gpu = device.type == "cuda"
    m, n, k = (world * 500, world * 1024, 2048) if gpu else (world * 7, world * 9, 24)
    dtype = torch.bfloat16 if gpu else torch.float32
    g = torch.Generator(device=device).manual_seed(rank)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    b = torch.randn(k, n, generator=g, device=device).to(dtype)
    full = a.float() @ b.float()
    dist.all_reduce(full)
    tol = 0.02 * full.abs().max().item() if gpu else 1e-3
    errors: list[str] = []
    for dim in (0, 1):
        out = torch.empty(full.chunk(world, dim)[rank].shape, dtype=dtype, device=device)
        iris.ops.matmul_reduce_scatter(out, a, b, scatter_dim=dim)
        check(errors, f"scatter_dim={dim}", out, full.chunk(world, dim)[rank], atol=tol)
    iris.ops.release_workspaces()
    return report(NAME, errors, f"({m}x{k} @ {k}x{n} summed over {world} ranks, rows and columns)")


if __name__ == "__main__":
    sys.exit(main())
