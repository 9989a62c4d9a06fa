"""iris.ops under ``torch.compile``: the fused ops as ``torch.ops.iris`` custom ops
(``iris.ops._library``).

(Triton compilation of the kernels for sm_90 is ``test_ops_compile.py``.)

A function calling every fused op through the public API, and one calling the functional
ops directly, are compiled with ``fullgraph=True`` inside one real world and compared with
eager runs; the graphs are counted (one frame, no break) and searched for the ops.
``torch.library.opcheck`` checks schemas, mutation declarations and fake implementations in
a world of one.
"""

import os
import shutil

import pytest
import torch
import torch.distributed as dist
from ops_testutils import device, require_world, setup_rank

from iris.mem.testing import run_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
WORLD_TIMEOUT = 300.0
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
#: What torch.library.opcheck checks (its default).
OPCHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
OPS = (
    "matmul_all_reduce",
    "all_gather_matmul",
    "matmul_all_gather",
    "matmul_reduce_scatter",
    "all_reduce_rmsnorm",
)


def _operands(rank: int, world: int):
    """Small fp32 operands, distinct per rank: a (M, K), b (K, N), bias (N,), a shard."""
    g = torch.Generator().manual_seed(100 + rank)
    m, k, n = 2 * world, 8, 24  # n divisible by the group sizes tested (1, 2, 3)
    a = torch.randn(m, k, generator=g).to(device())
    b = torch.randn(k, n, generator=g).to(device())
    bias = torch.randn(n, generator=torch.Generator().manual_seed(7)).to(device())  # the same everywhere
    shard = torch.randn(2, k, generator=g).to(device())
    return a, b, bias, shard


def _public(a, b, bias, shard, group, world: int) -> list[torch.Tensor]:
    """Every fused op through iris.ops's public functions."""
    import iris.ops

    m, n = a.shape[0], b.shape[1]
    outs = []
    out = a.new_empty(m, n)
    iris.ops.matmul_all_reduce(out, a, b, bias, group=group)
    outs.append(out)
    out = a.new_empty(world * shard.shape[0], n)
    iris.ops.all_gather_matmul(out, shard, b, group=group)
    outs.append(out)
    out = a.new_empty(world * m, n)
    iris.ops.matmul_all_gather(out, a, b, bias, group=group, config=iris.ops.Config(block_m=16))
    outs.append(out)
    out = a.new_empty(m // world, n)
    iris.ops.matmul_reduce_scatter(out, a, b, group=group)
    outs.append(out)
    x = a @ b
    normed, summed = torch.empty_like(x), torch.empty_like(x)
    iris.ops.all_reduce_rmsnorm(normed, x, bias, 1e-5, residual=x * 0 + 1, residual_out=summed, group=group)
    outs += [normed, summed]
    return outs


def _functional(a, b, bias, shard, group_name: str) -> list[torch.Tensor]:
    ops = torch.ops.iris
    x = a @ b
    return [
        ops.matmul_all_reduce(a, b, bias, group_name),
        ops.all_gather_matmul(shard, b, None, 0, group_name),
        ops.matmul_all_gather(a, b, None, group_name),
        ops.matmul_reduce_scatter(a, b, bias, 1, group_name),
        *ops.all_reduce_rmsnorm(x, bias, 1e-5, None, group_name),
    ]


def _public_fp8(a8, b8, scale_a, scale_b, x, norm, group) -> list[torch.Tensor]:
    """The float8 forms: a fused GEMM with float8 operands and scales (bf16 out), and
    all_reduce_rmsnorm quantizing its output with per-row scales."""
    import iris.ops

    out = torch.empty(a8.shape[0], b8.shape[1], dtype=torch.bfloat16, device=a8.device)
    iris.ops.matmul_all_reduce(out, a8, b8, scale_a=scale_a, scale_b=scale_b, group=group)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(x.shape[0], device=x.device)
    iris.ops.all_reduce_rmsnorm(q, x, norm, 1e-5, scales_out=scales, group=group)
    return [out, q.float(), scales]


def _fp8_operands(a, b):
    """Float8 copies of ``a`` and ``b`` with a per-row scale for ``a`` and one for ``b``."""
    scale_a = torch.linspace(0.5, 1.5, a.shape[0], device=a.device).view(-1, 1)
    return (
        a.to(torch.float8_e4m3fn),
        b.to(torch.float8_e4m3fn),
        scale_a,
        torch.full((1,), 0.75, device=a.device),
    )


def _graph_ops(counter) -> set[str]:
    names = set()
    for gm in counter.graphs:
        for node in gm.graph.nodes:
            target = getattr(node.target, "_qualified_op_name", None) or str(node.target)
            if "iris" in target:
                names.add(target.split("::")[-1].split(".")[0])
    return names


def _compare(eager: list, compiled: list, what: str) -> list[str]:
    if len(eager) != len(compiled):
        return [f"{what}: {len(compiled)} outputs compiled, {len(eager)} eager"]
    bad = []
    for i, (c, e) in enumerate(zip(compiled, eager)):
        if c.shape != e.shape or not torch.allclose(c.cpu(), e.cpu(), atol=1e-4, rtol=1e-4):
            bad.append(f"{what}[{i}]: compiled {list(c.shape)} differs from eager {list(e.shape)}")
    return bad


def _body_compile(rank: int, world_size: int, backend: str) -> list[str]:
    import torch._dynamo.testing

    import iris.ops  # noqa: F401  (registers torch.ops.iris)

    setup_rank()
    torch._dynamo.reset()
    group = dist.new_group(list(range(world_size)))
    a, b, bias, shard = _operands(rank, world_size)
    problems = []

    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    fn = torch.compile(_public, fullgraph=True, backend=counter)
    eager = _public(a, b, bias, shard, group, world_size)
    problems += _compare(eager, fn(a, b, bias, shard, group, world_size), "public")
    if counter.frame_count != 1:
        problems.append(f"public: {counter.frame_count} frames compiled, expected 1")
    missing = set(OPS) - _graph_ops(counter)
    if missing:
        problems.append(f"public: ops not in the graph: {sorted(missing)}")

    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    fn = torch.compile(_functional, fullgraph=True, backend=counter)
    eager = _functional(a, b, bias, shard, group.group_name)
    problems += _compare(eager, fn(a, b, bias, shard, group.group_name), "functional")
    missing = set(OPS) - _graph_ops(counter)
    if missing:
        problems.append(f"functional: ops not in the graph: {sorted(missing)}")
    # against a plain torch reference: the sum of every rank's a @ b, + bias
    full = (a @ b).clone()
    dist.all_reduce(full, group=group)
    problems += _compare([full + bias], [eager[0]], "matmul_all_reduce vs torch")

    if world_size == 1:  # the float8 forms; in worlds: test_ops_paths, test_ops_all_reduce_rmsnorm
        counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
        fn = torch.compile(_public_fp8, fullgraph=True, backend=counter)
        args = (*_fp8_operands(a, b), a @ b, bias, group)
        problems += _compare(_public_fp8(*args), fn(*args), "float8")
        missing = {"matmul_all_reduce", "all_reduce_rmsnorm_quantized"} - _graph_ops(counter)
        if counter.frame_count != 1 or missing:
            problems.append(f"float8: {counter.frame_count} frames; ops not in the graph: {sorted(missing)}")
    return problems


@pytest.mark.parametrize("world_size", [1, 3] if BACKEND == "cpu" else [2])
def test_compile_aot_eager_matches_eager(world_size):
    """fullgraph compile (aot_eager) of every fused op, public and functional, equals
    eager; one frame (no graph break); every op appears in the graph."""
    require_world(world_size)
    results = run_world(_body_compile, world_size, "aot_eager", timeout=WORLD_TIMEOUT)
    assert results == [[]] * world_size, results


@pytest.mark.full
@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("cc") is None,
    reason="inductor needs a C++ compiler (g++ or cc); none found",
)
def test_compile_inductor_matches_eager():
    results = run_world(_body_compile, 2, "inductor", timeout=2 * WORLD_TIMEOUT)
    assert results == [[]] * 2, results


def _body_refused(rank: int, world_size: int) -> list[str]:
    import iris.ops

    texts = []
    a = torch.randn(4, 8)
    b = torch.randn(8, 16)
    calls = {
        "async": lambda out: iris.ops.matmul_all_reduce(out, a, b, async_op=True),
        "workspace": lambda out: iris.ops.matmul_all_reduce(out, a, b, workspace=iris.ops.Workspace()),
    }
    for what, call in calls.items():

        def fn(out, call=call):
            call(out)
            return out

        try:
            torch.compile(fn, fullgraph=True, backend="aot_eager")(torch.empty(4, 16))
            texts.append(f"{what}: no error")
        except Exception as e:
            texts.append(f"{what}: {e}")
    return texts


def _body_opcheck(rank: int, world_size: int) -> tuple:
    from torch._subclasses.fake_tensor import FakeTensorMode

    import iris.ops  # noqa: F401  (registers torch.ops.iris)

    ops = torch.ops.iris
    a, b, bias, shard = _operands(0, 1)
    x = a @ b
    cases = {
        "matmul_all_reduce_": (torch.empty(2, 24), a, b, bias, "", ""),
        "all_gather_matmul_": (torch.empty(2, 24), shard, b, None, 0, "", ""),
        "matmul_all_gather_": (torch.empty(2, 24), a, b, None, "", ""),
        "matmul_reduce_scatter_": (torch.empty(2, 24), a, b, bias, 0, "", ""),
        "all_reduce_rmsnorm_": (torch.empty(2, 24), x, bias, 1e-5, None, torch.empty(2, 24), "", ""),
        "matmul_all_reduce": (a, b, bias, "", ""),
        "all_gather_matmul": (shard, b, None, 0, "", ""),
        "matmul_all_gather": (a, b, bias, "", ""),
        "matmul_reduce_scatter": (a, b, None, 1, "", ""),
        "all_reduce_rmsnorm": (x, bias, 1e-5, x.clone(), "", ""),
    }
    a8, b8, scale_a, scale_b = _fp8_operands(a, b)
    e4m3 = torch.float8_e4m3fn
    cases |= {
        "matmul_all_reduce_ (float8)": (
            torch.empty(2, 24, dtype=torch.bfloat16),
            a8,
            b8,
            None,
            "",
            "",
            scale_a,
            scale_b,
        ),
        "matmul_reduce_scatter (float8)": (a8, b8, None, 1, "", "", None, scale_b, torch.float32),
        "all_reduce_rmsnorm_ (float8)": (
            torch.empty(2, 24, dtype=e4m3),
            x,
            bias,
            1e-5,
            None,
            None,
            "",
            "",
            None,
            torch.empty(2),
        ),
        "all_reduce_rmsnorm_quantized": (x, bias, 1e-5, None, "", "", e4m3, torch.full((1,), 0.01)),
        "all_reduce_rmsnorm_quantized (per row)": (x, bias, 1e-5, x.clone(), "", "", torch.float8_e5m2, None),
    }
    problems = []
    for name, args in cases.items():
        try:
            # torch's schema check compares float8 inputs with a multiplication the CPU lacks
            # for float8 ("mul_cpu_reduced_float"): every other check for those.
            skip = ("test_schema",) if any(getattr(t, "dtype", None) in FP8 for t in args) else ()
            tests = tuple(t for t in OPCHECKS if t not in skip)
            torch.library.opcheck(getattr(ops, name.split()[0]).default, args, test_utils=tests)
        except Exception as e:
            problems.append(f"opcheck {name}: {type(e).__name__}: {e}")
    with FakeTensorMode() as mode:
        fa, fb = mode.from_tensor(torch.empty(6, 8)), mode.from_tensor(torch.empty(8, 16))
        shapes = {
            "matmul_all_reduce": ops.matmul_all_reduce(fa, fb, None, "").shape,
            "all_gather_matmul": ops.all_gather_matmul(fa, fb, None, 1, "").shape,
            "matmul_reduce_scatter": ops.matmul_reduce_scatter(fa, fb, None, 1, "").shape,
            "all_reduce_rmsnorm": ops.all_reduce_rmsnorm(fa, fb[0, :8], 1e-6, None, "")[1].shape,
        }
        f8a, f8b = mode.from_tensor(a8), mode.from_tensor(b8)
        fp8_out = ops.matmul_all_reduce(f8a, f8b, None, "", "", None, None, torch.bfloat16)
        if (tuple(fp8_out.shape), fp8_out.dtype) != ((2, 24), torch.bfloat16):
            problems.append(f"fake matmul_all_reduce (float8): {tuple(fp8_out.shape)} {fp8_out.dtype}")
        q, summed, scales = ops.all_reduce_rmsnorm_quantized(fa, fb[0, :8], 1e-6, None, "", "", e4m3)
        if (q.dtype, summed.dtype, tuple(scales.shape)) != (e4m3, torch.float32, (6,)):
            problems.append(
                f"fake all_reduce_rmsnorm_quantized: {q.dtype} {summed.dtype} {tuple(scales.shape)}"
            )
    expected = {
        "matmul_all_reduce": (6, 16), "all_gather_matmul": (6, 16), "matmul_reduce_scatter": (6, 16),
        "all_reduce_rmsnorm": (6, 8),
    }  # fmt: skip
    for name, shape in shapes.items():
        if tuple(shape) != expected[name]:
            problems.append(f"fake {name}: shape {tuple(shape)}, expected {expected[name]}")
    return problems, _body_refused(rank, world_size)


def test_opcheck_fake_tensors_and_refusals():
    """opcheck and fake tensors of every op; async_op=True and workspace= under compile
    raise errors that say so."""
    ((problems, (async_text, ws_text)),) = run_world(_body_opcheck, 1, timeout=WORLD_TIMEOUT)
    assert problems == [], problems
    assert "matmul_all_reduce(async_op=True) is not supported inside torch.compile" in async_text, async_text
    assert "matmul_all_reduce(workspace=...) is not supported inside torch.compile" in ws_text, ws_text


# --------------------------------------------------------------------------- GPU tier


def _body_cudagraphs(rank: int, world_size: int) -> list[str]:
    """Inductor with mode="reduce-overhead" (CUDA graphs) of a tensor-parallel MLP step on
    the functional ops, replayed on fresh inputs, equals eager."""
    import iris.ops  # noqa: F401

    setup_rank()
    torch._dynamo.reset()
    group = dist.new_group(list(range(world_size)))
    g = torch.Generator().manual_seed(rank)
    w1 = torch.randn(256, 512, generator=g).to(device(), torch.bfloat16)
    w2 = torch.randn(512, 256, generator=g).to(device(), torch.bfloat16) / 16
    norm = torch.ones(256, device=device(), dtype=torch.bfloat16)

    def step(x):
        h = torch.relu(x @ w1)
        y = torch.ops.iris.matmul_all_reduce(h, w2, None, group.group_name)
        return torch.ops.iris.all_reduce_rmsnorm(y, norm, 1e-5, x, group.group_name)[0]

    fn = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    problems = []
    for i in range(4):
        x = torch.randn(16, 256, generator=torch.Generator().manual_seed(50 + i)).to(device(), torch.bfloat16)
        want = step(x)  # eager first: workspaces are prepared outside any capture
        got = fn(x).clone()
        torch.cuda.synchronize()
        if not torch.allclose(got.float(), want.float(), atol=5e-2, rtol=5e-2):
            problems.append(f"reduce-overhead call {i}: max diff {(got.float() - want.float()).abs().max()}")
    return problems


@pytest.mark.gpu
@pytest.mark.skipif(BACKEND != "cuda", reason="CUDA graphs: needs IRIS_BACKEND=cuda")
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_inductor_reduce_overhead_gpu(world_size):
    require_world(world_size)
    results = run_world(_body_cudagraphs, world_size, timeout=2 * WORLD_TIMEOUT)
    assert results == [[]] * world_size, results
