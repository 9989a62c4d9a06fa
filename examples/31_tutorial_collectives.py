"""Tutorial 2: from torch.distributed to iris.ccl (docs/tutorials/collectives.md).

The collectives of a data-parallel training step of a small linear model, written first with
``torch.distributed`` and then with ``iris.ccl``, and compared:

* data parallel: the gradient averaged over the ranks (``all_reduce``, ``AVG``);
* sharded parameters: the full weight gathered from each rank's shard (``all_gather``) and
  the gradient reduced to each rank's shard (``reduce_scatter``);
* the same gradient average on a symmetric heap (in place, no staging), with a few
  ``Config`` variants, with ``async_op=True``, and captured in a CUDA graph where the device
  has graphs.

Run: ``torchrun --nproc_per_node=3 examples/31_tutorial_collectives.py`` (no GPU needed).
"""

import sys

import torch
import torch.distributed as dist

import iris.ccl
import iris.mem

NAME = "tutorial_collectives"
OUT, IN, BATCH = 24, 10, 7  # the weight has 240 elements: divisible by 1, 2, 3, 4, 5 ranks

# torch 2.13 names the tensor forms all_gather_single / reduce_scatter_single; older
# releases all_gather_into_tensor / reduce_scatter_tensor (the same collectives).
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def report(rank: int, world: int, errors: list[str], note: str = "") -> int:
    """Print this rank's verdict as one line (one write, so ranks' lines do not interleave)."""
    verdict = f"FAILED: {'; '.join(errors)}" if errors else f"validated {note}".rstrip()
    sys.stdout.write(f"[rank {rank}/{world}] {NAME}: {verdict}\n")
    sys.stdout.flush()
    return 1 if errors else 0


def check(errors: list[str], what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
        worst = (got - want).abs().max().item() if got.shape == want.shape else "shape"
        errors.append(f"{what}: differs from torch.distributed (max error {worst})")


# [gradient]
def local_gradient(weight: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """This rank's gradient of a squared error on its own batch (a different batch per rank)."""
    g = torch.Generator(device=weight.device).manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, IN, generator=g, device=weight.device)
    y = torch.randn(BATCH, OUT, generator=g, device=weight.device)
    w = weight.detach().clone().requires_grad_(True)
    ((x @ w.T - y) ** 2).mean().backward()
    return w.grad


# [/gradient]


def main() -> int:
    errors: list[str] = []
    # [setup]
    heap = iris.mem.init(heap_size=1 << 24)  # also starts torch.distributed if nobody has
    rank, world, device = heap.rank, heap.world_size, heap.device
    weight = torch.linspace(-1, 1, OUT * IN, device=device).view(OUT, IN)  # the same everywhere
    grad = local_gradient(weight, rank, step=0)
    # [/setup]

    # [torch]
    # Data parallel: average the gradient over the ranks.
    avg_torch = grad.clone()
    dist.all_reduce(avg_torch, op=dist.ReduceOp.AVG)
    # Sharded parameters: each rank owns 1/world of the flat weight ...
    shard = weight.flatten().chunk(world)[rank].clone()
    full_torch = torch.empty(OUT * IN, device=device)
    all_gather_single(full_torch, shard)
    # ... and keeps only its shard of the averaged gradient.
    grad_shard_torch = torch.empty_like(shard)
    reduce_scatter_single(grad_shard_torch, grad.flatten(), op=dist.ReduceOp.AVG)
    # [/torch]

    # [iris]
    avg = torch.empty_like(grad)
    iris.ccl.all_reduce(avg, grad, op=iris.ccl.ReduceOp.AVG)
    full = torch.empty(OUT * IN, device=device)
    iris.ccl.all_gather(full, shard)
    grad_shard = torch.empty_like(shard)
    iris.ccl.reduce_scatter(grad_shard, grad.flatten(), op=iris.ccl.ReduceOp.AVG)
    # [/iris]
    check(errors, "all_reduce AVG", avg, avg_torch)
    check(errors, "all_gather", full, full_torch)
    check(errors, "reduce_scatter AVG", grad_shard, grad_shard_torch)

    # [heap]
    # Gradients kept on the symmetric heap are reduced in place: no staging copies.
    grad_buf = heap.zeros(OUT, IN)
    grad_buf.copy_(grad)
    iris.ccl.all_reduce(grad_buf, grad_buf, op=iris.ccl.ReduceOp.AVG)
    # [/heap]
    check(errors, "all_reduce AVG in place on the heap", grad_buf, avg_torch)

    # [variants]
    # Config picks the algorithm; "auto" (the default) picks one by message size.
    for variant in ("auto", "one_shot", "two_shot", "ring"):
        grad_buf.copy_(grad)
        config = iris.ccl.Config(variant=variant)
        iris.ccl.all_reduce(grad_buf, grad_buf, op=iris.ccl.ReduceOp.AVG, config=config)
        check(errors, f"all_reduce variant {variant}", grad_buf, avg_torch)
    # [/variants]

    # [async]
    # async_op=True returns a handle at once; wait() orders the current stream after it.
    caps = heap.capabilities
    side = torch.cuda.Stream(device) if caps.streams else None  # where streams exist
    grad_buf.copy_(grad)
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))  # the copy above comes first
        with torch.cuda.stream(side):
            work = iris.ccl.all_reduce(grad_buf, grad_buf, op=iris.ccl.ReduceOp.AVG, async_op=True)
    else:
        work = iris.ccl.all_reduce(grad_buf, grad_buf, op=iris.ccl.ReduceOp.AVG, async_op=True)
    next_grad = local_gradient(weight, rank, step=1)  # independent work meanwhile
    work.wait()
    # [/async]
    check(errors, "all_reduce async_op=True", grad_buf, avg_torch)

    # [graph]
    # CUDA graphs: capture the step's collective once, replay it every step.
    graphs = caps.streams and not caps.interpreted  # compiled kernels queued on streams
    if graphs:
        iris.mem.synchronize(device)
        heap.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            iris.ccl.all_reduce(grad_buf, grad_buf, op=iris.ccl.ReduceOp.AVG)
        iris.mem.synchronize(device)
        heap.barrier()
        for step in (1, 2):
            g = local_gradient(weight, rank, step)
            grad_buf.copy_(g)
            want = g.clone()
            dist.all_reduce(want, op=dist.ReduceOp.AVG)
            heap.barrier()  # every rank has refilled its buffer before any replay reads it
            graph.replay()
            iris.mem.synchronize(device)
            check(errors, f"CUDA graph replay, step {step}", grad_buf, want)
            heap.barrier()  # no rank refills while a peer's replay may still read
    # [/graph]
    del next_grad

    iris.ccl.check_errors()  # raises if a device-side wait of a collective gave up
    heap.barrier()
    heap.close()
    graph_note = "CUDA graph replayed" if graphs else "no CUDA graphs: kernels are interpreted here"
    return report(rank, world, errors, f"(every collective matches torch.distributed; {graph_note})")


if __name__ == "__main__":
    sys.exit(main())
