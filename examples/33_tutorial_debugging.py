"""Tutorial 4: debugging and observing (docs/tutorials/debugging.md).

The program turns debug mode on for itself and provokes, on purpose, each kind of mistake
Iris catches, checking that each one is reported as documented:

* debug mode (``IRIS_DEBUG=1``): a kernel translating a pointer that is not on the heap
  (``HeapPointerError``, where kernels are interpreted), a tensor used after ``heap.free``
  (``UseAfterFreeError``), and, with more than one rank, ranks that allocate different
  tensors (``HeapMismatchError``) or call a collective with different shapes (``ValueError``);
* wait timeouts, with ``IRIS_WAIT_TIMEOUT`` set to half a second: a consumer whose producer
  never raises its flag, and (with more than one rank) a device barrier that one rank enters
  alone; both raise ``DeviceWaitTimeout``, whose message the program takes apart;
* device tracing: a traced producer/consumer kernel exported as Chrome/Perfetto JSON (per
  rank and merged) and drawn as a PNG when matplotlib is installed.

Run: ``torchrun --nproc_per_node=3 examples/33_tutorial_debugging.py [OUT_DIR]`` (no GPU
needed). The trace files go to OUT_DIR, or to a temporary folder removed at the end.
"""

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile

# [debug-on]
# Debug mode is read when iris.mem is imported and when a heap is made: set it first, the
# same on every rank (usually in the environment: IRIS_DEBUG=1 torchrun ...).
os.environ["IRIS_DEBUG"] = "1"
# [/debug-on]

import torch
import triton
import triton.language as tl

import iris.ccl
import iris.mem
import iris.mem.tracing
from iris.mem.runtime import SyncState, launch
from iris.mem.trace_format import TraceEvent
from iris.mem.triton import Context
from iris.mem.utils import record_timeout, wait_at_least

NAME = "tutorial_debugging"
N = 300  # elements per message, not a multiple of BLOCK
BLOCK = 128


def report(rank: int, world: int, errors: list[str], note: str = "") -> int:
    """Print this rank's verdict as one line (one write, so ranks' lines do not interleave)."""
    verdict = f"FAILED: {'; '.join(errors)}" if errors else f"validated {note}".rstrip()
    sys.stdout.write(f"[rank {rank}/{world}] {NAME}: {verdict}\n")
    sys.stdout.flush()
    return 1 if errors else 0


def say(rank: int, text: str) -> None:
    """What rank 0 saw, for the reader (other ranks see the same)."""
    if rank == 0:
        sys.stdout.write(f"  {text}\n")
        sys.stdout.flush()


def root_cause(error: BaseException) -> BaseException:
    """The innermost exception of a chain (the interpreter wraps a kernel's exception)."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return error


@contextlib.contextmanager
def wait_timeout(seconds: float):
    """IRIS_WAIT_TIMEOUT for the launches inside the block (it is read at every launch)."""
    old = os.environ.get("IRIS_WAIT_TIMEOUT")
    os.environ["IRIS_WAIT_TIMEOUT"] = str(seconds)
    try:
        yield
    finally:
        if old is None:
            del os.environ["IRIS_WAIT_TIMEOUT"]
        else:
            os.environ["IRIS_WAIT_TIMEOUT"] = old


# [bad-pointer]
@triton.jit
def store_to_right(context, dst, n, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.arange(0, BLOCK)
    ctx.store(dst + offs, offs.to(tl.float32), (RANK + 1) % WORLD, mask=offs < n)


# [/bad-pointer]


def debug_checks(heap, errors: list[str]) -> None:
    rank, world, device = heap.rank, heap.world_size, heap.device
    # [debug-checks]
    # 1. A pointer that is not on the heap, translated to a peer.
    if heap.capabilities.interpreted:  # compiled, the check traps and ends the CUDA context
        local = torch.zeros(N, device=device)  # a plain tensor: the bug
        try:
            store_to_right[(1,)](heap.get_device_context(), local, N, RANK=rank, WORLD=world, BLOCK=BLOCK)
            errors.append("a store through a pointer off the heap was not caught")
        except Exception as e:  # the interpreter wraps it; the cause is Iris's error
            cause = root_cause(e)
            if not isinstance(cause, iris.mem.HeapPointerError):
                errors.append(f"off-heap pointer: {type(cause).__name__}: {cause}")
            say(rank, f"HeapPointerError: {cause}")

    # 2. A tensor used after it was freed.
    stale = heap.zeros(N)
    heap.free(stale)
    try:
        iris.ccl.all_reduce(stale, stale)
        errors.append("a freed tensor was accepted by a collective")
    except iris.mem.UseAfterFreeError as e:
        say(rank, f"UseAfterFreeError: {e}")

    if world > 1:
        # 3. Ranks that allocate different tensors: every rank raises, nothing is allocated.
        try:
            heap.zeros(N + (rank == 0))
            errors.append("different allocations on the ranks were not caught")
        except iris.mem.HeapMismatchError as e:
            say(rank, f"HeapMismatchError: {e}")

        # 4. Ranks that call a collective with different shapes: every rank raises.
        x = torch.ones(N + (rank == 0), device=device)
        try:
            iris.ccl.all_reduce(x, x)
            errors.append("a collective with different shapes on the ranks was not caught")
        except ValueError as e:
            say(rank, f"ValueError: {e}")
    # [/debug-checks]


# [consumer]
@triton.jit
def consume(context, members, flags, epochs, status, budget, flag,
            RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):  # fmt: skip
    """Wait for the flag the left neighbour should raise; record a timeout if it never does."""
    left = (RANK + WORLD - 1) % WORLD
    if wait_at_least(flag, 1, budget) < 1:
        record_timeout(status, RANK, left, flag)


# [/consumer]

# What a DeviceWaitTimeout message says, field by field.
TIMEOUT_MESSAGE = re.compile(
    r"rank (?P<rank>\d+): (?P<what>.+?) gave up waiting for rank (?P<peer>\d+) "
    r"\((?P<where>flag at 0x[0-9a-f]+[^)]*)\) after IRIS_WAIT_TIMEOUT=(?P<timeout>[0-9.]+) s; (?P<advice>.+)"
)


def explain(rank: int, error: iris.mem.DeviceWaitTimeout, want_peer: int, errors: list[str]) -> dict:
    """Take a DeviceWaitTimeout's message apart and check it names what happened."""
    say(rank, f"DeviceWaitTimeout: {error}")
    fields = TIMEOUT_MESSAGE.match(str(error))
    if fields is None:
        errors.append(f"a DeviceWaitTimeout message in an unexpected form: {error}")
        return {}
    fields = fields.groupdict()
    for name, value in fields.items():
        say(rank, f"    {name:8} {value}")
    if int(fields["rank"]) != rank or int(fields["peer"]) != want_peer or float(fields["timeout"]) != 0.5:
        errors.append(
            f"the timeout names rank {fields['rank']}, peer {fields['peer']}, {fields['timeout']} s"
        )
    return fields


def timeouts(heap, errors: list[str]) -> None:
    rank, world, device = heap.rank, heap.world_size, heap.device
    # [timeout-own]
    # A consumer whose producer forgot to raise the flag. SyncState holds the status words
    # (and sync slots) of kernels that wait for peers; launch() raises what they recorded
    # where kernels finish before the launch returns, check() raises it elsewhere.
    state = SyncState(heap, range(world), 1, "the tutorial's consumer",
                      "its producer never raised the flag (the bug this tutorial plants)")  # fmt: skip
    flag = heap.zeros(1, dtype=torch.int32)  # nobody will raise it
    heap.barrier()
    with wait_timeout(0.5):
        say(rank, f"iris.mem.wait_timeout() = {iris.mem.wait_timeout()} s")
        try:
            launch(consume, 1, state, flag)
            iris.mem.synchronize(device)  # on GPUs the kernel only recorded it ...
            state.check()  # ... and the host raises it here
            errors.append("the consumer's wait did not time out")
        except iris.mem.DeviceWaitTimeout as e:
            explain(rank, e, (rank - 1) % world, errors)
    # [/timeout-own]

    if world > 1:
        # [timeout-barrier]
        # A device barrier that rank 0 enters alone: the others are late.
        heap.barrier()
        if rank == 0:
            with wait_timeout(0.5):
                try:
                    heap.device_barrier()
                    iris.mem.synchronize(device)
                    heap.check_device_errors()
                    errors.append("a device barrier entered alone did not time out")
                except iris.mem.DeviceWaitTimeout as e:
                    fields = explain(rank, e, 1, errors)
                    if fields and "members published [1, 0" not in fields["where"]:
                        errors.append(f"the barrier timeout does not show who arrived: {fields['where']}")
        heap.barrier()
        # The late ranks arrive now and find rank 0's arrival: the barrier completes and
        # every rank is in step again.
        if rank != 0:
            heap.device_barrier()
        heap.device_barrier()
        heap.barrier()
        # [/timeout-barrier]


# [traced-kernel]
@triton.jit
def traced_ring(context, outbox, inbox, flag, total, budget, N: tl.constexpr, WAIT: tl.constexpr,
                CONSUME: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
                BLOCK: tl.constexpr):  # fmt: skip
    """Send a message to the right neighbour, wait for the left one's, sum it."""
    ctx = Context.initialize(context, RANK, WORLD, tracing=True)
    right = (RANK + 1) % WORLD
    for start in tl.static_range(0, N, BLOCK):  # recorded: one "put" per block
        offs = start + tl.arange(0, BLOCK)
        ctx.put(outbox + offs, inbox + offs, right, mask=offs < N)
    tl.debug_barrier()
    ctx.atomic_xchg(flag, 1, right, sem="release", scope="sys")  # recorded: "atomic_xchg"
    waiting = ctx.tracing.record_event_start(WAIT, target_rank=(RANK + WORLD - 1) % WORLD)
    wait_at_least(flag, 1, budget)
    ctx.tracing.record_event_end(waiting)
    tl.debug_barrier()
    region = ctx.tracing.record_event_start(CONSUME)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.static_range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(inbox + offs, mask=offs < N, other=0.0)
    tl.store(total, tl.sum(acc))
    ctx.tracing.record_event_end(region)


# [/traced-kernel]


def tracing(heap, out_dir: str, errors: list[str]) -> str:
    rank, world, device = heap.rank, heap.world_size, heap.device
    # [tracing]
    consume_id = heap.tracing.register("consume")  # a name for a region of our own
    outbox = heap.full((N,), float(rank + 1))
    inbox = heap.zeros(N)
    flag = heap.zeros(1, dtype=torch.int32)
    total = torch.zeros(1, device=device)
    heap.tracing.enable(max_events=1000)  # collective
    heap.barrier()
    traced_ring[(1,)](
        heap.get_device_context(), outbox, inbox, flag, total, iris.mem.wait_budget_ns(),
        N=N, WAIT=int(TraceEvent.WAIT), CONSUME=consume_id, RANK=rank, WORLD=world, BLOCK=BLOCK,
    )  # fmt: skip
    heap.barrier()
    per_rank = heap.tracing.export(os.path.join(out_dir, "trace.json"))  # trace_rank<r>.json
    merged = heap.tracing.export(os.path.join(out_dir, "trace.json"), merge=True)  # rank 0 writes it
    picture = None
    if merged is not None:
        try:
            picture = iris.mem.tracing.render(merged, os.path.join(out_dir, "trace.png"))
        except ImportError:  # matplotlib is optional: pip install iris-mem[trace]
            pass
    # [/tracing]

    left = (rank - 1) % world
    if total.item() != N * (left + 1):
        errors.append(f"the traced kernel summed {total.item()}, expected {N * (left + 1)}")
    with open(per_rank) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    counts = {}
    for e in events:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
    want = {"put": triton.cdiv(N, BLOCK), "atomic_xchg": 1, "wait": 1, "consume": 1}
    if counts != want:
        errors.append(f"trace events {counts}, expected {want}")
    stats = heap.tracing.stats()
    if stats["dropped"] or not stats["guard_intact"]:
        errors.append(f"trace buffer: {stats}")
    note = f"{len(events)} events per rank"
    if merged is not None:
        note += ", merged" + (" and drawn" if picture else " (install matplotlib to draw it)")
    return note


def main() -> int:
    errors: list[str] = []
    out_dir = sys.argv[1] if len(sys.argv) > 1 else None
    keep = out_dir is not None
    heap = iris.mem.init(heap_size=1 << 24)
    rank, world = heap.rank, heap.world_size
    if out_dir is None:  # one folder for all ranks: rank 0 makes it
        out_dir = heap.broadcast(tempfile.mkdtemp(prefix="iris-trace-") if rank == 0 else None)
    say(rank, f"debug mode: {iris.mem.debug_enabled()}")
    debug_checks(heap, errors)
    timeouts(heap, errors)
    note = tracing(heap, out_dir, errors)
    heap.barrier()
    if rank == 0:
        if keep:
            note += f" in {out_dir}"
        else:
            shutil.rmtree(out_dir, ignore_errors=True)
    heap.close()
    return report(rank, world, errors, f"(every mistake reported as documented; trace: {note})")


if __name__ == "__main__":
    sys.exit(main())
