"""Property-based fuzzing of the symmetric heap's host API (hypothesis, CPU tier).

Property: random sequences of heap calls (factories with random shapes including 0 and odd
dims, dtypes, bad arguments, oversized requests, ``as_symmetric`` / ``is_symmetric``,
``broadcast`` of small objects, ``free`` of a live tensor) give torch's result or a clear
exception, never a crash or a hang, every rank allocates at the same offsets, and no
allocation overwrites a live tensor.

All ranks of ONE world run the same derandomized hypothesis test, so they draw the same
examples in the same order; after every example the ranks agree on its outcome with
``all_gather_object``, so a failure fails every rank identically and shrinking stays in
lock-step. A hang is caught by the world's deadline.
"""

import os

import pytest

from iris.mem.testing import run_world

pytestmark = pytest.mark.timeout(600)

WORLD = 2
HEAP = 64 << 20
#: Start a new heap when less than this is left (examples free only some of what they make).
REFRESH_BELOW = 1 << 20
#: Largest element count of one drawn shape (at most 8 bytes each: 8 KiB per tensor).
MAX_NUMEL = 1024
MAX_EXAMPLES = 200
#: A call that raises must not keep heap bytes (the bump allocator never gets them back).
CHECK_NO_LEAK = os.environ.get("FUZZ_NO_LEAK", "1") == "1"
#: Exceptions a bad argument may raise ("clear": never IndexError, AttributeError, ...).
CLEAR = (TypeError, ValueError, RuntimeError, MemoryError)


def _fuzz_rank(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import iris.mem as mem

    DTYPES = [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
        torch.complex64,
    ]
    BAD_DTYPES = ["float32", float, 3, torch.Tensor, object()]
    state = {"heap": mem.init(HEAP), "examples": 0, "calls": 0, "heaps": 1}

    dims = st.integers(0, 7) | st.sampled_from([1, 3, 5, 17, 31])

    @st.composite
    def shapes(draw):
        shape = draw(st.lists(dims, min_size=0, max_size=4))
        numel = 1
        for d in shape:
            numel *= d
        return tuple(shape) if numel <= MAX_NUMEL else tuple(min(d, 3) for d in shape)

    def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)

    # ------------------------------------------------------------------ one call
    def call(data, heap, log, live) -> None:
        """Make one drawn heap call; append what happened to ``log`` (identical on every
        rank when the heap is symmetric), and raise AssertionError on a wrong result."""
        kind = data.draw(
            st.sampled_from(
                [
                    "factory",
                    "full",
                    "random",
                    "range",
                    "like",
                    "bad_size",
                    "bad_dtype",
                    "oversized",
                    "as_symmetric",
                    "is_symmetric",
                    "broadcast",
                    "bad_device",
                    "free",
                ]
            ),
            label="kind",
        )
        state["calls"] += 1
        mark = [heap.used_bytes]  # used_bytes after the last checked allocation

        def check_new(t: torch.Tensor, want: torch.Tensor, what: str) -> None:
            assert isinstance(t, torch.Tensor), f"{what}: returned {type(t).__name__}"
            assert t.shape == want.shape, f"{what}: shape {list(t.shape)} != torch {list(want.shape)}"
            assert t.dtype == want.dtype, f"{what}: dtype {t.dtype} != torch {want.dtype}"
            assert t.device == heap.device, f"{what}: device {t.device}"
            assert heap.is_symmetric(t), f"{what}: result is not on the heap"
            assert mem.heap_of(t) is heap, f"{what}: heap_of does not find the heap"
            nbytes = t.numel() * t.element_size()
            grew, mark[0] = heap.used_bytes - mark[0], heap.used_bytes
            assert grew == (nbytes + 255) // 256 * 256, f"{what}: heap grew {grew} bytes for {nbytes}"
            if nbytes:
                off = t.data_ptr() - heap._base
                assert off % 256 == 0, f"{what}: offset {off} not 256-aligned"
                log.append(f"{what}@{off}")
            live.append((t, want.clone()))

        def expect_error(fn, what: str, allowed=CLEAR) -> type:
            used = heap.used_bytes
            try:
                fn()
            except allowed as e:
                assert str(e), f"{what}: {type(e).__name__} without a message"
                assert not CHECK_NO_LEAK or heap.used_bytes == used, (
                    f"{what}: raised {e!r} but kept {heap.used_bytes - used} bytes"
                )
                log.append(f"{what}:{type(e).__name__}")
                return type(e)
            raise AssertionError(f"{what}: did not raise")

        if kind == "factory":
            name = data.draw(st.sampled_from(["zeros", "ones", "empty"]))
            shape = data.draw(shapes())
            dtype = data.draw(st.sampled_from(DTYPES))
            form = data.draw(st.sampled_from(["star", "tuple", "size"]))
            args = {"star": shape, "tuple": (shape,), "size": (torch.Size(shape),)}[form]
            rg = dtype.is_floating_point and data.draw(st.booleans())
            t = getattr(heap, name)(*args, dtype=dtype, requires_grad=rg)
            # heap.zeros() with no size is a 0-dim tensor; torch.zeros() raises (leniency, kept)
            want = getattr(torch, name)(*(args or ((),)), dtype=dtype, requires_grad=rg)
            assert t.requires_grad == rg, f"{name}: requires_grad {t.requires_grad}"
            t, want = t.detach(), want.detach()
            if name == "empty":
                t.fill_(7)
                want.fill_(7)
            assert equal(t, want), f"{name}{shape} {dtype}: values differ from torch"
            check_new(t, want, f"{name}{shape}")
        elif kind == "full":
            shape = data.draw(shapes())
            fill = data.draw(st.sampled_from([0, 1, -3, 2.5, True, 1e4]))
            dtype = data.draw(st.none() | st.sampled_from(DTYPES))
            size = shape[0] if len(shape) == 1 and data.draw(st.booleans()) else shape
            try:
                want = torch.full(size if isinstance(size, tuple) else (size,), fill, dtype=dtype)
            except CLEAR:
                expect_error(lambda: heap.full(size, fill, dtype=dtype), f"full {fill} {dtype}")
                return
            t = heap.full(size, fill, dtype=dtype)
            assert equal(t, want), f"full({size}, {fill}, {dtype}): {t.dtype} {t.shape} differs from torch"
            check_new(t, want, f"full{shape}")
        elif kind == "random":
            name = data.draw(st.sampled_from(["rand", "randn", "randint"]))
            shape = data.draw(shapes())
            dtype = data.draw(st.none() | st.sampled_from(DTYPES))
            seed = data.draw(st.integers(0, 2**31))
            args = (shape,)
            if name == "randint":
                low = data.draw(st.integers(-50, 50))
                high = low + data.draw(st.integers(1, 100))
                args = (low, high, shape) if data.draw(st.booleans()) or low != 0 else (high, shape)
            try:
                want = getattr(torch, name)(*args, generator=torch.Generator().manual_seed(seed), dtype=dtype)
            except CLEAR:
                expect_error(
                    lambda: getattr(heap, name)(*args, dtype=dtype, generator=torch.Generator()),
                    f"{name} {dtype}",
                    CLEAR,
                )
                return
            t = getattr(heap, name)(*args, generator=torch.Generator().manual_seed(seed), dtype=dtype)
            assert equal(t, want), f"{name}{args} {dtype}: differs from torch with the same generator"
            check_new(t, want, f"{name}{shape}")
        elif kind == "range":
            name = data.draw(st.sampled_from(["arange", "linspace"]))
            start = data.draw(st.integers(-20, 20) | st.sampled_from([0.5, -1.25]))
            end = data.draw(st.integers(-20, 40) | st.sampled_from([10.5, 3.0]))
            dtype = data.draw(st.none() | st.sampled_from([torch.float32, torch.int64, torch.float16]))
            if name == "arange":
                step = data.draw(st.sampled_from([1, 2, 3, -1, -2, 0.5, 0]))
                args = (start, end, step)
            else:
                args = (start, end, data.draw(st.integers(0, 40)))
            try:
                want = getattr(torch, name)(*args, dtype=dtype)
            except CLEAR:
                expect_error(lambda: getattr(heap, name)(*args, dtype=dtype), f"{name}{args}")
                return
            t = getattr(heap, name)(*args, dtype=dtype)
            assert equal(t, want), f"{name}{args} {dtype}: {t.tolist()} != torch {want.tolist()}"
            check_new(t, want, f"{name}{args}")
        elif kind == "like":
            name = data.draw(st.sampled_from(["zeros_like", "ones_like", "empty_like"]))
            shape = data.draw(shapes())
            src = torch.ones(shape, dtype=data.draw(st.sampled_from(DTYPES)))
            if src.dim() >= 2 and data.draw(st.booleans()):
                src = src.transpose(0, -1)
            dtype = data.draw(st.none() | st.sampled_from(DTYPES))
            t = getattr(heap, name)(src, dtype=dtype)
            want = getattr(torch, name)(src, dtype=dtype).contiguous()
            if name == "empty_like":
                t.fill_(3)
                want.fill_(3)
            assert equal(t, want), f"{name}({list(src.shape)}, {dtype}) differs from torch"
            assert t.is_contiguous(), f"{name}: not contiguous"
            check_new(t, want, f"{name}{tuple(src.shape)}")
        elif kind == "bad_size":
            name = data.draw(st.sampled_from(["zeros", "ones", "empty", "rand", "full"]))
            shape = list(data.draw(shapes()))
            bad = data.draw(st.sampled_from([-1, -5, 2.0, "3", None, [2, None], 1.5]))
            shape.insert(data.draw(st.integers(0, len(shape))), bad)
            if name == "full":
                expect_error(lambda: heap.full(tuple(shape), 1.0), f"full{shape}")
            else:
                expect_error(lambda: getattr(heap, name)(*shape), f"{name}{shape}")
        elif kind == "bad_dtype":
            name = data.draw(st.sampled_from(["zeros", "ones", "empty", "full", "rand"]))
            bad = data.draw(st.sampled_from(BAD_DTYPES))
            shape = data.draw(shapes())
            if name == "full":
                expect_error(lambda: heap.full(shape, 1, dtype=bad), f"full dtype={bad!r}")
            else:
                expect_error(lambda: getattr(heap, name)(shape, dtype=bad), f"{name} dtype={bad!r}")
        elif kind == "oversized":
            name = data.draw(st.sampled_from(["zeros", "ones", "empty", "rand", "full"]))
            dtype = data.draw(st.sampled_from([torch.uint8, torch.float32, torch.int64]))
            how = data.draw(st.sampled_from(["free+1", "heap", "huge", "2d"]))
            item = dtype.itemsize
            n = {
                "free+1": heap.free_bytes // item + 1,
                "heap": heap.heap_size // item + 1,
                "huge": 1 << 50,
                "2d": None,
            }[how]
            shape = (1 << 25, 1 << 25) if n is None else (n,)
            if name == "full":
                fn = lambda: heap.full(shape, 1, dtype=dtype)  # noqa: E731
            else:
                fn = lambda: getattr(heap, name)(*shape, dtype=dtype)  # noqa: E731
            expect_error(fn, f"{name} oversized {how}", MemoryError)
        elif kind == "as_symmetric":
            shape = data.draw(shapes())
            dtype = data.draw(st.sampled_from(DTYPES))
            base = torch.arange(MAX_NUMEL * 2, dtype=torch.int64) % 97
            src = base[: int(torch.Size(shape).numel())].to(dtype).view(shape)
            layout = data.draw(st.sampled_from(["plain", "transposed", "strided", "heap", "heap_view"]))
            if layout == "transposed" and src.dim() >= 2:
                src = src.transpose(0, -1)
            elif layout == "strided" and src.dim() >= 1:
                src = base[: 2 * src.numel()].to(dtype)[::2].view(shape) if src.numel() else src
            elif layout in ("heap", "heap_view"):
                h = heap.empty(shape, dtype=dtype)
                h.copy_(src)
                check_new(h, src, "as_symmetric-src")
                src = h[..., ::2] if layout == "heap_view" and h.dim() else h
            before = heap.used_bytes
            t = heap.as_symmetric(src)
            if heap.is_symmetric(src):
                assert t is src, "as_symmetric copied a tensor already on the heap"
                assert heap.used_bytes == before, "as_symmetric allocated for a heap tensor"
                log.append("as_symmetric:same")
            else:
                assert t.is_contiguous(), "as_symmetric result is not contiguous"
                assert equal(t, src.contiguous()), "as_symmetric changed the values"
                check_new(t, src.contiguous(), f"as_symmetric{shape}")
            for bad in (None, 3, [1.0, 2.0], src.numpy() if dtype != torch.bfloat16 else "x"):
                expect_error(
                    lambda bad=bad: heap.as_symmetric(bad), f"as_symmetric({type(bad).__name__})", TypeError
                )
        elif kind == "is_symmetric":
            shape = data.draw(shapes())
            dtype = data.draw(st.sampled_from(DTYPES))
            h = heap.zeros(shape, dtype=dtype)
            check_new(h, torch.zeros(shape, dtype=dtype), f"is_symmetric-src{shape}")
            views = [h, h.view(-1), h.view(-1)[1:], h[..., :1] if h.dim() else h]
            if h.dim() >= 2:
                views.append(h.transpose(0, 1))
            if h.dim() >= 1:
                views.append(h.unsqueeze(0).expand(3, *h.shape))
            for v in views:
                assert heap.is_symmetric(v), (
                    f"view {list(v.shape)} {v.stride()} of a heap tensor not symmetric"
                )
                assert heap.require_symmetric(v) is v
            others = [torch.zeros(shape, dtype=dtype), torch.empty(0), 3, None, "t", [h]]
            for o in others:
                assert not heap.is_symmetric(o), f"is_symmetric({type(o).__name__}) is True"
                allowed = TypeError if not isinstance(o, torch.Tensor) else ValueError
                expect_error(
                    lambda o=o: heap.require_symmetric(o), f"require_symmetric({type(o).__name__})", allowed
                )
        elif kind == "broadcast":
            src = data.draw(st.integers(0, world_size - 1))
            value = data.draw(
                st.none()
                | st.integers()
                | st.floats(allow_nan=False)
                | st.text(max_size=20)
                | st.binary(max_size=64)
                | st.lists(st.integers(), max_size=8)
                | st.dictionaries(st.text(max_size=4), st.integers(), max_size=4)
                | st.tuples(st.integers(), st.text(max_size=4))
                | st.builds(
                    lambda n, s: torch.arange(n, dtype=torch.int64) * s, st.integers(0, 20), st.integers()
                )
            )
            sent = value if rank == src else ("junk", rank)
            got = heap.broadcast(sent, src=src)
            if isinstance(value, torch.Tensor):
                assert isinstance(got, torch.Tensor) and got.device == heap.device
                assert torch.equal(got.cpu(), value), f"broadcast tensor {value} -> {got}"
            else:
                assert got == value and type(got) is type(value), f"broadcast {value!r} -> {got!r}"
            log.append(f"broadcast:{src}:{value!r}")
            for bad in (-1, world_size, "0", 1.0, None):
                expect_error(
                    lambda bad=bad: heap.broadcast(value, src=bad), f"broadcast(src={bad!r})", ValueError
                )
        elif kind == "free":
            if live:
                t, _ = live.pop(data.draw(st.integers(0, len(live) - 1), label="which"))
                before = heap.used_bytes
                heap.free(t)
                freed = before - heap.used_bytes
                assert freed == (t.numel() * t.element_size() + 255) // 256 * 256, f"free gave back {freed}"
                mark[0] = heap.used_bytes
                log.append(f"free:{freed}")
        elif kind == "bad_device":
            dev = data.draw(st.sampled_from(["meta", "cuda", "cuda:1"]))
            expect_error(lambda: heap.zeros(2, 3, device=dev), f"zeros(device={dev})")

    # ------------------------------------------------------------------ the property
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def prop(data):
        state["examples"] += 1
        if state["heap"].free_bytes < REFRESH_BELOW:  # identical on every rank (lockstep)
            state["heap"].close()
            state["heap"] = mem.init(HEAP)
            state["heaps"] += 1
        heap = state["heap"]
        log: list[str] = []
        live: list = []
        outcome = "ok"
        try:
            for _ in range(data.draw(st.integers(1, 6), label="calls")):
                call(data, heap, log, live)
            for i, (t, want) in enumerate(live):  # no allocation overlapped an earlier one
                assert torch.equal(t, want), f"tensor #{i} ({list(t.shape)}, {t.dtype}) was overwritten"
            outcome = "ok " + " ".join(log)
        except BaseException as e:  # noqa: BLE001 - every failure becomes the agreed outcome
            outcome = f"FAIL {type(e).__name__}: {e}"
        outcomes = [None] * world_size
        dist.all_gather_object(outcomes, outcome)
        bad = [f"rank {r}: {o}" for r, o in enumerate(outcomes) if not o.startswith("ok ")]
        assert not bad, "\n".join(bad)
        assert len(set(outcomes)) == 1, "ranks disagree (asymmetric heap):\n" + "\n".join(
            f"rank {r}: {o}" for r, o in enumerate(outcomes)
        )

    prop()
    state["heap"].close()
    return {"examples": state["examples"], "calls": state["calls"], "heaps": state["heaps"]}


def test_heap_calls_match_torch_or_raise_clearly():
    results = run_world(_fuzz_rank, WORLD, timeout=500.0)
    for r, res in enumerate(results):
        assert res["examples"] >= MAX_EXAMPLES, f"rank {r} ran only {res['examples']} examples"
    assert len({(res["examples"], res["calls"]) for res in results}) == 1, results
    print(f"{results[0]['examples']} examples, {results[0]['calls']} calls, {results[0]['heaps']} heaps")
