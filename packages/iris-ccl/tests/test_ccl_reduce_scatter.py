"""``iris.ccl.reduce_scatter`` against ``torch.distributed.reduce_scatter_tensor`` (gloo).

Every test starts one real multi-process world and loops over its cases inside the ranks;
each rank returns its mismatch descriptions (empty when everything matched). References
reduce floats as an fp32 upcast cast back; AVG is SUM divided by the group size (gloo has
no AVG). Inputs are plain tensors and tensors on an iris heap spanning the world,
contiguous or not, in every dtype and with every ReduceOp.
"""

import warnings

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import DTYPES, SIZES, device, dtype_name, make_input, mismatch, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

VARIANTS = ("boxed", "push", "pull")
SMALL_DTYPES = (torch.float32, torch.bfloat16, torch.int32)
WORLD_TIMEOUT = 400.0


def _cfg(variant: str, **kw):
    import iris.ccl as ccl

    return ccl.Config(variant=variant, **kw)


def _ops(dtype: torch.dtype) -> list[str]:
    return ["SUM", "AVG", "MAX", "MIN"] if dtype.is_floating_point else ["SUM", "MAX", "MIN"]


def reference(x: torch.Tensor, op: str, out_shape, group=None) -> torch.Tensor:
    """``reduce_scatter_tensor`` of ``x`` flattened over ``group`` (gloo on CPU; floats in
    fp32), shaped like the output, in ``x``'s dtype and on its device. Collective."""
    t = x.detach().cpu().contiguous().reshape(-1)
    t = t.float() if t.dtype.is_floating_point else t.clone()
    size = dist.get_world_size(group)
    want = torch.empty(t.numel() // size, dtype=t.dtype)
    dop = dist.ReduceOp.SUM if op == "AVG" else getattr(dist.ReduceOp, op)
    with warnings.catch_warnings():  # torch deprecates the name in favour of reduce_scatter_single
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_tensor(want, t, op=dop, group=group)
    if op == "AVG":
        want = want / size
    return want.to(x.dtype).reshape(out_shape).to(x.device)


def _run(world_size: int, fn, *args, env=None):
    require_world(world_size)
    return run_world(fn, world_size, *args, timeout=WORLD_TIMEOUT, env=env)


def _assert_clean(results, min_cases: int = 0) -> None:
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    for r, res in enumerate(results):
        assert res["cases"] >= min_cases, f"rank {r} checked only {res['cases']} cases (< {min_cases})"


def _check(bad, out, inp, inp0, op, what, group=None):
    """Compare ``out`` with the reference of ``inp0``; ``inp`` must be unchanged."""
    if (m := mismatch(out, reference(inp0, op, out.shape, group), what)) is not None:
        bad.append(m)
    if inp is not None and not torch.equal(inp, inp0):
        bad.append(f"{what}: the input was modified")


# --------------------------------------------------------------------------- the matrix


def _shapes(size: int, g: int):
    """(inp shape, out shape) for ``size`` output elements: dim-0 split, or a flat out."""
    if size == 1000:
        return (g * 10, 100), (10, 100)
    if size == 4099:
        return (g, 4099), (4099,)  # any shapes with the right element counts
    return (g * size,), (size,)


def matrix_body(rank, world_size, dtypes):
    """Every variant x ``dtypes`` x SIZES, the ops rotating over the sizes so that every
    (dtype, variant) sees every op."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    cases = 0
    salt = 0
    for dtype in dtypes:
        ops = _ops(dtype)
        for v, variant in enumerate(VARIANTS):
            for i, size in enumerate(SIZES):
                salt += 1
                op = ops[(i + v) % len(ops)]
                ishape, oshape = _shapes(size, world_size)
                x = make_input(ishape, dtype, rank, salt)
                x0 = x.clone()
                out = torch.full(oshape, 77, dtype=dtype, device=device())
                ret = ccl.reduce_scatter(out, x, op=getattr(ccl.ReduceOp, op), config=_cfg(variant))
                what = f"world={world_size} {variant} {op} {dtype_name(dtype)} inp {list(ishape)}"
                if ret is not None:
                    bad.append(f"{what}: returned {ret!r} with async_op=False")
                _check(bad, out, x, x0, op, what)
                cases += 1
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_reduce_scatter_matches_torch(world_size):
    # Every dtype at world size 3 (odd); fp32/bf16/int32 at every world size.
    dtypes = DTYPES if world_size == 3 else SMALL_DTYPES
    _assert_clean(_run(world_size, matrix_body, dtypes), min_cases=len(dtypes) * len(VARIANTS) * len(SIZES))


# --------------------------------------------------------------------------- layouts, async


def layouts_body(rank, world_size):
    """Non-contiguous inputs and outputs, 0-d and empty outputs, in-place reduce-scatter on
    a plain tensor, an output overlapping the input elsewhere, "auto", async_op handles."""
    setup_rank()
    import iris.ccl as ccl

    g, dev = world_size, device()
    bad: list[str] = []
    cases = 0
    salt = 100
    for dtype in SMALL_DTYPES:
        ops = _ops(dtype)
        for v, variant in enumerate((*VARIANTS, "auto")):
            salt += 10
            op = ops[v % len(ops)]
            tag = f"{variant} {op} {dtype_name(dtype)}"
            x = make_input((123, g * 5), dtype, rank, salt).t()  # non-contiguous
            out = torch.full((5, 123), 77, dtype=dtype, device=dev)
            x0 = x.clone()
            ccl.reduce_scatter(out, x, op=op, config=_cfg(variant))
            _check(bad, out, x, x0, op, f"{tag} transposed inp")
            # Strided output view: elements outside it keep their sentinel.
            x = make_input((2 * g * 1001,), dtype, rank, salt + 1)[::2]
            base = torch.full((2 * 1001,), 77, dtype=dtype, device=dev)
            x0 = x.clone()
            ccl.reduce_scatter(base[1::2], x, op=op, config=_cfg(variant))
            _check(bad, base[1::2], x, x0, op, f"{tag} strided inp and out")
            if not torch.equal(base[0::2], torch.full_like(base[0::2], 77)):
                bad.append(f"{tag}: elements outside the output view were written")
            # 0-d output.
            x = make_input((g,), dtype, rank, salt + 2)
            out = torch.empty((), dtype=dtype, device=dev)
            ccl.reduce_scatter(out, x, op=op, config=_cfg(variant))
            _check(bad, out, x, x.clone(), op, f"{tag} 0-d out")
            # In place on a plain tensor: out is this rank's chunk of inp.
            x = make_input((g * 5, 7), dtype, rank, salt + 3)
            t = x.clone()
            ccl.reduce_scatter(t[rank * 5 : (rank + 1) * 5], t, op=op, config=_cfg(variant))
            _check(bad, t[rank * 5 : (rank + 1) * 5], None, x, op, f"{tag} in place (plain)")
            # out overlapping inp elsewhere than this rank's chunk: reduced from a copy.
            t = make_input((g * 40,), dtype, rank, salt + 4)
            x0 = t.clone()
            ccl.reduce_scatter(t[3:43], t, op=op, config=_cfg(variant))
            _check(bad, t[3:43], None, x0, op, f"{tag} overlapping out")
            # async_op
            x = make_input((g * 1000,), dtype, rank, salt + 5)
            out = torch.empty(1000, dtype=dtype, device=dev)
            work = ccl.reduce_scatter(out, x, op=op, async_op=True, config=_cfg(variant))
            if not isinstance(work, ccl.Work) or work.wait() is not True:
                bad.append(f"{tag} async: got {work!r}, wait() must return True")
            if device().type == "cuda":
                torch.cuda.current_stream().synchronize()
            _check(bad, out, x, x.clone(), op, f"{tag} async")
            # Empty tensors: nothing to do, no error, no hang.
            e = torch.empty(0, 3, dtype=dtype, device=dev)
            ccl.reduce_scatter(torch.empty(0, dtype=dtype, device=dev), e, op=op, config=_cfg(variant))
            cases += 6
    return {"bad": bad, "cases": cases}


def test_reduce_scatter_layouts_in_place_async():
    _assert_clean(_run(3, layouts_body), min_cases=3 * 3 * 6)


# --------------------------------------------------------------------------- heap tensors


def heap_body(rank, world_size, dtypes):
    """Tensors on an iris heap spanning the world (used in place by pull), mixed with plain
    tensors, in-place reduce-scatter on the heap, and non-contiguous heap views."""
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
            ops = _ops(dtype)
            hin = heap.zeros(g * 4099, dtype=dtype)
            hout = heap.zeros(4099, dtype=dtype)
            h2d = heap.zeros(g * 37, 29, dtype=dtype)
            for variant in VARIANTS:
                for mode in modes:
                    salt += 1
                    n = SIZES[salt % len(SIZES)]
                    op = ops[salt % len(ops)]
                    x = make_input((g * n,), dtype, rank, salt)
                    if mode == "heap transposed":
                        x = make_input((29, g * 37), dtype, rank, salt)
                        h2d.t().copy_(x)
                        inp, out = h2d.t(), hout[: 29 * 37].view(29, 37)
                    elif mode == "heap in-place":
                        inp = hin[: g * n]
                        inp.copy_(x)
                        out = inp[rank * n : (rank + 1) * n]
                    else:
                        inp = hin[: g * n] if mode != "plain->heap" else x.clone()
                        inp.copy_(x)
                        out = torch.full((n,), 77, dtype=dtype, device=device())
                        if mode != "heap->plain":
                            out = hout[:n]
                            out.fill_(77)
                    what = f"heap {variant} {op} {dtype_name(dtype)} n={x.numel()} {mode}"
                    ccl.reduce_scatter(out, inp, op=op, config=_cfg(variant))
                    _check(bad, out, None if mode == "heap in-place" else inp, x, op, what)
                    cases += 1
            heap.barrier()
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [pytest.param(2, marks=pytest.mark.full), 3])
def test_reduce_scatter_heap_tensors(world_size):
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
            hin, hout = heap.zeros(3 * 1000), heap.zeros(1000)
            for i, variant in enumerate(VARIANTS):
                for dtype in SMALL_DTYPES:
                    op = _ops(dtype)[i]
                    x = make_input((3 * 1000,), dtype, rank, 300 + i)
                    out = torch.empty(1000, dtype=dtype, device=device())
                    ccl.reduce_scatter(out, x, op=op, group=group, config=_cfg(variant))
                    _check(bad, out, x, x.clone(), op, f"group {variant} {op} {dtype_name(dtype)}", group)
                    cases += 1
                x = make_input((3 * 1000,), torch.float32, rank, 310 + i)
                hin.copy_(x)
                ccl.reduce_scatter(hout, hin, op="avg", group=group, config=_cfg(variant))
                _check(bad, hout, hin, x, "AVG", f"group heap {variant}", group)
                cases += 1
    else:
        try:
            ccl.reduce_scatter(torch.empty(8, device=device()), torch.ones(24, device=device()), group=group)
            bad.append("non-member call with the group did not raise")
        except ValueError as e:
            if "not a member" not in str(e):
                bad.append(f"non-member call raised an unclear ValueError: {e}")
    for variant in VARIANTS:
        x = make_input((world_size * 7,), torch.float32, rank, 320)
        out = torch.empty(7, device=device())
        ccl.reduce_scatter(out, x, config=_cfg(variant))
        _check(bad, out, x, x.clone(), "SUM", f"world after group {variant}")
    return {"bad": bad, "cases": cases}


def test_reduce_scatter_subgroup():
    results = _run(4, subgroup_body)
    _assert_clean([results[1]])
    _assert_clean([results[r] for r in (0, 2, 3)], min_cases=8)


def chunked_body(rank, world_size):
    """Messages larger than one launch: the staging buffer (pull's staged input, push's
    workspace) is small (IRIS_CCL_STAGING_BYTES) and Config.chunk_elements splits heap
    tensors used in place."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    g = world_size
    bad: list[str] = []
    cases = 0
    n = 16384 // (2 * g) + 103  # more per-rank elements than one staged launch covers
    for dtype in SMALL_DTYPES:
        for variant in VARIANTS:
            op = _ops(dtype)[cases % 3]
            x = make_input((g * n,), dtype, rank, 400 + cases)
            out = torch.full((n,), 77, dtype=dtype, device=device())
            ccl.reduce_scatter(out, x, op=op, config=_cfg(variant))
            _check(bad, out, x, x.clone(), op, f"staged n={n} {variant} {op} {dtype_name(dtype)}")
            cases += 1
    with iris.mem.init(1 << 21) as heap:
        hin, hout = heap.zeros(g * 3003), heap.zeros(3003)
        for variant in VARIANTS:
            x = make_input((g * 3003,), torch.float32, rank, 450 + cases)
            hin.copy_(x)
            ccl.reduce_scatter(hout, hin, config=_cfg(variant, chunk_elements=1041, block_size=256))
            _check(bad, hout, hin, x, "SUM", f"heap {variant} chunk_elements=1041")
            cases += 1
    return {"bad": bad, "cases": cases}


def test_reduce_scatter_larger_than_one_launch():
    _assert_clean(_run(3, chunked_body, env={"IRIS_CCL_STAGING_BYTES": "16384"}), min_cases=8)


# --------------------------------------------------------------------------- repetition


def repeated_body(rank, world_size, calls):
    """``calls`` calls on the same buffers (plain and heap in place, alternating variants),
    with fresh data each time: a stale result or drifting sync state is caught."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    g = world_size
    bad: list[str] = []
    cases = 0
    with iris.mem.init(1 << 21) as heap:
        pin, pout = torch.empty(g * 7, device=device()), torch.empty(7, device=device())
        hin = heap.zeros(g * 7)
        hout = hin[rank * 7 : (rank + 1) * 7]  # in place on the heap
        for i in range(calls):
            variant = VARIANTS[i % 2]
            x = make_input((g * 7,), torch.float32, rank, i)
            pin.copy_(x)
            hin.copy_(x)
            ccl.reduce_scatter(pout, pin, config=_cfg(variant))
            ccl.reduce_scatter(hout, hin, config=_cfg(variant))
            want = reference(x, "SUM", (7,))
            for name, got in (("plain", pout), ("heap in-place", hout)):
                if (m := mismatch(got, want, f"{variant} call {i} {name}")) is not None:
                    bad.append(m)
            cases += 1
    return {"bad": bad, "cases": cases}


def test_reduce_scatter_repeated_calls():
    _assert_clean(_run(2, repeated_body, 100), min_cases=100)


# --------------------------------------------------------------------------- bad input


def bad_input_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl

    dev = device()
    other = torch.device("meta") if dev.type == "cpu" else torch.device("cpu")
    ones = lambda *shape, device=dev, **kw: torch.ones(*shape, device=device, **kw)
    g = world_size
    f32 = ones(g * 10)
    i32 = ones(g * 10, dtype=torch.int32)
    out = ones(10)
    rs = ccl.reduce_scatter
    cases = [
        ("out too small", lambda: rs(ones(9), f32), ValueError, ["out", "[9]", f"[{g * 10}]"]),
        ("out like inp", lambda: rs(f32.clone(), f32), ValueError, ["out", "10"]),
        ("inp not divisible", lambda: rs(out, ones(g * 10 + 1)), ValueError,
         ["inp", str(g * 10 + 1), "divide"]),
        ("dtypes differ", lambda: rs(ones(10, dtype=torch.int32), f32), TypeError,
         ["dtype", "int32", "float32"]),
        ("devices differ", lambda: rs(ones(10, device=other), f32), ValueError, ["out", str(other)]),
        ("out not a tensor", lambda: rs([1.0] * 10, f32), TypeError, ["out", "Tensor"]),
        ("inp is None", lambda: rs(out, None), TypeError, ["inp", "Tensor"]),
        ("uint16", lambda: rs(out.to(torch.uint16), f32.to(torch.uint16)), TypeError, ["uint16"]),
        ("AVG on int32", lambda: rs(ones(10, dtype=torch.int32), i32, op="avg"), ValueError,
         ["AVG", "int32"]),
        ("unknown op", lambda: rs(out, f32, op="prod"), ValueError, ["prod", "SUM"]),
        ("variant of another collective", lambda: rs(out, f32, config=_cfg("one_shot")), ValueError,
         ["one_shot", "push", "pull"]),
        ("group not a group", lambda: rs(out, f32, group="world"), TypeError, ["group"]),
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
        x = make_input((g * 10,), torch.float32, rank, 3)
        out = torch.empty(10, device=dev)
        ccl.reduce_scatter(out, x, config=_cfg(variant))
        _check(bad, out, x, x.clone(), "SUM", f"valid call after bad input, {variant}")
    return {"bad": bad, "cases": len(seen), "seen": seen}


def test_reduce_scatter_bad_input():
    results = _run(3, bad_input_body)
    for r in range(1, len(results)):
        # Same cases and exception types everywhere (messages may name this rank's device).
        mine, first = ([s[:2] for s in res["seen"]] for res in (results[r], results[0]))
        assert mine == first, f"rank {r} saw other errors than rank 0"
    _assert_clean(results, min_cases=12)
