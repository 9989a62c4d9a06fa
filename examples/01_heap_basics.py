"""Symmetric heap basics: allocation, symmetry, heap bases, broadcast and barriers.

Demonstrates the host side of ``iris.mem`` without writing a kernel:

* ``iris.mem.init`` creates one equal-sized heap per rank (a context manager closes it);
* the torch-like factories (``zeros``, ``ones``, ``full``, ``arange``, ``randn`` with a
  seeded generator, ``zeros_like``) allocate on the heap, in the same order on every rank,
  so every tensor sits at the same byte offset of every rank's heap;
* ``is_symmetric`` tells heap tensors from ordinary ones, ``as_symmetric`` copies an
  ordinary tensor onto the heap;
* ``get_heap_bases`` is the table of every rank's heap address (what kernels translate with);
* ``broadcast`` sends a Python object or tensor from rank 0 to every rank;
* ``barrier`` (host) and ``device_barrier`` (stream-ordered, on the device) synchronise ranks.

Run: ``torchrun --nproc_per_node=3 examples/01_heap_basics.py`` (no GPU needed: without one,
or with ``IRIS_BACKEND=cpu``, kernels run in Triton's interpreter).
"""

import sys

import torch

import iris.mem

NAME = "heap_basics"


def check(errors: list[str], ok: bool, what: str) -> None:
    if not ok:
        errors.append(what)


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

        # --- factories: every rank allocates the same sequence -------------------------
        z = heap.zeros(4, 5)
        o = heap.ones(7, dtype=torch.int32)
        f = heap.full((3, 3), 2.5)
        a = heap.arange(10)
        a2 = heap.arange(1, 10, 3, dtype=torch.float32)
        gen = torch.Generator(device=device).manual_seed(1234)
        r = heap.randn(16, generator=gen)
        like = heap.zeros_like(torch.empty(2, 6, dtype=torch.float16))

        check(errors, torch.equal(z, torch.zeros(4, 5, device=device)), "zeros")
        check(errors, torch.equal(o, torch.ones(7, dtype=torch.int32, device=device)), "ones")
        check(errors, torch.equal(f, torch.full((3, 3), 2.5, device=device)), "full")
        check(errors, torch.equal(a, torch.arange(10, device=device)), "arange(10)")
        check(errors, torch.equal(a2, torch.arange(1, 10, 3, dtype=torch.float32, device=device)), "arange")
        expected_r = torch.randn(
            16, generator=torch.Generator(device=device).manual_seed(1234), device=device
        )
        check(errors, torch.equal(r, expected_r), "randn with a seeded generator")
        check(errors, like.shape == (2, 6) and like.dtype == torch.float16 and not like.any(), "zeros_like")
        for t in (z, o, f, a, a2, r, like):
            check(errors, t.device == device, f"factory tensor on {t.device}, heap on {device}")

        # --- symmetry -------------------------------------------------------------------
        plain = torch.arange(6, dtype=torch.float32, device=device) * (rank + 1)
        check(errors, heap.is_symmetric(z) and heap.is_symmetric(z[1:, 2:]), "heap tensor not symmetric")
        check(errors, not heap.is_symmetric(plain), "ordinary tensor reported symmetric")
        sym = heap.as_symmetric(plain)
        check(errors, heap.is_symmetric(sym) and torch.equal(sym, plain), "as_symmetric copy")
        check(errors, heap.as_symmetric(sym) is sym, "as_symmetric of a heap tensor must return it")

        # --- heap bases: one address per rank; offsets agree on every rank ---------------
        bases = heap.get_heap_bases()
        check(errors, bases.shape == (world,) and bases.dtype == torch.int64, "heap bases shape/dtype")
        base = int(bases[rank])
        offsets = [t.data_ptr() - base for t in (z, o, f, a, r, sym)]
        check(errors, all(0 <= off < heap.heap_size for off in offsets), "tensor outside this rank's heap")
        check(errors, len(set(bases.tolist())) == world, "heap bases are not distinct")
        # The same allocation sequence puts every tensor at the same offset on every rank.
        check(errors, heap.broadcast(offsets, src=0) == offsets, "allocation offsets differ from rank 0")

        # --- broadcast of a Python object and of a tensor from rank 0 --------------------
        config = heap.broadcast({"seed": 1234, "note": "from rank 0"} if rank == 0 else None, src=0)
        check(errors, config == {"seed": 1234, "note": "from rank 0"}, f"broadcast object: {config}")
        t0 = heap.broadcast(plain, src=0)  # rank 0's plain is arange(6) * 1
        check(
            errors, torch.equal(t0, torch.arange(6, dtype=torch.float32, device=device)), "broadcast tensor"
        )
        check(errors, t0.device == device, "broadcast tensor device")
        # Same seed on every rank: every rank drew the same numbers.
        check(errors, torch.equal(heap.broadcast(r, src=0), r), "seeded randn differs between ranks")

        # --- barriers ----------------------------------------------------------------------
        heap.barrier()  # host: waits for this rank's queued device work, then for all ranks
        for _ in range(3):  # device: generations are counted on the device, nothing to reset
            heap.device_barrier()
        heap.barrier()

    return report(rank, world, errors)


if __name__ == "__main__":
    sys.exit(main())
