"""The end of a tensor-parallel layer in one kernel: ``iris.ops.all_reduce_rmsnorm``.

Every rank holds its partial sum of the layer's output (``[tokens, hidden]``, as a
row-parallel linear layer leaves it). One kernel sums it over the ranks, adds the residual
stream, writes the new residual stream back in place and normalises it with RMSNorm.
Decode-sized inputs go through the flag-in-data one-shot form (``"ll"``), large ones
through reduce-scatter -> norm -> all-gather (``"rs_ag"``); both are shown, forced through
the config, then the automatic choice. Checked against ``torch.distributed.all_reduce`` of
float64 copies followed by the norm in float64.

Run: ``torchrun --nproc_per_node=3 examples/24_all_reduce_rmsnorm.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist
from _ccl_example import check, report, setup

import iris.mem
import iris.ops

NAME = "ops_all_reduce_rmsnorm"


def reference(partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(normalised rows, new residual) in float64."""
    s = partial.double()
    dist.all_reduce(s)
    s += residual.double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.double(), s


def main() -> int:
    rank, world, device = setup()
    gpu = device.type == "cuda"
    tokens, hidden = (8, 4096) if gpu else (5, 1000)  # any sizes, not only block multiples
    dtype, eps = torch.bfloat16, 1e-6
    g = torch.Generator(device=device).manual_seed(rank)
    partial = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)  # differs per rank
    same = torch.Generator(device=device).manual_seed(1234)  # the same on every rank
    residual0 = torch.randn(tokens, hidden, generator=same, device=device).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=same, device=device)).to(dtype)
    want, want_residual = reference(partial, residual0, weight, eps)
    tol = 0.03 * want.abs().max().item()  # bf16 outputs
    errors: list[str] = []

    for form in ("ll", "rs_ag"):
        config = iris.ops.AllReduceRMSNormConfig(form=form)
        out = torch.empty_like(partial)  # any tensors: nothing here needs to be on a heap
        residual = residual0.clone()
        iris.ops.all_reduce_rmsnorm(
            out, partial, weight, eps, residual=residual, residual_out=residual, config=config
        )
        check(errors, f"{form}: out", out, want, atol=tol)
        check(errors, f"{form}: residual updated in place", residual, want_residual, atol=tol)

    # An output on a symmetric heap; the form chosen by size; one Workspace serves every call
    # with the same shapes (nothing allocated or reset after the first, CUDA-graph capturable).
    with iris.mem.init(1 << 26) as heap:
        out = heap.empty((tokens, hidden), dtype=dtype)
        residual_out = heap.empty((tokens, hidden), dtype=dtype)
        workspace = iris.ops.Workspace()
        for _ in range(3):
            work = iris.ops.all_reduce_rmsnorm(
                out, partial, weight, eps, residual=residual0, residual_out=residual_out, workspace=workspace,
                async_op=True,
            )  # fmt: skip
            work.wait()
        check(errors, "auto, heap output, reused workspace", out, want, atol=tol)
        check(errors, "auto, residual_out", residual_out, want_residual, atol=tol)
        workspace.close()
        heap.barrier()
    iris.ops.release_workspaces()
    return report(NAME, errors, f"({tokens} x {hidden} summed over {world} ranks, + residual, RMSNorm)")


if __name__ == "__main__":
    sys.exit(main())
