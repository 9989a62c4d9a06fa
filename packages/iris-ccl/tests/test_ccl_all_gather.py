"""``iris.ccl.all_gather`` against ``torch.distributed.all_gather_into_tensor`` (gloo).

Every test starts one real multi-process world and loops over its cases inside the ranks;
each rank returns its mismatch descriptions (empty when everything matched). Inputs are
plain tensors (staged through iris.ccl's own heap) and tensors on an iris heap spanning the
world (used in place), contiguous or not, in every dtype.
"""

import warnings

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import (
    BACKEND,
    DTYPES,
    SIZES,
    device,
    dtype_name,
    make_input,
    mismatch,
    require_world,
    setup_rank,
)

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

# Gluon: GPUs only
VARIANTS = ("boxed", "push", "pull", "copy_engine") + (("gluon",) if BACKEND == "cuda" else ())
SMALL_DTYPES = (torch.float32, torch.bfloat16, torch.int32)
WORLD_TIMEOUT = 400.0


def _cfg(variant: str, **kw):
    import iris.ccl as ccl

    return ccl.Config(variant=variant, **kw)


def reference(x: torch.Tensor, out_shape, group=None) -> torch.Tensor:
    """``all_gather_into_tensor`` of ``x`` flattened over ``group`` (gloo on CPU), shaped
    like the output, on ``x``'s device. Collective: every member calls it."""
    t = x.detach().cpu().contiguous().reshape(-1)
    want = torch.empty(t.numel() * dist.get_world_size(group), dtype=t.dtype)
    with warnings.catch_warnings():  # torch deprecates the name in favour of all_gather_single
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_into_tensor(want, t, group=group)
    return want.reshape(out_shape).to(x.device)


def _run(world_size: int, fn, *args, env=None):
    require_world(world_size)
    return run_world(fn, world_size, *args, timeout=WORLD_TIMEOUT, env=env)


def _assert_clean(results, min_cases: int = 0) -> None:
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    for r, res in enumerate(results):
        assert res["cases"] >= min_cases, f"rank {r} checked only {res['cases']} cases (< {min_cases})"


def _check(bad, out, inp, inp0, what, group=None):
    """Compare ``out`` with the reference of ``inp0``; ``inp`` must be unchanged."""
    if (m := mismatch(out, reference(inp0, out.shape, group), what)) is not None:
        bad.append(m)
    if inp is not None and not torch.equal(inp, inp0):
        bad.append(f"{what}: the input was modified")


# --------------------------------------------------------------------------- the matrix


def _shapes(size: int, g: int):
    """(inp shape, out shape) for ``size`` elements: dim-0 concatenation, or a flat out."""
    if size == 1000:
        return (10, 100), (g * 10, 100)
    if size == 4099:
        return (4099,), (g, 4099)  # any shape with the right element count
    return (size,), (g * size,)


def matrix_body(rank, world_size, dtypes):
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    cases = 0
    salt = 0
    for dtype in dtypes:
        for variant in VARIANTS:
            for size in SIZES:
                salt += 1
                ishape, oshape = _shapes(size, world_size)
                x = make_input(ishape, dtype, rank, salt)
                x0 = x.clone()
                out = torch.full(oshape, 77, dtype=dtype, device=device())
                ret = ccl.all_gather(out, x, config=_cfg(variant))
                what = f"world={world_size} {variant} {dtype_name(dtype)} inp {list(ishape)}"
                if ret is not None:
                    bad.append(f"{what}: returned {ret!r} with async_op=False")
                _check(bad, out, x, x0, what)
                cases += 1
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_all_gather_matches_torch(world_size):
    # Every dtype at world size 3 (odd); fp32/bf16/int32 at every world size.
    dtypes = DTYPES if world_size == 3 else SMALL_DTYPES
    _assert_clean(_run(world_size, matrix_body, dtypes), min_cases=len(dtypes) * len(VARIANTS) * len(SIZES))


# --------------------------------------------------------------------------- layouts, async


def layouts_body(rank, world_size):
    """Non-contiguous inputs and outputs, 0-d and empty tensors, in-place all-gather on a
    plain tensor, "auto", and async_op handles."""
    setup_rank()
    import iris.ccl as ccl

    g, dev = world_size, device()
    bad: list[str] = []
    cases = 0
    salt = 100
    for dtype in SMALL_DTYPES:
        for variant in (*VARIANTS, "auto"):
            salt += 10
            x = make_input((123, 35), dtype, rank, salt).t()  # non-contiguous
            out = torch.full((g * 35, 123), 77, dtype=dtype, device=dev)
            x0 = x.clone()
            ccl.all_gather(out, x, config=_cfg(variant))
            _check(bad, out, x, x0, f"{variant} {dtype_name(dtype)} transposed inp")
            # Strided output view: elements outside it keep their sentinel.
            x = make_input((2 * 1001,), dtype, rank, salt + 1)[::2]
            base = torch.full((2 * g * 1001,), 77, dtype=dtype, device=dev)
            x0 = x.clone()
            ccl.all_gather(base[1::2], x, config=_cfg(variant))
            _check(bad, base[1::2], x, x0, f"{variant} {dtype_name(dtype)} strided inp and out")
            if not torch.equal(base[0::2], torch.full_like(base[0::2], 77)):
                bad.append(f"{variant} {dtype_name(dtype)}: elements outside the output view were written")
            # 0-d input.
            x = make_input((), dtype, rank, salt + 2)
            out = torch.empty(g, dtype=dtype, device=dev)
            ccl.all_gather(out, x, config=_cfg(variant))
            _check(bad, out, x, x.clone(), f"{variant} {dtype_name(dtype)} 0-d")
            # In place on a plain tensor: inp is this rank's chunk of out.
            x = make_input((5, 7), dtype, rank, salt + 3)
            out = torch.full((g * 5, 7), 77, dtype=dtype, device=dev)
            out[rank * 5 : (rank + 1) * 5].copy_(x)
            ccl.all_gather(out, out[rank * 5 : (rank + 1) * 5], config=_cfg(variant))
            _check(bad, out, None, x, f"{variant} {dtype_name(dtype)} in place (plain)")
            # inp overlapping out elsewhere than this rank's chunk: gathered from a copy.
            big = make_input((g * 40,), dtype, rank, salt + 4)
            x0 = big[3:43].clone()
            ccl.all_gather(big, big[3:43], config=_cfg(variant))
            _check(bad, big, None, x0, f"{variant} {dtype_name(dtype)} overlapping inp")
            # async_op
            x = make_input((1000,), dtype, rank, salt + 5)
            out = torch.empty(g * 1000, dtype=dtype, device=dev)
            work = ccl.all_gather(out, x, async_op=True, config=_cfg(variant))
            if not isinstance(work, ccl.Work) or work.wait() is not True:
                bad.append(f"{variant} async: got {work!r}, wait() must return True")
            if device().type == "cuda":
                torch.cuda.current_stream().synchronize()
            _check(bad, out, x, x.clone(), f"{variant} {dtype_name(dtype)} async")
            # Empty tensors: nothing to do, no error, no hang.
            e = torch.empty(0, 3, dtype=dtype, device=dev)
            ccl.all_gather(torch.empty(0, 3, dtype=dtype, device=dev), e, config=_cfg(variant))
            cases += 6
    return {"bad": bad, "cases": cases}


def test_all_gather_layouts_in_place_async():
    _assert_clean(_run(3, layouts_body), min_cases=3 * 3 * 6)


# --------------------------------------------------------------------------- heap tensors


def heap_body(rank, world_size, dtypes):
    """Tensors on an iris heap spanning the world (used in place), mixed with plain
    tensors, in-place all-gather on the heap, and non-contiguous heap views."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    g = world_size
    bad: list[str] = []
    cases = 0
    salt = 200
    modes = ("heap->heap", "heap in-place", "heap->plain", "plain->heap", "heap transposed")
    with iris.mem.init(1 << 22) as heap:
        for dtype in dtypes:
            hin = heap.zeros(4099, dtype=dtype)
            hout = heap.zeros(g * 4099, dtype=dtype)
            h2d = heap.zeros(37, 29, dtype=dtype)
            for variant in VARIANTS:
                for mode in modes:
                    salt += 1
                    n = SIZES[salt % len(SIZES)]
                    x = make_input((n,), dtype, rank, salt)
                    if mode == "heap transposed":
                        x = make_input((29, 37), dtype, rank, salt)
                        h2d.t().copy_(x)
                        inp, out = h2d.t(), hout[: g * x.numel()].view(g * 29, 37)
                    elif mode == "heap in-place":
                        out = hout[: g * n]
                        inp = out[rank * n : (rank + 1) * n]
                        inp.copy_(x)
                    else:
                        inp = hin[:n] if mode != "plain->heap" else x.clone()
                        inp.copy_(x)
                        out = torch.full((g * n,), 77, dtype=dtype, device=device())
                        if mode != "heap->plain":
                            out = hout[: g * n]
                            out.fill_(77)
                    what = f"heap {variant} {dtype_name(dtype)} n={x.numel()} {mode}"
                    ccl.all_gather(out, inp, config=_cfg(variant))
                    _check(bad, out, None if mode == "heap in-place" else inp, x, what)
                    cases += 1
            heap.barrier()
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [pytest.param(2, marks=pytest.mark.full), 3])
def test_all_gather_heap_tensors(world_size):
    dtypes = DTYPES if world_size == 2 else SMALL_DTYPES  # every dtype at 2 ranks
    _assert_clean(_run(world_size, heap_body, dtypes), min_cases=len(dtypes) * len(VARIANTS) * 5)


# --------------------------------------------------------------------------- subgroups, chunking


def subgroup_body(rank, world_size):
    """A group of ranks 0, 2, 3 in a world of 4: plain tensors and tensors on a heap of the
    group; rank 1 gets a clear error; the world works afterwards."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    members = [0, 2, 3]
    group = dist.new_group(members)
    bad: list[str] = []
    cases = 0
    if rank in members:
        with iris.mem.init(1 << 22, group=group) as heap:
            hin, hout = heap.zeros(1000), heap.zeros(3 * 1000)
            for i, variant in enumerate(VARIANTS):
                for dtype in SMALL_DTYPES:
                    x = make_input((1000,), dtype, rank, 300 + i)
                    out = torch.empty(3 * 1000, dtype=dtype, device=device())
                    ccl.all_gather(out, x, group=group, config=_cfg(variant))
                    _check(bad, out, x, x.clone(), f"group {variant} {dtype_name(dtype)}", group)
                    cases += 1
                x = make_input((1000,), torch.float32, rank, 310 + i)
                hin.copy_(x)
                ccl.all_gather(hout, hin, group=group, config=_cfg(variant))
                _check(bad, hout, hin, x, f"group heap {variant}", group)
                cases += 1
    else:
        try:
            ccl.all_gather(torch.empty(24, device=device()), torch.ones(8, device=device()), group=group)
            bad.append("non-member call with the group did not raise")
        except ValueError as e:
            if "not a member" not in str(e):
                bad.append(f"non-member call raised an unclear ValueError: {e}")
    for variant in VARIANTS:
        x = make_input((7,), torch.float32, rank, 320)
        out = torch.empty(world_size * 7, device=device())
        ccl.all_gather(out, x, config=_cfg(variant))
        _check(bad, out, x, x.clone(), f"world after group {variant}")
    return {"bad": bad, "cases": cases}


def test_all_gather_subgroup():
    results = _run(4, subgroup_body)
    _assert_clean([results[1]])
    _assert_clean([results[r] for r in (0, 2, 3)], min_cases=8)


def chunked_body(rank, world_size):
    """Messages larger than one launch: the staging buffer is small (IRIS_CCL_STAGING_BYTES)
    and Config.chunk_elements splits heap tensors used in place."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    g = world_size
    bad: list[str] = []
    cases = 0
    n = 16384 // (2 * g) + 103  # more per-rank elements than one staged launch covers
    for dtype in SMALL_DTYPES:
        for variant in VARIANTS:
            x = make_input((n,), dtype, rank, 400 + cases)
            out = torch.full((g * n,), 77, dtype=dtype, device=device())
            ccl.all_gather(out, x, config=_cfg(variant))
            _check(bad, out, x, x.clone(), f"staged n={n} {variant} {dtype_name(dtype)}")
            cases += 1
    with iris.mem.init(1 << 21) as heap:
        hin, hout = heap.zeros(3003), heap.zeros(g * 3003)
        for variant in VARIANTS:
            x = make_input((3003,), torch.float32, rank, 450 + cases)
            hin.copy_(x)
            ccl.all_gather(hout, hin, config=_cfg(variant, chunk_elements=1041, block_size=256))
            _check(bad, hout, hin, x, f"heap {variant} chunk_elements=1041")
            cases += 1
    return {"bad": bad, "cases": cases}


def test_all_gather_larger_than_one_launch():
    _assert_clean(_run(3, chunked_body, env={"IRIS_CCL_STAGING_BYTES": "16384"}), min_cases=8)


# --------------------------------------------------------------------------- repetition


def repeated_body(rank, world_size, calls):
    """``calls`` calls on the same buffers (plain and heap, alternating variants), with
    fresh data each time: a stale result or sync state drifting between calls is caught."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    g = world_size
    bad: list[str] = []
    cases = 0
    with iris.mem.init(1 << 21) as heap:
        pin, pout = torch.empty(7, device=device()), torch.empty(g * 7, device=device())
        hout = heap.zeros(g * 7)
        hin = hout[rank * 7 : (rank + 1) * 7]  # in place on the heap
        for i in range(calls):
            variant = VARIANTS[i % 2]
            x = make_input((7,), torch.float32, rank, i)
            pin.copy_(x)
            hin.copy_(x)
            ccl.all_gather(pout, pin, config=_cfg(variant))
            ccl.all_gather(hout, hin, config=_cfg(variant))
            want = reference(x, (g * 7,))
            for name, got in (("plain", pout), ("heap in-place", hout)):
                if (m := mismatch(got, want, f"{variant} call {i} {name}")) is not None:
                    bad.append(m)
            cases += 1
    return {"bad": bad, "cases": cases}


def test_all_gather_repeated_calls():
    _assert_clean(_run(2, repeated_body, 100), min_cases=100)


# --------------------------------------------------------------------------- bad input


def bad_input_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl

    dev = device()
    other = torch.device("meta") if dev.type == "cpu" else torch.device("cpu")
    ones = lambda *shape, device=dev, **kw: torch.ones(*shape, device=device, **kw)
    g = world_size
    f32 = ones(10)
    ag = ccl.all_gather
    cases = [
        ("out too small", lambda: ag(ones(g * 10 - 1), f32), ValueError, ["out", "[10]"]),
        ("out too large", lambda: ag(ones(g * 10 + 10), f32), ValueError, ["shape", "[10]"]),
        ("out like inp", lambda: ag(ones(10), f32), ValueError, ["[10]", str(g * 10)]),
        ("dtypes differ", lambda: ag(ones(g * 10, dtype=torch.int32), f32), TypeError,
         ["dtype", "int32", "float32"]),
        ("devices differ", lambda: ag(ones(g * 10, device=other), f32), ValueError, ["out", str(other)]),
        ("out not a tensor", lambda: ag([1.0] * g * 10, f32), TypeError, ["out", "Tensor"]),
        ("inp is None", lambda: ag(ones(g * 10), None), TypeError, ["inp", "Tensor"]),
        ("sparse", lambda: ag(ones(g * 10), f32.to_sparse()), TypeError, ["sparse", "to_dense"]),
        ("variant of another collective", lambda: ag(ones(g * 10), f32,
         config=_cfg("ring")), ValueError, ["ring", "push", "pull"]),
        ("group not a group", lambda: ag(ones(g * 10), f32, group="world"), TypeError,
         ["group"]),
    ]  # fmt: skip
    bad: list[str] = []
    seen = []
    for name, call, types, needles in cases:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - every outcome is checked below
            seen.append((name, type(e).__name__, str(e)))
            if not isinstance(e, types):
                bad.append(f"{name}: raised {type(e).__name__}: {e}")
            elif missing := [s for s in needles if s not in str(e)]:
                bad.append(f"{name}: {type(e).__name__} message lacks {missing}: {e}")
        else:
            seen.append((name, None, None))
            bad.append(f"{name}: no exception")
    # No rank was left inside a collective: the next valid call works on every rank.
    for variant in VARIANTS:
        x = make_input((10,), torch.float32, rank, 3)
        out = torch.empty(g * 10, device=dev)
        ccl.all_gather(out, x, config=_cfg(variant))
        _check(bad, out, x, x.clone(), f"valid call after bad input, {variant}")
    return {"bad": bad, "cases": len(seen), "seen": seen}


def test_all_gather_bad_input():
    results = _run(2, bad_input_body)
    for r in range(1, len(results)):
        # Same cases and exception types everywhere (messages may name this rank's device).
        mine, first = ([s[:2] for s in res["seen"]] for res in (results[r], results[0]))
        assert mine == first, f"rank {r} saw other errors than rank 0"
    _assert_clean(results, min_cases=10)
