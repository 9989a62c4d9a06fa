"""Host API of the symmetric heap: factories, symmetry, context tensor, barriers, errors."""

import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl
from mem_testutils import BACKEND, HEAP, MULTI_WORLD, WORLD_SIZES, require_world

import iris.mem
from iris.mem.testing import run_world, visible_gpus
from iris.mem.triton import Context

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def _offsets_agree(heap, tensors):
    """Byte offsets of the tensors in this rank's heap, gathered from every rank."""
    base = heap.get_heap_bases()[heap.rank].item()
    mine = [t.data_ptr() - base for t in tensors]
    everyone = [None] * heap.world_size
    dist.all_gather_object(everyone, mine)
    return all(o == everyone[0] for o in everyone)


def factories_body(rank, world_size):
    failures = []
    with iris.mem.init(HEAP) as heap:
        g = torch.Generator(device=heap.device).manual_seed(1234)
        made = {
            "zeros": (heap.zeros(3, 5), torch.zeros(3, 5)),
            "zeros_tuple": (heap.zeros((2, 7), dtype=torch.int32), torch.zeros(2, 7, dtype=torch.int32)),
            "ones_size": (
                heap.ones(torch.Size([4, 3]), dtype=torch.float16),
                torch.ones(4, 3, dtype=torch.float16),
            ),
            "full": (heap.full((2, 3), 7, dtype=torch.int64), torch.full((2, 3), 7, dtype=torch.int64)),
            "full_infer": (heap.full((5,), 2.5), torch.full((5,), 2.5)),
            "arange": (heap.arange(11), torch.arange(11)),
            "arange3": (
                heap.arange(1, 10, 3, dtype=torch.float32),
                torch.arange(1, 10, 3, dtype=torch.float32),
            ),
            "linspace": (heap.linspace(0, 1, 7), torch.linspace(0, 1, 7)),
            "randn": (
                heap.randn(33, generator=g),
                torch.randn(
                    33, generator=torch.Generator(device=heap.device).manual_seed(1234), device=heap.device
                ).cpu(),
            ),
        }
        for name, (got, want) in made.items():
            if not heap.is_symmetric(got):
                failures.append(f"{name} is not on the heap")
            got = got.cpu()
            if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
                failures.append(f"{name}: got {got} want {want}")
        r = heap.rand(1000, dtype=torch.float64)
        if not (0 <= r.min() and r.max() < 1) or r.dtype != torch.float64:
            failures.append("rand out of [0, 1) or wrong dtype")
        ri = heap.randint(3, 9, (500,))
        ri2 = heap.randint(4, (10,), dtype=torch.int32)
        if ri.dtype != torch.int64 or not (ri.min() >= 3 and ri.max() < 9):
            failures.append(f"randint(low, high): {ri.min()}..{ri.max()} {ri.dtype}")
        if ri2.dtype != torch.int32 or not (ri2.min() >= 0 and ri2.max() < 4):
            failures.append("randint(high)")
        src = torch.randn(6, 4, dtype=torch.bfloat16)
        for name, t in [
            ("zeros_like", heap.zeros_like(src)),
            ("ones_like", heap.ones_like(src)),
            ("empty_like", heap.empty_like(src)),
            ("empty", heap.empty(6, 4, dtype=torch.bfloat16)),
        ]:
            if t.shape != src.shape or t.dtype != src.dtype or not heap.is_symmetric(t):
                failures.append(f"{name}: shape {t.shape} dtype {t.dtype}")
        if heap.zeros_like(src).abs().sum() != 0 or heap.ones_like(src).sum() != 24:
            failures.append("zeros_like/ones_like values")
        grad = heap.zeros(3, requires_grad=True)
        if not grad.requires_grad:
            failures.append("requires_grad ignored")
        empty = heap.zeros(0)
        if empty.numel() != 0 or not heap.is_symmetric(empty):
            failures.append("zero-element tensor")
        out = heap.zeros(4)
        if heap.ones(4, out=out) is not out or out.sum() != 4:
            failures.append("out= not filled in place")
        # Every rank allocated the same sequence, so all offsets agree.
        if not _offsets_agree(heap, [t for t, _ in made.values()] + [r, ri, empty, out]):
            failures.append("heap offsets differ between ranks")
        # Allocations are aligned and do not overlap.
        ptrs = sorted((t.data_ptr(), t.numel() * t.element_size()) for t, _ in made.values())
        for (p0, n0), (p1, _) in zip(ptrs, ptrs[1:]):
            if p0 + n0 > p1 or p1 % 256:
                failures.append(f"overlap or misalignment at {p0:#x}/{p1:#x}")
    return failures


@pytest.mark.parametrize("world_size", [1, MULTI_WORLD])
def test_factories_match_torch_and_are_symmetric(world_size):
    require_world(world_size)
    for failures in run_world(factories_body, world_size, timeout=120):
        assert failures == []


def symmetry_body(rank, world_size):
    with iris.mem.init(HEAP) as heap:
        a = heap.arange(40, dtype=torch.float32).view(5, 8)
        outside = torch.arange(40, dtype=torch.float32, device=heap.device)
        copied = heap.as_symmetric(outside)
        return {
            "heap": heap.is_symmetric(a),
            "slice": heap.is_symmetric(a[1:3, ::2]),
            "transpose": heap.is_symmetric(a.t()),
            "outside": heap.is_symmetric(outside),
            "not_tensor": heap.is_symmetric([1, 2]),
            "copied": heap.is_symmetric(copied) and torch.equal(copied, outside) and copied is not outside,
            "same": heap.as_symmetric(a) is a,
            "shares_memory": copied.data_ptr() != outside.data_ptr(),
        }


def test_as_symmetric_and_is_symmetric():
    (result,) = run_world(symmetry_body, 1, timeout=60)
    assert result == {
        "heap": True,
        "slice": True,
        "transpose": True,
        "outside": False,
        "not_tensor": False,
        "copied": True,
        "same": True,
        "shares_memory": True,
    }


def context_body(rank, world_size):
    with iris.mem.init(HEAP) as heap:
        ctx = heap.get_device_context()
        bases = heap.get_heap_bases()
        first = heap.zeros(1)
        return {
            "header": ctx[:4].tolist(),
            "bases_view": bases.data_ptr() == ctx.data_ptr() + 4 * 8
            and bases.tolist() == ctx[4 : 4 + world_size].tolist(),
            "n_bases": bases.numel(),
            "distinct": len(set(bases.tolist())) == world_size,
            "local_base": bases[rank].item() <= first.data_ptr() < bases[rank].item() + heap.heap_size,
            "dtype": str(ctx.dtype),
            "ranks_on_device": heap.capabilities.ranks_on_device,
            "attrs": (
                heap.rank,
                heap.world_size,
                heap.get_rank(),
                heap.get_num_ranks(),
                heap.backend,
                str(heap.device),
            ),
        }


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_device_context_layout(world_size):
    require_world(world_size)
    for rank, r in enumerate(run_world(context_body, world_size, timeout=120)):
        assert r["header"] == [rank, world_size, HEAP, 0]
        assert r["bases_view"] and r["n_bases"] == world_size and r["distinct"] and r["local_base"]
        assert r["dtype"] == "torch.int64"
        gpus = visible_gpus()
        # by local rank modulo the GPUs present: with fewer GPUs than ranks, ranks share them
        device = "cpu" if BACKEND == "cpu" else f"cuda:{rank % gpus}"
        assert r["attrs"] == (rank, world_size, rank, world_size, BACKEND, device)
        sharing = 1 if BACKEND == "cpu" else len(range(rank % gpus, world_size, gpus))
        assert r["ranks_on_device"] == sharing, (rank, r["ranks_on_device"], sharing)


def broadcast_body(rank, world_size):
    with iris.mem.init(HEAP) as heap:
        src = world_size - 1
        obj = heap.broadcast({"rank": rank, "items": [rank] * 3} if rank == src else None, src=src)
        scalar = heap.broadcast(rank * 10 + 5, src=0)
        tensor = heap.broadcast(torch.full((2, 3), float(rank)) if rank == src else None, src=src)
        try:
            heap.broadcast(1, src=world_size)
            bad = None
        except ValueError as e:
            bad = str(e)
        return obj, scalar, tensor.cpu(), tensor.device == heap.device, bad


@pytest.mark.parametrize("world_size", [1, MULTI_WORLD])
def test_broadcast(world_size):
    require_world(world_size)
    for obj, scalar, tensor, on_heap_device, bad in run_world(broadcast_body, world_size, timeout=120):
        assert on_heap_device
        assert obj == {"rank": world_size - 1, "items": [world_size - 1] * 3}
        assert scalar == 5
        assert torch.equal(tensor, torch.full((2, 3), float(world_size - 1)))
        assert bad is not None and "src" in bad


@triton.jit
def _write_round_kernel(context, buf, value, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Write ``value`` into slot RANK of ``buf`` on every rank."""
    ctx = Context.initialize(context, RANK, WORLD)
    for peer in tl.static_range(WORLD):
        ctx.store(buf + RANK, value, peer)


def device_barrier_body(rank, world_size, rounds):
    failures = []
    with iris.mem.init(HEAP) as heap:
        buf = heap.full((world_size,), -1, dtype=torch.int32)
        heap.barrier()
        for r in range(rounds):
            _write_round_kernel[(1,)](heap.get_device_context(), buf, r, RANK=rank, WORLD=world_size)
            heap.device_barrier()
            # After the barrier every rank's write of round r is visible here, and no rank can
            # have written round r+1 yet (it would need this rank at the next barrier).
            got = buf.tolist()
            if got != [r] * world_size:
                failures.append(f"round {r}: {got}")
            heap.device_barrier()
    return failures


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_device_barrier_orders_rounds(world_size):
    require_world(world_size)
    for failures in run_world(device_barrier_body, world_size, 25, timeout=120):
        assert failures == []


def errors_body(rank, world_size):
    """Each bad call, the exception type and message it raised."""
    import iris.mem as im

    caught = {}

    def expect(name, fn):
        try:
            fn()
            caught[name] = None
        except Exception as e:  # noqa: BLE001 - the test inspects type and message
            caught[name] = (type(e).__name__, str(e))

    expect("heap_size_zero", lambda: im.init(0))
    expect("heap_size_str", lambda: im.init("1GB"))
    expect("backend_unknown", lambda: im.init(1 << 20, backend="tpu"))
    expect("group_bad", lambda: im.init(1 << 20, group=[0, 1]))
    with im.init(1 << 16) as heap:
        expect("size_str", lambda: heap.zeros("a"))
        expect("size_negative", lambda: heap.zeros(-1))
        expect("dtype_bad", lambda: heap.zeros(3, dtype=int))
        expect("device_other", lambda: heap.zeros(3, device="meta"))
        expect("out_not_heap", lambda: heap.zeros(3, out=torch.zeros(3)))
        expect("out_not_tensor", lambda: heap.zeros(3, out=[0, 0, 0]))
        expect("require_cpu_tensor", lambda: heap.require_symmetric(torch.zeros(3, device="meta"), "x"))
        expect("require_not_heap", lambda: heap.require_symmetric(torch.zeros(3, device=heap.device), "y"))
        expect("require_not_tensor", lambda: heap.require_symmetric(3.0, "z"))
        if heap.device.type == "cuda":  # a CPU tensor, and a tensor of another GPU
            expect("require_cpu_tensor", lambda: heap.require_symmetric(torch.zeros(3), "x"))
            if torch.cuda.device_count() > 1:
                other_device = torch.device("cuda", (heap.device.index + 1) % torch.cuda.device_count())
                expect(
                    "require_other_gpu",
                    lambda: heap.require_symmetric(torch.zeros(3, device=other_device), "w"),
                )
        required = heap.require_symmetric(heap.zeros(3), "v")
        expect("out_shape", lambda: heap.zeros(4, out=heap.zeros(3)))
        expect("randint_range", lambda: heap.randint(5, 5, (2,)))
        expect("randint_args", lambda: heap.randint(5))
        expect("as_symmetric_list", lambda: heap.as_symmetric([1, 2]))
        used = heap.used_bytes
        expect("exhausted", lambda: heap.empty(1 << 20, dtype=torch.float32))
        unchanged = heap.used_bytes == used
        fits = heap.empty(heap.free_bytes // 4, dtype=torch.float32)
        expect("exhausted_exact", lambda: heap.empty(1, dtype=torch.uint8))
        full_numel = fits.numel()
    expect("closed", lambda: heap.zeros(1))
    heap.close()  # idempotent
    return caught, unchanged, full_numel, tuple(required.shape)


def test_bad_input_raises_clear_errors():
    ((caught, unchanged, full_numel, required_shape),) = run_world(errors_body, 1, timeout=60)
    expected = {
        "heap_size_zero": ("ValueError", "heap_size"),
        "heap_size_str": ("ValueError", "heap_size"),
        "backend_unknown": ("ValueError", "'tpu'"),
        "group_bad": ("TypeError", "ProcessGroup"),
        "size_str": ("TypeError", "size"),
        "size_negative": ("ValueError", "negative"),
        "dtype_bad": ("TypeError", "dtype"),
        "device_other": ("ValueError", "device"),
        "out_not_heap": ("ValueError", "not on this symmetric heap"),
        "out_not_tensor": ("TypeError", "torch.Tensor"),
        "out_shape": ("ValueError", "shape"),
        "require_cpu_tensor": ("ValueError", "x is on "),
        "require_not_heap": ("ValueError", "y is not on this symmetric heap"),
        "require_not_tensor": ("TypeError", "z must be a torch.Tensor"),
        "randint_range": ("ValueError", "low < high"),
        "randint_args": ("TypeError", "randint"),
        "as_symmetric_list": ("TypeError", "torch.Tensor"),
        "exhausted": ("MemoryError", "requested 4194304 bytes"),
        "exhausted_exact": ("MemoryError", "requested 1 bytes"),
        "closed": ("RuntimeError", "closed"),
    }
    for name, (etype, fragment) in expected.items():
        assert caught[name] is not None, f"{name}: no exception"
        assert caught[name][0] == etype, f"{name}: {caught[name]}"
        assert fragment in caught[name][1], f"{name}: {caught[name][1]!r} lacks {fragment!r}"
    assert "free" in caught["exhausted"][1] and "heap_size" in caught["exhausted"][1]
    assert (
        "0 bytes free" in caught["exhausted_exact"][1]
        and "65536 of 65536 bytes in use" in caught["exhausted_exact"][1]
    )
    assert unchanged, "a failed allocation must not consume heap space"
    assert full_numel > 0
    assert required_shape == (3,)
    if "require_other_gpu" in caught:  # cuda backend with two GPUs or more
        assert (
            caught["require_other_gpu"][0] == "ValueError"
            and "w is on cuda:" in caught["require_other_gpu"][1]
        )


def mismatch_body(rank, world_size):
    try:
        iris.mem.init(HEAP + rank * 4096)
    except iris.mem.HeapMismatchError as e:
        return str(e)
    return None


def test_mismatched_heap_size_raises_on_every_rank():
    require_world(MULTI_WORLD)
    for message in run_world(mismatch_body, MULTI_WORLD, timeout=60):
        assert message is not None and "heap_size" in message and f"rank {MULTI_WORLD - 1}" in message


def group_body(rank, world_size, members):
    pg = dist.new_group(members)  # collective over the whole world
    if rank not in members:
        try:
            iris.mem.init(HEAP, group=pg)
        except ValueError as e:
            return "not a member" in str(e)
        return False
    with iris.mem.init(HEAP, group=pg) as heap:
        buf = heap.full((len(members),), -1, dtype=torch.int32)
        heap.barrier()
        _write_round_kernel[(1,)](
            heap.get_device_context(), buf, 100 + rank, RANK=heap.rank, WORLD=heap.world_size
        )
        heap.device_barrier()
        return heap.rank, heap.world_size, buf.tolist()


def test_heap_over_an_uneven_subgroup():
    require_world(4)
    members = [0, 2, 3]
    results = run_world(group_body, 4, members, timeout=120)
    assert results[1] is True
    expected = [100 + m for m in members]
    for group_rank, global_rank in enumerate(members):
        assert results[global_rank] == (group_rank, 3, expected)


def exhausted_body(rank, world_size):
    """A heap that runs out: the message splits the bytes in use into the caller's, those
    libraries keep (made in ``heap.unscoped()``) and the heap's own sync flags."""
    with iris.mem.init(1 << 16) as heap:
        heap.empty(1000, dtype=torch.uint8)  # 1024 bytes with alignment
        heap.empty(3000, dtype=torch.uint8)  # 3072
        with heap.unscoped():
            heap.empty(10, dtype=torch.uint8)  # 256, as a library's
        try:
            heap.empty(1 << 16, dtype=torch.uint8)
        except MemoryError as e:
            return str(e)
        return None


@pytest.mark.parametrize("world_size", [1, 3])
def test_exhausted_heap_tells_the_callers_bytes_from_irises(world_size):
    require_world(world_size)
    messages = run_world(exhausted_body, world_size, timeout=120)
    for rank, message in enumerate(messages):
        assert message is not None, "the oversized allocation did not fail"
        assert f"exhausted on rank {rank}" in message
        assert "4096 bytes in 2 allocations of yours" in message, message
        assert "256 bytes in 1 that libraries keep" in message, message
        # The device barrier's sync state: member table, flags, generations, status words.
        assert "1024 bytes in 4 of the heap's own" in message, message


def _close_without_collector_body(rank: int, world_size: int) -> list[int]:
    """Mappings and descriptors of this process after each init / allocate / close cycle,
    with the cyclic garbage collector off: close() alone must release the heap."""
    import gc
    import os

    gc.disable()
    seen = []
    for _ in range(6):
        heap = iris.mem.init(heap_size=1 << 20)
        heap.zeros(100)
        heap.device_barrier()
        heap.barrier()
        heap.close()
        del heap
        with open("/proc/self/maps") as f:
            seen.append(len(os.listdir("/proc/self/fd")) + sum(1 for _ in f))
    return seen


@pytest.mark.skipif(BACKEND != "cpu", reason="counts the shared-memory mappings of the cpu backend")
def test_close_releases_the_mapping_without_the_garbage_collector():
    """The heap's sync state refers to the heap: close() must break that cycle, or every
    closed heap keeps its mapping and descriptors until the collector happens to run (two
    more per cycle). After the first cycles (which may load or map something once), five
    cycles leave at most one more."""
    for seen in run_world(_close_without_collector_body, 2, timeout=120):
        assert seen[-1] - seen[0] <= 1, f"mappings + descriptors grew over init/close cycles: {seen}"
