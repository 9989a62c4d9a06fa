"""Tutorial 3: overlapping communication with compute (docs/tutorials/overlap.md).

Every rank multiplies its own ``a`` (M x K) by a weight ``b`` (K x N) shared by all ranks;
the next stage needs ``relu`` of every rank's product, stacked along M (an all-gather).
Three ways to get there, each checked against plain torch:

1. bulk-synchronous: ``torch.matmul``, then ``iris.ccl.all_gather``, then ``relu``;
2. producer/consumer, by hand: one kernel whose programs push each finished tile to every
   rank and raise a per-tile flag there (release, system scope); then, for the same tiles of
   every rank, wait for the flag (acquire, bounded in time) and apply ``relu`` at once;
3. fused, with ``iris.ops.matmul_all_gather`` (and, for the work-group specialised pattern,
   ``iris.ops.all_gather_matmul``).

Shapes are small and not multiples of the tile, so the interpreter runs them in seconds.

Run: ``torchrun --nproc_per_node=3 examples/32_tutorial_overlap.py`` (no GPU needed).
"""

import sys

import torch
import triton
import triton.language as tl

import iris.ccl
import iris.mem  # before defining kernels: it decides whether they run in the interpreter
import iris.ops
from iris.mem.triton import Context
from iris.mem.utils import record_timeout, wait_at_least

NAME = "tutorial_overlap"
M, N, K = 37, 45, 29  # none a multiple of the 16 x 16 x 16 tiles below
BLOCK_M, BLOCK_N, BLOCK_K = 16, 16, 16
CALLS = 2  # the kernel runs twice: flags count calls, so nothing is reset between them


# [kernel]
@triton.jit
def gemm_push_relu(
    context, a, b, gathered, flags, out, status, call, budget, M, N, K,
    RANK: tl.constexpr, WORLD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """out = relu(all_gather(a @ b)), tile by tile.

    a (M, K), b (K, N), out (WORLD * M, N): row-major. On the heap: gathered (WORLD * M, N),
    where rows [r * M, (r + 1) * M) receive rank r's product, and flags (WORLD, tiles), where
    flags[r, t] reaches `call` when rank r's tile t of this call has landed here.
    """
    ctx = Context.initialize(context, RANK, WORLD)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n

    # Producer: this program's tiles (pid, pid + programs, ...) of this rank's product.
    t = tl.program_id(0)
    while t < tiles:
        rows = (t // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (t % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k = 0
        while k < K:
            ks = k + tl.arange(0, BLOCK_K)
            a_mask = (rows[:, None] < M) & (ks[None, :] < K)
            b_mask = (ks[:, None] < K) & (cols[None, :] < N)
            a_blk = tl.load(a + rows[:, None] * K + ks[None, :], mask=a_mask, other=0.0)
            b_blk = tl.load(b + ks[:, None] * N + cols[None, :], mask=b_mask, other=0.0)
            acc += tl.dot(a_blk, b_blk)
            k += BLOCK_K
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        mine = gathered + (RANK * M + rows[:, None]) * N + cols[None, :]
        for i in tl.static_range(WORLD):  # push the tile into every rank's `gathered`
            ctx.store(mine, acc, (RANK + i) % WORLD, mask=mask)
        tl.debug_barrier()  # every thread's stores of the tile come before the flag
        for i in tl.static_range(WORLD):  # then tell every rank it is there
            ctx.atomic_xchg(flags + RANK * tiles + t, call, (RANK + i) % WORLD, sem="release", scope="sys")
        t += tl.num_programs(0)

    # Consumer: the same tiles of every rank's product, each as soon as its flag is up.
    t = tl.program_id(0)
    while t < tiles:
        rows = (t // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (t % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        for i in tl.static_range(WORLD):
            src = (RANK + i) % WORLD
            flag = flags + src * tiles + t
            if wait_at_least(flag, call, budget) < call:  # acquire, gives up after `budget` ns
                record_timeout(status, RANK, src, flag)  # the host raises it
            tl.debug_barrier()  # every thread reads the tile after the acquire
            where = (src * M + rows[:, None]) * N + cols[None, :]
            tile = tl.load(gathered + where, mask=mask)
            tl.store(out + where, tl.maximum(tile, 0.0), mask=mask)
        t += tl.num_programs(0)


# [/kernel]


def a_of(rank: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s rows: any rank can rebuild any other's, for the torch reference."""
    g = torch.Generator(device=device).manual_seed(rank)
    return torch.randn(M, K, generator=g, device=device)


def report(rank: int, world: int, errors: list[str], note: str = "") -> int:
    """Print this rank's verdict as one line (one write, so ranks' lines do not interleave)."""
    verdict = f"FAILED: {'; '.join(errors)}" if errors else f"validated {note}".rstrip()
    sys.stdout.write(f"[rank {rank}/{world}] {NAME}: {verdict}\n")
    sys.stdout.flush()
    return 1 if errors else 0


def main() -> int:
    errors: list[str] = []
    heap = iris.mem.init(heap_size=1 << 24)
    rank, world, device = heap.rank, heap.world_size, heap.device
    a = a_of(rank, device)
    b = torch.linspace(-1, 1, K * N, device=device).view(K, N)  # the same weight everywhere
    # The reference: plain torch, every rank's product computed locally.
    want = torch.cat([a_of(r, device) @ b for r in range(world)]).relu()

    def check(what: str, got: torch.Tensor) -> None:
        # fp32 GEMMs run on tf32 tensor cores on GPUs: compare relative to the largest value
        tol = 1e-2 * want.abs().max().item()
        if got.shape != want.shape or not torch.allclose(got, want, rtol=0, atol=tol):
            worst = (got - want).abs().max().item() if got.shape == want.shape else "shape"
            errors.append(f"{what}: differs from torch (max error {worst})")

    # [bulk]
    # 1. Bulk-synchronous: the whole GEMM, then the whole collective, then the consumer.
    product = a @ b
    gathered_bs = torch.empty(world * M, N, device=device)
    iris.ccl.all_gather(gathered_bs, product)
    check("bulk-synchronous", gathered_bs.relu())
    # [/bulk]

    # [launch]
    # 2. Producer/consumer in one kernel.
    gathered = heap.zeros(world * M, N)  # peers push tiles here
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    flags = heap.zeros(world, tiles, dtype=torch.int32)  # peers raise these
    status = torch.zeros(4, dtype=torch.int64, device=device)  # a timeout's record, if any
    out = torch.empty(world * M, N, device=device)
    # Programs wait for their twins on the peers: never more than can run at once.
    programs = min(tiles, heap.capabilities.resident_programs)
    heap.barrier()  # `gathered` and `flags` are zeroed everywhere before anyone pushes
    for call in range(1, CALLS + 1):
        gemm_push_relu[(programs,)](
            heap.get_device_context(), a, b, gathered, flags, out, status, call,
            iris.mem.wait_budget_ns(), M, N, K, RANK=rank, WORLD=world,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        )  # fmt: skip
        # Before the next call overwrites a peer's `gathered`, that peer must have read it.
        heap.device_barrier()
    iris.mem.synchronize(device)
    code, waiter, peer, address = status.tolist()  # [1, rank, peer, flag] after a timeout
    if code:
        errors.append(f"rank {waiter} gave up waiting for rank {peer}'s tile (flag at {address:#x})")
    check("producer/consumer kernel", out)
    # [/launch]

    # [fused]
    # 3. Fused: iris.ops computes the product and pushes each tile as it is finished.
    fused = heap.empty(world * M, N)  # on the heap: peers store their tiles straight into it
    iris.ops.matmul_all_gather(fused, a, b)
    check("iris.ops.matmul_all_gather", fused.relu())
    # Work-group specialised: some programs only push this rank's rows of A to the peers
    # while the others start multiplying; out = all_gather(a) @ b.
    ag_out = torch.empty(world * M, N, device=device)
    iris.ops.all_gather_matmul(ag_out, a, b, config=iris.ops.Config(comm_sms=1))
    check("iris.ops.all_gather_matmul", ag_out.relu())
    # [/fused]

    heap.barrier()
    iris.ops.release_workspaces()
    heap.close()
    return report(rank, world, errors, f"({world} x {M}x{K} @ {K}x{N}, three ways, {programs} programs)")


if __name__ == "__main__":
    sys.exit(main())
