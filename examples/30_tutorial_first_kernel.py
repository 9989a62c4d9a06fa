"""Tutorial 1: your first multi-GPU kernel (docs/tutorials/first-kernel.md).

Every rank allocates the same tensors on a symmetric heap, checks that each one sits at the
same offset on every rank, and runs two kernels:

* ``exchange``: a remote store into the right neighbour's inbox, a remote load from the
  left neighbour, and an atomic increment of a counter on every rank;
* ``two_hops``, after a device barrier: a remote load of the left neighbour's inbox, which
  the rank two to the left filled in the first kernel.

Everything is checked against values computed with torch on the host.

Run: ``torchrun --nproc_per_node=3 examples/30_tutorial_first_kernel.py`` (no GPU needed).
"""

import sys

import torch
import triton
import triton.language as tl

import iris.mem  # before defining kernels: it decides whether they run in the interpreter
from iris.mem.triton import Context

NAME = "tutorial_first_kernel"
N = 1000  # elements per rank, not a multiple of BLOCK
BLOCK = 256


# [kernels]
@triton.jit
def exchange(context, mine, inbox, pulled, counter, n, RANK: tl.constexpr, WORLD: tl.constexpr,
             BLOCK: tl.constexpr):  # fmt: skip
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    right = (RANK + 1) % WORLD
    left = (RANK + WORLD - 1) % WORLD

    # Push: my values into my right neighbour's inbox.
    values = tl.load(mine + offs, mask=mask)
    ctx.store(inbox + offs, values, right, mask=mask)

    # Pull: my left neighbour's values into `pulled`, an ordinary local tensor.
    theirs = ctx.load(mine + offs, left, mask=mask)
    tl.store(pulled + offs, theirs, mask=mask)

    # Count: every program adds 1 to the counter of every rank, this one included.
    for peer in tl.static_range(WORLD):
        ctx.atomic_add(counter, 1, peer, sem="relaxed", scope="sys")


@triton.jit
def two_hops(context, inbox, out, n, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    left = (RANK + WORLD - 1) % WORLD
    # The left neighbour's inbox holds what the rank two to the left pushed in `exchange`.
    tl.store(out + offs, ctx.load(inbox + offs, left, mask=mask), mask=mask)


# [/kernels]


def values_of(rank: int, device: torch.device) -> torch.Tensor:
    """What rank ``rank`` starts with: 0, 1, 2, ... plus 1000 times its rank."""
    return torch.arange(N, dtype=torch.float32, device=device) + 1000.0 * rank


def report(rank: int, world: int, errors: list[str], note: str = "") -> int:
    """Print this rank's verdict as one line (one write, so ranks' lines do not interleave)."""
    verdict = f"FAILED: {'; '.join(errors)}" if errors else f"validated {note}".rstrip()
    sys.stdout.write(f"[rank {rank}/{world}] {NAME}: {verdict}\n")
    sys.stdout.flush()
    return 1 if errors else 0


def expect(errors: list[str], what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        i = int((got != want).nonzero().flatten()[0])
        errors.append(f"{what}: element {i} is {got[i].item()}, expected {want[i].item()}")


def main() -> int:
    errors: list[str] = []
    # [heap]
    heap = iris.mem.init(heap_size=1 << 20)  # collective: every rank calls it, same size
    rank, world, device = heap.rank, heap.world_size, heap.device

    # Every rank allocates the same tensors, in the same order.
    mine = heap.as_symmetric(values_of(rank, device))  # a copy of a torch tensor, on the heap
    inbox = heap.zeros(N, dtype=torch.float32)  # peers store into it
    counter = heap.zeros(1, dtype=torch.int32)  # peers add to it
    pulled = torch.zeros(N, dtype=torch.float32, device=device)  # local only: not on the heap
    # [/heap]

    # [symmetric]
    bases = heap.get_heap_bases().tolist()  # where every rank's heap is mapped in this process
    offset = inbox.data_ptr() - bases[rank]  # inbox's byte offset in my heap
    offsets = [heap.broadcast(offset, src=r) for r in range(world)]  # everyone's offset
    if len(set(offsets)) != 1:
        errors.append(f"inbox sits at offsets {offsets} on the ranks, not one offset")
    for r in range(world):
        # The twin of inbox on rank r, as this process sees it: base of r's heap + offset.
        twin = heap.peer_tensor(inbox, r)
        if twin.data_ptr() != bases[r] + offset:
            errors.append(f"rank {r}'s inbox is mapped at {twin.data_ptr():#x}, not {bases[r] + offset:#x}")
    # [/symmetric]

    # [launch]
    context = heap.get_device_context()
    grid = (triton.cdiv(N, BLOCK),)
    heap.barrier()  # every rank has zeroed its inbox and counter before anyone writes to them
    exchange[grid](context, mine, inbox, pulled, counter, N, RANK=rank, WORLD=world, BLOCK=BLOCK)
    heap.device_barrier()  # every rank's `exchange` is done before any `two_hops` reads
    two = torch.zeros(N, dtype=torch.float32, device=device)
    two_hops[grid](context, inbox, two, N, RANK=rank, WORLD=world, BLOCK=BLOCK)
    heap.barrier()  # every rank's kernels have finished: the host may read the results
    # [/launch]

    # [check]
    left, left2 = (rank - 1) % world, (rank - 2) % world
    expect(errors, "inbox (stored by the left neighbour)", inbox, values_of(left, device))
    expect(errors, "pulled (loaded from the left neighbour)", pulled, values_of(left, device))
    expect(errors, "two hops", two, values_of(left2, device))
    want_count = world * grid[0]  # every program of every rank added 1
    if counter.item() != want_count:
        errors.append(f"counter is {counter.item()}, expected {want_count}")
    heap.close()
    # [/check]
    return report(rank, world, errors, f"(inbox at offset {offset} on every rank, counter {want_count})")


if __name__ == "__main__":
    sys.exit(main())
