"""All-gather with ``iris.ccl``: every rank ends with every rank's tensor, concatenated
along dim 0 in rank order (like ``torch.distributed.all_gather_into_tensor``).

Run: ``torchrun --nproc_per_node=3 examples/11_all_gather.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.ccl

NAME = "ccl_all_gather"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    x = torch.arange(10 * 3, dtype=torch.float32, device=device).view(10, 3) + 100 * rank
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    want = torch.cat(parts)
    for variant in ("push", "pull"):
        out = torch.empty(world * 10, 3, device=device)
        iris.ccl.all_gather(out, x, config=iris.ccl.Config(variant=variant))
        check(errors, variant, out, want)
    return report(NAME, errors, f"({world} x [10, 3] gathered, push and pull)")


if __name__ == "__main__":
    sys.exit(main())
