"""GEMM + all-gather with ``iris.ops.matmul_all_gather``: every rank's product gathered along M.

Each rank multiplies its own ``a`` (M, K) by ``b`` (K, N) and, as each output tile is
finished, stores it into its rows of every rank's output (``(world * M, N)``), so the
gather runs while the GEMM does. The bias is each rank's own, added to its product.
Checked against ``torch.matmul`` followed by ``torch.distributed.all_gather``.

Run: ``torchrun --nproc_per_node=3 examples/22_matmul_all_gather.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.mem
import iris.ops

NAME = "ops_matmul_all_gather"


def main() -> int:
    rank, world, device = setup()
    gpu = device.type == "cuda"
    m, n, k = (512, 4096, 2048) if gpu else (21, 40, 24)
    dtype = torch.bfloat16 if gpu else torch.float32
    g = torch.Generator(device=device).manual_seed(rank)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    b = torch.randn(k, n, generator=g, device=device).to(dtype)
    bias = torch.full((n,), float(rank), dtype=dtype, device=device)  # each rank its own
    mine = a.float() @ b.float() + bias.float()
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    want = torch.cat(parts)
    tol = 0.02 * want.abs().max().item() if gpu else 1e-3
    errors: list[str] = []

    # The output on a symmetric heap: peers store their tiles into it directly.
    with iris.mem.init(1 << 26) as heap:
        out = heap.empty((world * m, n), dtype=dtype)
        iris.ops.matmul_all_gather(out, a, b, bias)
        check(errors, "heap output", out, want, atol=tol)
        heap.barrier()
    # Any other output works too (written through the workspace, then copied).
    out = torch.empty(world * m, n, dtype=dtype, device=device)
    work = iris.ops.matmul_all_gather(out, a, b, bias, async_op=True)
    work.wait()
    check(errors, "plain output, async_op=True", out, want, atol=tol)
    iris.ops.release_workspaces()
    return report(NAME, errors, f"({world} products of {m}x{k} @ {k}x{n})")


if __name__ == "__main__":
    sys.exit(main())
