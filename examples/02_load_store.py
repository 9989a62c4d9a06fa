"""Remote store and remote load with the device ``Context``.

Each rank writes a block of its data straight into its right neighbour's heap with
``Context.store`` (a "push"), then, after a barrier, reads its left neighbour's data with
``Context.load`` (a "pull"). The kernels receive ``heap.get_device_context()`` and the
rank and world size as ``tl.constexpr``; ``Context`` turns a pointer into this rank's heap
into the pointer at the same offset of a peer's heap.

``n`` is deliberately not a multiple of ``BLOCK``: the last program masks its tail, and
the guard elements past ``n`` must stay untouched.

Run: ``torchrun --nproc_per_node=3 examples/02_load_store.py`` (no GPU needed).
"""

import sys

import torch
import triton
import triton.language as tl

import iris.mem  # before defining kernels: it decides whether they run in the interpreter
from iris.mem.triton import Context

NAME = "load_store"
N = 1000  # elements per rank, not a multiple of BLOCK
BLOCK = 128
GUARD = -1.0  # value of the elements past N, which masked accesses must not touch


@triton.jit
def store_to_right(context, src, dst, n, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """dst on rank (RANK + 1) % WORLD  <-  src here (masked to n elements)."""
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = tl.load(src + offs, mask=mask)
    ctx.store(dst + offs, values, (RANK + 1) % WORLD, mask=mask)


@triton.jit
def load_from_left(context, src, out, n, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """out here  <-  src on rank (RANK - 1) % WORLD (masked to n elements)."""
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = ctx.load(src + offs, (RANK + WORLD - 1) % WORLD, mask=mask, other=0.0)
    tl.store(out + offs, values, mask=mask)


def rank_data(rank: int, n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device=device) + 1000.0 * rank


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
        left = (rank - 1) % world
        context = heap.get_device_context()

        # Heap tensors (allocated in the same order on every rank). Only pointers that a
        # kernel translates to a peer must be on the heap: src (loaded remotely) and inbox.
        src = heap.as_symmetric(rank_data(rank, N, device))
        inbox = heap.full((N + BLOCK,), GUARD, dtype=torch.float32)
        out = torch.full((N + BLOCK,), GUARD, dtype=torch.float32, device=device)  # local only
        # Nobody may write into a peer's heap before that peer initialised it.
        heap.barrier()

        grid = (triton.cdiv(N, BLOCK),)
        store_to_right[grid](context, src, inbox, N, RANK=rank, WORLD=world, BLOCK=BLOCK)
        heap.barrier()  # every store has landed before anyone reads
        load_from_left[grid](context, src, out, N, RANK=rank, WORLD=world, BLOCK=BLOCK)
        heap.barrier()

        expected = rank_data(left, N, device)  # what the left neighbour stored / holds
        for name, got in (("store (inbox)", inbox), ("load (out)", out)):
            if not torch.equal(got[:N], expected):
                bad = (got[:N] != expected).nonzero().flatten()
                i = int(bad[0])
                errors.append(
                    f"{name}: {bad.numel()} of {N} elements differ from rank {left}'s data, first at {i}: "
                    f"got {got[i].item()}, expected {expected[i].item()}"
                )
            if not bool((got[N:] == GUARD).all()):
                errors.append(f"{name}: masked-out elements past n={N} were written")

    return report(rank, world, errors)


if __name__ == "__main__":
    sys.exit(main())
