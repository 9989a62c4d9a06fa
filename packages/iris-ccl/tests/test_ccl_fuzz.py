"""Property-based fuzzing of the collectives (hypothesis, CPU tier).

Property: a collective on random plain (staged) tensors, shapes (1-3 dims, 1..300
elements), dtypes, ops, variants and layouts (contiguous or transposed input and output)
matches a reference computed with torch.distributed (gloo: the inputs all-gathered as
fp32/int64 copies, reduced locally in float64) within the dtype's tolerance, or raises a
clear TypeError/ValueError identically on every rank.

All ranks of ONE world run the same derandomized hypothesis test, so they draw the same
examples in the same order; after every example the ranks agree on its outcome with
``all_gather_object``, so a failure fails every rank identically and shrinking stays in
lock-step. A hang is caught by the world's deadline.
"""

import pytest

from iris.mem.testing import run_world

pytestmark = pytest.mark.timeout(600)

WORLD = 3
MAX_EXAMPLES = 200
MAX_NUMEL = 300


def _fuzz_rank(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist
    from ccl_testutils import mismatch
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import iris.ccl as ccl

    DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]
    # every variant iris.ccl declares, except the GPU-only Gluon kernel and copy_engine
    # (whole-message DMA copies: test_ccl_copy_engine.py)
    VARIANTS = {
        c: [v for v in variants if v not in ("gluon", "copy_engine")]
        for c, variants in ccl.VARIANTS.items()
        if c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    }
    G = world_size
    state = {"examples": 0, "launched": 0, "checked": 0, "raised": 0}

    @st.composite
    def shapes(draw):
        ndim = draw(st.integers(1, 3))
        shape = []
        budget = MAX_NUMEL
        for _ in range(ndim):
            d = draw(st.integers(1, max(1, min(budget, 300))))
            shape.append(d)
            budget //= d
        return tuple(shape)

    def make(shape, dtype, transposed: bool, salt: int) -> torch.Tensor:
        """Values in [-8, 8) (floats, exact in bf16 steps of 1/16) or [-100, 100) (ints),
        distinct per rank; ``transposed``: a non-contiguous view of the same shape."""
        g = torch.Generator().manual_seed(1000 * rank + salt)
        phys = tuple(reversed(shape)) if transposed else shape
        if dtype.is_floating_point:
            x = (torch.randint(-128, 128, phys, generator=g) / 16).to(dtype)
        else:
            x = torch.randint(-100, 100, phys, generator=g).to(dtype)
        return x.permute(*reversed(range(len(shape)))) if transposed else x

    def empty(shape, dtype, transposed: bool) -> torch.Tensor:
        if transposed and len(shape) >= 2:
            return torch.full(tuple(reversed(shape)), 99, dtype=dtype).permute(*reversed(range(len(shape))))
        if transposed:  # 1-D: every other element of a longer tensor
            return torch.full((2 * shape[0],), 99, dtype=dtype)[::2]
        return torch.full(shape, 99, dtype=dtype)

    def gathered(x: torch.Tensor) -> torch.Tensor:
        """``[G, numel]`` float64 of every rank's flattened ``x`` (gloo all_gather)."""
        wide = torch.float32 if x.dtype.is_floating_point else torch.int64
        t = x.detach().reshape(-1).to(wide)
        parts = [torch.empty_like(t) for _ in range(G)]
        dist.all_gather(parts, t)
        return torch.stack(parts).double()

    def reduce(parts: torch.Tensor, op: str) -> torch.Tensor:
        if op == "SUM":
            return parts.sum(0)
        if op == "AVG":
            return parts.sum(0) / G
        return parts.amax(0) if op == "MAX" else parts.amin(0)

    def one(data) -> str:
        """Run one drawn collective; return "ok ..." or a description of what went wrong."""
        coll = data.draw(st.sampled_from(list(VARIANTS)), label="collective")
        variant = data.draw(st.sampled_from(VARIANTS[coll]), label="variant")
        dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
        shape = data.draw(shapes(), label="shape")
        if coll in ("reduce_scatter", "all_to_all") and data.draw(st.integers(0, 3), label="divisible") > 0:
            # mostly a size the group divides (else the call must raise ValueError)
            shape = (max(G, shape[0] // G * G), *shape[1:])
            while len(shape) > 1 and torch.Size(shape).numel() > MAX_NUMEL:
                shape = shape[:-1]
        op = data.draw(st.sampled_from(["SUM", "SUM", "AVG", "MAX", "MIN"]), label="op")
        t_in = data.draw(st.booleans(), label="inp transposed") and len(shape) >= 2
        t_out = data.draw(st.booleans(), label="out transposed")
        salt = data.draw(st.integers(0, 1000), label="salt")
        # Occasionally a bad argument that must raise before any communication.
        bad = data.draw(
            st.sampled_from(["none"] * 12 + ["out_dtype", "not_tensor", "sparse", "out_numel", "config"]),
            label="bad",
        )
        n = 1
        for d in shape:
            n *= d
        inp = make(shape, dtype, t_in, salt)
        out_numel = {"all_reduce": n, "all_gather": G * n, "reduce_scatter": n // G, "all_to_all": n}[coll]
        out_shape = shape if coll in ("all_reduce", "all_to_all") else (out_numel,)
        if coll == "all_gather" and data.draw(st.booleans(), label="gather 2-D out"):
            out_shape = (G, *shape)
        out = empty(out_shape, dtype, t_out)
        kwargs = {"config": ccl.Config(variant=variant)}
        if coll in ("all_reduce", "reduce_scatter"):
            kwargs["op"] = op
        what = f"{coll}[{variant}] {dtype} {list(shape)} op={op} t_in={t_in} t_out={t_out} bad={bad}"

        # The error the call must raise (None: it must succeed).
        expected = None
        if bad == "out_dtype":
            out = out.to(torch.int64 if dtype != torch.int64 else torch.float32)
            expected = TypeError
        elif bad == "not_tensor":
            inp = inp.tolist()
            expected = TypeError
        elif bad == "sparse":
            inp = inp.to_sparse()
            expected = TypeError
        elif bad == "out_numel":
            out = torch.zeros(out_numel + 1, dtype=dtype)
            expected = ValueError
        elif bad == "config":
            kwargs["config"] = (
                ccl.Config(variant="nope") if data.draw(st.booleans()) else {"variant": variant}
            )
            expected = ValueError if isinstance(kwargs["config"], ccl.Config) else TypeError
        if expected is None:
            if coll in ("reduce_scatter", "all_to_all") and n % G:
                expected = ValueError
            elif op == "AVG" and coll in ("all_reduce", "reduce_scatter") and not dtype.is_floating_point:
                expected = ValueError
            elif coll == "all_reduce" and variant in ("atomic", "spinlock") and op in ("MAX", "MIN"):
                expected = ValueError
        ref_parts = None
        if expected is None:
            ref_parts = gathered(inp)  # collective: before the call, on every rank alike
        inp_before = inp.clone() if isinstance(inp, torch.Tensor) else None

        fn = getattr(ccl, coll)
        try:
            state["launched"] += 1
            result = fn(out, inp, **kwargs)
        except (TypeError, ValueError) as e:
            if expected is None:
                return f"FAIL {what}: raised {type(e).__name__}: {e}"
            if not isinstance(e, expected):
                return f"FAIL {what}: raised {type(e).__name__} ({e}), expected {expected.__name__}"
            if not str(e):
                return f"FAIL {what}: {type(e).__name__} without a message"
            state["raised"] += 1
            return f"ok {what} -> {type(e).__name__}"
        except Exception as e:  # noqa: BLE001 - anything else is a crash
            return f"FAIL {what}: crashed with {type(e).__name__}: {e}"
        if expected is not None:
            return f"FAIL {what}: did not raise {expected.__name__}"
        if result is not None:
            return f"FAIL {what}: returned {result!r} (async_op=False)"
        if not torch.equal(inp, inp_before):
            return f"FAIL {what}: the input changed"
        if coll == "all_reduce":
            want = reduce(ref_parts, op)
        elif coll == "all_gather":
            want = ref_parts.reshape(-1)
        elif coll == "reduce_scatter":
            want = reduce(ref_parts.view(G, G, n // G)[:, rank], op)
        else:
            want = ref_parts.view(G, G, n // G)[:, rank].reshape(-1)
        want = want.to(dtype).reshape(out.shape)
        problem = mismatch(out, want, what)
        state["checked"] += 1
        return f"FAIL {problem}" if problem else f"ok {what}"

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
        try:
            outcome = one(data)
        except BaseException as e:  # noqa: BLE001 - a failure of the test itself
            outcome = f"FAIL test error {type(e).__name__}: {e}"
        outcomes = [None] * G
        dist.all_gather_object(outcomes, outcome)
        bad = [f"rank {r}: {o}" for r, o in enumerate(outcomes) if not o.startswith("ok ")]
        assert not bad, "\n".join(bad)

    prop()
    from iris.ccl import _comm

    _comm.close_all()
    return dict(state)


def test_collectives_match_torch_or_raise_clearly():
    results = run_world(_fuzz_rank, WORLD, timeout=500.0)
    for r, res in enumerate(results):
        assert res["examples"] >= MAX_EXAMPLES, f"rank {r} ran only {res['examples']} examples"
    res = results[0]
    # Most examples must run a collective to the end, not just raise.
    assert res["checked"] >= MAX_EXAMPLES // 2, res
    print(f"{res['examples']} examples: {res['checked']} results checked, {res['raised']} clear errors")
