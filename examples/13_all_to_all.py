"""All-to-all with ``iris.ccl``: chunk ``j`` of every rank's input goes to rank ``j``, which
stores the chunks in rank order (like ``all_to_all_single`` with equal splits).

Run: ``torchrun --nproc_per_node=3 examples/13_all_to_all.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_all_to_all"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    x = torch.arange(world * 6, dtype=torch.float32, device=device) + 1000 * rank
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    want = torch.cat([p.chunk(world)[rank] for p in parts])
    for variant in ("push", "pull"):
        out = torch.empty_like(x)
        iris.ccl.all_to_all(out, x, config=iris.ccl.Config(variant=variant))
        check(errors, variant, out, want)
    return report(NAME, errors, "(equal splits, push and pull)")


if __name__ == "__main__":
    sys.exit(main())
