"""``iris.ccl.all_to_all`` with split sizes against ``torch.distributed.all_to_all_single``
(gloo, on CPU copies of the same tensors, computed in the same ranks).

Every test starts one real multi-process world and loops over its cases inside the ranks;
each rank returns its mismatch descriptions. Split sizes come from a matrix every rank
draws from the same seed (rank ``i`` sends row ``i``, receives column ``i``): random,
skewed (one rank receives most), with zeros (a rank sends nothing, another receives
nothing), all zero, and large (several ``ll`` tiles or bulk rounds per pair). The GPU
tests at the end (``IRIS_BACKEND=cuda``, worlds of 2-4 on any number of GPUs) capture calls
in CUDA graphs and replay them.
"""

import os

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import device, dtype_name, make_input, mismatch, setup_rank
from test_ccl_all_to_all import _assert_clean, _run, expect_errors
from test_ccl_all_to_all import _check as _check_equal

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
VARIANTS = ("auto", "ll", "boxed", "push", "pull", "copy_engine")
DTYPES = ("float32", "bfloat16", "float16", "int32")
PATTERNS = ("random", "skewed", "zeros", "empty", "large")
#: Trailing shapes of the rows: 1-d tensors and rows not a multiple of any block.
TRAILING = ((), (37,), (3, 7))


def _check(bad, out, inp, inp0, out_rows, in_rows, what, group=None):
    """Compare ``out`` with gloo's result for ``inp0`` and the split sizes."""
    _check_equal(bad, out, inp, inp0, what, group, (out_rows, in_rows))


def splits(pattern: str, world: int, seed: int) -> list[list[int]]:
    """``m[i][j]``: rows rank ``i`` sends to rank ``j`` (the same matrix on every rank)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 9, (world, world), generator=g)
    if pattern == "skewed":  # rank 0 receives most, the others a row or none
        m = torch.randint(0, 2, (world, world), generator=g)
        m[:, 0] = torch.randint(40, 60, (world,), generator=g)
    elif pattern == "zeros":  # rank 0 sends nothing, the last rank receives nothing
        m[0, :] = 0
        m[:, world - 1] = 0
    elif pattern == "empty":
        m.zero_()
    elif pattern == "large":  # several ll tiles or bulk rounds per pair
        m = torch.randint(60, 120, (world, world), generator=g)
    elif pattern == "symmetric":  # every rank sends and receives the same number of rows
        m = m + m.t()
    return m.tolist()


def _cfg(variant: str, **kw):
    import iris.ccl as ccl

    return ccl.Config(variant=variant, **kw)


def one_case(bad, rank, world, variant, dtype, pattern, trailing, salt, group=None, index=None):
    """One call on plain tensors: rank ``index`` (default ``rank``) of the group sends row
    ``index`` of the pattern's matrix and receives its column."""
    import iris.ccl as ccl

    me = rank if index is None else index
    m = splits(pattern, world, salt)
    in_rows, out_rows = m[me], [row[me] for row in m]
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    x = make_input((sum(in_rows), *trailing), dtype, rank, salt)
    x0 = x.clone()
    out = torch.full((sum(out_rows), *trailing), 77, dtype=dtype, device=device())
    ret = ccl.all_to_all(out, x, out_rows, in_rows, group=group, config=_cfg(variant))
    what = f"world={world} {variant} {dtype_name(dtype)} {pattern} rows {list(trailing)} sends {in_rows}"
    if ret is not None:
        bad.append(f"{what}: returned {ret!r} with async_op=False")
    _check(bad, out, x, x0, out_rows, in_rows, what, group)


# --------------------------------------------------------------------------- the matrix


def matrix_body(rank, world_size, cases):
    setup_rank()
    bad: list[str] = []
    for salt, (variant, dtype, pattern, trailing) in enumerate(cases):
        one_case(bad, rank, world_size, variant, dtype, pattern, trailing, salt)
    return {"bad": bad, "cases": len(cases)}


def _default_cases(world: int) -> list[tuple]:
    """A few calls per world: every variant, dtype, pattern and trailing shape appears at
    worlds 2 and 3, rotated so that each call differs in several of them."""
    if world == 1:
        return [("auto", d, "random", TRAILING[i % 3]) for i, d in enumerate(DTYPES)] + [
            ("push", "float32", "empty", (5,))
        ]
    if world == 4:
        return [
            ("auto", "bfloat16", "random", (37,)), ("push", "float32", "skewed", (3, 7)),
            ("boxed", "int32", "zeros", ()), ("ll", "float16", "large", (5,)),
        ]  # fmt: skip
    patterns = ("random", "skewed", "zeros", "large", "random", "empty")
    return [
        (v, DTYPES[(i + world) % 4], patterns[(i + world) % 6], TRAILING[i % 3])
        for i, v in enumerate(VARIANTS)
    ] + [("auto", d, "random", TRAILING[(i + 1) % 3]) for i, d in enumerate(DTYPES)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_uneven_matches_torch(world_size):
    cases = _default_cases(world_size)
    _assert_clean(_run(world_size, matrix_body, cases), min_cases=len(cases))


@pytest.mark.full
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_uneven_matches_torch_every_combination(world_size):
    """Every variant x dtype (float8 and int64 too) x pattern, trailing shapes rotated."""
    dtypes = (*DTYPES, "int64", "float8_e4m3fn")
    cases = [
        (v, d, p, TRAILING[(i + j) % 3])
        for i, v in enumerate(VARIANTS)
        for j, d in enumerate(dtypes)
        for p in PATTERNS
    ]
    _assert_clean(_run(world_size, matrix_body, cases), min_cases=len(cases))


# --------------------------------------------------------------------------- layouts, heaps, async


def layouts_body(rank, world_size):
    """Heap tensors (bulk pairs moved directly: push into the peers' outputs, pull from their
    inputs), heap and plain mixed, out is inp, non-contiguous tensors, one split list None,
    async_op, and uneven calls between equal ones on the same buffers."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    g, dev = world_size, device()
    bad: list[str] = []
    cases = 0
    m = splits("large", g, 11)
    in_rows, out_rows = m[rank], [row[rank] for row in m]
    nin, nout = sum(in_rows), sum(out_rows)
    with iris.mem.init(1 << 23) as heap:
        hin, hout = heap.zeros(nin, 5), heap.zeros(nout, 5)
        for i, (variant, kind) in enumerate(
            [("push", "heap"), ("pull", "heap"), ("auto", "heap"), ("boxed", "heap"),
             ("push", "heap->plain"), ("pull", "heap->plain"), ("push", "plain->heap")]
        ):  # fmt: skip
            x = make_input((nin, 5), torch.float32, rank, 500 + i)
            inp = hin.copy_(x) if kind.startswith("heap") else x.clone()
            out = hout.fill_(77) if kind != "heap->plain" else torch.full((nout, 5), 77.0, device=dev)
            ccl.all_to_all(out, inp, out_rows, in_rows, config=_cfg(variant))
            _check(bad, out, inp, x, out_rows, in_rows, f"{variant} {kind}")
            cases += 1
        # out is inp on the heap (a symmetric split: as many rows out as in)
        s = splits("symmetric", g, 12)
        rows = s[rank]
        assert rows == [r[rank] for r in s]
        h = heap.zeros(sum(rows), 3)
        for variant in ("push", "pull", "auto"):
            x = make_input((sum(rows), 3), torch.float32, rank, 520)
            h.copy_(x)
            ccl.all_to_all(h, h, rows, rows, config=_cfg(variant))
            _check(bad, h, None, x, rows, rows, f"{variant} heap out is inp")
            cases += 1
        heap.barrier()
    for variant in ("auto", "push"):
        # non-contiguous input (a transposed view) and output (every other row of a larger tensor)
        x = make_input((7, nin), torch.bfloat16, rank, 530).t()
        base = torch.full((2 * nout, 7), 77, dtype=torch.bfloat16, device=dev)
        ccl.all_to_all(base[1::2], x, out_rows, in_rows, config=_cfg(variant))
        _check(bad, base[1::2], x, x.clone(), out_rows, in_rows, f"{variant} strided")
        if not torch.equal(base[0::2], torch.full_like(base[0::2], 77)):
            bad.append(f"{variant}: rows outside the output view were written")
        # out is inp, plain
        t = make_input((sum(rows), 4), torch.int32, rank, 540)
        t0 = t.clone()
        ccl.all_to_all(t, t, rows, rows, config=_cfg(variant))
        _check(bad, t, None, t0, rows, rows, f"{variant} plain out is inp")
        cases += 2
    # one of the split lists None: equal splits of that tensor's dim 0 (rank j sends j + 1
    # rows to every rank; rank r receives r + 1 rows from every rank)
    each = [j + 1 for j in range(g)]
    x = make_input((g * (rank + 1), 3), torch.float32, rank, 550)
    out = torch.empty(sum(each), 3, device=dev)
    ccl.all_to_all(out, x, each, None)
    _check(bad, out, x, x.clone(), each, [rank + 1] * g, "input_split_sizes None")
    x = make_input((sum(each), 3), torch.float32, rank, 551)
    out = torch.empty(g * (rank + 1), 3, device=dev)
    ccl.all_to_all(out, x, None, each)
    _check(bad, out, x, x.clone(), [rank + 1] * g, each, "output_split_sizes None")
    # async_op
    x = make_input((nin, 2), torch.float32, rank, 560)
    out = torch.empty(nout, 2, device=dev)
    work = ccl.all_to_all(out, x, out_rows, in_rows, async_op=True)
    if not isinstance(work, ccl.Work) or work.wait() is not True:
        bad.append(f"async: got {work!r}, wait() must return True")
    _check(bad, out, x, x.clone(), out_rows, in_rows, "async")
    cases += 3
    # uneven calls between equal ones (they share the staging buffers and launch counters)
    for i, (equal, uneven) in enumerate(
        [("ll", "auto"), ("boxed", "boxed"), ("ll", "push"), ("boxed", "ll")]
    ):
        e = make_input((g * 301,), torch.float32, rank, 570 + i)
        eout = torch.empty_like(e)
        ccl.all_to_all(eout, e, config=_cfg(equal))
        want = torch.empty(e.shape)
        dist.all_to_all_single(want, e.cpu())
        if (mm := mismatch(eout, want.to(dev), f"equal {equal} after uneven")) is not None:
            bad.append(mm)
        one_case(bad, rank, g, uneven, "float32", ("random", "large")[i % 2], (9,), 580 + i)
        cases += 2
    return {"bad": bad, "cases": cases}


def test_uneven_heap_layouts_async():
    _assert_clean(_run(3, layouts_body), min_cases=23)


def rounds_body(rank, world_size):
    """Staging buffers of 16 KiB: every pair of the large pattern needs several bulk rounds
    (and no pair fits an ll box), for plain tensors and between equal boxed calls (the
    rounds share the boxed buffer's banks); a subgroup of three ranks in a world of four."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    cases = 0
    group, index = None, rank
    if world_size == 4:
        group = dist.new_group([0, 2, 3])
        if rank == 1:
            return {"bad": bad, "cases": 99}
        index = [0, 2, 3].index(rank)
    g = 3
    for i, variant in enumerate(("auto", "boxed", "push", "ll", "pull")):
        for dtype in ("float32", "bfloat16"):
            one_case(bad, rank, g, variant, dtype, "large", (37,), 600 + 2 * i, group, index)
            if variant == "boxed":  # equal boxed launches between uneven ones
                e = make_input((g * 900,), torch.float32, rank, 650 + i)
                eout = torch.empty_like(e)
                ccl.all_to_all(eout, e, config=_cfg("boxed"), group=group)
                want = torch.empty(e.shape)
                dist.all_to_all_single(want, e.cpu(), group=group)
                if (mm := mismatch(eout, want.to(device()), "equal boxed between rounds")) is not None:
                    bad.append(mm)
            cases += 1
    return {"bad": bad, "cases": cases}


def test_uneven_in_rounds():
    _assert_clean(_run(3, rounds_body, env={"IRIS_CCL_STAGING_BYTES": "16384"}), min_cases=10)


@pytest.mark.full
def test_uneven_in_rounds_subgroup():
    _assert_clean(_run(4, rounds_body, env={"IRIS_CCL_STAGING_BYTES": "16384"}), min_cases=10)


# --------------------------------------------------------------------------- bad input


def bad_input_body(rank, world_size):
    """Every rank makes the same bad call: each raises a clear error by itself (no rank is
    left inside a collective), and a valid call works afterwards."""
    setup_rank()
    import iris.ccl as ccl

    dev, g = device(), world_size
    a2a = ccl.all_to_all
    x, out = torch.ones(g * 3, 4, device=dev), torch.ones(g * 3, 4, device=dev)
    ok = [3] * g
    keeps = [3 + (j == rank) - (j == (rank + 1) % g) for j in range(g)]  # one row more for itself
    cases = [
        ("wrong sum", lambda: a2a(out, x, ok, [3] * (g - 1) + [4]), ValueError,
         ["input_split_sizes", f"{3 * g + 1}", f"{3 * g}", "rows"]),
        ("negative", lambda: a2a(out, x, ok, [-1, 4 + 3] + [3] * (g - 2)), ValueError,
         ["input_split_sizes", "negative"]),
        ("wrong length", lambda: a2a(out, x, [3 * g], ok), ValueError,
         ["output_split_sizes", "1 entries", f"{g} ranks"]),
        ("float size", lambda: a2a(out, x, [3.0] * g, ok), TypeError, ["output_split_sizes", "3.0", "int"]),
        ("bool size", lambda: a2a(out, x, ok, [True] * g), TypeError, ["input_split_sizes", "True"]),
        ("not a list", lambda: a2a(out, x, ok, "3,3,3"), TypeError, ["input_split_sizes", "str"]),
        ("float tensor", lambda: a2a(out, x, ok, torch.full((g,), 3.0)), TypeError,
         ["input_split_sizes", "list of ints"]),
        ("rows differ", lambda: a2a(torch.ones(g * 3, 5, device=dev), x, ok, ok), ValueError,
         ["rows", f"[{g * 3}, 5]", f"[{g * 3}, 4]"]),
        ("scalar", lambda: a2a(out, torch.ones((), device=dev), ok, ok), ValueError, ["inp", "scalar"]),
        ("None split, rows not divisible", lambda: a2a(out, torch.ones(g * 3 + 1, 4, device=dev), ok, None),
         ValueError, ["input_split_sizes is None", str(g * 3 + 1), "divide"]),
        ("own rows differ", lambda: a2a(out, x, keeps, ok), ValueError, ["itself", "output_split_sizes"]),
        ("dtypes differ", lambda: a2a(out.int(), x, ok, ok), TypeError, ["dtype", "int32", "float32"]),
        ("variant of another collective", lambda: a2a(out, x, ok, ok, config=_cfg("ring")), ValueError,
         ["ring", "push"]),
    ]  # fmt: skip
    bad, seen = expect_errors(cases)
    one_case(bad, rank, g, "auto", "float32", "random", (4,), 700)
    bad += _disagreeing_sizes(rank, g)
    return {"bad": bad, "cases": len(seen), "seen": seen}


def _disagreeing_sizes(rank: int, g: int) -> list[str]:
    """Without debug mode, the last rank sends rank 1 four rows where rank 1 expects three
    (every other pair agrees; every rank's own sizes add up): a direct push stops at the
    rows rank 1 expects, so the rows right after rank 1's output keep their values."""
    import iris.ccl as ccl
    import iris.mem

    sends = [[3] * g for _ in range(g - 1)] + [[3, 4] + [3] * (g - 3) + [2]]
    expects = [3] * (g - 1) + [2] if rank == g - 1 else [3] * g
    with iris.mem.init(1 << 20) as heap:
        x = heap.full((sum(sends[rank]), 2), float(rank))
        buf = heap.full((sum(expects) + 8, 2), -7.0)  # the output, then 8 guard rows
        ccl.all_to_all(buf[: sum(expects)], x, expects, sends[rank], config=_cfg("push"))
        guard = buf[sum(expects) :]
        problems = [] if bool((guard == -7.0).all()) else [f"a push wrote past the output: {guard.tolist()}"]
        heap.barrier()
    return problems


def test_uneven_bad_split_sizes():
    results = _run(3, bad_input_body)
    for r in range(1, len(results)):
        mine, first = ([s[:2] for s in res["seen"]] for res in (results[r], results[0]))
        assert mine == first, f"rank {r} saw other errors than rank 0"
    _assert_clean(results, min_cases=13)


def debug_body(rank, world_size):
    """IRIS_DEBUG=1: split sizes that disagree across the ranks, a bad size on one rank
    only, one rank without split sizes and rows of another size each raise a ValueError on
    every rank; a matching call works afterwards, and so do heap outputs of a different
    length on each rank given as views of allocations of the same shape."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    assert iris.mem.debug_enabled()
    dev, g = device(), world_size
    ok = [2] * g
    x, out = torch.ones(2 * g, 3, device=dev), torch.ones(2 * g, 3, device=dev)
    # rank 1 sends 1 row to rank 0 and 3 to rank 2, which still expect 2 each
    mismatched = [1, 2, 3] if rank == 1 else ok
    calls = {
        "mismatch": lambda: ccl.all_to_all(out, x, ok, mismatched),
        "one bad rank": lambda: ccl.all_to_all(out, x, ok, [2, 2, 5] if rank == 2 else ok),
        "one rank without sizes": lambda: ccl.all_to_all(out, x, *((None, None) if rank == 0 else (ok, ok))),
        "rows differ": lambda: ccl.all_to_all(
            *(torch.ones(2 * g, 4, device=dev),) * 2 if rank == 1 else (out, x), ok, ok
        ),
    }  # fmt: skip
    messages = {}
    for name, call in calls.items():
        try:
            call()
        except (ValueError, TypeError) as e:
            messages[name] = str(e)
        else:
            messages[name] = None
    bad: list[str] = []
    one_case(bad, rank, g, "auto", "float32", "skewed", (3,), 800)
    # Heap tensors whose lengths differ between the ranks: one allocation of the same shape
    # everywhere (debug mode compares allocations), a view of this rank's rows passed.
    m = splits("random", g, 810)
    in_rows, out_rows = m[rank], [row[rank] for row in m]
    with iris.mem.init(1 << 20) as heap:
        hin = heap.zeros(max(sum(row) for row in m), 3)
        hout = heap.zeros(max(sum(row[j] for row in m) for j in range(g)), 3)
        for variant in ("push", "pull", "auto"):
            x = make_input((sum(in_rows), 3), torch.float32, rank, 811)
            inp, out = hin[: sum(in_rows)].copy_(x), hout[: sum(out_rows)]
            ccl.all_to_all(out, inp, out_rows, in_rows, config=_cfg(variant))
            _check(bad, out, inp, x, out_rows, in_rows, f"debug mode, {variant}, views of heap tensors")
        heap.barrier()
    return {"messages": messages, "bad": bad, "cases": 4}


#: case -> what every rank's message must contain
DEBUG_EXPECTED = {
    "mismatch": ["IRIS_DEBUG", "rank 1 sends 3 rows to rank 2", "rank 2 expects 2", "output_split_sizes[1]"],
    "one bad rank": ["IRIS_DEBUG", "ranks [2]", "problem", "input_split_sizes sums to 9"],
    "one rank without sizes": ["IRIS_DEBUG", "ranks [0]", "split_sizes"],
    "rows differ": ["IRIS_DEBUG", "ranks [1]", "shapes"],
}


def test_uneven_mismatch_raises_on_every_rank_in_debug_mode():
    results = _run(3, debug_body, env={"IRIS_DEBUG": "1"})
    for rank, res in enumerate(results):
        for case, needles in DEBUG_EXPECTED.items():
            message = res["messages"][case]
            assert message is not None, f"rank {rank}: {case}: no error"
            missing = [n for n in needles if n not in message]
            assert not missing, f"rank {rank}: {case}: message lacks {missing}: {message}"
    _assert_clean(results, min_cases=4)


# --------------------------------------------------------------------------- GPUs: CUDA graphs


def graph_body(rank, world_size, use_heap: bool):
    """Warm-up, capture in a CUDA graph, three replays with fresh inputs (same storage, same
    split sizes), every variant and pattern, bf16 rows of 4096 (the large pattern moves
    about 1 MiB per pair: bulk pairs on every variant but ll and auto)."""
    import iris.ccl as ccl
    import iris.mem

    dev = device()  # LOCAL_RANK modulo the GPUs present
    torch.cuda.set_device(dev)
    bad: list[str] = []
    cases = 0
    heap = iris.mem.init(1 << 30) if use_heap else None
    try:
        for v, variant in enumerate(VARIANTS):
            for p, pattern in enumerate(("random", "skewed", "zeros", "large")):
                m = splits(pattern, world_size, 900 + 10 * v + p)
                in_rows, out_rows = m[rank], [row[rank] for row in m]
                shape_in, shape_out = (sum(in_rows), 4096), (sum(out_rows), 4096)
                if heap is not None:
                    x = heap.zeros(shape_in, dtype=torch.bfloat16)
                    out = heap.zeros(shape_out, dtype=torch.bfloat16)
                else:
                    x = torch.zeros(shape_in, dtype=torch.bfloat16, device=dev)
                    out = torch.zeros(shape_out, dtype=torch.bfloat16, device=dev)
                what = f"{variant} {pattern} {'heap' if use_heap else 'plain'} world={world_size}"
                cases += 1

                def call(out=out, x=x, variant=variant, out_rows=out_rows, in_rows=in_rows):
                    ccl.all_to_all(out, x, out_rows, in_rows, config=ccl.Config(variant=variant))

                x.copy_(make_input(shape_in, torch.bfloat16, rank, 0))
                call()
                torch.cuda.synchronize()
                ccl.check_errors()
                _check(bad, out, None, x, out_rows, in_rows, what + " warm-up")
                dist.barrier()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    call()
                torch.cuda.synchronize()
                dist.barrier()
                for r in range(1, 4):
                    x.copy_(make_input(shape_in, torch.bfloat16, rank, r))
                    torch.cuda.synchronize()
                    dist.barrier()
                    graph.replay()
                    torch.cuda.synchronize()
                    ccl.check_errors()
                    _check(bad, out, None, x, out_rows, in_rows, f"{what} replay {r}")
                    dist.barrier()  # nobody refills an input a peer may still read
                del graph
    finally:
        if heap is not None:
            torch.cuda.synchronize()
            heap.close()
    return {"bad": bad, "cases": cases}


@pytest.mark.skipif(BACKEND != "cuda", reason="GPU-only test: run with IRIS_BACKEND=cuda")
@pytest.mark.parametrize("use_heap", [True, False], ids=["heap", "plain"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_uneven_cuda_graph_capture_and_replay(world_size, use_heap):
    _assert_clean(_run(world_size, graph_body, use_heap), min_cases=len(VARIANTS) * 4)


def large_body(rank, world_size):
    """64 MiB per rank of skewed bf16 rows (one rank receives most of it), every variant,
    back to back without host synchronisation between the calls, then checked."""
    import iris.ccl as ccl
    import iris.mem

    dev = device()
    torch.cuda.set_device(dev)
    rows = (64 << 20) // (2 * 4096)
    m = [
        [rows * 3 // 4 if j == 0 else rows // (4 * (world_size - 1)) for j in range(world_size)]
    ] * world_size
    in_rows, out_rows = m[rank], [row[rank] for row in m]
    bad: list[str] = []
    with iris.mem.init(3 << 30) as heap:
        x = heap.zeros(sum(in_rows), 4096, dtype=torch.bfloat16)
        x.copy_(make_input(tuple(x.shape), torch.bfloat16, rank, 1))
        shape = (sum(out_rows), 4096)
        outs = [  # heap and plain outputs, alternately
            heap.zeros(shape, dtype=torch.bfloat16)
            if i % 2
            else torch.zeros(shape, dtype=torch.bfloat16, device=dev)
            for i in range(len(VARIANTS))
        ]
        for variant, out in zip(VARIANTS, outs):
            ccl.all_to_all(out, x, out_rows, in_rows, config=ccl.Config(variant=variant))
        torch.cuda.synchronize()
        ccl.check_errors()
        for variant, out in zip(VARIANTS, outs):
            _check(bad, out, None, x, out_rows, in_rows, f"64 MiB skewed {variant}")
        dist.barrier()
    return {"bad": bad, "cases": len(VARIANTS)}


@pytest.mark.skipif(BACKEND != "cuda", reason="GPU-only test: run with IRIS_BACKEND=cuda")
def test_uneven_64mib_skewed_back_to_back():
    _assert_clean(_run(2, large_body), min_cases=len(VARIANTS))
