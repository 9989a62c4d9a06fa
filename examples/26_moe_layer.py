"""A mixture-of-experts layer with expert parallelism, trained a step: ``iris.ops.moe_dispatch``
and ``iris.ops.moe_combine``.

Every rank holds its own batch of tokens (a different number per rank) and
``num_experts / world`` experts (small MLPs whose weights are parameters). A router picks the
top-k experts of each token and their weights; ``moe_dispatch`` sends each token to the ranks
of its experts in one kernel (a token going to two experts of one rank crosses the link
once), the experts run on the rows they received as grouped GEMMs delimited by
``d.expert_offsets`` (on the device: no host synchronisation), and ``moe_combine`` sends the
results back and sums them with the router's weights in one kernel. Both ops are
differentiable: the backward pass sends the gradients the other way, to the tokens, the
router and the experts' weights. Checked against the same layer computed on one device from
every rank's tokens (gathered with torch.distributed) with every expert's weights: outputs
and gradients.

Run: ``torchrun --nproc_per_node=3 examples/26_moe_layer.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _ccl_example import check, report, setup

import iris.ops

NAME = "ops_moe_layer"


def experts_weights(num_experts: int, hidden: int, inner: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every expert's up ``[E, hidden, inner]`` and down ``[E, inner, hidden]`` projections:
    the same on every rank (seeded)."""
    g = torch.Generator(device="cpu").manual_seed(42)
    up = torch.randn(num_experts, hidden, inner, generator=g) / hidden**0.5
    down = torch.randn(num_experts, inner, hidden, generator=g) / inner**0.5
    return up.to(device), down.to(device)


def run_experts(tokens, offsets, up, down):
    """The local experts on the rows they received: expert ``j`` on rows ``offsets[j]`` to
    ``offsets[j + 1]`` of ``tokens`` (``up``, ``down``: the local experts' weights). Rows past
    the last offset are never read by combine. No host synchronisation either way."""
    if hasattr(F, "grouped_mm"):  # one grouped GEMM per projection (torch 2.8 and later)
        ends = offsets[1:].to(torch.int32)
        return F.grouped_mm(F.silu(F.grouped_mm(tokens, up, offs=ends)), down, offs=ends)
    # Without it: every row through its own expert's weights, found from the offsets.
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    expert = torch.bucketize(rows, offsets[1:], right=True).clamp(max=up.shape[0] - 1)
    hidden = F.silu(torch.bmm(tokens[:, None, :], up[expert]))
    return torch.bmm(hidden, down[expert])[:, 0, :]


def route(x: torch.Tensor, router: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts of each token and their softmax weights."""
    weights, idx = torch.topk(torch.softmax(x @ router, dim=-1), k, dim=-1)
    return idx, weights / weights.sum(-1, keepdim=True)


def moe_layer(x, router, up, down, num_experts: int, k: int):
    """The layer with expert parallelism: this rank runs only its experts (``up``, ``down``)."""
    idx, weights = route(x, router, k)
    d = iris.ops.moe_dispatch(x, idx, num_experts)
    return iris.ops.moe_combine(run_experts(d.tokens, d.expert_offsets, up, down), d, weights)


def reference_layer(x, router, up, down, k: int):
    """The same layer on one device: every token, every expert."""
    idx, weights = route(x, router, k)
    y = torch.zeros_like(x)
    for e in range(up.shape[0]):
        rows, slots = (idx == e).nonzero(as_tuple=True)
        out = F.silu(x[rows] @ up[e]) @ down[e]
        y = y.index_add(0, rows, weights[rows, slots, None] * out)
    return y


def main() -> int:
    rank, world, device = setup()
    gpu = device.type == "cuda"
    hidden, inner, k = (1024, 512, 4) if gpu else (40, 24, 2)
    num_experts = 4 * world
    local = slice(rank * 4, rank * 4 + 4)
    tokens = (64 if gpu else 5) + 3 * rank  # a different number of tokens on every rank
    g = torch.Generator(device="cpu").manual_seed(rank)
    x = torch.randn(tokens, hidden, generator=g).to(device).requires_grad_()
    router = torch.randn(hidden, num_experts, generator=torch.Generator().manual_seed(7)).to(device)
    up_all, down_all = experts_weights(num_experts, hidden, inner, device)
    router = router.requires_grad_()
    up, down = up_all[local].clone().requires_grad_(), down_all[local].clone().requires_grad_()
    errors: list[str] = []

    # Forward and backward with expert parallelism.
    y = moe_layer(x, router, up, down, num_experts, k)
    grad_y = torch.randn(tokens, hidden, generator=g).to(device)
    y.backward(grad_y)

    # The same on one device: every rank's tokens and output gradients, every expert.
    everyone = [None] * world
    dist.all_gather_object(everyone, (x.detach().cpu(), grad_y.cpu()))
    full = torch.cat([e[0] for e in everyone]).to(device).requires_grad_()
    ref = [t.detach().clone().requires_grad_() for t in (router, up_all, down_all)]
    want = reference_layer(full, *ref, k)
    want.backward(torch.cat([e[1] for e in everyone]).to(device))
    start = sum(e[0].shape[0] for e in everyone[:rank])
    check(errors, "y", y, want[start : start + tokens])
    check(errors, "grad x", x.grad, full.grad[start : start + tokens])
    check(errors, "grad up", up.grad, ref[1].grad[local])
    check(errors, "grad down", down.grad, ref[2].grad[local])
    router_grad = router.grad.clone()
    dist.all_reduce(router_grad)  # the router is replicated: each rank holds its tokens' share
    check(errors, "grad router", router_grad, ref[0].grad)
    iris.ops.release_workspaces()  # collective; synchronises the ranks itself
    return report(NAME, errors, f"({tokens} tokens, {num_experts} experts over {world} ranks, top-{k})")


if __name__ == "__main__":
    sys.exit(main())
