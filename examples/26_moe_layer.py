"""A mixture-of-experts layer with expert parallelism: ``iris.ops.moe_dispatch`` and
``iris.ops.moe_combine``.

Every rank holds its own batch of tokens (a different number per rank) and
``num_experts / world`` experts (small MLPs). A router picks the top-k experts of each token
and their weights; ``moe_dispatch`` sends each token to the ranks of its experts in one
kernel (a token going to two experts of one rank crosses the link once), the experts run on
the rows they received (grouped by expert: ``d.expert_counts`` rows each), and
``moe_combine`` sends the results back and sums them with the router's weights in one
kernel. Checked against the same layer computed on one device from every rank's tokens
(gathered with torch.distributed) with every expert's weights.

Run: ``torchrun --nproc_per_node=3 examples/26_moe_layer.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.ops

NAME = "ops_moe_layer"


def experts_weights(
    num_experts: int, hidden: int, inner: int, device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every expert's (up, down) projection: the same on every rank (seeded)."""
    g = torch.Generator(device="cpu").manual_seed(42)
    return [
        (
            (torch.randn(hidden, inner, generator=g) / hidden**0.5).to(device),
            (torch.randn(inner, hidden, generator=g) / inner**0.5).to(device),
        )
        for _ in range(num_experts)
    ]


def mlp(x: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x @ up) @ down


def route(x: torch.Tensor, router: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts of each token and their softmax weights."""
    weights, idx = torch.topk(torch.softmax(x @ router, dim=-1), k, dim=-1)
    return idx, weights / weights.sum(-1, keepdim=True)


def main() -> int:
    rank, world, device = setup()
    gpu = device.type == "cuda"
    hidden, inner, k = (1024, 512, 4) if gpu else (40, 24, 2)
    num_experts = 4 * world
    local = num_experts // world
    tokens = (64 if gpu else 5) + 3 * rank  # a different number of tokens on every rank
    g = torch.Generator(device="cpu").manual_seed(rank)
    x = torch.randn(tokens, hidden, generator=g).to(device)
    router = torch.randn(hidden, num_experts, generator=torch.Generator().manual_seed(7)).to(device)
    experts = experts_weights(num_experts, hidden, inner, device)
    errors: list[str] = []

    # The layer with expert parallelism: this rank runs only its experts.
    idx, weights = route(x, router, k)
    d = iris.ops.moe_dispatch(x, idx, num_experts)
    counts = d.expert_counts.tolist()  # rows per local expert (a host read, for this loop)
    expert_out = torch.empty_like(d.tokens)
    start = 0
    for j, n in enumerate(counts):  # d.tokens is grouped by local expert
        up, down = experts[rank * local + j]
        expert_out[start : start + n] = mlp(d.tokens[start : start + n], up, down)
        start += n
    y = iris.ops.moe_combine(expert_out, d, weights)

    # The same layer on one device: every rank's tokens, every expert.
    everyone = [None] * world
    dist.all_gather_object(everyone, x.cpu())
    full = torch.cat(everyone).to(device)
    fidx, fweights = route(full, router, k)
    want = torch.zeros_like(full)
    for e in range(num_experts):
        rows, slots = (fidx == e).nonzero(as_tuple=True)
        want.index_add_(0, rows, fweights[rows, slots, None] * mlp(full[rows], *experts[e]))
    mine = want[sum(t.shape[0] for t in everyone[:rank]) :][:tokens]
    check(errors, "y", y, mine, atol=1e-4)
    received = sum(int((fidx == e).sum()) for e in range(rank * local, (rank + 1) * local))
    if sum(counts) != received:
        errors.append(f"received {sum(counts)} rows, expected {received}")
    dist.barrier()  # every rank is done with the others' buffers
    iris.ops.release_workspaces()
    return report(NAME, errors, f"({tokens} tokens, {num_experts} experts over {world} ranks, top-{k})")


if __name__ == "__main__":
    sys.exit(main())
