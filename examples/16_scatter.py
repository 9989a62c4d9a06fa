"""Scatter with ``iris.ccl``: rank ``src`` splits its input into one chunk per rank; rank ``i``
receives chunk ``i``.

Run: ``torchrun --nproc_per_node=3 examples/16_scatter.py`` (no GPU needed).
"""

import sys

import torch
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_scatter"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    src = world - 1
    inp = torch.arange(world * 8, dtype=torch.float32, device=device) if rank == src else None
    out = torch.empty(8, device=device)
    iris.ccl.scatter(out, inp, src)
    check(errors, "chunk", out, torch.arange(8, dtype=torch.float32, device=device) + 8 * rank)
    return report(NAME, errors, f"(from rank {src})")


if __name__ == "__main__":
    sys.exit(main())
