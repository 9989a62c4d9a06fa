"""Broadcast with ``iris.ccl``: every rank's tensor becomes a copy of rank ``src``'s.

Run: ``torchrun --nproc_per_node=3 examples/14_broadcast.py`` (no GPU needed).
"""

import sys

import torch
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_broadcast"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    for src in range(world):
        t = torch.full((33, 2), float(rank), device=device)
        iris.ccl.broadcast(t, src)
        check(errors, f"src {src}", t, torch.full((33, 2), float(src), device=device))
    return report(NAME, errors, f"(from each of the {world} ranks)")


if __name__ == "__main__":
    sys.exit(main())
