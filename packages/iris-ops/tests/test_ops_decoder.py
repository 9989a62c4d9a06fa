"""The tensor-parallel decoder layer of ``examples/25_tp_decoder.py`` and its benchmark.

The layer (RMSNorm, q/k/v column-parallel, RoPE, grouped-query attention, row-parallel output
projection, gated SiLU MLP) runs in every form: torch.distributed on gloo (``nccl`` on
GPUs) and on an ``iris`` group, in the tensor-parallel and the sequence-parallel layout, and
with iris.ops' fused kernels (``matmul_all_reduce``; ``all_gather_matmul`` /
``matmul_reduce_scatter``), each checked against the unsharded layer computed in float64 by
plain torch code (attention by SDPA). The same layer with its collectives left out must
*not* match (the check can fail). Default run: worlds 3 and 1, fp32 and bf16, prefill and a
decode step against a KV cache, eager and ``aot_eager`` compiled. ``full``: the example
program at 2 and 3 ranks and ``benchmarks/ops/bench_decoder.py --smoke``. GPU tier (2 and 3
ranks, on any number of GPUs): inductor with ``mode="reduce-overhead"`` (CUDA graphs) of the
Iris forms against the torch.distributed form on the default group (NCCL; gloo, eagerly, where
ranks share a GPU). From an sdist (no examples folder) the tests skip.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ops_testutils import BACKEND, require_world, setup_rank

from iris.mem.testing import record_duration, run_example, run_world, shares_gpus

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "25_tp_decoder.py"
BENCH = ROOT / "benchmarks" / "ops" / "bench_decoder.py"
WORLD_TIMEOUT = 300.0
need_example = pytest.mark.skipif(
    not EXAMPLE.is_file(), reason=f"{EXAMPLE} not found (not a source checkout)"
)
#: Largest ``max |got - want| / max |want|`` per dtype, against the float64 layer.
TOL = {torch.float32: 1e-3, torch.bfloat16: 3e-2}


def load_example():
    spec = importlib.util.spec_from_file_location("tp_decoder", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _comm(ex, form: str, world: int, iris_group):
    sp = form.endswith("_sp")
    base = form.removesuffix("_sp")
    if base == "torch":
        return ex.TorchComm(dist.group.WORLD, sp)
    if base == "iris":
        return ex.TorchComm(iris_group, sp)
    if base == "fused":
        return ex.FusedComm(None, sp)
    return ex.NoComm(world, sp)


def layer_body(rank: int, world: int, plan: list[tuple[str, str, str, bool]]) -> dict:
    """Run ``plan`` (dtype, case, form, compiled) and return each entry's error against the
    unsharded float64 layer."""
    import iris.ops

    device = setup_rank()
    ex = load_example()
    shape = ex.TINY
    tokens, context = 6, 5  # 6 tokens: divisible by 1, 2 and 3 ranks (sequence parallel)
    iris_group = dist.new_group(backend="iris")
    errors = {}
    for dtype_name, case, form, compiled in plan:
        dtype = getattr(torch, dtype_name)
        weights = ex.make_weights(shape, dtype, device, seed=3)
        shard = ex.shard_weights(weights, shape, rank, world)
        g = torch.Generator().manual_seed(4)
        x = torch.randn(tokens, shape.hidden, generator=g).to(device, dtype)
        cache = None
        if case == "decode":
            cache_shape = (tokens, shape.kv_heads, context, shape.head_dim)
            cache = [torch.randn(cache_shape, generator=g).to(device, dtype) for _ in range(2)]
        positions = torch.full((tokens,), context) if cache else torch.arange(tokens)
        cos, sin = ex.rope_tables(positions.to(device), shape, dtype)
        want = ex.reference_layer(weights, x, shape, cos, sin, *(cache or (None, None)))
        layer = ex.TPDecoderLayer(shard, shape, world, _comm(ex, form, world, iris_group))
        layer.set_rope(cos, sin)
        if cache:
            kv = slice(rank * shape.kv_heads // world, (rank + 1) * shape.kv_heads // world)
            layer.set_cache(cache[0][:, kv].contiguous(), cache[1][:, kv].contiguous())
        rows = (
            slice(rank * tokens // world, (rank + 1) * tokens // world)
            if form.endswith("_sp")
            else slice(None)
        )
        fn = layer
        if compiled:
            torch.compiler.reset()
            fn = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=False)
        errors[(dtype_name, case, form, compiled)] = _error(fn(x[rows]), want[rows])
    # A rank leaves matmul_reduce_scatter once its own rows have arrived: wait for every rank
    # to finish its last call before any of them tears down and exits.
    dist.barrier()
    iris.ops.release_workspaces()
    return errors


def _check(results: list[dict], world: int) -> None:
    bad = []
    for rank, errors in enumerate(results):
        for (dtype_name, case, form, compiled), err in errors.items():
            tol = TOL[getattr(torch, dtype_name)]
            what = f"rank {rank}: {dtype_name} {case} {form}{' compiled' if compiled else ''}"
            if form.startswith("local"):  # collectives left out: must differ (when there are peers)
                if world > 1 and not err > 10 * tol:
                    bad.append(f"{what}: matched ({err:.3g}) without communicating: the check cannot fail")
            elif not err <= tol:
                bad.append(f"{what}: error {err:.3g} > {tol:g}")
    assert not bad, "\n".join(bad)


FORMS = ("torch", "iris", "fused", "torch_sp", "iris_sp", "fused_sp")
# Default run: every form eagerly (fp32 prefill), a decode step of each kind of
# communication, bf16, one compiled layer per world, and the layer without communication.
PLAN_3 = (
    [("float32", "prefill", form, False) for form in FORMS + ("local", "local_sp")]
    + [("float32", "decode", form, False) for form in ("torch", "iris_sp", "fused")]
    + [("bfloat16", "decode", form, False) for form in ("iris", "torch_sp")]
    + [("float32", "prefill", "fused_sp", True)]
)
PLAN_1 = [("bfloat16", "prefill", "fused", False), ("bfloat16", "prefill", "fused_sp", False)]
PLAN_1 += [("bfloat16", "decode", "iris", True)]
# tests_full: every dtype, case and form, eager and compiled.
PLAN_FULL = [
    (dtype, case, form, compiled)
    for dtype in ("float32", "bfloat16")
    for case in ("prefill", "decode")
    for form in FORMS
    for compiled in (False, True)
]


@need_example
@pytest.mark.parametrize("world", [1, 3] if BACKEND == "cpu" else [2])
def test_layer_matches_unsharded(world):
    """Every form of the layer equals the unsharded float64 layer (eager and compiled)."""
    require_world(world)
    plan = PLAN_3 if world > 1 else PLAN_1
    _check(run_world(layer_body, world, plan, timeout=WORLD_TIMEOUT), world)


@pytest.mark.full
@need_example
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("world", [2, 3])
def test_layer_every_form_dtype_case_and_mode(world):
    """Every form x fp32/bf16 x prefill/decode x eager/compiled against the unsharded layer."""
    require_world(world)
    _check(run_world(layer_body, world, PLAN_FULL, timeout=1500.0), world)


@need_example
def test_world_not_dividing_the_heads_raises():
    ex = load_example()
    weights = ex.make_weights(ex.TINY, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"over 4 ranks needs kv_heads \(6\) divisible by 4"):
        ex.shard_weights(weights, ex.TINY, 0, 4)
    with pytest.raises(ValueError, match=r"needs heads \(12\) divisible by 5"):
        ex.TPDecoderLayer({}, ex.TINY, 5, ex.NoComm(5))


@pytest.mark.full
@need_example
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 3])
def test_example_runs(world):
    """The example program: four forms, prefill and decode, eager and compiled, all validated."""
    require_world(world)
    run_example(EXAMPLE, world, timeout=600)


@pytest.mark.full
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not BENCH.is_file(), reason=f"{BENCH} not found (not a source checkout)")
def test_bench_decoder_smoke(tmp_path):
    """``bench_decoder.py --smoke`` on 2 CPU ranks: every form checked against the NCCL
    form, timed eager and compiled, the table printed and results.json written."""
    env = {**os.environ, "IRIS_BACKEND": "cpu", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(BENCH)]
    cmd += ["--smoke", "--reps", "1", "--prefill", "", "--out", str(tmp_path)]
    started, timeout = time.monotonic(), 1000.0
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        record_duration("torchrun", 2, timeout, time.monotonic() - started, "bench_decoder.py", True)
        raise AssertionError(f"bench_decoder.py did not finish in {timeout:g} s:\n{output}") from None
    record_duration("torchrun", 2, timeout, time.monotonic() - started, "bench_decoder.py")
    assert proc.returncode == 0, f"bench_decoder.py exited {proc.returncode}:\n{output}"
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["failures"] == [], results["failures"]
    forms = {"nccl", "iris", "fused", "nccl_sp", "iris_sp", "fused_sp", "local", "local_sp"}
    for mode in ("eager", "compiled"):
        rows = {r["form"]: r for r in results["rows"] if r["mode"] == mode}
        assert set(rows) == forms, (mode, sorted(rows))
        assert all(r["time_us"] > 0 and r["tokens"] == 2 and r["phase"] == "decode" for r in rows.values()), (
            rows
        )
        assert rows["nccl"]["nccl_over_form"] == pytest.approx(1.0), rows["nccl"]
        assert rows["fused_sp"]["nccl_over_form"] == pytest.approx(
            rows["nccl_sp"]["time_us"] / rows["fused_sp"]["time_us"]
        )
        assert rows["iris"]["comm_share"] == pytest.approx(
            1 - rows["local"]["time_us"] / rows["iris"]["time_us"]
        )
    assert "| model | tokens | phase | mode | form | time (us) | nccl/form | comm share |" in output


# --------------------------------------------------------------------------- GPU tier


def graphed_body(rank: int, world: int) -> list[str]:
    """Each Iris form compiled by inductor with mode="reduce-overhead", replayed on fresh
    inputs, against the torch.distributed form on the default group, eager: NCCL (also
    compiled the same way), or gloo where ranks share a GPU (not compiled: a CUDA graph
    cannot hold gloo's copies through host memory)."""
    import iris.ops

    device = setup_rank()
    ex = load_example()
    shape = ex.SMALL  # 2 and 3 ranks divide its heads
    dtype = torch.bfloat16
    shard = ex.shard_weights(ex.make_weights(shape, dtype, device, seed=5), shape, rank, world)
    iris_group = dist.new_group(backend="iris")
    nccl = "nccl" in str(dist.get_backend_config())
    comms = {
        "nccl": ex.TorchComm(dist.group.WORLD),
        "iris": ex.TorchComm(iris_group),
        "fused": ex.FusedComm(None),
        "iris_sp": ex.TorchComm(iris_group, sequence_parallel=True),
        "fused_sp": ex.FusedComm(None, sequence_parallel=True),
    }
    problems = []
    for case, tokens, context in (("decode", 48, 256), ("prefill", 480, 0)):  # tokens: 2 and 3 divide
        torch.compiler.reset()
        positions = torch.full((tokens,), context) if context else torch.arange(tokens)
        cos, sin = ex.rope_tables(positions.to(device), shape, dtype)
        cg = torch.Generator().manual_seed(6 + rank)
        cache_shape = (tokens, shape.kv_heads // world, context, shape.head_dim)
        cache = (
            [torch.randn(cache_shape, generator=cg).to(device, dtype) for _ in range(2)] if context else None
        )
        layers, compiled = {}, {}
        for form, comm in comms.items():
            layers[form] = ex.TPDecoderLayer(shard, shape, world, comm)
            layers[form].set_rope(cos, sin)
            if cache:
                layers[form].set_cache(*cache)
            if form != "nccl" or nccl:
                compiled[form] = torch.compile(
                    layers[form], mode="reduce-overhead", fullgraph=True, dynamic=False
                )
        rows = slice(rank * tokens // world, (rank + 1) * tokens // world)
        for i in range(4):  # warm-up, capture, then replays: each call on a new input
            x = torch.randn(tokens, shape.hidden, generator=torch.Generator().manual_seed(70 + i)).to(
                device, dtype
            )
            with torch.no_grad():
                want = layers["nccl"](x).float()
                # the NCCL form first (compiled only where the reference is NCCL), then the rest
                for form, fn in sorted(compiled.items(), key=lambda item: item[0] != "nccl"):
                    torch.compiler.cudagraph_mark_step_begin()
                    sp = form.endswith("_sp")
                    got = fn(x[rows] if sp else x).float()
                    err = ((got - (want[rows] if sp else want)).abs().max() / want.abs().max()).item()
                    if not err <= TOL[dtype]:
                        problems.append(
                            f"rank {rank} {case} call {i} {form}: error {err:.3g} against torch.distributed"
                        )
            torch.cuda.synchronize()
        del layers, compiled
        torch.compiler.reset()
    dist.barrier()  # every rank has finished its last call
    iris.ops.release_workspaces()
    return problems


@pytest.mark.gpu
@need_example
@pytest.mark.timeout(1500)
@pytest.mark.skipif(BACKEND != "cuda", reason="CUDA graphs: needs IRIS_BACKEND=cuda")
@pytest.mark.parametrize("world", [2, 3])
def test_reduce_overhead_matches_nccl_gpu(world):
    require_world(world)
    # NCCL refuses ranks that share a GPU: the world's reference runs on gloo there
    backend = "gloo" if shares_gpus(world) else "nccl"
    results = run_world(graphed_body, world, timeout=1200.0, backend=backend)
    assert results == [[]] * world, results
