"""Remote atomics: counters, maximum and compare-and-swap across ranks.

Every program of every rank atomically increments

* one shared counter on *every* rank (``atomic_add``, ``sem="relaxed"``: only the total
  matters, no ordering with other memory is needed), and
* a per-sender slot ``hits[RANK]`` on every rank,

so after a barrier each rank must hold exactly ``world * PROGRAMS * ITERS`` in its counter
and ``PROGRAMS * ITERS`` in every slot. Then every rank proposes a value to a maximum on
every rank (``atomic_max``) and tries to claim an "owner" word on rank 0 with
``atomic_cas(owner, -1, RANK)``: exactly one rank wins, and every rank learns from the
returned previous value whether it did.

Remote atomics use ``scope="sys"`` because the target word lives in another GPU's (or
process's) memory.

Run: ``torchrun --nproc_per_node=3 examples/04_atomics.py`` (no GPU needed).
"""

import sys

import torch
import triton
import triton.language as tl

import iris.mem  # before defining kernels: it decides whether they run in the interpreter
from iris.mem.triton import Context

NAME = "atomics"
PROGRAMS = 4  # programs per rank, all incrementing concurrently
ITERS = 3  # increments per program and target rank


@triton.jit
def increment_everywhere(
    context, counter, hits, RANK: tl.constexpr, WORLD: tl.constexpr, ITERS: tl.constexpr
):
    ctx = Context.initialize(context, RANK, WORLD)
    for _ in tl.static_range(ITERS):
        for peer in tl.static_range(WORLD):
            ctx.atomic_add(counter, 1, peer, sem="relaxed", scope="sys")
            ctx.atomic_add(hits + RANK, 1, peer, sem="relaxed", scope="sys")


@triton.jit
def max_and_claim(context, maximum, owner, previous, RANK: tl.constexpr, WORLD: tl.constexpr):
    ctx = Context.initialize(context, RANK, WORLD)
    for peer in tl.static_range(WORLD):
        ctx.atomic_max(maximum, RANK * 10 + 7, peer, sem="relaxed", scope="sys")
    # Claim rank 0's owner word: succeeds (returns -1) for exactly one rank.
    old = ctx.atomic_cas(owner, -1, RANK, 0, sem="acq_rel", scope="sys")
    tl.store(previous, old)


def report(rank: int, world: int, errors: list[str], note: str = "") -> int:
    """Print this rank's verdict as one line (one write, so ranks' lines do not interleave)."""
    verdict = f"FAILED: {'; '.join(errors)}" if errors else f"validated {note}".rstrip()
    sys.stdout.write(f"[rank {rank}/{world}] {NAME}: {verdict}\n")
    sys.stdout.flush()
    return 1 if errors else 0


def main() -> int:
    errors: list[str] = []
    with iris.mem.init(heap_size=1 << 24) as heap:
        rank, world, device = heap.rank, heap.world_size, heap.device
        context = heap.get_device_context()

        counter = heap.zeros(1, dtype=torch.int32)
        hits = heap.zeros(world, dtype=torch.int32)
        maximum = heap.full((1,), -1, dtype=torch.int32)
        owner = heap.full((1,), -1, dtype=torch.int32)
        previous = torch.zeros(1, dtype=torch.int32, device=device)  # local result
        heap.barrier()  # every rank's words are initialised before anyone updates them

        increment_everywhere[(PROGRAMS,)](context, counter, hits, RANK=rank, WORLD=world, ITERS=ITERS)
        max_and_claim[(1,)](context, maximum, owner, previous, RANK=rank, WORLD=world)
        heap.barrier()  # every atomic of every rank is done

        # Expected values, computed with torch.
        expected_counter = torch.tensor([world * PROGRAMS * ITERS], dtype=torch.int32, device=device)
        expected_hits = torch.full((world,), PROGRAMS * ITERS, dtype=torch.int32, device=device)
        expected_max = torch.arange(world, dtype=torch.int32, device=device).mul(10).add(7).max()
        if not torch.equal(counter, expected_counter):
            errors.append(f"counter is {counter.item()}, expected {expected_counter.item()}")
        if not torch.equal(hits, expected_hits):
            errors.append(f"hits per sender are {hits.tolist()}, expected {expected_hits.tolist()}")
        if maximum.item() != expected_max.item():
            errors.append(f"maximum is {maximum.item()}, expected {expected_max.item()}")

        winner = heap.broadcast(int(owner.item()), src=0)  # only rank 0 holds the owner word
        won = int(previous.item()) == -1
        if not 0 <= winner < world:
            errors.append(f"owner word on rank 0 is {winner}, not a rank")
        elif won != (winner == rank):
            errors.append(f"atomic_cas returned {previous.item()} but the owner is rank {winner}")
        elif not won and int(previous.item()) != winner:
            errors.append(f"losing atomic_cas returned {previous.item()}, expected the owner {winner}")
        heap.barrier()

    return report(rank, world, errors, f"(owner: rank {winner})")


if __name__ == "__main__":
    sys.exit(main())
