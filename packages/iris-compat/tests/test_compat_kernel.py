"""Code written against the old ``iris.device`` layout runs unchanged.

``compat_legacy_kernels`` holds a kernel that uses ``DeviceContext`` (initialize, store,
atomic_add, the ``heap_bases`` field) and ``__translate`` from their old homes. It runs on
a real multi-process world (the cpu backend in CI, GPUs with ``-m gpu``: ranks beyond the
number of GPUs share them) and is
compared with ``torch.distributed.all_gather``; it is also compiled for Hopper (sm_90)
without a GPU, like every kernel of the iris-mem and iris-ccl tiers.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import triton

with pytest.warns(DeprecationWarning, match="iris.device"):
    import compat_legacy_kernels as legacy

import iris.mem
from iris.mem.testing import gpu_skip_reason, run_world

pytestmark = pytest.mark.timeout(300)

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
N = 203  # elements: not a multiple of BLOCK, so the last program is masked
BLOCK = 64
GRID = (triton.cdiv(N, BLOCK),)
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32]


def _pattern(dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Distinct per rank and index, exact in every dtype of DTYPES."""
    return ((torch.arange(N) * 7 + rank * 31) % 251 - 100).to(dtype)


def _exchange(rank: int, world: int, dialect: str) -> list[str]:
    """Run the ``dialect`` ("triton" or "gluon") legacy kernel once per dtype; return what
    this rank found wrong."""
    heap = iris.mem.init(1 << 20)
    failures = []
    try:
        left = (rank - 1) % world
        bufs = []
        for dtype in DTYPES:
            src = heap.as_symmetric(_pattern(dtype, rank))
            dst, got = heap.full((N,), -1, dtype=dtype), heap.full((N,), -1, dtype=dtype)
            bufs.append((dtype, src, dst, got, heap.zeros(1, dtype=torch.int32)))
        heap.barrier()
        context = heap.get_device_context()
        for _, src, dst, got, arrivals in bufs:
            if dialect == "triton":
                legacy.legacy_exchange_kernel[GRID](
                    context, src, dst, got, arrivals, N, rank, world, BLOCK=BLOCK
                )
            else:
                legacy.legacy_gluon_exchange_kernel[GRID](
                    context, src, dst, arrivals, N, BLOCK=BLOCK, num_warps=1
                )
        heap.barrier()
        checks = {"store into dst": 2, "__translate + load": 3}
        if dialect == "gluon":  # the Gluon kernel has no __translate part
            del checks["__translate + load"]
        for buf in bufs:
            dtype, src, arrivals = buf[0], buf[1], buf[4]
            # The oracle: every rank's source, as torch.distributed gathers it.
            gathered = [torch.empty(N, dtype=torch.int32) for _ in range(world)]
            dist.all_gather(gathered, src.cpu().to(torch.int32))
            want = gathered[left].to(dtype)
            for what, index in checks.items():
                got = buf[index].cpu()
                if not torch.equal(got, want):
                    bad = (got != want).nonzero().flatten().tolist()
                    failures.append(f"{dtype} {what}: {len(bad)} wrong elements, first at {bad[0]}")
            if arrivals.item() != GRID[0]:
                failures.append(f"{dtype} atomic_add: {arrivals.item()} arrivals, want {GRID[0]}")
    finally:
        heap.close()
    return failures


def _run_exchange(world: int, dialect: str) -> None:
    reason = gpu_skip_reason(world)
    if reason:
        pytest.skip(reason)
    results = run_world(_exchange, world, dialect, timeout=240)
    assert results == [[]] * world, "\n".join(f for r in results for f in r)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 3])
def test_legacy_kernel_runs(world):
    _run_exchange(world, "triton")


@pytest.mark.gpu
@pytest.mark.skipif(BACKEND != "cuda", reason="Gluon kernels need the cuda backend (no interpreter)")
def test_legacy_gluon_kernel_runs():
    _run_exchange(2, "gluon")


def _compile_child() -> dict:
    """In a fresh interpreter without TRITON_INTERPRET: compile both kernels for sm_90;
    returns the atomics of each one's PTX and whether it produced a cubin."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"context": "*i64", "src": "*fp32", "dst": "*fp32", "got": "*fp32", "arrivals": "*i32", "n": "i32"}
    result = {}
    for fn, source, consts, warps in (
        (legacy.legacy_exchange_kernel, ASTSource, {"RANK": 1, "WORLD": 3, "BLOCK": BLOCK}, 4),
        (legacy.legacy_gluon_exchange_kernel, GluonASTSource, {"BLOCK": BLOCK}, 1),
    ):
        fn_sig = {name: sig.get(name, "constexpr") for name in fn.arg_names}
        k = triton.compile(source(fn, fn_sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": warps})  # fmt: skip
        atoms = [ln.strip() for ln in k.asm["ptx"].splitlines() if "atom." in ln or "red." in ln]
        result[fn.__name__] = {"atoms": atoms, "cubin": bool(k.asm.get("cubin"))}
    return result


def test_legacy_kernels_compile_for_hopper():
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["IRIS_BACKEND"] = "cuda"
    with tempfile.TemporaryDirectory(prefix="iris-compile-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        code = (
            f"import json, sys; sys.path.insert(0, {HERE!r})\n"
            "import test_compat_kernel as m\n"
            "print('@@RESULT@@' + json.dumps(m._compile_child()))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240, cwd=HERE
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@")]
    assert proc.returncode == 0 and lines, (
        f"compile child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    result = json.loads(lines[-1][len("@@RESULT@@") :])
    assert set(result) == {"legacy_exchange_kernel", "legacy_gluon_exchange_kernel"}
    for name, kernel in result.items():
        assert kernel["cubin"], name
        assert any(".release" in a and ".sys" in a for a in kernel["atoms"]), (name, kernel["atoms"])
