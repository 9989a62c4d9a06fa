"""All-reduce with ``iris.ccl``: every variant, checked against torch.distributed.

Any torch tensor works (it is staged through a heap iris.ccl makes for the group); tensors
allocated on an ``iris.mem`` heap are used in place. ``config=Config(variant=...)`` picks
the algorithm; the default picks by size.

Run: ``torchrun --nproc_per_node=3 examples/10_all_reduce.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.ccl
import iris.mem

NAME = "ccl_all_reduce"


def main() -> int:
    rank, world, device = setup()
    errors: list[str] = []
    x = torch.randn(300, 7, device=device, generator=None) + rank  # any tensor, any shape
    want = x.clone()
    dist.all_reduce(want)
    for variant in iris.ccl.VARIANTS["all_reduce"]:  # auto, ll, boxed, one_shot, ...
        out = torch.empty_like(x)
        iris.ccl.all_reduce(out, x, config=iris.ccl.Config(variant=variant))
        check(errors, variant, out, want)
    # On a symmetric heap the collective works in place, with no staging copies.
    with iris.mem.init(1 << 22) as heap:
        h = heap.as_symmetric(x)
        iris.ccl.all_reduce(h, h, op=iris.ccl.ReduceOp.MAX)
        maxed = x.clone()
        dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
        check(errors, "heap, in place, MAX", h, maxed)
    variants = len(iris.ccl.VARIANTS["all_reduce"])
    return report(NAME, errors, f"(sum of {world} ranks, {variants} variants, and MAX in place on a heap)")


if __name__ == "__main__":
    sys.exit(main())
