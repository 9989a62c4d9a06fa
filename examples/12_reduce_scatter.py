"""Reduce-scatter with ``iris.ccl``: the input is split into one chunk per rank along dim 0,
and rank ``i`` receives the sum over ranks of chunk ``i`` (like ``reduce_scatter_tensor``).

Run: ``torchrun --nproc_per_node=3 examples/12_reduce_scatter.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_reduce_scatter"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    x = torch.randn(world * 5, 4, device=device) + rank
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    want = torch.stack(parts).sum(0).chunk(world)[rank]
    for variant in ("push", "pull"):
        out = torch.empty(5, 4, device=device)
        iris.ccl.reduce_scatter(out, x, config=iris.ccl.Config(variant=variant))
        check(errors, variant, out, want)
    return report(NAME, errors, "(sum of each rank's chunk, push and pull)")


if __name__ == "__main__":
    sys.exit(main())
