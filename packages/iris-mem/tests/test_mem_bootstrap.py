"""Bring-up without a launcher, environment errors, and the PEP 420 namespace."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[3]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


def run_python(code: str, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    with tempfile.TemporaryDirectory() as folder:  # a file: compiled @triton.jit needs source
        script = Path(folder) / "script.py"
        script.write_text(code)
        return subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
        )


WORLD_OF_ONE = """
import torch, triton, triton.language as tl
import iris.mem
from iris.mem.triton import Context

@triton.jit
def kernel(context, buf, RANK: tl.constexpr, WORLD: tl.constexpr):
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.arange(0, 8)
    ctx.store(buf + offs, offs.to(tl.float32) * 2, 0)

with iris.mem.init(1 << 20) as heap:
    buf = heap.zeros(8)
    kernel[(1,)](heap.get_device_context(), buf, RANK=heap.rank, WORLD=heap.world_size)
    assert torch.equal(buf, torch.arange(8.0) * 2), buf
    print("ok", heap.rank, heap.world_size, heap.backend)
import torch.distributed as dist
print("destroyed", not dist.is_initialized())
"""


def test_world_of_one_needs_no_launcher():
    # Nothing set: importing iris.mem on a machine without a GPU picks cpu and the interpreter.
    done = run_python(WORLD_OF_ONE, IRIS_BACKEND=None, TRITON_INTERPRET=None)
    assert done.returncode == 0, done.stderr
    assert "ok 0 1 cpu" in done.stdout and "destroyed True" in done.stdout


def test_incomplete_launcher_environment_is_named():
    done = run_python("import iris.mem; iris.mem.init(1 << 20)", RANK="0", WORLD_SIZE="2")
    assert done.returncode != 0
    assert "MASTER_ADDR" in done.stderr and "MASTER_PORT" in done.stderr and "torchrun" in done.stderr


def test_cpu_backend_without_interpreter_says_what_to_set():
    done = run_python(
        "import iris.mem; iris.mem.init(1 << 20, backend='cpu')", IRIS_BACKEND=None, TRITON_INTERPRET="0"
    )
    assert done.returncode != 0
    assert (
        "RuntimeError" in done.stderr
        and "TRITON_INTERPRET" in done.stderr
        and "IRIS_BACKEND=cpu" in done.stderr
    )


TRITON_FIRST = """
import torch, triton, triton.language as tl  # before iris.mem, with no TRITON_INTERPRET set

@triton.jit
def total(x, out, N: tl.constexpr):
    tl.store(out, tl.sum(tl.load(x + tl.arange(0, N)) + tl.zeros([N], tl.float32), axis=0))

import iris.mem  # turns the interpreter on, including for triton's own library

@triton.jit
def total_late(x, out, N: tl.constexpr):
    tl.store(out, tl.sum(tl.load(x + tl.arange(0, N)) + tl.zeros([N], tl.float32), axis=0))

with iris.mem.init(1 << 20) as heap:
    x, out = heap.arange(8, dtype=torch.float32), heap.zeros(1)
    total_late[(1,)](x, out, N=8)
    print("late", out.item())
    try:
        total[(1,)](x, out, N=8)
    except Exception as e:
        print("early", type(e).__name__)
"""


def test_triton_imported_before_iris_mem_still_interprets():
    done = run_python(TRITON_FIRST, IRIS_BACKEND=None, TRITON_INTERPRET=None)
    assert done.returncode == 0, done.stderr
    # A kernel defined after importing iris.mem runs; one defined before cannot (Triton fixed
    # its mode when it was defined), and fails instead of running wrongly.
    assert "late 28.0" in done.stdout and "early" in done.stdout


KERNEL_BEFORE_IRIS = """
import torch, triton, triton.language as tl  # no TRITON_INTERPRET: kernels below are compiled-mode

@triton.jit
def add_one(x, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)

@triton.jit
def waits_on_peers(context, members, flags, epochs, status, budget,
                   RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr):
    pass

import iris.mem  # too late: it turns the interpreter on for kernels defined from now on
from iris.mem import runtime

with iris.mem.init(1 << 20) as heap:
    x = heap.zeros(16)
    for name, launch in (
        ("direct", lambda: add_one[(1,)](x, 16, BLOCK=16)),
        ("runtime.launch", lambda: runtime.launch(waits_on_peers, 1, heap._sync)),
    ):
        try:
            launch()
            print(name, "launched")
        except Exception as e:
            print(name, type(e).__name__, str(e).replace("\\n", " "))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where Triton finds no GPU driver")
def test_kernel_defined_before_iris_mem_is_explained():
    """A compiled-mode kernel on the cpu backend: Triton said "0 active drivers ([]). There
    should only be one."; Iris says what happened and what to do."""
    done = run_python(KERNEL_BEFORE_IRIS, IRIS_BACKEND="cpu", TRITON_INTERPRET=None)
    assert done.returncode == 0, done.stderr
    lines = {line.split(" ", 1)[0]: line for line in done.stdout.splitlines()}
    for name in ("direct", "runtime.launch"):
        assert "import iris.mem before defining kernels" in lines[name], done.stdout
        assert "Triton interprets" in lines[name], done.stdout
    assert "add_one" in lines["direct"] or "defined before" in lines["direct"], done.stdout
    assert "waits_on_peers" in lines["runtime.launch"], done.stdout


def test_unknown_backend_in_environment():
    done = run_python("import iris.mem; iris.mem.init(1 << 20)", IRIS_BACKEND="tpu")
    assert done.returncode != 0 and "IRIS_BACKEND='tpu'" in done.stderr


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e400"])
def test_bad_timeouts_name_the_variable(monkeypatch, value):
    import iris.mem
    from iris.mem import bootstrap

    for name, read in (
        ("IRIS_WAIT_TIMEOUT", iris.mem.wait_timeout),
        ("IRIS_HOST_TIMEOUT", bootstrap.host_timeout),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=name):
            read()


def test_wait_timeout_is_seconds_and_kernels_get_nanoseconds(monkeypatch):
    import iris.mem

    monkeypatch.delenv("IRIS_WAIT_TIMEOUT", raising=False)
    assert iris.mem.wait_timeout() == 300.0 and iris.mem.wait_budget_ns() == 300 * 10**9
    monkeypatch.setenv("IRIS_WAIT_TIMEOUT", " 0.25 ")
    assert iris.mem.wait_timeout() == 0.25 and iris.mem.wait_budget_ns() == 250_000_000
    monkeypatch.setenv("IRIS_WAIT_TIMEOUT", "1e300")  # capped to what an int64 holds
    assert iris.mem.wait_budget_ns() == 4 * 10**18


def test_no_package_puts_a_file_directly_under_src_iris():
    packages = sorted((REPO / "packages").glob("*/src/iris"))
    assert packages, "no packages found"
    for src_iris in packages:
        direct_files = [p.name for p in src_iris.iterdir() if p.is_file()]
        assert direct_files == [], f"{src_iris} holds {direct_files}: iris must stay a PEP 420 namespace"


def test_iris_is_a_namespace_package():
    done = run_python("import iris, iris.mem; print(iris.__file__, type(iris.__path__).__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "_NamespacePath"]
