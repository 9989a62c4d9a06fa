"""Bad translations on the cpu backend, in normal mode: swapped rank arguments, a pointer off
the heap, a rank that is not one. Each raises an error naming the argument (never a crash of
the process by SIGSEGV), before any memory is touched; the message reaches the caller
readable, not inside one wrapper per device function.

The checks run in Triton's interpreter only (GPUs check in debug mode: test_mem_debug.py).
"""

import pytest
import torch
import triton
import triton.language as tl
from mem_testutils import BACKEND, HEAP, MULTI_WORLD

import iris.mem
import iris.mem.triton as imt
from iris.mem.testing import launch_world, run_world
from iris.mem.triton import Context

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(BACKEND != "cpu", reason="host-side pointer checks of the interpreter (cpu backend)"),
]
BLOCK = 64


@triton.jit
def _swapped_load_kernel(heap_bases, buf, out, rank, peer, BLOCK: tl.constexpr):
    """``load(pointer, to_rank, from_rank, ...)`` takes the calling rank first: swapped here."""
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, imt.load(buf + offs, peer, rank, heap_bases))


def swapped_load_body(rank, world_size):
    with iris.mem.init(HEAP) as heap:
        buf = heap.full((BLOCK,), float(rank))
        out = torch.zeros(BLOCK)
        heap.barrier()
        _swapped_load_kernel[(1,)](
            heap.get_heap_bases(), buf, out, rank, (rank + 1) % world_size, BLOCK=BLOCK
        )
        return out.sum().item()


def test_swapped_ranks_raise_on_every_rank_instead_of_crashing():
    """Every rank of a 3-rank world gets an error naming both rank arguments and the order
    they go in; none is killed by SIGSEGV (exit code -11), as happened before."""
    results = launch_world(swapped_load_body, MULTI_WORLD, timeout=120)
    for r in results:
        assert r.exitcode == 1 and not r.timed_out, f"rank {r.rank}: exit code {r.exitcode}\n{r.error}"
        assert "HeapPointerError" in r.error, r.error
        assert "`to_rank` and `from_rank` look swapped" in r.error, r.error
        assert "load(pointer, to_rank, from_rank, heap_bases, ...)" in r.error, r.error
        assert f"rank {r.rank} translated a pointer" in r.error, r.error


#: float32 words of a heap: ``buf + HEAP_WORDS`` lies past the end of the calling rank's heap.
HEAP_WORDS: tl.constexpr = tl.constexpr(HEAP // 4)


@triton.jit
def _bad_translation_kernel(context, heap_bases, buf, plain, out, rank, peer,
                            RANK: tl.constexpr, WORLD: tl.constexpr, CASE: tl.constexpr):  # fmt: skip
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.arange(0, 16)
    if CASE == "swapped_store":  # store(pointer, value, from_rank, to_rank, ...)
        imt.store(buf + offs, offs.to(tl.float32), peer, rank, heap_bases)
    elif CASE == "swapped_atomic":  # atomic_add(pointer, val, from_rank, to_rank, ...)
        imt.atomic_add(buf + offs, 1.0, peer, rank, heap_bases)
    elif CASE == "rank_out_of_range":
        tl.store(out + offs, ctx.load(buf + offs, WORLD))
    elif CASE == "not_on_heap":
        ctx.store(plain + offs, offs.to(tl.float32), peer)
    elif CASE == "past_the_end":
        ctx.store(buf + HEAP_WORDS + offs, offs.to(tl.float32), peer)
    else:  # masked-out lanes may hold any pointer: they are never touched
        ctx.store(plain + offs, offs.to(tl.float32), peer, mask=offs < 0)


CASES = ("swapped_store", "swapped_atomic", "rank_out_of_range", "not_on_heap", "past_the_end", "masked")


def bad_translations_body(rank, world_size):
    caught = {}
    with iris.mem.init(HEAP) as heap:
        buf = heap.zeros(16)
        plain = torch.zeros(16)
        out = torch.zeros(16)
        heap.barrier()
        for case in CASES:
            try:
                _bad_translation_kernel[(1,)](
                    heap.get_device_context(), heap.get_heap_bases(), buf, plain, out, rank,
                    (rank + 1) % world_size, RANK=rank, WORLD=world_size, CASE=case,
                )  # fmt: skip
                caught[case] = None
            except Exception as e:  # noqa: BLE001 - the interpreter wraps it once; its text is Iris's
                caught[case] = (type(e).__name__, str(e))
        heap.barrier()
        untouched = heap.zeros(16).sum().item() == 0 and buf.sum().item() == 0 and plain.sum().item() == 0
        return caught, untouched


def test_bad_translations_name_the_argument():
    for rank, (caught, untouched) in enumerate(run_world(bad_translations_body, MULTI_WORLD, timeout=180)):
        peer = (rank + 1) % MULTI_WORLD
        assert caught["masked"] is None, caught["masked"]
        for case in CASES[:-1]:
            assert caught[case] is not None, f"rank {rank}: {case} was not caught"
            name, text = caught[case]
            # One wrapper (the interpreter's, around the kernel), quoting Iris's error once.
            assert text.startswith("HeapPointerError("), (case, name, text)
            assert "InterpreterError" not in text, (case, text)
        assert "`from_rank` and `to_rank` look swapped" in caught["swapped_store"][1]
        assert "store(pointer, value, from_rank, to_rank, heap_bases, ...)" in caught["swapped_store"][1]
        assert "`from_rank` and `to_rank` look swapped" in caught["swapped_atomic"][1]
        assert "atomic_add(" in caught["swapped_atomic"][1]
        assert (
            f"from_rank={MULTI_WORLD} is not a rank of the symmetric heap" in caught["rank_out_of_range"][1]
        )
        assert "Context.load" in caught["rank_out_of_range"][1]
        assert "not in the symmetric heap" in caught["not_on_heap"][1]
        assert f"translated a pointer to rank {peer}" in caught["not_on_heap"][1]
        assert f"rank {rank} translated a pointer to rank {peer}" in caught["past_the_end"][1]
        assert untouched, "a bad translation wrote before it was refused"
