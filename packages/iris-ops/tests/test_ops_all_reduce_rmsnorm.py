"""``iris.ops.all_reduce_rmsnorm`` against torch: ``torch.distributed.all_reduce`` of float64
copies of the inputs, the residual added and the RMSNorm computed in float64.

Each world test starts one real world (``run_world``) and loops over its cases inside the
ranks; a case is a dtype, a shape ``(tokens, hidden)`` (hidden not a multiple of any block,
tokens not a multiple of the group size), the form (``ll``, ``rs_ag`` or chosen
automatically), residual and residual_out (none, plain, on a heap, in place), the kind of
output (plain, strided, on a heap, ``inp`` itself) and sometimes a forced block size (rows
processed in several pieces) or program count. The argument checks run without a world.
"""

import pytest
import torch
import torch.distributed as dist
from ops_testutils import (
    BACKEND,
    assert_clean,
    dtype_name,
    make_out,
    rand,
    require_world,
    run_cases,
    seed,
    setup_rank,
    summed,
)

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
WORLD_TIMEOUT = 240.0
HEAP = 1 << 25
BF, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
#: Error allowed, relative to the largest finite element of the exact result: the output is
#: rounded once from fp32 (half a unit in the last place; a whole unit for bf16 in Triton's
#: interpreter, which truncates fp32 to bf16); fp32 sums of squares over a few thousand
#: elements.
TOL = {FP32: 2.0**-14, FP16: 2.0**-9, BF: 2.0**-6}
EPS = 1e-5

# Every world size, dtype, form, residual kind and output kind appears below; the world of
# 3 (odd, tokens not divisible by it) carries most of them.
CASES = {
    1: [
        dict(dtype=BF, shape=(3, 1000), form="ll", res="plain", rout="plain", out_kind="plain"),
        dict(dtype=FP32, shape=(5, 37), form="rs_ag", res="none", rout="none", out_kind="heap"),
        # fp16 sums past 65504 (residual_out infinite there), rows in two passes, in place:
        # out is computed from the fp32 sum, as in one pass, not from the overflowed residual.
        dict(
            dtype=FP16,
            shape=(3, 1000),
            form="ll",
            res="plain",
            rout="inplace",
            out_kind="plain",
            block=256,
            magnitude=40000.0,
        ),
        # float8 out: a static scale small enough that the largest values saturate (ll);
        # per-row scales into a strided scales_out, rows in two passes (rs_ag).
        dict(
            dtype=BF,
            shape=(3, 1000),
            form="ll",
            res="plain",
            rout="plain",
            out_kind="plain",
            fp8=E4M3,
            scale=0.004,
        ),
        dict(
            dtype=FP16,
            shape=(5, 1000),
            form="rs_ag",
            res="plain",
            rout="inplace",
            out_kind="plain",
            fp8=E5M2,
            block=256,
        ),
    ],
    2: [
        dict(dtype=BF, shape=(1, 4097), form="auto", res="plain", rout="heap", out_kind="heap"),
        dict(
            dtype=FP16,
            shape=(37, 1000),
            form="rs_ag",
            res="plain",
            rout="plain",
            out_kind="strided",
            repeat=2,
        ),
        dict(dtype=FP32, shape=(3, 1000), form="ll", res="none", rout="none", out_kind="inplace", repeat=2),
    ],
    3: [
        dict(dtype=BF, shape=(3, 1000), form="ll", res="plain", rout="inplace", out_kind="plain", repeat=2),
        dict(dtype=FP16, shape=(1, 1000), form="ll", res="none", rout="plain", out_kind="heap", w=FP32),
        dict(dtype=FP32, shape=(37, 1000), form="rs_ag", res="plain", rout="heap", out_kind="heap", repeat=2),
        dict(dtype=BF, shape=(37, 1000), form="rs_ag", res="plain", rout="inplace", out_kind="inplace"),
        dict(dtype=FP16, shape=(3, 4097), form="rs_ag", res="plain", rout="plain", out_kind="strided"),
        dict(
            dtype=FP16,
            shape=(4, 1000),
            form="rs_ag",
            res="plain",
            rout="inplace",
            out_kind="heap",
            block=256,
            magnitude=30000.0,
        ),
        # float8 out, both forms, both formats, static and dynamic scales, one and two passes,
        # outputs on the heap (rs_ag: written by the rows' owners), strided and plain.
        dict(dtype=BF, shape=(4, 1000), form="rs_ag", res="plain", rout="plain", out_kind="heap", fp8=E4M3),
        dict(
            dtype=FP32,
            shape=(3, 1000),
            form="ll",
            res="none",
            rout="none",
            out_kind="plain",
            fp8=E5M2,
            scale=3e-5,
            block=256,
        ),
        dict(dtype=BF, shape=(5, 1000), form="ll", res="plain", rout="inplace", out_kind="plain", fp8=E4M3),
        dict(
            dtype=FP16,
            shape=(4, 1000),
            form="rs_ag",
            res="plain",
            rout="heap",
            out_kind="strided",
            fp8=E5M2,
            scale=3e-5,
        ),
        # Rows in several pieces (block < hidden), residual_out in place.
        dict(dtype=BF, shape=(5, 1000), form="ll", res="plain", rout="inplace", out_kind="plain", block=256),
        dict(dtype=FP32, shape=(2, 1000), form="auto", res="none", rout="none", out_kind="plain", programs=1),
        # The pushes spread over the programs in pieces (one program: the interpreter runs
        # programs one after another, and a piece may belong to a row of another program).
        dict(
            dtype=FP16,
            shape=(3, 1000),
            form="ll",
            res="plain",
            rout="plain",
            out_kind="plain",
            programs=1,
            spread=True,
        ),
    ],
    4: [
        dict(dtype=BF, shape=(3, 1000), form="auto", res="plain", rout="plain", out_kind="heap"),
        dict(dtype=FP32, shape=(37, 1000), form="auto", res="none", rout="heap", out_kind="plain"),
    ],
}

# The exhaustive matrix (``nox -s tests_full``): every form x dtype x residual kind at
# worlds 2-4, alternately on a heap output at 37 x 1000 and in place at 3 x 4097 in pieces
# of 1024 (both at every form and dtype).
_ROUTS = (("none", "none"), ("plain", "none"), ("plain", "plain"), ("plain", "inplace"), ("none", "heap"))
_LAYOUTS = (("heap", (37, 1000), 0), ("inplace", (3, 4097), 1024))
FULL = [
    dict(dtype=dt, shape=shape, form=form, res=res, rout=rout, out_kind=out_kind, block=block)
    for d, dt in enumerate((BF, FP16, FP32))
    for f, form in enumerate(("ll", "rs_ag"))
    for r, (res, rout) in enumerate(_ROUTS)
    for out_kind, shape, block in [_LAYOUTS[(d + f + r) % 2]]
]


def _vector(dtype, n, case, which):
    return rand((n,), dtype, seed(0, case, which))  # the same on every rank


def norm_case(
    rank, world, case, heap, dtype, shape, form, res, rout, out_kind, repeat=1, w=None, block=0, programs=0,
    spread=None, group=None, magnitude=1.0, fp8=None, scale=None,
):  # fmt: skip
    """``repeat`` calls on one workspace, fresh inputs each (uniform in ``[-magnitude,
    magnitude)``), against the float64 reference; returns the problems found. With ``fp8``
    (a float8 dtype) ``out`` is of that dtype, quantized with the static ``scale`` when given
    (a number), else with per-row scales (``scales_out``: on the heap with ``out_kind="heap"``,
    else a strided view)."""
    import iris.ops

    tokens, hidden = shape
    ws = iris.ops.Workspace()
    cfg = iris.ops.AllReduceRMSNormConfig(form=form, block=block, programs=programs, spread=spread)
    what = f"world={world} {dtype_name(dtype)} {shape} form={form} res={res} rout={rout} out={out_kind}"
    what += f" block={block} programs={programs} spread={spread} magnitude={magnitude}"
    weight = _vector(w or dtype, hidden, case, 99)
    problems = []
    for call in range(repeat):
        inp = (rand(shape, FP32, seed(rank, case, 3 * call)) * magnitude).to(dtype)
        residual = None
        if res == "plain":
            residual = (rand(shape, FP32, seed(0, case, 3 * call + 1)) * magnitude).to(dtype)
        expected_inp, expected_res = inp.clone(), residual.clone() if residual is not None else None
        out = inp if out_kind == "inplace" else make_out(out_kind, shape, fp8 or dtype, heap)
        quant = {}
        if fp8 is not None and scale is not None:
            quant["scale"] = torch.full((1,), scale, device=inp.device)
        elif fp8 is not None:
            quant["scales_out"] = (
                heap.full((tokens,), float("nan"))
                if out_kind == "heap"
                else torch.full((tokens, 2), float("nan"), device=inp.device)[:, 1]
            )
        residual_out = None
        if rout == "inplace":
            residual_out = residual
        elif rout != "none":
            residual_out = make_out(rout, shape, dtype, heap)
        returned = iris.ops.all_reduce_rmsnorm(
            out, inp, weight, EPS, residual=residual, residual_out=residual_out, group=group, config=cfg,
            workspace=ws, **quant,
        )  # fmt: skip
        s = summed(expected_inp, group) + (expected_res.double() if expected_res is not None else 0)
        want = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + EPS) * weight.double()
        label = f"{what} call {call}"
        if returned is not None:
            problems.append(f"{label}: returned {returned!r} with async_op=False")
        if fp8 is None:
            problems += compare(out, want, f"{label} out")
        else:
            problems += compare_fp8(out, want, quant, label)
        if residual_out is not None:  # s rounded to the dtype (infinite where it overflows it)
            problems += compare(residual_out, s.to(dtype).double(), f"{label} residual_out")
    ws.close()
    return problems


#: The float8 output's contract (docs/ops.md): ``out = fp8(y / s)`` rounded to nearest even,
#: saturating. The kernel's ``y / s`` is computed in fp32, the reference's ``v`` in float64;
#: each code must be the rounding of a value within ``FP8_REL * |v| + FP8_ABS * fp8_max``
#: of ``v`` (so bit-exact, except where ``v`` lies that close to a rounding midpoint: fp32
#: sums of squares and products land on either side there), and a dynamic scale within
#: ``FP8_REL`` of ``max(amax|y_t|, 2**-40) / fp8_max``.
FP8_REL, FP8_ABS = 2.0**-16, 2.0**-20
FP8_TINY = 2.0**-40


def fp8_round(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``v`` (float64) rounded to nearest even in ``dtype``, saturating, as float64."""
    top = torch.finfo(dtype).max
    return v.clamp(-top, top).to(dtype).double()


def compare_fp8(out: torch.Tensor, y: torch.Tensor, quant: dict, what: str, rounding=fp8_round) -> list[str]:
    """Problems of the float8 ``out`` against the float64 normed rows ``y``, quantized with the
    static ``quant["scale"]`` or the per-row ``quant["scales_out"]`` the call returned (its
    own scales checked against ``y``'s amax)."""
    dtype, top = out.dtype, torch.finfo(out.dtype).max
    got, y = out.detach().cpu().double(), y.detach().cpu().double()
    problems = []
    if "scale" in quant:
        scales = quant["scale"].detach().cpu().double().reshape(1, 1)
    else:
        scales = quant["scales_out"].detach().cpu().double()[:, None]
        want = y.abs().amax(-1, keepdim=True).clamp_min(FP8_TINY) / top
        bad = ~((scales - want).abs() <= FP8_REL * want)
        if bad.any():
            problems.append(
                f"{what} scales_out: {int(bad.sum())} of {want.numel()} off by more than {FP8_REL:.3g} "
                f"relative: got {scales[bad][:4].tolist()} want {want[bad][:4].tolist()}"
            )
    v = y / scales
    band = FP8_REL * v.abs() + FP8_ABS * top
    low, high, nearest = rounding(v - band, dtype), rounding(v + band, dtype), rounding(v, dtype)
    bad = ~((low <= got) & (got <= high))  # NaN too
    if bad.any():
        idx = bad.nonzero()[:4].tolist()
        problems.append(
            f"{what} out ({dtype_name(dtype)}): {int(bad.sum())} of {got.numel()} codes are not the "
            f"rounding of y / scale; first {idx}: got {got[bad][:4].tolist()} want "
            f"{nearest[bad][:4].tolist()} (y / scale = {v[bad][:4].tolist()})"
        )
    return problems


def compare(got: torch.Tensor, want: torch.Tensor, what: str) -> list[str]:
    """``[]`` when ``|got - want| <= TOL * max|want|`` everywhere (the largest finite
    ``|want|``; infinities must match exactly), else the worst elements."""
    tol = TOL[got.dtype]
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    finite = want[want.isfinite()]
    atol = tol * max(finite.abs().max().item() if finite.numel() else 0.0, 1e-3)
    if got.shape != want.shape:
        return [f"{what}: shape {list(got.shape)} != {list(want.shape)}"]
    err = torch.where(got == want, 0.0, (got - want).abs())
    bad = ~(err <= atol)  # NaN too
    if not bad.any():
        return []
    idx = bad.nonzero()[:4].tolist()
    return [
        f"{what}: {int(bad.sum())} of {got.numel()} elements off by more than {atol:.3g} "
        f"(max {err.max().item():.3g}); first {idx}: got {got[bad][:4].tolist()} "
        f"want {want[bad][:4].tolist()}"
    ]


def matrix_body(rank, world_size, cases):
    return run_cases(norm_case, rank, world_size, cases, heap_bytes=HEAP)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_matches_torch(world_size):
    require_world(world_size)
    cases = CASES[world_size]
    assert_clean(run_world(matrix_body, world_size, cases, timeout=WORLD_TIMEOUT), len(cases))


@pytest.mark.full
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_matches_torch_every_combination(world_size):
    require_world(world_size)
    assert_clean(run_world(matrix_body, world_size, FULL, timeout=3 * WORLD_TIMEOUT), len(FULL))


def test_cases_cover_every_dtype_form_and_kind():
    every = [c for cases in CASES.values() for c in cases]
    assert {c["dtype"] for c in CASES[3]} == {BF, FP16, FP32}
    assert {c["form"] for c in CASES[3]} == {"ll", "rs_ag", "auto"}
    assert {c["out_kind"] for c in every} == {"plain", "strided", "heap", "inplace"}
    assert {c["rout"] for c in every} == {"none", "plain", "heap", "inplace"}
    assert {c["shape"][1] for c in every} >= {1000, 4097}
    assert {c["shape"][0] for c in every} >= {1, 3, 37}


def reuse_body(rank, world_size):
    """One workspace per form, three calls with fresh data, heap outputs: nothing is
    allocated after the first; an async call returns a handle; a reference missing a rank
    fails the check (negative control); a call with another shape is refused."""
    import torch.distributed as dist

    import iris.mem
    import iris.ops

    setup_rank()
    bad, cases = [], 0
    shape = (5, 300)
    with iris.mem.init(HEAP) as heap:
        for form in ("ll", "rs_ag"):
            cfg = iris.ops.AllReduceRMSNormConfig(form=form)
            ws = iris.ops.Workspace()
            out, residual_out = heap.empty(shape, dtype=BF), heap.empty(shape, dtype=BF)
            weight = _vector(BF, shape[1], 60, 0)
            used = None
            for call in range(3):
                inp = rand(shape, BF, seed(rank, 60 + call, 0))
                residual = rand(shape, BF, seed(0, 60 + call, 1))
                work = iris.ops.all_reduce_rmsnorm(
                    out, inp, weight, residual=residual, residual_out=residual_out, config=cfg, workspace=ws,
                    async_op=call == 2,
                )  # fmt: skip
                if call == 2 and (not isinstance(work, iris.ops.Work) or not work.wait()):
                    bad.append(f"{form}: async call returned {work!r}")
                s = summed(inp) + residual.double()
                want = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6) * weight.double()
                bad += compare(out, want, f"{form} call {call}") + compare(
                    residual_out, s, f"{form} call {call} s"
                )
                if call == 0:
                    used = heap.used_bytes
                    dropped = summed(inp * (0.0 if rank == world_size - 1 else 1.0)) + residual.double()
                    if not compare(residual_out, dropped, "control"):
                        bad.append(f"{form}: negative control: a reference missing a rank was not caught")
                elif heap.used_bytes != used:
                    bad.append(f"{form}: call {call} allocated {heap.used_bytes - used} heap bytes")
                cases += 1
            try:
                other = heap.empty((6, 300), dtype=BF)
                iris.ops.all_reduce_rmsnorm(other, rand((6, 300), BF, 1), weight, config=cfg, workspace=ws)
                bad.append(f"{form}: a workspace prepared for another shape was accepted")
            except ValueError as e:
                if "prepared for" not in str(e):
                    bad.append(f"{form}: unexpected error text: {e}")
            ws.close()
        iris.ops.release_workspaces()
        dist.barrier()
    return {"bad": bad, "cases": cases}


def test_repeated_calls_reuse_one_workspace():
    require_world(3)
    assert_clean(run_world(reuse_body, 3, timeout=WORLD_TIMEOUT), 6)


def subgroup_body(rank, world_size):
    """Ranks 0 and 2 of a world of 3 run the op over their own group; rank 1 stays out."""
    import torch.distributed as dist

    import iris.ops

    group = dist.new_group([0, 2])
    bad = []
    if rank != 1:
        for i, form in enumerate(("ll", "rs_ag")):
            bad += norm_case(
                rank, 2, 70 + i, None, FP32, (3, 100), form, "plain", "plain", "plain", group=group
            )
        iris.ops.release_workspaces()
    dist.barrier()
    return {"bad": bad, "cases": 1}


@pytest.mark.full
def test_subgroup():
    require_world(3)
    results = run_world(subgroup_body, 3, timeout=WORLD_TIMEOUT)
    assert_clean([results[0], results[2]], 1)


def absent_body(rank, world_size):
    """Per form: an empty call does nothing; after one call together (which prepares the
    workspace), rank 1 skips the next call: rank 0's kernel gives up after
    IRIS_WAIT_TIMEOUT and raises DeviceWaitTimeout naming the ranks, instead of hanging;
    its four rows cost one budget, not one each (waits after a timeout give up at once)."""
    import time

    import torch.distributed as dist

    import iris.mem
    import iris.ops

    outcomes = []
    for form in ("ll", "rs_ag"):
        cfg = iris.ops.AllReduceRMSNormConfig(form=form)
        iris.ops.all_reduce_rmsnorm(torch.empty(0, 8), torch.empty(0, 8), torch.ones(8), config=cfg)
        ws = iris.ops.Workspace()

        def call(cfg=cfg, ws=ws):
            iris.ops.all_reduce_rmsnorm(
                torch.empty(4, 8), torch.ones(4, 8), torch.ones(8), config=cfg, workspace=ws
            )

        call()
        outcome = "no error"
        if rank == 0:
            started = time.monotonic()
            try:
                call()
            except iris.mem.DeviceWaitTimeout as e:
                outcome = str(e)
            outcome += f" [{time.monotonic() - started:.1f} s]"
        outcomes.append(outcome)
        dist.barrier()
        ws.close()
    return outcomes


def test_absent_rank_is_reported_not_a_hang():
    require_world(2)
    results = run_world(absent_body, 2, timeout=200, env={"IRIS_WAIT_TIMEOUT": "1", "IRIS_WATCHDOG": "0"})
    for outcome in results[0]:
        assert "rank 0: iris.ops.all_reduce_rmsnorm gave up waiting for rank 1" in outcome, outcome
        assert float(outcome.rsplit("[", 1)[1].split(" ")[0]) < 3.5, outcome  # budget: 1 s
    assert results[1] == ["no error", "no error"], results[1]


# --------------------------------------------------------------------------- arguments


def test_forms_chosen_by_size():
    import iris.ops
    from iris.ops.all_reduce_rmsnorm import LL_MAX_BYTES, choose_form, resolve

    assert choose_form(1, 8192, 2, 2) == "ll"
    assert choose_form(LL_MAX_BYTES // (2 * 4096), 4096, 2, 2) == "ll"
    assert choose_form(LL_MAX_BYTES // (2 * 4096) + 1, 4096, 2, 2) == "rs_ag"
    assert choose_form(8192, 8192, 2, 2) == "rs_ag"
    assert choose_form(8192, 8192, 2, 1) == "ll"  # nothing to exchange
    forced = iris.ops.AllReduceRMSNormConfig(form="rs_ag")
    assert resolve(forced, 1, 8192, 2, 2, False).form == "rs_ag"
    cfg = resolve(None, 1, 8192, 2, 2, False)
    assert (cfg.form, cfg.block, cfg.num_warps, cfg.spread) == ("ll", 8192, 16, True)
    cfg = resolve(None, 1, 4097, 2, 2, True)
    assert (cfg.block, cfg.num_warps, cfg.spread) == (4096, 4, False)
    assert resolve(None, 1, 1, 4, 2, False).block == 64


def test_config_validates_fields():
    import iris.ops

    make = iris.ops.AllReduceRMSNormConfig
    for kwargs, text in [
        (dict(form="two_shot"), "form must be 'auto', 'll' or 'rs_ag'"),
        (dict(block=100), "block must be a power of two"),
        (dict(block=32), "block must be a power of two"),
        (dict(num_warps=3), "num_warps"),
        (dict(programs=5000), "programs must be at most"),
        (dict(programs=-1), "programs must be >= 0"),
    ]:
        with pytest.raises(ValueError, match=text):
            make(**kwargs)
    with pytest.raises(TypeError, match="spread must be True, False or None"):
        make(spread=1)
    with pytest.raises(TypeError, match="block must be an int"):
        make(block=64.0)
    with pytest.raises(TypeError):
        make("ll")  # keyword-only


def test_bad_arguments_raise_clear_errors():
    """Every rejected argument, checked before anything needs the group."""
    import iris.ops

    op = iris.ops.all_reduce_rmsnorm
    x, w, big = torch.zeros(4, 8), torch.ones(8), torch.zeros(4, 16)
    q, one = torch.empty(4, 8, dtype=E4M3), torch.ones(1)
    cases = [
        (TypeError, "out must be a torch.Tensor", (None, x, w), {}),
        (TypeError, "inp must be a torch.Tensor", (x.clone(), [1.0], w), {}),
        (ValueError, "inp must be 2-D", (x.clone(), x.view(-1), w), {}),
        (ValueError, "weight must be 1-D", (x.clone(), x, x), {}),
        (TypeError, "dtype torch.int32 is not supported", (x.int(), x.int(), w), {}),
        (TypeError, "weight has dtype torch.int64", (x.clone(), x, w.long()), {}),
        (TypeError, "out has dtype torch.float16 but inp has torch.float32", (x.half(), x, w), {}),
        (ValueError, "out has shape [4, 9]", (torch.zeros(4, 9), x, w), {}),
        (ValueError, "weight has 7 elements, expected 8", (x.clone(), x, torch.ones(7)), {}),
        (ValueError, "residual has shape [3, 8]", (x.clone(), x, w), dict(residual=torch.zeros(3, 8))),
        (
            TypeError,
            "residual_out has dtype torch.bfloat16",
            (x.clone(), x, w),
            dict(residual_out=x.bfloat16()),
        ),
        (ValueError, "residual must be 2-D", (x.clone(), x, w), dict(residual=torch.zeros(32))),
        (ValueError, "eps must be a finite number >= 0", (x.clone(), x, w, -1.0), {}),
        (ValueError, "eps must be a finite number >= 0", (x.clone(), x, w, float("nan")), {}),
        (ValueError, "out overlaps inp", (big[:, :8], big[:, 4:12], w), {}),
        (ValueError, "out overlaps weight", (x, torch.zeros(4, 8), x[0]), {}),
        (
            ValueError,
            "residual_out overlaps inp",
            (x.clone(), x, w),
            dict(residual=x.clone(), residual_out=x),
        ),
        (ValueError, "out overlaps residual_out", (x, torch.zeros(4, 8), w), dict(residual_out=x)),
        (TypeError, "config must be an iris.ops.AllReduceRMSNormConfig", (x.clone(), x, w), dict(config=1)),
        # a float8 out and its scales
        (ValueError, "a float8 out needs exactly one of scale=", (q, x, w), {}),
        (ValueError, "; got both", (q, x, w), dict(scale=one, scales_out=torch.ones(4))),
        (ValueError, "scale is for a float8 out", (x.clone(), x, w), dict(scale=one)),
        (ValueError, "scales_out is for a float8 out", (x.clone(), x, w), dict(scales_out=torch.ones(4))),
        (TypeError, "scale has dtype torch.float64; scales are float32", (q, x, w), dict(scale=one.double())),
        (ValueError, "scale has shape [2]; expected one element", (q, x, w), dict(scale=torch.ones(2))),
        (ValueError, "scales_out is torch.float32 [3]; expected torch.float32 [4]", (q, x, w),
         dict(scales_out=torch.ones(3))),
        (ValueError, "scales_out overlaps inp", (q, x, w), dict(scales_out=x[:, 0])),
        (TypeError, "out has dtype torch.float8_e4m3fn but inp has torch.float32", (x.clone(), q.float(), w),
         dict(residual=x, residual_out=q)),
    ]  # fmt: skip
    had_world = dist.is_initialized()
    try:
        for exc, text, args, kwargs in cases:
            with pytest.raises(exc, match=text.replace("[", r"\[").replace("]", r"\]")):
                op(*args, **kwargs)
        with pytest.raises(ValueError, match=r"out is on .* but inp is on meta"):
            op(x.clone(), torch.zeros(4, 8, device="meta"), w)
    finally:  # the first call made a world of one in this (pytest's) process: not left to later tests
        if not had_world and dist.is_initialized():
            dist.destroy_process_group()


# --------------------------------------------------------------------------- GPUs only


needs_gpus = pytest.mark.skipif(BACKEND != "cuda", reason="GPU-only test: run with IRIS_BACKEND=cuda")
GPU_HEAP = 3 << 30
GPU_CASES = [
    dict(dtype=BF, shape=(1, 8192), form="auto", res="plain", rout="inplace", out_kind="plain"),
    dict(dtype=BF, shape=(8, 4096), form="ll", res="plain", rout="heap", out_kind="heap", repeat=3),
    dict(dtype=BF, shape=(128, 8192), form="auto", res="plain", rout="plain", out_kind="heap"),
    dict(dtype=BF, shape=(128, 8192), form="rs_ag", res="plain", rout="inplace", out_kind="plain"),
    dict(dtype=BF, shape=(2048, 4096), form="auto", res="plain", rout="heap", out_kind="heap", repeat=2),
    dict(dtype=BF, shape=(2048, 8192), form="ll", res="none", rout="none", out_kind="plain"),
    dict(dtype=BF, shape=(8192, 8192), form="auto", res="plain", rout="plain", out_kind="heap"),
    dict(dtype=BF, shape=(8192, 8192), form="rs_ag", res="plain", rout="inplace", out_kind="inplace"),
    dict(dtype=BF, shape=(3, 20000), form="ll", res="plain", rout="inplace", out_kind="plain"),  # two passes
    dict(dtype=BF, shape=(37, 20000), form="rs_ag", res="plain", rout="plain", out_kind="heap"),
    dict(dtype=FP16, shape=(37, 4097), form="ll", res="plain", rout="plain", out_kind="strided"),
    dict(dtype=FP16, shape=(1001, 4097), form="rs_ag", res="none", rout="heap", out_kind="plain"),
    dict(dtype=FP32, shape=(1000, 1000), form="auto", res="plain", rout="plain", out_kind="heap", w=BF),
    dict(dtype=FP32, shape=(3, 1000), form="ll", res="plain", rout="none", out_kind="inplace"),
]


def gpu_shapes_body(rank, world_size):
    return run_cases(norm_case, rank, world_size, GPU_CASES, heap_bytes=GPU_HEAP)


@needs_gpus
@pytest.mark.timeout(1500)
def test_real_shapes_on_gpus():
    require_world(2)
    assert_clean(run_world(gpu_shapes_body, 2, timeout=1200), len(GPU_CASES))


class _Call:
    """Buffers of one call at a fixed shape: ``fill(r)`` refills the inputs in place with the
    data of round ``r``, ``call()`` runs the op, ``expect()`` the reference (collective)."""

    def __init__(self, rank, alloc, shape, form, rout_in_place):
        import iris.ops

        self.rank, self.shape = rank, shape
        self.inp, self.residual = alloc(shape), alloc(shape)
        self.out = alloc(shape)
        self.residual_out = self.residual if rout_in_place else alloc(shape)
        self.weight = _vector(BF, shape[1], 800, 0)
        cfg, ws = iris.ops.AllReduceRMSNormConfig(form=form), iris.ops.Workspace()
        self.workspace = ws
        self.call = lambda: iris.ops.all_reduce_rmsnorm(
            self.out, self.inp, self.weight, residual=self.residual, residual_out=self.residual_out,
            config=cfg, workspace=ws,
        )  # fmt: skip

    def fill(self, r: int) -> None:
        self.inp.copy_(rand(self.shape, BF, seed(self.rank, 800 + r, 1)))
        self.residual.copy_(rand(self.shape, BF, seed(0, 800 + r, 2)))
        self.s = summed(self.inp) + self.residual.double()

    def check(self, what: str) -> list[str]:
        s = self.s
        want = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6) * self.weight.double()
        return compare(self.out, want, f"{what} out") + compare(self.residual_out, s, f"{what} residual_out")


GRAPH_CASES = [((1, 8192), "ll"), ((128, 8192), "ll"), ((128, 8192), "rs_ag"), ((4096, 8192), "auto")]


def graph_body(rank, world_size, use_heap):
    """Per form and shape: 50 calls back to back without synchronising (ranks drift apart:
    the generations must keep calls apart), then a check; a warm-up, one call captured in a
    CUDA graph, three replays each after refilling the inputs in place."""
    import torch.distributed as dist

    import iris.mem
    import iris.ops

    dev = setup_rank()
    bad, cases = [], 0
    heap = iris.mem.init(GPU_HEAP) if use_heap else None
    alloc = (
        (lambda shape: heap.zeros(shape, dtype=BF))
        if heap
        else (lambda shape: torch.zeros(shape, dtype=BF, device=dev))
    )
    try:
        for shape, form in GRAPH_CASES:
            what = f"{form} {shape} {'heap' if use_heap else 'plain'}"
            c = _Call(rank, alloc, shape, form, rout_in_place=False)
            c.fill(0)
            for _ in range(50):
                c.call()
            torch.cuda.synchronize()
            bad += c.check(f"{what} after 50 calls")
            dist.barrier()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                c.call()
            torch.cuda.synchronize()
            dist.barrier()
            for r in range(1, 4):
                c.fill(r)
                torch.cuda.synchronize()
                graph.replay()
                torch.cuda.synchronize()
                bad += c.check(f"{what} replay {r}")
                dist.barrier()  # nobody refills inputs a peer may still read
            cases += 1
            del graph
        iris.ops.check_errors()
        iris.ops.release_workspaces()
    finally:
        torch.cuda.synchronize()
        if heap is not None:
            heap.close()
    return {"bad": bad, "cases": cases}


@needs_gpus
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("use_heap", [True, False], ids=["heap", "plain"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_back_to_back_and_cuda_graph_replay(world_size, use_heap):
    require_world(world_size)
    assert_clean(run_world(graph_body, world_size, use_heap, timeout=1200), len(GRAPH_CASES))
