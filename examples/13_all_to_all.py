"""All-to-all with ``iris.ccl``: chunk ``j`` of every rank's input goes to rank ``j``, which
stores the chunks in rank order (like ``all_to_all_single``): equal chunks, then rows of
dim 0 in chunks of any size (split sizes, as a mixture-of-experts layer sends tokens).

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
    # Split sizes: rank r sends (r + j) % 3 rows of 16 to rank j (some none), so rank j
    # receives (r + j) % 3 rows from each rank r. Every rank knows only its own sizes.
    sends = [(rank + j) % 3 for j in range(world)]
    receives = [(r + rank) % 3 for r in range(world)]
    rows = torch.arange(sum(sends) * 16, dtype=torch.float32, device=device).view(-1, 16) + 1000 * rank
    want = torch.empty(sum(receives), 16, device=device)
    dist.all_to_all_single(want, rows, receives, sends)
    for variant in ("auto", "push"):
        out = torch.empty(sum(receives), 16, device=device)
        iris.ccl.all_to_all(out, rows, receives, sends, config=iris.ccl.Config(variant=variant))
        check(errors, f"split sizes, {variant}", out, want)
    return report(NAME, errors, "(equal splits, push and pull; split sizes, auto and push)")


if __name__ == "__main__":
    sys.exit(main())
