"""Producer/consumer message passing with release/acquire flags.

Each round, rank ``r`` sends a payload to rank ``(r + 1) % world``:

1. the producer writes the payload into the consumer's inbox with ``put``;
2. it then raises the consumer's flag with ``atomic_xchg(sem="release", scope="sys")``:
   the release orders the payload writes before the flag, for any observer that
   reads the flag with acquire semantics;
3. the consumer polls its own flag with ``atomic_add(flag, 0, sem="acquire", scope="sys")``
   (a read that cannot be cached or reordered) until it shows the round, and only then
   reads the payload.

The wait is bounded: ``SPIN_BUDGET`` (a constexpr) caps the polls. When it runs out, the
kernel records the failure in a status word instead of hanging, and the host reports it.
Each round uses its own inbox row and the flag counts rounds (``step + 1``), so a fast
producer never overwrites a payload the consumer has not read yet.

Run: ``torchrun --nproc_per_node=3 examples/05_message_passing.py`` (no GPU needed).
"""

import sys

import torch
import triton
import triton.language as tl

import iris.mem  # before defining kernels: it decides whether they run in the interpreter
from iris.mem.triton import atomic_add, atomic_xchg, put

NAME = "message_passing"
ROUNDS = 4
N = 300  # payload elements, not a multiple of BLOCK
BLOCK = 128


@triton.jit
def send_and_receive(
    outbox,
    inbox,
    received,
    flag,
    status,
    heap_bases,
    step,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    SPIN_BUDGET: tl.constexpr,
):
    """One program: send this round's payload right, then wait for the one from the left."""
    dst = (RANK + 1) % WORLD
    row = step * N
    # 1. Producer: payload into the consumer's inbox row.
    for start in tl.static_range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        put(outbox + row + offs, inbox + row + offs, RANK, dst, heap_bases, mask=offs < N)
    tl.debug_barrier()  # all threads of the program have issued their writes
    # 2. Producer: publish. Release: the payload is visible before the flag is.
    atomic_xchg(flag, step + 1, RANK, dst, heap_bases, sem="release", scope="sys")

    # 3. Consumer: bounded acquire spin on our own flag.
    seen = atomic_add(flag, 0, RANK, RANK, heap_bases, sem="acquire", scope="sys")
    spins = 0
    while (seen < step + 1) & (spins < SPIN_BUDGET):
        seen = atomic_add(flag, 0, RANK, RANK, heap_bases, sem="acquire", scope="sys")
        spins += 1
    if seen >= step + 1:
        for start in tl.static_range(0, N, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            payload = tl.load(inbox + row + offs, mask=offs < N)
            tl.store(received + row + offs, payload, mask=offs < N)
    else:
        # Out of budget: record [1, spins, last flag value seen] instead of hanging.
        tl.store(status + step * 3, 1)
        tl.store(status + step * 3 + 1, spins)
        tl.store(status + step * 3 + 2, seen)


def payload(rank: int, step: int, device: torch.device) -> torch.Tensor:
    return torch.arange(N, dtype=torch.float32, device=device) * (step + 1) + 10_000.0 * rank


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
        heap_bases = heap.get_heap_bases()
        # Budget of polls per wait: enough to ride out a peer that starts late (still compiling
        # its kernel, or interpreting: an interpreted poll takes about a millisecond), small
        # enough that a lost message is reported within a minute or so on the CPU backend.
        spin_budget = 30_000 if heap.backend == "cpu" else 1 << 30

        outbox = heap.as_symmetric(torch.stack([payload(rank, k, device) for k in range(ROUNDS)]))
        inbox = heap.zeros(ROUNDS, N, dtype=torch.float32)
        flag = heap.zeros(1, dtype=torch.int32)
        received = torch.zeros(ROUNDS, N, dtype=torch.float32, device=device)
        status = torch.zeros(ROUNDS, 3, dtype=torch.int32, device=device)
        heap.barrier()  # inboxes and flags are zeroed everywhere before anyone sends

        for k in range(ROUNDS):  # no host synchronisation between rounds: the flags order them
            send_and_receive[(1,)](
                outbox, inbox, received, flag, status, heap_bases, k,
                RANK=rank, WORLD=world, N=N, BLOCK=BLOCK, SPIN_BUDGET=spin_budget,
            )  # fmt: skip
        heap.barrier()

        for k in range(ROUNDS):
            failed, spins, seen = status[k].tolist()
            if failed:
                errors.append(
                    f"step {k}: no message from rank {left} after {spins} polls (flag was {seen}, "
                    f"expected >= {k + 1})"
                )
                continue
            expected = payload(left, k, device)
            if not torch.equal(received[k], expected):
                bad = (received[k] != expected).nonzero().flatten()
                i = int(bad[0])
                errors.append(
                    f"step {k}: {bad.numel()} of {N} payload elements from rank {left} differ, first at "
                    f"{i}: got {received[k, i].item()}, expected {expected[i].item()}"
                )
        if flag.item() != ROUNDS:
            errors.append(f"flag is {flag.item()} after {ROUNDS} rounds")

    return report(rank, world, errors)


if __name__ == "__main__":
    sys.exit(main())
