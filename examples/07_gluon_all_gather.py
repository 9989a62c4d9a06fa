"""All-gather in Gluon: a kernel of your own on ``iris.mem.gluon.Context``, and iris.ccl's.

Gluon (``triton.experimental.gluon``) is Triton's lower-level dialect: every tensor has an
explicit layout saying which thread holds which elements. The kernel below gives each
thread 16-byte runs of its tile (a ``BlockedLayout``), stores the tile into every rank's
``gathered`` buffer at this rank's chunk (``ctx.store`` with ``hint=16``: 16-byte vector
stores over NVLink), raises a per-(tile, source) flag on that rank (release, system scope),
then waits (acquire, system scope, bounded) until every source's tile has arrived in its
own buffer. The Gluon ``Context`` reads the rank and world size from the context tensor
when the kernel runs, so they are not kernel arguments.

Then ``iris.ccl.all_gather(..., config=Config(variant="gluon"))`` does the same for any
tensor. Both are checked against ``torch.distributed.all_gather_into_tensor``.

Gluon kernels compile for NVIDIA GPUs only; Triton's interpreter (the ``cpu`` backend)
cannot run them. On the cpu backend this example says so, checks that iris.ccl gives the
same clear error for ``variant="gluon"``, and exits 0.

Run: ``torchrun --nproc_per_node=2 examples/07_gluon_all_gather.py`` (NVIDIA GPUs).
"""

import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import iris.ccl
import iris.mem  # before defining kernels: it decides whether Triton kernels are interpreted
from iris.mem.gluon import Context

NAME = "gluon_all_gather"
N = 4000  # elements per rank: not a multiple of BLOCK, a multiple of 4 (16-byte chunks)
BLOCK = 1024
SPINS = 1 << 26  # per wait: a lost flag ends in a counted failure, not a hang


@gluon.jit
def all_gather_kernel(context, src, gathered, flags, failures, n, epoch, budget, BLOCK: gl.constexpr):
    """Program ``t`` pushes tile ``t`` of ``src`` (``n`` fp32 elements) into every rank's
    ``gathered[rank * n:]``, raises ``flags[t, rank]`` = ``epoch`` there, and waits for
    ``flags[t, source]`` = ``epoch`` from every source here."""
    ctx = Context.initialize(context)
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])  # 4 fp32 = 16 bytes
    tile = gl.program_id(0)
    offs = tile * BLOCK + gl.arange(0, BLOCK, layout=layout)
    mask = offs < n
    x = gl.load(src + offs, mask=mask)
    mine = gathered + ctx.rank * n
    for peer in range(ctx.world_size):
        ctx.store(mine + offs, x, peer, mask=mask, hint=16)
    # A CTA barrier: every thread's stores come before the flags below. Triton's own
    # tl.debug_barrier works in Gluon kernels (Gluon renamed its version between releases).
    tl.debug_barrier()
    row = flags + tile * ctx.world_size
    for peer in range(ctx.world_size):
        ctx.atomic_xchg(row + ctx.rank, epoch, peer, sem="release", scope="sys")
    for source in range(ctx.world_size):
        seen = gl.atomic_add(row + source, 0, sem="acquire", scope="sys")
        spins = budget * 0
        while (seen < epoch) & (spins < budget):
            seen = gl.atomic_add(row + source, 0, sem="acquire", scope="sys")
            spins += 1
        if seen < epoch:
            gl.atomic_add(failures, 1)


def report(rank: int, world: int, errors: list[str], note: str = "") -> int:
    """Print this rank's verdict as one line (one write, so ranks' lines do not interleave)."""
    verdict = f"FAILED: {'; '.join(errors)}" if errors else f"validated {note}".rstrip()
    sys.stdout.write(f"[rank {rank}/{world}] {NAME}: {verdict}\n")
    sys.stdout.flush()
    return 1 if errors else 0


def on_cpu(heap, errors: list[str]) -> str:
    """The cpu backend cannot run Gluon: say so, and check iris.ccl refuses clearly."""
    if heap.rank == 0:
        print("Gluon kernels need the cuda backend (NVIDIA GPUs): Triton's interpreter, which runs the "
              "cpu backend, cannot execute them. Run this example on GPUs.", flush=True)  # fmt: skip
    x = torch.ones(10)
    try:
        iris.ccl.all_gather(torch.empty(heap.world_size * 10), x, config=iris.ccl.Config(variant="gluon"))
        errors.append("iris.ccl ran Config(variant='gluon') on the cpu backend")
    except RuntimeError as e:
        if "cuda backend" not in str(e):
            errors.append(f"unclear error for variant='gluon' on the cpu backend: {e}")
    return "(cpu backend: Gluon needs CUDA; checked that iris.ccl says so)"


def main() -> int:
    errors: list[str] = []
    with iris.mem.init(heap_size=1 << 24) as heap:
        rank, world, device = heap.rank, heap.world_size, heap.device
        if heap.backend == "cpu":
            return report(rank, world, errors, on_cpu(heap, errors))
        src = torch.arange(N, dtype=torch.float32, device=device) + 10000.0 * rank
        want = torch.empty(world * N, device=device)
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(want, src)

        # 1. The hand-written kernel: the buffers peers write into live on the heap.
        gathered = heap.zeros(world * N)
        tiles = triton.cdiv(N, BLOCK)
        flags = heap.zeros(tiles * world, dtype=torch.int32)
        failures = torch.zeros(1, dtype=torch.int32, device=device)
        heap.barrier()  # nobody writes into a peer's heap before the peer zeroed it
        all_gather_kernel[(tiles,)](heap.get_device_context(), src, gathered, flags, failures, N, 1, SPINS,
                                    BLOCK=BLOCK, num_warps=4)  # fmt: skip
        heap.barrier()
        if failures.item():
            errors.append(f"{failures.item()} waits for a peer's tile ran out of spins")
        if not torch.equal(gathered, want):
            errors.append(f"hand-written kernel: {int((gathered != want).sum())} wrong elements")

        # 2. iris.ccl's Gluon all-gather, on plain tensors (staged through iris.ccl's heap).
        out = torch.empty(world * N, device=device)
        iris.ccl.all_gather(out, src, config=iris.ccl.Config(variant="gluon"))
        torch.cuda.synchronize()
        if not torch.equal(out, want):
            errors.append(f"iris.ccl gluon variant: {int((out != want).sum())} wrong elements")
    return report(rank, world, errors, f"({world} x {N} fp32 gathered, hand-written and iris.ccl)")


if __name__ == "__main__":
    sys.exit(main())
