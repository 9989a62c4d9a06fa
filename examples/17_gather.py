"""Gather with ``iris.ccl``: rank ``dst`` receives every rank's tensor, concatenated in rank
order.

Run: ``torchrun --nproc_per_node=3 examples/17_gather.py`` (no GPU needed).
"""

import sys

import torch
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_gather"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    dst = 0
    x = torch.full((5,), float(rank), device=device)
    out = torch.empty(world * 5, device=device) if rank == dst else None
    iris.ccl.gather(out, x, dst)
    if rank == dst:
        want = torch.arange(world, dtype=torch.float32, device=device).repeat_interleave(5)
        check(errors, "gathered", out, want)
    return report(NAME, errors, f"(to rank {dst})")


if __name__ == "__main__":
    sys.exit(main())
