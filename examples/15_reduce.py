"""Reduce with ``iris.ccl``: rank ``dst`` receives the sum over ranks; the other ranks'
outputs are left as they were.

Run: ``torchrun --nproc_per_node=3 examples/15_reduce.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_reduce"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    x = torch.randn(100, device=device) + rank
    want = x.clone()
    dist.all_reduce(want)
    for dst in range(world):
        out = torch.full_like(x, -7.0)
        iris.ccl.reduce(out, x, dst)
        check(errors, f"dst {dst}", out, want if rank == dst else torch.full_like(x, -7.0))
    return report(NAME, errors, "(to every root in turn)")


if __name__ == "__main__":
    sys.exit(main())
