"""Functional ``put`` and ``get`` around a ring.

The functional device API (``iris.mem.triton.put``, ``get``, ``load``, ``store``,
``atomic_*``) takes the table of heap bases (``heap.get_heap_bases()``) and both ranks
explicitly, in the reference Iris argument order:

* ``put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=...)``: read local data at
  ``from_ptr`` and write it to ``to_ptr`` on ``to_rank``; ``from_rank`` is the caller.
* ``get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=...)``: read ``from_ptr`` on
  ``from_rank`` and write it locally at ``to_ptr``; ``to_rank`` is the caller.

Both pointers are given in the caller's address space. Here every rank puts a 2-D tile
(rows x cols, neither a multiple of the block) into its right neighbour's inbox, then,
after a barrier, gets its right neighbour's tile into a local buffer.

Run: ``torchrun --nproc_per_node=3 examples/03_put_get.py`` (no GPU needed).
"""

import sys

import torch
import triton
import triton.language as tl

import iris.mem  # before defining kernels: it decides whether they run in the interpreter
from iris.mem.triton import get, put

NAME = "put_get"
ROWS, COLS = 37, 45  # neither is a multiple of the block
BLOCK_M, BLOCK_N = 16, 32


@triton.jit
def put_right(
    src,
    inbox,
    heap_bases,
    rows,
    cols,
    stride,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """inbox on rank (RANK + 1) % WORLD  <-  src here."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    idx = offs_m[:, None] * stride + offs_n[None, :]
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < cols)
    put(src + idx, inbox + idx, RANK, (RANK + 1) % WORLD, heap_bases, mask=mask)


@triton.jit
def get_right(
    src,
    local,
    heap_bases,
    rows,
    cols,
    stride,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """local here  <-  src on rank (RANK + 1) % WORLD."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    idx = offs_m[:, None] * stride + offs_n[None, :]
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < cols)
    get(src + idx, local + idx, (RANK + 1) % WORLD, RANK, heap_bases, mask=mask)


def tile(rank: int, device: torch.device) -> torch.Tensor:
    """Rank-specific values, exact in float16."""
    values = torch.arange(ROWS * COLS, device=device).reshape(ROWS, COLS) % 251 + 256 * rank
    return values.to(torch.float16)


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
        left, right = (rank - 1) % world, (rank + 1) % world
        heap_bases = heap.get_heap_bases()

        src = heap.as_symmetric(tile(rank, device))  # read remotely by get: must be on the heap
        inbox = heap.zeros(ROWS, COLS, dtype=torch.float16)  # written remotely by put
        local = torch.zeros(ROWS, COLS, dtype=torch.float16, device=device)  # written locally only
        heap.barrier()  # every heap is initialised before anyone writes into it

        grid = (triton.cdiv(ROWS, BLOCK_M), triton.cdiv(COLS, BLOCK_N))
        meta = dict(RANK=rank, WORLD=world, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        put_right[grid](src, inbox, heap_bases, ROWS, COLS, src.stride(0), **meta)
        heap.barrier()  # every put has landed
        get_right[grid](src, local, heap_bases, ROWS, COLS, src.stride(0), **meta)
        heap.barrier()

        for name, got, owner in (("put (inbox)", inbox, left), ("get (local)", local, right)):
            expected = tile(owner, device)
            if not torch.equal(got, expected):
                bad = (got != expected).nonzero()
                i, j = (int(v) for v in bad[0])
                errors.append(
                    f"{name}: {bad.shape[0]} of {ROWS * COLS} elements differ from rank {owner}'s tile, "
                    f"first at ({i}, {j}): got {got[i, j].item()}, expected {expected[i, j].item()}"
                )

    return report(rank, world, errors)


if __name__ == "__main__":
    sys.exit(main())
