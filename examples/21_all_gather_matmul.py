"""All-gather + GEMM with ``iris.ops.all_gather_matmul``: A gathered while the GEMM runs.

Two layouts. ``gather_dim=0`` (sequence parallelism): every rank holds rows of A; its own
rows are multiplied at once while the other ranks' rows arrive. ``gather_dim=1``: every rank
holds columns of A (a slice of K), and ``b`` is the full (K, N). Each rank may use its own
``b`` (a column-parallel layer: its slice of N). Checked against
``torch.distributed.all_gather`` followed by ``torch.matmul``.

Run: ``torchrun --nproc_per_node=3 examples/21_all_gather_matmul.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.ops

NAME = "ops_all_gather_matmul"


def gathered(x: torch.Tensor, dim: int, world: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim)


def main() -> int:
    rank, world, device = setup()
    gpu = device.type == "cuda"
    rows, k, n = (512, 2048, 4096) if gpu else (13, 24, 40)  # this rank's rows of A, K, N
    dtype = torch.bfloat16 if gpu else torch.float32
    g = torch.Generator(device=device).manual_seed(rank)
    errors: list[str] = []

    # A sharded along M: a_shard is (rows, K), out is (world * rows, N).
    a_shard = torch.randn(rows, k, generator=g, device=device).to(dtype)
    b = torch.randn(k, n, generator=g, device=device).to(dtype)
    out = torch.empty(world * rows, n, dtype=dtype, device=device)
    iris.ops.all_gather_matmul(out, a_shard, b, gather_dim=0)
    want = gathered(a_shard, 0, world).float() @ b.float()
    check(errors, "gather_dim=0", out, want, atol=0.02 * want.abs().max().item() if gpu else 1e-3)

    # A sharded along K: a_shard is (rows, K), b is (world * K, N), out is (rows, N).
    b_full = torch.randn(world * k, n, generator=g, device=device).to(dtype)
    out = torch.empty(rows, n, dtype=dtype, device=device)
    iris.ops.all_gather_matmul(out, a_shard, b_full, gather_dim=1)
    want = gathered(a_shard, 1, world).float() @ b_full.float()
    check(errors, "gather_dim=1", out, want, atol=0.02 * want.abs().max().item() if gpu else 1e-3)
    iris.ops.release_workspaces()
    return report(NAME, errors, f"(shards of {rows}x{k} from {world} ranks, along M and along K)")


if __name__ == "__main__":
    sys.exit(main())
