"""Giving heap memory back: free, scopes, statistics, the debug checks, and the allocator.

The loop tests allocate, use the tensor in a kernel that stores into a peer's twin, check,
and free, many times over on a heap that holds only a few tensors; a rank whose offsets
drifted from its peers' would read values that are not there.
"""

import random

import pytest
import torch
import triton
import triton.language as tl
from mem_testutils import BACKEND, WORLD_SIZES, pattern, require_world

import iris.mem
from iris.mem._alloc import FirstFit
from iris.mem.testing import run_world
from iris.mem.triton import Context

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

#: Elements of the loop's tensors: none a multiple of the kernel's block.
SIZES = (1, 77, 300, 1000, 1531)
DTYPES = (torch.float32, torch.bfloat16, torch.int32)
#: Tensors alive at once in the loop; the heap holds little more than that.
LIVE = 3
LOOP_HEAP = 32 << 10
BLOCK = 2048  # one program covers every size


@triton.jit
def _stamp_right_kernel(context, buf, n, value, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Store ``value + index % 97`` into the right neighbour's twin of ``buf`` (exact in bf16)."""
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    vals = (value + offs % 97).to(tl.float32).to(buf.dtype.element_ty)
    ctx.store(buf + offs, vals, (RANK + 1) % WORLD, mask=offs < n)


def _expected(n: int, dtype: torch.dtype, value: int) -> torch.Tensor:
    return (value + torch.arange(n, dtype=torch.int64) % 97).to(dtype)


def loop_body(rank, world_size, iterations, seed):
    """``iterations`` rounds of allocate / stamp from the left neighbour / check / free."""
    rng = random.Random(seed)  # the same draws on every rank
    with iris.mem.init(LOOP_HEAP) as heap:
        start = heap.memory_stats()
        live: list[tuple[torch.Tensor, int]] = []
        offsets = []
        for it in range(iterations):
            n, dtype = rng.choice(SIZES), rng.choice(DTYPES)
            t = heap.empty(n, dtype=dtype)
            offsets.append(t.data_ptr() - heap.get_heap_bases()[heap.rank].item())
            _stamp_right_kernel[(triton.cdiv(n, BLOCK),)](
                heap.get_device_context(), t, n, (it * 7 + rank) % 100, rank, world_size, BLOCK=BLOCK
            )
            heap.barrier()  # every stamp has landed
            live.append((t, (it * 7 + (rank - 1) % world_size) % 100))  # the left neighbour's stamp
            for u, v in live:
                want = _expected(u.numel(), u.dtype, v)
                if not torch.equal(u.cpu(), want):
                    raise AssertionError(
                        f"iteration {it}: a live {u.dtype} tensor of {u.numel()} lost its values"
                    )
            if len(live) == LIVE:
                u, _ = live.pop(rng.randrange(LIVE))
                heap.free(u)
        heap.free(*(u for u, _ in live))
        end = heap.memory_stats()
        if end.in_use_bytes != start.in_use_bytes or end.free_ranges != 1:
            raise AssertionError(f"memory not all given back: {start} -> {end}")
        return offsets, end.peak_bytes


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_allocate_use_free_loop(world_size, request):
    """A short loop at every world size (the full tier runs 10,000 iterations)."""
    require_world(world_size)
    iterations = 300 if world_size == 3 or BACKEND == "cuda" else 100
    results = run_world(loop_body, world_size, iterations, 1234 + world_size, timeout=300)
    offsets = [r[0] for r in results]
    assert all(o == offsets[0] for o in offsets), "ranks allocated at different offsets"
    assert len(set(offsets[0])) > 1 and results[0][1] <= LOOP_HEAP


@pytest.mark.full
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_allocate_use_free_10000_times(world_size):
    require_world(world_size)
    results = run_world(loop_body, world_size, 10_000, 99 + world_size, timeout=1800)
    offsets = [r[0] for r in results]
    assert all(o == offsets[0] for o in offsets), "ranks allocated at different offsets"


# ---------------------------------------------------------------------- scopes and stats
def scopes_body(rank, world_size):
    """Nested scopes, frees inside a scope, an exception leaving one, statistics."""
    with iris.mem.init(1 << 16) as heap:
        base = heap.memory_stats()
        keep = heap.full((5,), rank, dtype=torch.int32)  # outside every scope
        with heap.scope():
            a = heap.zeros(1000)
            with heap.scope():
                b = heap.ones(3000)
                inner = heap.memory_stats()
                c = heap.zeros(10)
                heap.free(c)  # freed inside: the scope skips it
            after_inner = heap.memory_stats()
            b2 = heap.ones(3000)  # reuses b's range
            same = b2.data_ptr() == b.data_ptr()
            del a
        after_outer = heap.memory_stats()
        try:
            with heap.scope():
                heap.zeros(500)
                raise KeyError("boom")
        except KeyError:
            pass
        after_raise = heap.memory_stats()
        assert torch.equal(keep.cpu(), torch.full((5,), rank, dtype=torch.int32)), (
            "a scope touched a tensor outside it"
        )
        heap.free(keep)
        final = heap.memory_stats()
        return {
            "base": base.in_use_bytes,
            "inner": inner.allocations - base.allocations,
            "after_inner": after_inner.in_use_bytes - base.in_use_bytes,
            "reused": same,
            "after_outer": after_outer.in_use_bytes - base.in_use_bytes,
            "after_raise": after_raise.in_use_bytes - base.in_use_bytes,
            "final": (final.in_use_bytes - base.in_use_bytes, final.free_ranges, final.peak_bytes),
            "totals": (
                final.total_allocations - base.total_allocations,
                final.total_frees - base.total_frees,
            ),
        }


@pytest.mark.parametrize("world_size", [1, 3])
def test_scopes_nest_and_stats_add_up(world_size):
    require_world(world_size)
    results = run_world(scopes_body, world_size, timeout=120)
    assert all(r == results[0] for r in results), f"ranks disagree: {results}"
    r = results[0]
    assert r["inner"] == 3  # keep, a, b
    assert r["after_inner"] == 256 + 4096  # keep (20 bytes) and a (4000 bytes), aligned
    assert r["reused"], "an allocation after the inner scope did not reuse its range"
    assert r["after_outer"] == 256 and r["after_raise"] == 256
    assert r["final"][0] == 0 and r["final"][1] == 1
    assert r["final"][2] >= r["base"] + 256 + 4096 + 12288
    assert r["totals"] == (6, 6)  # keep, a, b, c, b2 and the one in the raising scope


def empty_scopes_body(rank, world_size):
    """Scopes that allocate nothing, inside and around scopes that do: every scope gives back
    its own allocations, and nothing is left collecting allocations after the last one."""
    with iris.mem.init(1 << 16) as heap:
        base = heap.used_bytes
        with heap.scope():  # empty when the inner scope ends
            with heap.scope():
                pass
            outer_alloc = heap.zeros(100)  # the outer scope's
        after_first = heap.used_bytes - base
        with heap.scope():
            with heap.scope():
                with heap.scope():
                    pass
                heap.zeros(10)  # the middle scope's
            after_middle = heap.used_bytes - base
            heap.ones(10)
        after_second = heap.used_bytes - base
        kept = heap.zeros(10)  # outside every scope: no leftover frame may take it
        with heap.scope():
            pass
        after_kept = heap.used_bytes - base
        heap.free(kept)
        return after_first, after_middle, after_second, after_kept, outer_alloc.numel()


@pytest.mark.parametrize("world_size", [1, 3])
def test_empty_nested_scopes_keep_each_scope_its_own(world_size):
    """An empty inner scope used to remove its (equal, empty) outer frame: the outer exit then
    raised ``ValueError: list.remove(x)`` and its allocations were never given back."""
    require_world(world_size)
    results = run_world(empty_scopes_body, world_size, timeout=120)
    assert results == [(0, 0, 0, 256, 100)] * world_size


def fragmentation_body(rank, world_size):
    """Free every other block of a full heap: a block of twice the size fits only after the
    neighbours are freed too and the ranges merge."""
    block = 4096
    with iris.mem.init(64 << 10) as heap:
        blocks = []
        while heap.memory_stats().largest_free_bytes >= block:
            blocks.append(heap.empty(block // 4, dtype=torch.float32))
        for t in blocks[0::2]:
            heap.free(t)
        stats = heap.memory_stats()
        try:
            heap.empty(2 * block // 4, dtype=torch.float32)
            fitted_before = True
        except MemoryError as e:
            fitted_before, message = False, str(e)
        heap.free(*blocks[1::2])
        big = heap.empty(2 * block // 4, dtype=torch.float32)
        offset = big.data_ptr() - heap.get_heap_bases()[heap.rank].item()
        first = blocks[0].data_ptr() - heap.get_heap_bases()[heap.rank].item()
        return (
            len(blocks),
            stats.free_ranges,
            stats.largest_free_bytes,
            fitted_before,
            message,
            offset == first,
        )


def test_fragmentation_then_merge():
    require_world(2)
    results = run_world(fragmentation_body, 2, timeout=120)
    assert results[0][:4] == results[1][:4] and results[0][5] == results[1][5]
    count, ranges, largest, fitted_before, message, at_first = results[0]
    assert count >= 8
    assert ranges >= count // 2 and largest < 2 * 4096 + 256
    assert not fitted_before, "a block twice the size fitted between live blocks"
    for words in ("exhausted", "largest", "heap.free()", "heap.scope()", "heap.close()", "frees nothing"):
        assert words in message, f"{words!r} missing from {message!r}"
    assert at_first, "after merging, the big block did not take the lowest range"


# ---------------------------------------------------------------------- errors
def bad_frees_body(rank, world_size):
    errors = {}
    with iris.mem.init(1 << 16) as heap:
        t = heap.zeros(100)
        cases = {
            "plain": lambda: heap.free(torch.zeros(3)),
            "not_tensor": lambda: heap.free([1, 2]),
            "view": lambda: heap.free(t[1:]),
            "twice_in_one_call": lambda: heap.free(t, t),
        }
        for name, fn in cases.items():
            try:
                fn()
            except (TypeError, ValueError) as e:
                errors[name] = (type(e).__name__, str(e))
        heap.free(t.view(10, 10))  # a view starting where the allocation does is fine
        try:
            heap.free(t)
        except ValueError as e:
            errors["double"] = ("ValueError", str(e))
        heap.free(heap.zeros(0))  # empty tensors hold nothing
    try:
        heap.free(t)
    except RuntimeError as e:
        errors["closed"] = ("RuntimeError", str(e))
    return errors


def test_bad_frees_raise_clear_errors():
    (errors,) = run_world(bad_frees_body, 1, timeout=120)
    assert set(errors) == {"plain", "not_tensor", "view", "twice_in_one_call", "double", "closed"}, errors
    assert "not on this symmetric heap" in errors["plain"][1]
    assert errors["not_tensor"][0] == "TypeError"
    assert "freed already" in errors["double"][1] and "begin" in errors["view"][1]
    assert "twice" in errors["twice_in_one_call"][1]
    assert "closed" in errors["closed"][1]


def debug_order_body(rank, world_size):
    """Rank 1 frees two allocations in the other order: every rank must raise."""
    import iris.mem as mem

    heap = mem.init(1 << 16)
    a, b = heap.zeros(10), heap.zeros(20)
    first, second = (b, a) if rank == 1 else (a, b)
    try:
        heap.free(first)
        heap.free(second)
    except mem.HeapMismatchError as e:
        return str(e)
    finally:
        heap.close()
    return None


def debug_use_after_free_body(rank, world_size):
    import iris.mem as mem

    with mem.init(1 << 16) as heap:
        t = heap.zeros(64)
        view = t[8:]
        mem.check_live(t)  # live: no error
        heap.free(t)
        caught = []
        for what in (t, view):
            try:
                mem.heap_of(what)
            except mem.UseAfterFreeError as e:
                caught.append(str(e))
            try:
                mem.check_live(what, "x")
            except mem.UseAfterFreeError as e:
                caught.append(str(e))
        u = heap.zeros(64)  # reuses the range: t aliases a live allocation again
        mem.check_live(u)
        return caught


@pytest.mark.parametrize("world_size", [2, 3])
def test_debug_catches_a_rank_freeing_in_another_order(world_size):
    require_world(world_size)
    results = run_world(debug_order_body, world_size, timeout=120, env={"IRIS_DEBUG": "1"})
    for rank, message in enumerate(results):
        assert message is not None, f"rank {rank} did not raise"
        assert "same order" in message and "rank 1: free #0 of allocation #1" in message, message


def test_debug_rejects_freed_tensors():
    (caught,) = run_world(debug_use_after_free_body, 1, timeout=120, env={"IRIS_DEBUG": "1"})
    assert len(caught) == 4, caught
    assert all("freed" in c for c in caught)


# ---------------------------------------------------------------------- the allocator
def test_first_fit_is_deterministic_merges_and_counts():
    ff = FirstFit(16 * 256, 256)
    offs = [ff.allocate(n) for n in (1, 256, 257, 0, 1000)]
    assert offs == [0, 256, 512, 1024, 1280]
    assert ff.allocate(16 * 256) is None
    ff.release(256)
    ff.release(1024)
    assert ff.free_ranges() == [(256, 256), (1024, 256), (2304, 16 * 256 - 2304)]
    assert ff.allocate(200) == 256  # lowest fit
    ff.release(512)  # merges with 1024 on its right
    assert ff.free_ranges()[0] == (512, 768)
    ff.release(256)  # merges both sides
    assert ff.free_ranges()[0] == (256, 1024)
    s = ff.stats()
    assert (s.allocations, s.in_use_bytes, s.total_allocations, s.total_frees) == (2, 1280, 6, 4)
    assert s.peak_bytes == 2304 and s.largest_free_bytes == 16 * 256 - 2304
    assert ff.owner(1280 + 10, 1280 + 1024) == 1280 and ff.owner(256, 300) is None


def test_first_fit_property():
    """Random allocate/free sequences: live ranges never overlap, free ranges never touch,
    and everything adds up to the heap."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.lists(st.tuples(st.booleans(), st.integers(0, 5000), st.integers(0, 99)), max_size=80))
    def prop(steps):
        ff = FirstFit(64 * 256, 256)
        live: dict[int, int] = {}
        for alloc, nbytes, pick in steps:
            if alloc or not live:
                off = ff.allocate(nbytes)
                if off is None:
                    assert ff.stats().largest_free_bytes < ff.aligned(nbytes)
                    continue
                live[off] = ff.aligned(nbytes)
            else:
                off = sorted(live)[pick % len(live)]
                assert ff.release(off) == live.pop(off)
            spans = sorted(list(live.items()) + ff.free_ranges())
            pos = 0
            for start, length in spans:  # live and free ranges tile the heap exactly
                assert start == pos and length > 0
                pos += length
            assert pos == ff.size
            free = ff.free_ranges()
            assert all(a + la < b for (a, la), (b, _) in zip(free, free[1:])), "adjacent free ranges"
            assert ff.stats().in_use_bytes == sum(live.values())

    prop()


def contents_body(rank, world_size):
    """Hypothesis on a heap: random allocate/free sequences (every rank draws the same) keep
    every live tensor's contents and give the same offsets on every rank."""
    import torch.distributed as dist
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    heap = iris.mem.init(48 << 10)
    examples = [0]

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2000), st.sampled_from(DTYPES)), max_size=40))
    def prop(steps):
        examples[0] += 1
        live, log = [], []
        try:
            for salt, (what, n, dtype) in enumerate(steps):
                if what and live:  # free one (1 in 4 of the steps allocate when some are live)
                    heap.free(live.pop((n + what) % len(live))[0])
                    continue
                try:
                    t = heap.empty(n, dtype=dtype)
                except MemoryError:
                    log.append("full")
                    continue
                t.copy_(pattern(n, dtype, rank, salt).to(t.device))
                live.append((t, salt))
                log.append(t.data_ptr() - heap.get_heap_bases()[rank].item() if n else "empty")
                for u, s in live:
                    assert torch.equal(u.cpu(), pattern(u.numel(), u.dtype, rank, s)), (
                        "a live tensor was overwritten"
                    )
        finally:
            heap.free(*(u for u, _ in live))
        everyone = [None] * world_size
        dist.all_gather_object(everyone, log)
        assert all(e == log for e in everyone), f"offsets differ between ranks: {everyone}"
        assert heap.memory_stats().free_ranges == 1

    prop()
    heap.close()
    return examples[0]


@pytest.mark.parametrize("world_size", [1, 2])
def test_random_allocate_free_keeps_contents(world_size):
    require_world(world_size)
    results = run_world(contents_body, world_size, timeout=300)
    assert all(r >= 60 for r in results), results


# ---------------------------------------------------------------------- CUDA graphs
def graph_body(rank, world_size, iterations):
    """Allocate outside the graph, capture the kernel, replay, check, free; repeatedly. A
    free during the capture is refused."""
    with iris.mem.init(LOOP_HEAP) as heap:
        errors, refused = [], []
        for it in range(iterations):
            n = SIZES[it % len(SIZES)]
            t = heap.zeros(n, dtype=torch.float32)
            heap.barrier()  # zeroed everywhere before a peer's replay stores into it
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                _stamp_right_kernel[(1,)](
                    heap.get_device_context(), t, n, (it * 7 + rank) % 100, rank, world_size, BLOCK=BLOCK
                )
                if it == 0:
                    try:
                        heap.free(t)
                    except RuntimeError as e:
                        refused.append(str(e))
            graph.replay()
            heap.barrier()
            want = _expected(n, torch.float32, (it * 7 + (rank - 1) % world_size) % 100)
            if not torch.equal(t.cpu(), want):
                errors.append(f"iteration {it}: replay wrote {t[:4].tolist()}")
            heap.free(t)
            del graph
        if not (refused and "CUDA graph" in refused[0]):
            errors.append(f"a free during capture was not refused: {refused}")
        return errors


@pytest.mark.skipif(BACKEND != "cuda", reason="CUDA graphs need the cuda backend (GPU tier)")
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_loop_under_cuda_graph_capture(world_size):
    require_world(world_size)
    results = run_world(graph_body, world_size, 50, timeout=300)
    assert results == [[]] * world_size, results
