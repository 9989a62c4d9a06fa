"""``iris.ccl.all_reduce`` against ``torch.distributed`` on the same inputs.

Every test starts one real multi-process world (``iris.mem.testing.run_world``) and loops
over its cases inside the ranks: each rank body returns a list of mismatch descriptions
(empty when everything matched), so one world checks hundreds of calls and a failure
lists every case that went wrong. References come from ``torch.distributed`` on CPU
(gloo): half types are reduced as an fp32 upcast and cast back, AVG is SUM divided by the
group size (gloo has no AVG). The same bodies run on GPUs with ``IRIS_BACKEND=cuda``.
"""

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import DTYPES, SIZES, device, dtype_name, make_input, mismatch, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

ALL_VARIANTS = (
    "boxed", "one_shot", "two_shot", "two_shot_push", "copy_engine", "ring", "atomic", "spinlock", "auto",
)  # fmt: skip
SUM_AVG_ONLY = ("atomic", "spinlock")
SMALL_DTYPES = (torch.float32, torch.bfloat16, torch.int32)
WORLD_TIMEOUT = 400.0


# --------------------------------------------------------------------------- helpers (in ranks)


def _ops(variant: str, dtype: torch.dtype) -> list[str]:
    """The ReduceOps ``variant`` supports for ``dtype`` (AVG only for floats)."""
    ops = ["SUM", "AVG"] if variant in SUM_AVG_ONLY else ["SUM", "AVG", "MAX", "MIN"]
    return [op for op in ops if op != "AVG" or dtype.is_floating_point]


def reference(x: torch.Tensor, op: str, group=None, drop_rank: int | None = None) -> torch.Tensor:
    """``torch.distributed.all_reduce`` of ``x`` over ``group`` (gloo, on CPU), in ``x``'s
    dtype and on ``x``'s device. Floats are reduced in fp32; ``drop_rank`` leaves one
    rank's contribution out (for the negative control). Collective: every member calls it."""
    # A copy (never a view of ``x``): all_reduce below works in place.
    t = x.detach().to("cpu", torch.float32 if x.dtype.is_floating_point else x.dtype, copy=True)
    if drop_rank is not None and dist.get_rank() == drop_rank:
        t.zero_()
    size = dist.get_world_size(group)
    if op == "AVG":
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        t = t / size
    else:
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
    return t.to(x.dtype).to(x.device)


def _config(variant: str, **kw):
    import iris.ccl as ccl

    return ccl.Config(variant=variant, **kw)


def _run(world_size: int, fn, *args, env=None, **kwargs):
    require_world(world_size)
    results = run_world(fn, world_size, *args, timeout=WORLD_TIMEOUT, env=env, **kwargs)
    return results


def _assert_clean(results, min_cases: int = 0) -> None:
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    for r, res in enumerate(results):
        assert res["cases"] >= min_cases, f"rank {r} checked only {res['cases']} cases (< {min_cases})"


# --------------------------------------------------------------------------- the matrix


def _sizes(op: str, dtype: torch.dtype, full: tuple, k: int) -> list[int]:
    """Every size for SUM and for the dtypes in ``full``; else two of SIZES, rotating with
    the case counter ``k`` so that every op still meets every size across the variants."""
    if op == "SUM" or dtype in full:
        return list(SIZES)
    return [SIZES[k % len(SIZES)], SIZES[(k + 2) % len(SIZES)]]


def matrix_body(rank, world_size, dtypes, full):
    """Every variant x every op it supports x ``dtypes`` x sizes, against gloo; plus the
    negative control (a reference missing one rank's contribution must be caught)."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    digests: list[tuple[str, int]] = []
    cases = 0
    salt = 0
    k = 0
    for dtype in dtypes:
        for variant in ALL_VARIANTS:
            for op in _ops(variant, dtype):
                k += 1
                for size in _sizes(op, dtype, full, k):
                    salt += 1
                    x = make_input((size,), dtype, rank, salt)
                    x0 = x.clone()
                    out = torch.full_like(x, 77)
                    what = f"world={world_size} {variant} {op} {dtype_name(dtype)} n={size}"
                    ret = ccl.all_reduce(out, x, op=getattr(ccl.ReduceOp, op), config=_config(variant))
                    if ret is not None:
                        bad.append(f"{what}: returned {ret!r} with async_op=False")
                    want = reference(x0, op)
                    if (m := mismatch(out, want, what)) is not None:
                        bad.append(m)
                    if not torch.equal(x, x0):
                        bad.append(f"{what}: the input was modified")
                    if variant not in SUM_AVG_ONLY:  # float atomics land in any order
                        digests.append((what, hash(out.cpu().view(-1).view(torch.uint8).numpy().tobytes())))
                    cases += 1
        # Negative control: the same comparison against a reference that lacks the last
        # rank's contribution must report a mismatch, else it could not catch a bug.
        x = make_input((1000,), dtype, rank, 999)
        out = torch.empty_like(x)
        ccl.all_reduce(out, x, config=_config("one_shot"))
        if mismatch(out, reference(x, "SUM"), "control") is not None:
            bad.append(f"negative control {dtype_name(dtype)}: the true reference did not match")
        if mismatch(out, reference(x, "SUM", drop_rank=world_size - 1), "control") is None:
            bad.append(f"negative control {dtype_name(dtype)}: a reference missing a rank was not caught")
    # Pulling in member order makes every rank's result bitwise the same (as with NCCL).
    everyone = [None] * world_size
    dist.all_gather_object(everyone, digests)
    for (what, mine), (_, rank0) in zip(digests, everyone[0]):
        if mine != rank0:
            bad.append(f"{what}: result differs bitwise from rank 0's")
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize(
    "world_size, exhaustive",
    [(1, True), (2, False), (3, False), pytest.param(3, True, marks=pytest.mark.full),
     pytest.param(4, True, marks=pytest.mark.full)],
    ids=["1", "2", "3", "3-exhaustive", "4"],
)  # fmt: skip
def test_all_reduce_matches_torch(world_size, exhaustive):
    """Every dtype at world sizes 1 and 3 (odd), fp32/bf16/int32 at every world size, every
    variant and op. SUM meets every size of SIZES; the other ops meet every size for the
    exhaustive cases (every dtype at world 1; fp32/bf16/int32 at 3 and 4, in the full tier)
    and two sizes each otherwise, rotating so that each op still meets every size across
    the variants (the interpreter is slow)."""
    dtypes = DTYPES if world_size in (1, 3) else SMALL_DTYPES
    full = (DTYPES if world_size == 1 else SMALL_DTYPES) if exhaustive else ()
    results = _run(world_size, matrix_body, dtypes, full)
    _assert_clean(results, min_cases=len(ALL_VARIANTS) * len(SIZES) * len(dtypes))


# --------------------------------------------------------------------------- layouts


def _layout_cases(dtype, rank, salt):
    """(name, out, inp, untouched) for shapes and non-contiguous layouts. ``untouched`` is
    a (tensor, mask) whose masked-out elements must keep their sentinel, or None."""
    dev = device()
    cases = []
    x = make_input((5, 123, 7), dtype, rank, salt)
    cases.append(("shape (5,123,7)", torch.empty_like(x), x, None))
    x = make_input((123, 35), dtype, rank, salt + 1).t()
    cases.append(("transposed inp", torch.empty(35, 123, dtype=dtype, device=dev), x, None))
    x = make_input((35, 123), dtype, rank, salt + 2)
    out_base = torch.full((123, 35), 77, dtype=dtype, device=dev)
    cases.append(("transposed out", out_base.t(), x, None))
    big = make_input((2 * 1001,), dtype, rank, salt + 3)
    out_big = torch.full((3 * 1001,), 77, dtype=dtype, device=dev)
    keep = torch.ones(3 * 1001, dtype=torch.bool)
    keep[1::3] = False
    cases.append(("strided slices", out_big[1::3], big[::2], (out_big, keep)))
    x = make_input((4, 9, 33), dtype, rank, salt + 4).permute(2, 0, 1)
    cases.append(
        ("permuted 3-d inp and out", torch.empty(4, 9, 33, dtype=dtype, device=dev).permute(2, 0, 1), x, None)
    )
    x = make_input((), dtype, rank, salt + 5)
    cases.append(("0-d", torch.empty_like(x), x, None))
    x = make_input((64, 64), dtype, rank, salt + 6)[5:60:3, 1::2]
    cases.append(("2-d strided slice", torch.empty(x.shape, dtype=dtype, device=dev), x, None))
    return cases


def _inplace_cases(dtype, rank, salt):
    """(name, tensor, untouched) for ``out is inp``."""
    dev = device()
    cases = [("in-place contiguous", make_input((4099,), dtype, rank, salt), None)]
    cases.append(("in-place transposed", make_input((61, 17), dtype, rank, salt + 1).t(), None))
    base = make_input((3 * 700,), dtype, rank, salt + 2)
    keep = torch.ones(3 * 700, dtype=torch.bool)
    keep[2::3] = False
    cases.append(("in-place strided", base[2::3], (base, keep)))
    cases.append(("in-place (5,123,7)", make_input((5, 123, 7), dtype, rank, salt + 3), None))
    del dev
    return cases


def layouts_body(rank, world_size):
    """Every layout case with every variant, the dtype (fp32, bf16, int32) and the op
    rotating between cases; empty tensors with every variant and dtype."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    cases = 0
    salt = 0
    for v, variant in enumerate(ALL_VARIANTS):
        layouts = [("out", d, c) for d in SMALL_DTYPES for c in _layout_cases(d, rank, salt + 100 * v)]
        layouts += [("in-place", d, c) for d in SMALL_DTYPES for c in _inplace_cases(d, rank, salt + 100 * v)]
        # One dtype per case, rotating with the variant, so each variant meets each layout once.
        per_dtype = len(layouts) // len(SMALL_DTYPES)
        for i in range(per_dtype):
            kind, dtype, case = layouts[((i + v) % len(SMALL_DTYPES)) * per_dtype + i]
            ops = _ops(variant, dtype)
            op = ops[(i + v) % len(ops)]
            if kind == "out":
                name, out, inp, untouched = case
            else:
                name, out, untouched = case
                inp = out
            inp0 = inp.clone()
            snapshot = untouched[0].clone() if untouched else None
            what = f"{variant} {op} {dtype_name(dtype)} {name} {list(inp.shape)}"
            # Ops by name for one kind, as torch.distributed's ReduceOp for the other.
            cop = op.lower() if kind == "out" else getattr(dist.ReduceOp, op)
            ccl.all_reduce(out, inp, op=cop, config=_config(variant))
            if (m := mismatch(out, reference(inp0, op), what)) is not None:
                bad.append(m)
            if out is not inp and not torch.equal(inp, inp0):
                bad.append(f"{what}: the input was modified")
            if untouched is not None:
                t, keep = untouched
                if not torch.equal(t.cpu()[keep], snapshot.cpu()[keep]):
                    bad.append(f"{what}: elements outside the output view were written")
            cases += 1
    # Empty tensors: nothing to do, no error, no hang.
    for dtype in SMALL_DTYPES:
        for shape in ((0,), (3, 0)):
            e = torch.empty(shape, dtype=dtype, device=device())
            for variant in ALL_VARIANTS:
                ccl.all_reduce(torch.empty_like(e), e, config=_config(variant))
                ccl.all_reduce(e, e, config=_config(variant))
    return {"bad": bad, "cases": cases}


def test_all_reduce_shapes_strides_and_in_place():
    _assert_clean(_run(3, layouts_body), min_cases=len(ALL_VARIANTS) * 11)


# --------------------------------------------------------------------------- heap tensors


MODES = ("heap->heap", "heap in-place", "heap->plain", "plain->heap", "heap 2-d transposed")


def heap_body(rank, world_size):
    """Tensors on an iris heap spanning the world (used in place by the collective), mixed
    with plain tensors, in place on the heap, and non-contiguous heap views."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    bad: list[str] = []
    cases = 0
    salt = 0
    with iris.mem.init(1 << 22) as heap:
        for dtype in SMALL_DTYPES:
            hin = heap.zeros(4099, dtype=dtype)
            hout = heap.zeros(4099, dtype=dtype)
            h2d = heap.zeros(37, 29, dtype=dtype)
            for variant in ALL_VARIANTS:
                for op in _ops(variant, dtype):
                    for mode in (MODES[salt % len(MODES)], MODES[(salt + 2) % len(MODES)]):
                        salt += 1
                        n = SIZES[salt % len(SIZES)]
                        x = make_input((n,), dtype, rank, salt)
                        if mode == "heap 2-d transposed":
                            x = make_input((29, 37), dtype, rank, salt)
                            h2d.t().copy_(x)
                            inp = out = h2d.t()
                        else:
                            inp = hin[:n] if mode != "plain->heap" else x.clone()
                            inp.copy_(x)
                            if mode == "heap in-place":
                                out = inp
                            elif mode == "heap->plain":
                                out = torch.full_like(x, 77)
                            else:
                                out = hout[:n]
                                out.fill_(77)
                        what = f"heap {variant} {op} {dtype_name(dtype)} n={x.numel()} {mode}"
                        ccl.all_reduce(out, inp, op=op, config=_config(variant))
                        if (m := mismatch(out, reference(x, op), what)) is not None:
                            bad.append(m)
                        if out is not inp and not torch.equal(inp, x):
                            bad.append(f"{what}: the input was modified")
                        cases += 1
            # Every rank's heap tensors hold the same offsets: the heap is still consistent.
            heap.barrier()
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [pytest.param(2, marks=pytest.mark.full), 3])
def test_all_reduce_heap_tensors(world_size):
    _assert_clean(_run(world_size, heap_body), min_cases=40)


# --------------------------------------------------------------------------- subgroups


def subgroup_body(rank, world_size):
    """A group of ranks 0, 2, 3 in a world of 4 (created on every rank); rank 1 skips the
    calls. Plain tensors (staged through iris.ccl's heap for the group) and tensors on a
    heap made for the group (used in place); the world still works afterwards."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    members = [0, 2, 3]
    group = dist.new_group(members)
    bad: list[str] = []
    cases = 0
    if rank in members:
        heap = iris.mem.init(1 << 22, group=group)
        if heap.world_size != 3:
            bad.append(f"heap of the group has world_size {heap.world_size}")
        hbuf = heap.zeros(4099, dtype=torch.float32)
        salt = 0
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for variant in ALL_VARIANTS:
                for op in _ops(variant, dtype):
                    salt += 1
                    n = SIZES[salt % len(SIZES)]
                    x = make_input((n,), dtype, rank, salt)
                    out = torch.full_like(x, 77)
                    what = f"group {members} {variant} {op} {dtype_name(dtype)} n={n}"
                    ccl.all_reduce(out, x, op=op, group=group, config=_config(variant))
                    if (m := mismatch(out, reference(x, op, group=group), what)) is not None:
                        bad.append(m)
                    cases += 1
                    if dtype == torch.float32:
                        h = hbuf[:n]
                        h.copy_(x)
                        ccl.all_reduce(h, h, op=op, group=group, config=_config(variant))
                        if (
                            m := mismatch(h, reference(x, op, group=group), what + " group heap")
                        ) is not None:
                            bad.append(m)
                        cases += 1
        heap.close()
    else:
        # A non-member passing the group gets a clear error, without communicating.
        x = torch.ones(8, device=device())
        try:
            ccl.all_reduce(x, x, group=group)
            bad.append("non-member call with the group did not raise")
        except ValueError as e:
            if "not a member" not in str(e):
                bad.append(f"non-member call raised an unclear ValueError: {e}")
        except Exception as e:  # noqa: BLE001 - reported
            bad.append(f"non-member call raised {type(e).__name__}: {e}")
    # The whole world, after the group's collectives.
    for variant in ALL_VARIANTS:
        x = make_input((1000,), torch.float32, rank, 500)
        out = torch.empty_like(x)
        ccl.all_reduce(out, x, config=_config(variant))
        if (m := mismatch(out, reference(x, "SUM"), f"world after group {variant}")) is not None:
            bad.append(m)
    return {"bad": bad, "cases": cases}


def test_all_reduce_subgroup():
    results = _run(4, subgroup_body)
    _assert_clean([results[1]])
    _assert_clean([results[r] for r in (0, 2, 3)], min_cases=40)


# --------------------------------------------------------------------------- repetition, async


def repeated_body(rank, world_size, calls):
    """``calls`` calls per variant, alternating between one pair of plain buffers (staged)
    and one heap buffer (in place), with fresh data each time, so a stale result or a sync
    slot that drifts between calls is caught."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    bad: list[str] = []
    cases = 0
    with iris.mem.init(1 << 21) as heap:
        plain_in, plain_out = torch.empty(1000, device=device()), torch.empty(1000, device=device())
        heap_buf = heap.zeros(1000)
        for variant in ALL_VARIANTS:
            cfg = _config(variant)
            for i in range(calls):
                x = make_input((1000,), torch.float32, rank, i)
                if i % 2:
                    heap_buf.copy_(x)
                    ccl.all_reduce(heap_buf, heap_buf, config=cfg)
                    got, name = heap_buf, "heap in-place"
                else:
                    plain_in.copy_(x)
                    ccl.all_reduce(plain_out, plain_in, config=cfg)
                    got, name = plain_out, "plain"
                if (m := mismatch(got, reference(x, "SUM"), f"{variant} call {i} {name}")) is not None:
                    bad.append(m)
                cases += 1
    return {"bad": bad, "cases": cases}


def test_all_reduce_repeated_calls():
    calls = 40  # both kinds of tensor, every variant: sync generations and ll banks cycle many times
    _assert_clean(_run(2, repeated_body, calls), min_cases=calls * len(ALL_VARIANTS))


def async_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    cases = 0
    for variant in ALL_VARIANTS:
        for dtype in (torch.float32, torch.bfloat16):
            x = make_input((4099,), dtype, rank, cases)
            out = torch.empty_like(x)
            work = ccl.all_reduce(out, x, op="avg", async_op=True, config=_config(variant))
            what = f"async {variant} {dtype_name(dtype)}"
            if not isinstance(work, ccl.Work):
                bad.append(f"{what}: returned {work!r}, not a Work")
                continue
            if work.wait() is not True:
                bad.append(f"{what}: wait() did not return True")
            if device().type == "cuda":
                torch.cuda.current_stream().synchronize()
            if work.is_completed() is not True:
                bad.append(f"{what}: is_completed() is not True after wait and a synchronisation")
            if (m := mismatch(out, reference(x, "AVG"), what)) is not None:
                bad.append(m)
            cases += 1
    return {"bad": bad, "cases": cases}


def test_all_reduce_async_op():
    _assert_clean(_run(3, async_body), min_cases=2 * len(ALL_VARIANTS))


# --------------------------------------------------------------------------- chunking


#: Staging bytes for the chunking test: small, so a short message (quick in the
#: interpreter) still needs several launches.
STAGING = 16384


def chunked_body(rank, world_size):
    """Messages larger than the staging buffer (IRIS_CCL_STAGING_BYTES is small) and
    Config.chunk_elements splitting on heap tensors: every launch boundary must be right."""
    setup_rank()
    import iris.ccl as ccl
    import iris.ccl.settings
    import iris.mem

    bad: list[str] = []
    cases = 0
    staging = iris.ccl.settings.staging_bytes(iris.mem.capabilities(device()))
    if staging != STAGING:
        bad.append(f"IRIS_CCL_STAGING_BYTES did not take effect: {staging}")
    n = STAGING // 4 + 1003  # more elements than the staging buffer holds, even for int32
    for v, variant in enumerate(ALL_VARIANTS):
        for dtype in (SMALL_DTYPES[v % 3], SMALL_DTYPES[(v + 1) % 3]):
            ops = _ops(variant, dtype)
            op = ops[cases % len(ops)]
            x = make_input((n,), dtype, rank, cases)
            out = torch.full_like(x, 77)
            ccl.all_reduce(out, x, op=op, config=_config(variant))
            what = f"staged n={n} {variant} {op} {dtype_name(dtype)}"
            if (m := mismatch(out, reference(x, op), what)) is not None:
                bad.append(m)
            cases += 1
            # In place on a plain tensor, with chunk_elements on top.
            t = x.clone()
            ccl.all_reduce(t, t, op=op, config=_config(variant, chunk_elements=1500))
            if (m := mismatch(t, reference(x, op), what + " chunk_elements=1500 in-place")) is not None:
                bad.append(m)
            cases += 1
    with iris.mem.init(1 << 21) as heap:
        h = heap.zeros(5003)
        for variant in ALL_VARIANTS:
            x = make_input((5003,), torch.float32, rank, 40 + cases)
            h.copy_(x)
            ccl.all_reduce(h, h, config=_config(variant, chunk_elements=1024 + 17, block_size=256))
            if (m := mismatch(h, reference(x, "SUM"), f"heap {variant} chunk_elements=1041")) is not None:
                bad.append(m)
            cases += 1
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.full)])
def test_all_reduce_larger_than_staging_buffer(world_size):
    results = _run(world_size, chunked_body, env={"IRIS_CCL_STAGING_BYTES": str(STAGING)})
    _assert_clean(results, min_cases=5 * len(ALL_VARIANTS))


# --------------------------------------------------------------------------- bad input


def _bad_cases(rank):
    """(name, call, exception types, substrings of the message)."""
    import iris.ccl as ccl

    dev = device()
    other = torch.device("meta") if dev.type == "cpu" else torch.device("cpu")
    f32 = torch.ones(10, device=dev)
    i32 = torch.ones(10, dtype=torch.int32, device=dev)
    ar = ccl.all_reduce
    C = ccl.Config
    cases = [
        ("out has fewer elements", lambda: ar(torch.ones(9, device=dev), f32), ValueError, ["out", "9"]),
        (
            "out has another shape",
            lambda: ar(torch.ones(2, 5, device=dev), f32),
            ValueError,
            ["shape", "[2, 5]"],
        ),
        ("dtypes differ", lambda: ar(i32.clone(), f32), TypeError, ["dtype", "int32", "float32"]),
        ("devices differ", lambda: ar(torch.ones(10, device=other), f32), ValueError, ["out", str(other)]),
        ("out not a tensor", lambda: ar([1.0] * 10, f32), TypeError, ["out", "Tensor", "list"]),
        ("inp not a tensor", lambda: ar(f32, 3.0), TypeError, ["inp", "Tensor", "float"]),
        ("inp is None", lambda: ar(f32, None), TypeError, ["inp", "Tensor"]),
        ("bool AVG", lambda: ar(f32.bool(), f32.bool(), op="avg"), ValueError, ["AVG", "bool"]),
        ("AVG on int32", lambda: ar(i32, i32.clone(), op=ccl.ReduceOp.AVG), ValueError, ["AVG", "int32"]),
        ("AVG on int64", lambda: ar(i32.long(), i32.long(), op="avg"), ValueError, ["AVG", "int64"]),
        ("unknown op", lambda: ar(f32, f32, op="prod"), ValueError, ["prod", "SUM"]),
        (
            "atomic MAX",
            lambda: ar(f32, f32, op="max", config=C(variant="atomic")),
            ValueError,
            ["atomic", "SUM"],
        ),
        (
            "spinlock MIN",
            lambda: ar(f32, f32, op="min", config=C(variant="spinlock")),
            ValueError,
            ["spinlock"],
        ),
        (
            "unknown variant",
            lambda: ar(f32, f32, config=C(variant="butterfly")),
            ValueError,
            ["butterfly", "ring"],
        ),
        (
            "variant of another collective",
            lambda: ar(f32, f32, config=C(variant="push")),
            ValueError,
            ["push"],
        ),
        ("config is a dict", lambda: ar(f32, f32, config={"variant": "ring"}), TypeError, ["config"]),
        ("group not a group", lambda: ar(f32, f32, group="world"), TypeError, ["group"]),
        ("Config empty variant", lambda: C(variant=""), ValueError, ["variant"]),
        ("Config variant None", lambda: C(variant=None), ValueError, ["variant"]),
        ("Config block_size 100", lambda: C(block_size=100), ValueError, ["block_size", "100"]),
        ("Config block_size 8", lambda: C(block_size=8), ValueError, ["block_size"]),
        ("Config block_size -64", lambda: C(block_size=-64), ValueError, ["block_size"]),
        ("Config num_warps 3", lambda: C(num_warps=3), ValueError, ["num_warps", "3"]),
        ("Config num_warps 64", lambda: C(num_warps=64), ValueError, ["num_warps"]),
        ("Config num_warps -4", lambda: C(num_warps=-4), ValueError, ["num_warps"]),
        ("Config chunk_elements -1", lambda: C(chunk_elements=-1), ValueError, ["chunk_elements"]),
        # Non-integers: a clear error naming the field (ValueError or TypeError).
        ("Config block_size 64.0", lambda: C(block_size=64.0), (ValueError, TypeError), ["block_size"]),
        ("Config num_warps '4'", lambda: C(num_warps="4"), (ValueError, TypeError), ["num_warps"]),
        (
            "Config chunk_elements 2.5",
            lambda: C(chunk_elements=2.5),
            (ValueError, TypeError),
            ["chunk_elements"],
        ),
    ]
    del rank
    return cases


def bad_input_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    seen = []
    for name, call, types, needles in _bad_cases(rank):
        try:
            call()
        except Exception as e:  # noqa: BLE001 - every outcome is checked below
            seen.append((name, type(e).__name__, str(e)))
            if not isinstance(e, types):
                bad.append(f"{name}: raised {type(e).__name__}: {e}")
            else:
                missing = [s for s in needles if s not in str(e)]
                if missing:
                    bad.append(f"{name}: {type(e).__name__} message lacks {missing}: {e}")
        else:
            seen.append((name, None, None))
            bad.append(f"{name}: no exception")
    # No rank was left inside a collective: the next valid call works on every rank.
    for variant in ALL_VARIANTS:
        x = make_input((1000,), torch.float32, rank, 3)
        out = torch.empty_like(x)
        ccl.all_reduce(out, x, config=_config(variant))
        if (m := mismatch(out, reference(x, "SUM"), f"valid call after bad input, {variant}")) is not None:
            bad.append(m)
    return {"bad": bad, "cases": len(seen), "seen": seen}


def test_all_reduce_bad_input():
    results = _run(3, bad_input_body)
    # Every rank raised the same exceptions (an error on some ranks only would leave the
    # others waiting in a collective).
    for r in range(1, len(results)):
        # Same cases and exception types everywhere (messages may name this rank's device).
        mine, first = ([s[:2] for s in res["seen"]] for res in (results[r], results[0]))
        assert mine == first, f"rank {r} saw other errors than rank 0"
    _assert_clean(results, min_cases=29)
