"""``Config.path``: the fused kernel and the composed path (torch.matmul and an iris.ccl
collective) of every fused op, and the choice ``path="auto"`` makes.

* Both paths give the torch result (float64 matmul of the gathered operands, then the
  torch.distributed collective) at worlds 1 and 3, on odd shapes, in two dtypes, with and
  without bias, outputs plain, strided and on a heap, repeated calls on one workspace; on
  GPUs at worlds 2, 3 and 4 (on any number of GPUs), the fused kernels also with TMA on a
  shape whose rows TMA can read (16-byte aligned), and both paths captured in CUDA graphs.
* Forcing works: ``path="composed"`` prepares a workspace of the composed signature.
* The selection (``iris.ops._select``) reads synthetic tables keyed by GPU model and group
  size, falls back to the heuristic for unknown models and group sizes, and rejects bad
  tables with a clear error.
"""

import functools
import json
import os

import pytest
import torch
from ops_testutils import (
    assert_clean,
    device,
    dtype_name,
    gathered,
    make_out,
    mismatch,
    peak,
    rand,
    require_world,
    run_cases,
    seed,
    setup_rank,
    summed,
)

from iris.mem.testing import run_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
pytestmark = pytest.mark.timeout(300)
WORLD_TIMEOUT = 240.0
OPS = ("matmul_all_reduce", "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_gather")


def _reference(op, a, b, bias, extra, size):
    """What ``op`` returns on this rank, in float64 (``a`` and ``b`` this rank's operands)."""
    import torch.distributed as dist

    add = bias.double() if bias is not None else 0.0
    if op == "matmul_all_reduce":
        return summed(a.double() @ b.double()) + add
    if op == "matmul_reduce_scatter":
        total = summed(a.double() @ b.double()) + add
        return total.chunk(size, dim=extra)[dist.get_rank()]
    if op == "matmul_all_gather":
        return gathered(a.double() @ b.double() + add, 0)
    return gathered(a.double(), extra) @ b.double() + add  # all_gather_matmul


def _operands(op, m, n, k, size, extra, dtype, rank, case):
    """``(a, b, out shape)`` of ``op`` for the global shape ``(M, N, K)``."""
    if op == "all_gather_matmul":
        shard = (m // size, k) if extra == 0 else (m, k // size)
        return rand(shard, dtype, seed(rank, case, 0)), rand((k, n), dtype, seed(rank, case, 1)), (m, n)
    rows = m // size if op == "matmul_all_gather" else m
    a, b = rand((rows, k), dtype, seed(rank, case, 0)), rand((k, n), dtype, seed(rank, case, 1))
    if op == "matmul_reduce_scatter":
        return a, b, (m // size, n) if extra == 0 else (m, n // size)
    return a, b, (m, n)


def path_case(
    rank, world_size, case, heap, op, path, dtype, shape, bias, out_kind, extra=0, repeat=1, tma=None
):
    import iris.ops

    m, n, k = shape
    what = f"{op} path={path} {dtype_name(dtype)} {shape} bias={bias} out={out_kind} extra={extra} tma={tma}"
    cfg = iris.ops.Config(path=path, tma=tma)
    bad = []
    workspace = iris.ops.Workspace()
    for call in range(repeat):
        a, b, out_shape = _operands(op, m, n, k, world_size, extra, dtype, rank, 10 * case + call)
        bias_t = rand((n,), dtype, seed(0, case, 2)) if bias else None  # the same on every rank
        out = make_out(out_kind, out_shape, dtype, heap)
        kw = {"config": cfg, "workspace": workspace}
        if op == "all_gather_matmul":
            kw["gather_dim"] = extra
        elif op == "matmul_reduce_scatter":
            kw["scatter_dim"] = extra
        returned = getattr(iris.ops, op)(out, a, b, bias_t, **kw)
        want = _reference(op, a, b, bias_t, extra, world_size)
        terms = world_size if op in ("matmul_all_reduce", "matmul_reduce_scatter") else 1
        scale = terms * peak(a) * peak(b) * k + (peak(bias_t) if bias else 0.0)
        if returned is not None:
            bad.append(f"{what}: returned {returned!r}")
        if (msg := mismatch(out, want, scale, f"{what} call {call}")) is not None:
            bad.append(msg)
    sig = workspace._signature
    if world_size > 1 and (sig is None or sig[4].path != path):
        bad.append(f"{what}: the workspace was prepared for {sig and sig[4]}, not path={path!r}")
    workspace.close()
    return bad


#: Every op on both paths; each world covers two dtypes, bias on and off, every output kind,
#: an odd shape (no dimension a multiple of a block; M and the scattered or gathered N or K
#: divisible by the group) and both layouts of the scattering and gathering ops.
def _cases(world, paths=("composed",), tma=False):
    """``tma``: add, per op, a fused case with ``Config.tma`` on at a shape TMA reads (every
    row 16-byte aligned: K and N multiples of 8 bf16 elements, per rank too)."""
    g = world
    odd = (g * 13, g * 11, g * 7)  # 39 x 33 x 21 at world 3
    f32, bf16 = torch.float32, torch.bfloat16
    cases = []
    for i, op in enumerate(OPS):
        dt = (f32, bf16)[i % 2]
        other = (bf16, f32)[i % 2]
        extras = (0, 1) if op in ("all_gather_matmul", "matmul_reduce_scatter") else (0, 0)
        if "composed" in paths:
            cases += [
                dict(op=op, path="composed", dtype=dt, shape=odd, bias=True, out_kind="heap",
                     extra=extras[0], repeat=2),
                dict(op=op, path="composed", dtype=other, shape=odd, bias=False, out_kind="strided",
                     extra=extras[1]),
            ]  # fmt: skip
        if "fused" in paths:
            cases += [
                dict(op=op, path="fused", dtype=dt, shape=odd, bias=False, out_kind="heap", extra=extras[0]),
                dict(op=op, path="fused", dtype=other, shape=odd, bias=True, out_kind="plain",
                     extra=extras[1]),
            ]  # fmt: skip
        if tma and "fused" in paths:
            aligned = (g * 40, g * 24, g * 32)  # every row a multiple of 16 bytes, per rank too
            cases.append(
                dict(op=op, path="fused", dtype=bf16, shape=aligned, bias=True, out_kind="heap",
                     extra=extras[1], tma=True)
            )  # fmt: skip
    return cases


def paths_body(rank, world_size, paths, tma=False):
    def one(rank, world_size, i, heap, **case):
        return path_case(rank, world_size, i, heap, **case)

    return run_cases(one, rank, world_size, _cases(world_size, paths, tma))


@pytest.mark.parametrize("world_size", [1, 3])
def test_composed_path_matches_torch(world_size):
    """The composed path of every op (the fused kernels have their own test files)."""
    require_world(world_size)
    results = run_world(paths_body, world_size, ("composed",), timeout=WORLD_TIMEOUT)
    assert_clean(results, len(_cases(world_size)))


@pytest.mark.full
@pytest.mark.parametrize("world_size", [1, 3])
def test_forced_fused_path_matches_torch(world_size):
    """``Config(path="fused")`` runs the fused kernel, with this file's cases."""
    require_world(world_size)
    results = run_world(paths_body, world_size, ("fused",), timeout=WORLD_TIMEOUT)
    assert_clean(results, len(_cases(world_size, ("fused",))))


@pytest.mark.gpu
@pytest.mark.skipif(BACKEND != "cuda", reason="GPU-only test (TMA): run with IRIS_BACKEND=cuda")
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_both_paths_match_torch_on_gpus(world_size):
    """Every op composed and fused, the fused kernels also with TMA on, at worlds 2-4 on
    however many GPUs there are."""
    require_world(world_size)
    paths = ("composed", "fused")
    results = run_world(paths_body, world_size, paths, True, timeout=WORLD_TIMEOUT)
    assert_clean(results, len(_cases(world_size, paths, True)))


# ---------------------------------------------------------------------------- float8 inputs

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
#: Error allowed for float8 inputs, relative to the magnitude of the terms summed into each
#: element (sum of |a_ik scale_a_i| |b_kj scale_b_j| over k and the ranks, + |bias|;
#: docs/ops.md): the products of float8 values are exact in fp32 and summed in fp32; a bf16
#: output (and the bf16 partials the reducing ops exchange) rounds twice (half a unit in the
#: last place each compiled, a whole unit in Triton's interpreter, which truncates to bf16).
FP8_EPS = {torch.bfloat16: 2.0**-7, torch.float32: 2.0**-16}


def _fp8_operand(shape, dtype, case, which, rank):
    """Uniform values in [-8, 8) rounded to ``dtype`` (float8)."""
    return (rand(shape, torch.float32, seed(rank, case, which)) * 8).to(dtype)


def _fp8_scale(kind: str, length: int, row: bool, case: int, rank: int):
    """A scale: ``"tensor"`` one element, ``"row"`` ``[length, 1]`` (or ``[1, length]`` when not
    ``row``) in [0.25, 1.25), ``"none"`` None."""
    if kind == "none":
        return None
    if kind == "tensor":
        return torch.full((1,), 0.375 + 0.25 * rank, device=device())
    values = rand((length,), torch.float32, seed(rank, case, 7 if row else 8)) * 0.5 + 0.75
    return values.view(length, 1) if row else values.view(1, length)


def fp8_case(
    rank, world_size, case, heap, op, path, dtypes, scales, out_dtype, out_kind, bias, extra=0, rows=13
):  # fmt: skip
    """One call of ``op`` with float8 operands of ``dtypes`` and scales of kinds ``scales``,
    against the float64 dequantized reference and the torch.distributed collective; M is
    ``rows`` per rank."""
    import iris.ops

    m, n, k = (world_size * rows, world_size * 11, world_size * 7)  # odd: no block multiple
    what = f"{op} path={path} {[dtype_name(d) for d in dtypes]} scales={scales} -> {dtype_name(out_dtype)}"
    what += f" out={out_kind} bias={bias} extra={extra} rows={rows}"
    a, b, out_shape = _operands(op, m, n, k, world_size, extra, torch.float32, rank, case)
    a, b = _fp8_operand(a.shape, dtypes[0], case, 0, rank), _fp8_operand(b.shape, dtypes[1], case, 1, rank)
    scale_a = _fp8_scale(scales[0], a.shape[0], True, case, rank)
    scale_b = _fp8_scale(scales[1], b.shape[1], False, case, rank)
    bias_t = rand((n,), out_dtype, seed(0, case, 2)) if bias else None
    out = make_out(out_kind, out_shape, out_dtype, heap)
    kw = {"config": iris.ops.Config(path=path), "scale_a": scale_a, "scale_b": scale_b}
    if op == "all_gather_matmul":
        kw["gather_dim"] = extra
    elif op == "matmul_reduce_scatter":
        kw["scatter_dim"] = extra
    getattr(iris.ops, op)(out, a, b, bias_t, **kw)
    a64 = a.double() * (scale_a.double() if scale_a is not None else 1.0)
    b64 = b.double() * (scale_b.double() if scale_b is not None else 1.0)
    want = _reference(op, a64, b64, bias_t, extra, world_size)
    # each element's magnitude: the same op on the absolute values
    bias_abs = bias_t.abs() if bias else None
    magnitude = _reference(op, a64.abs(), b64.abs(), bias_abs, extra, world_size)
    problem = _fp8_mismatch(out, want, magnitude, what)
    # Negative controls: the check catches a scale left out, on either side.
    for name, scale, wrong in (
        ("scale_a", scale_a, (a.double(), b64)),
        ("scale_b", scale_b, (a64, b.double())),
    ):
        if scale is not None:
            unscaled = _reference(op, *wrong, bias_t, extra, world_size)
            if _fp8_mismatch(out, unscaled, magnitude, what) is None:
                problem = (problem or "") + f" {what}: negative control: a reference without {name} passed"
    return [problem] if problem else []


def _fp8_mismatch(out, want, magnitude, what: str) -> str | None:
    """None when ``|out - want| <= FP8_EPS * magnitude`` everywhere, else the worst elements."""
    got, want, magnitude = out.detach().cpu().double(), want.cpu(), magnitude.cpu()
    err = (got - want).abs()
    bad = ~(err <= FP8_EPS[out.dtype] * magnitude)  # NaN too
    if not bad.any():
        return None
    return (
        f"{what}: {int(bad.sum())} of {got.numel()} elements off by more than {FP8_EPS[out.dtype]:.3g} x the "
        f"magnitude of their terms; got {got[bad][:4].tolist()} want {want[bad][:4].tolist()}"
    )


def _fp8_cases(world: int) -> list[dict]:
    """Every op on both paths with float8 inputs: both formats (and one of each), every kind
    of scale on each side, bf16 and fp32 outputs, outputs plain, strided and on a heap, both
    layouts of the gathering and scattering ops, with and without bias."""
    kinds = [("tensor", "tensor"), ("row", "row"), ("row", "tensor"), ("none", "row")]
    dtypes = [(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2), (E4M3, E4M3)]
    outs = ["heap", "plain", "strided", "plain"]
    cases = []
    for i, op in enumerate(OPS):
        for p, path in enumerate(("fused", "composed")):
            j = (i + p) % 4
            layered = op in ("all_gather_matmul", "matmul_reduce_scatter")
            cases.append(
                dict(
                    op=op, path=path, dtypes=dtypes[j], scales=kinds[(i + 2 * p) % 4],
                    out_dtype=(torch.bfloat16, torch.float32)[j % 2], out_kind=outs[j], bias=j % 2 == 0,
                    extra=p if layered else 0,
                )
            )  # fmt: skip
    # all_gather_matmul's shards carrying their scales along K (each slice scaled) on both
    # paths, and in the decode layout (every gathered row in one tile: the whole shard and
    # its scales pushed at once); matmul_reduce_scatter's fused kernel split along N.
    common = dict(out_dtype=torch.bfloat16, out_kind="plain", bias=True, dtypes=(E4M3, E4M3))
    cases += [
        dict(op="all_gather_matmul", path="fused", scales=("tensor", "row"), extra=1, **common),
        dict(op="all_gather_matmul", path="composed", scales=("row", "tensor"), extra=1, **common),
        dict(op="all_gather_matmul", path="fused", scales=("row", "row"), extra=0, rows=4, **common),
        dict(op="matmul_reduce_scatter", path="fused", scales=("row", "row"), extra=1, **common),
    ]
    return cases


def fp8_body(rank, world_size):
    def one(rank, world_size, i, heap, **case):
        return fp8_case(rank, world_size, i, heap, **case)

    return run_cases(one, rank, world_size, _fp8_cases(world_size))


@pytest.mark.parametrize("world_size", [1, 3])
def test_fp8_inputs_match_the_dequantized_product(world_size):
    """Float8 ``a`` and ``b`` with ``scale_a`` / ``scale_b`` on both paths of every op, against
    ``(a * scale_a) @ (b * scale_b)`` in float64 and the torch.distributed collective."""
    require_world(world_size)
    assert_clean(run_world(fp8_body, world_size, timeout=WORLD_TIMEOUT), len(_fp8_cases(world_size)))


def test_fp8_cases_cover_every_kind():
    cases = _fp8_cases(3)
    for op in OPS:
        mine = [c for c in cases if c["op"] == op]
        assert {c["path"] for c in mine} == {"fused", "composed"}
    assert {c["dtypes"] for c in cases} >= {(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2)}
    assert {c["scales"][0] for c in cases} == {"tensor", "row", "none"}
    assert {c["scales"][1] for c in cases} == {"tensor", "row"}
    assert {c["out_dtype"] for c in cases} == {torch.bfloat16, torch.float32}
    for op in ("all_gather_matmul", "matmul_reduce_scatter"):
        assert {c["extra"] for c in cases if c["op"] == op} == {0, 1}


def test_config_path_is_validated():
    import iris.ops

    with pytest.raises(ValueError, match="Config.path must be 'auto', 'fused' or 'composed'"):
        iris.ops.Config(path="cublas")
    assert iris.ops.Config().path == "auto"
    from iris.ops import _select

    with pytest.raises(TypeError, match="iris.ops.Config"):
        _select.path("matmul_all_reduce", 1, 2, torch.device("cpu"), "composed")


# ---------------------------------------------------------------------------- the selection


def path_for(rules: list, work: int) -> str:
    """The path of the rule of ``rules`` that covers ``work`` (through iris.ccl.tuning)."""
    from iris.ccl import tuning

    return tuning.pick(rules, work)[1]


def test_auto_reads_the_table_of_its_model_and_group_size(tmp_path, monkeypatch):
    """Synthetic tables: rules by work for one GPU model and group size; another model or
    group size takes the heuristic, never that table."""
    from iris.ops import _select

    path = tmp_path / "ops.json"
    rules = [[1 << 20, "composed"], [1 << 30, "fused"], [None, "composed"]]
    path.write_text(json.dumps({"tables": {"Test GPU": {"2": {"matmul_all_reduce": rules}}}}))
    monkeypatch.setenv("IRIS_OPS_TABLE", str(path))
    got, source = _select.rules_for("matmul_all_reduce", 2, "Test GPU", True, False)
    assert (got, source) == (rules, str(path))
    assert [path_for(got, w) for w in (1, 1 << 20, (1 << 20) + 1, 1 << 30, 1 << 40)] == [
        "composed", "composed", "fused", "fused", "composed",
    ]  # fmt: skip
    for model, size, op in (("NVIDIA H200", 2, "matmul_all_reduce"), ("Test GPU", 4, "matmul_all_reduce"),
                            ("Test GPU", 2, "matmul_all_gather")):  # fmt: skip
        got, source = _select.rules_for(op, size, model, True, False)
        assert source == "heuristic" and got == _select.heuristic_rules(op, size, True, False)
    # the packaged table (measured on no machine yet) serves nobody: the heuristic does
    monkeypatch.delenv("IRIS_OPS_TABLE")
    assert _select.rules_for("matmul_all_reduce", 2, "NVIDIA H200", True, False)[1] == "heuristic"


def test_heuristic_by_size_group_and_links():
    from iris.ops import _select

    h = _select.heuristic_rules
    # interpreted kernels (the CPU backend): always the fused kernel
    assert h("matmul_all_reduce", 3, None, True) == [[None, "fused"]]
    # a group of one, or peers without NVLink: the composition
    assert h("matmul_all_reduce", 1, True, False) == [[None, "composed"]]
    assert h("all_gather_matmul", 2, False, False) == [[None, "composed"]]
    # NVLink (or unknown): composed for small GEMMs, fused from FUSED_FROM (scaled by G/2)
    decode, prefill = 16 * 8192 * 4096, 1024 * 8192 * 4096
    for nvlink in (True, None):
        rules = h("matmul_reduce_scatter", 2, nvlink, False)
        assert path_for(rules, decode) == "composed" and path_for(rules, prefill) == "fused"
    assert path_for(h("matmul_all_gather", 2, True, False), 64 * 8192 * 4096) == "fused"
    limit = _select.FUSED_FROM["matmul_all_reduce"]
    assert path_for(h("matmul_all_reduce", 8, True, False), limit) == "composed"
    assert path_for(h("matmul_all_reduce", 8, True, False), 4 * limit) == "fused"
    # forcing wins over everything
    cpu = torch.device("cpu")
    import iris.ops

    for forced in ("fused", "composed"):
        assert _select.path("matmul_all_reduce", 1, 2, cpu, iris.ops.Config(path=forced)) == forced
    assert _select.path("matmul_all_reduce", 1 << 40, 2, cpu, None) == "fused"  # interpreted here


def test_fold_and_bad_tables(tmp_path):
    from iris.ccl import tuning
    from iris.ops import _select

    points = [(1 << 28, "composed"), (1 << 30, "composed"), (1 << 33, "fused"), (1 << 35, "fused")]
    assert tuning.fold(points) == [[1 << 30, "composed"], [None, "fused"]]
    for content, words in (
        ("{nope", "cannot read"),
        (json.dumps({"tables": {"X": {"2": {"matmul_all_reduce": [[4, "fused"]]}}}}), "[null, path]"),
        (json.dumps({"tables": {"X": {"2": {"matmul_all_reduce": [[None, "cublas"]]}}}}), "paths of"),
        (json.dumps({"tables": {"X": {"2": {"moe": [[None, "fused"]]}}}}), "an op of"),
        (json.dumps({"tables": {"X": {"two": {}}}}), "group sizes"),
        (json.dumps({"rules": []}), '"tables"'),
    ):
        path = tmp_path / f"t{abs(hash(content))}.json"
        path.write_text(content)
        with pytest.raises(RuntimeError, match="iris.ops") as info:
            _select.TABLES.load(str(path))
        assert words in str(info.value), info.value


# ---------------------------------------------------------------------------- CUDA graphs


def graph_body(rank, world_size):
    """Each op forced onto the composed path: a first call (prepares its workspace and the
    collective's), a capture, replays with fresh inputs copied into the captured ones."""
    import torch.distributed as dist

    import iris.mem
    import iris.ops

    setup_rank()
    bad, cases = [], 0
    cfg = iris.ops.Config(path="composed")
    with iris.mem.init(1 << 28) as heap:
        for case, op in enumerate(OPS):
            shape, extra = (world_size * 301, 2 * 257, 2 * 129), 0  # rows split evenly over the ranks
            a, b, out_shape = _operands(op, *shape, world_size, extra, torch.bfloat16, rank, case)
            bias = rand((shape[1],), torch.bfloat16, seed(0, case, 2))
            out = heap.zeros(out_shape, dtype=torch.bfloat16)
            call = functools.partial(getattr(iris.ops, op), out, a, b, bias, config=cfg)
            call()
            torch.cuda.synchronize()
            dist.barrier()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            torch.cuda.synchronize()
            dist.barrier()
            for r in range(1, 3):
                fresh_a, fresh_b, _ = _operands(op, *shape, world_size, extra, torch.bfloat16, rank, 50 + r)
                a.copy_(fresh_a)
                b.copy_(fresh_b)
                torch.cuda.synchronize()
                dist.barrier()
                graph.replay()
                torch.cuda.synchronize()
                want = _reference(op, a, b, bias, extra, world_size)
                scale = world_size * peak(a) * peak(b) * shape[2] + peak(bias)
                if (msg := mismatch(out, want, scale, f"{op} composed replay {r}")) is not None:
                    bad.append(msg)
                dist.barrier()
            cases += 1
            del graph
        iris.ops.release_workspaces()
    return {"bad": bad, "cases": cases}


@pytest.mark.gpu
@pytest.mark.skipif(BACKEND != "cuda", reason="CUDA graphs: run with IRIS_BACKEND=cuda")
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_composed_path_captures_in_a_cuda_graph(world_size):
    require_world(world_size)
    assert_clean(run_world(graph_body, world_size, timeout=WORLD_TIMEOUT), len(OPS))


# ---------------------------------------------------------------------------- python -m iris.ops.tune


def test_tune_writes_a_table_auto_reads(tmp_path, monkeypatch):
    """The table ``python -m iris.ops.tune`` writes: under the model and group size, other
    entries kept, checked before it replaces the file; ``auto`` reads it for that model."""
    from iris.ops import _select

    path = str(tmp_path / "ops.json")
    two = {"matmul_all_gather": [[1 << 30, "composed"], [None, "fused"]]}
    _select.TABLES.write(path, "Test GPU", 2, two, "n")
    _select.TABLES.write(path, "Test GPU", 4, {"matmul_all_gather": [[None, "composed"]]}, "n")
    with pytest.raises(RuntimeError, match="paths of"):
        _select.TABLES.write(path, "Test GPU", 4, {"matmul_all_gather": [[None, "cublas"]]}, "n")
    monkeypatch.setenv("IRIS_OPS_TABLE", path)
    assert _select.rules_for("matmul_all_gather", 4, "Test GPU", True, False)[0] == [[None, "composed"]]
    rules = _select.rules_for("matmul_all_gather", 2, "Test GPU", True, False)[0]
    assert path_for(rules, 1 << 30) == "composed" and path_for(rules, 1 << 31) == "fused"


@pytest.mark.full
def test_tune_command_smoke(tmp_path):
    """``torchrun -m iris.ops.tune --smoke`` end to end on two CPU ranks."""
    import os
    import subprocess
    import sys

    path = tmp_path / "ops.json"
    env = {**os.environ, "IRIS_BACKEND": "cpu", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]
    cmd += ["iris.ops.tune", "--smoke", "--ops", "matmul_all_reduce", "--shapes", "6x40x24"]
    cmd += ["--out", str(path)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout + run.stderr
    rules = json.loads(path.read_text())["tables"]["interpreter"]["2"]["matmul_all_reduce"]
    assert len(rules) == 1 and rules[0][0] is None and rules[0][1] in ("fused", "composed")
