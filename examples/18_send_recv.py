"""Point to point with ``iris.ccl.send`` / ``recv``: a message travels around the ring, each
rank adding its rank number before passing it on.

Run: ``torchrun --nproc_per_node=3 examples/18_send_recv.py`` (no GPU needed).
"""

import sys

import torch
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_send_recv"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    msg = torch.zeros(1000, device=device)
    if world > 1:
        if rank == 0:
            iris.ccl.send(msg + 1, 1)
            iris.ccl.recv(msg, world - 1)
            want = torch.full_like(msg, 1 + sum(range(1, world)))
            check(errors, "ring total", msg, want)
        else:
            iris.ccl.recv(msg, rank - 1)
            iris.ccl.send(msg + rank, (rank + 1) % world)
    return report(NAME, errors, f"(around a ring of {world})")


if __name__ == "__main__":
    sys.exit(main())
