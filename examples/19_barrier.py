"""Barrier with ``iris.ccl.barrier``: a device-side barrier of the group (stream-ordered, so
it can be captured in a CUDA graph).

Run: ``torchrun --nproc_per_node=3 examples/19_barrier.py`` (no GPU needed).
"""

import sys

import torch
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_barrier"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    for _ in range(10):
        iris.ccl.barrier()
    # Work queued before the barrier is visible to every rank after it: a broadcast of
    # a tensor written just before it returns the value written.
    t = torch.full((4,), float(rank), device=device)
    iris.ccl.barrier()
    iris.ccl.broadcast(t, 0)
    check(errors, "after barrier", t, torch.zeros(4, device=device))
    return report(NAME, errors, "(10 barriers)")


if __name__ == "__main__":
    sys.exit(main())
