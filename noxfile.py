"""Developer and CI sessions for the Iris monorepo.

Run ``nox -s tests`` for the CPU test suite (Triton interpreter, no GPU needed; the
exhaustive cases marked ``full`` run in ``nox -s tests_full``; ``nox -s tests_torch_floor``
runs it on the oldest torch the distributions declare),
``nox -s gpu_tests`` on a machine with NVIDIA GPUs, ``nox -s lint``, ``nox -s build``
and ``nox -s docs``. Sessions use the interpreter nox itself runs under.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "no"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).resolve().parent

# Pins for the heavy dependencies. Unpinned, pip resolves torch to a multi-GB CUDA build;
# the CPU build of this version is available locally.
TORCH = "torch==2.13.0"
TRITON = "triton==3.6.0"
# hatchling: iris-compat's wheel test builds wheels without build isolation.
# matplotlib: the trace-render tests of iris-mem
# expecttest: PyTorch's own process-group test suite (iris-ccl's test_ccl_torch_suite) imports it
TEST_DEPS = ["pytest>=8", "pytest-timeout", "hypothesis>=6", "hatchling>=1.21", "matplotlib", "expecttest"]

# Dependency order of the distributions; packages not listed here sort last, by name.
KNOWN_ORDER = ["iris-mem", "iris-ccl", "iris-ops", "iris-compat"]
# Import package of each distribution when it is not iris.<suffix>.
IMPORT_OVERRIDES = {"iris-compat": "device"}


def _discover_packages() -> list[str]:
    found = [p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml")]

    def order(name: str) -> tuple[int, str]:
        return (KNOWN_ORDER.index(name) if name in KNOWN_ORDER else len(KNOWN_ORDER), name)

    return sorted(found, key=order)


PACKAGES = _discover_packages()


def _import_name(dist: str) -> str:
    """``iris-mem`` -> ``mem``; ``iris-compat`` -> ``device``."""
    return IMPORT_OVERRIDES.get(dist, dist.removeprefix("iris-"))


def _package_paths() -> list[str]:
    return [f"./packages/{p}" for p in PACKAGES]


def _test_dirs() -> list[str]:
    """Every package's tests, then the repository's own (tests/docs: the docs' code blocks)."""
    dirs = [f"packages/{p}/tests" for p in PACKAGES if (ROOT / "packages" / p / "tests").is_dir()]
    return dirs + [d for d in ("tests",) if (ROOT / d).is_dir()]


def _cpu_env() -> dict[str, str]:
    return {"IRIS_BACKEND": "cpu", "TRITON_INTERPRET": "1"}


def _run_pytest(session: nox.Session, *args: str, env: dict[str, str], deadlines: str | None = None) -> None:
    """pytest over every package's tests. ``deadlines`` ("strict" or "warn") records how long
    each multi-rank world took; pytest's summary lists those closest to their deadline, and
    "strict" fails unless each finished in a third of its deadline (``.ci/check_deadlines.py``)."""
    test_dirs = _test_dirs()
    if not test_dirs:
        session.skip("no packages/*/tests directories found")
    if deadlines:
        durations = Path(session.create_tmp()) / "world-durations.jsonl"
        durations.unlink(missing_ok=True)
        env = {**env, "IRIS_TEST_DURATIONS": str(durations)}
    session.run("pytest", *test_dirs, *args, *session.posargs, env=env)
    if deadlines == "strict":  # (the "warn" report is part of pytest's summary: conftest.py)
        session.run("python", str(ROOT / ".ci" / "check_deadlines.py"), str(durations))


@nox.session
def tests(session: nox.Session) -> None:
    """CPU test suite: pinned torch/triton, cpu backend, Triton interpreter. Leaves the
    exhaustive cases (marked ``full``) to ``tests_full``; reports worlds near their deadline."""
    session.install(TORCH, TRITON)
    session.install(TORCH, TRITON, *_package_paths(), *TEST_DEPS)
    _run_pytest(session, "-m", "not full", "--durations=15", env=_cpu_env(), deadlines="warn")


@nox.session
def tests_full(session: nox.Session) -> None:
    """Every CPU test, the exhaustive matrices included; fails when a multi-rank world used
    more than a third of its deadline (run it on an idle machine)."""
    session.install(TORCH, TRITON)
    session.install(TORCH, TRITON, *_package_paths(), *TEST_DEPS)
    _run_pytest(session, "--durations=15", env=_cpu_env(), deadlines="strict")


def _torch_floor() -> str:
    """The oldest torch the distributions declare: the highest of their ``torch>=`` floors."""
    floors = []
    for package in PACKAGES:
        found = re.search(r'"torch>=([0-9.]+)"', (ROOT / "packages" / package / "pyproject.toml").read_text())
        if found:
            floors.append(found.group(1))
    if not floors:
        raise RuntimeError("no distribution declares a torch floor (torch>=X.Y in its pyproject.toml)")
    return max(floors, key=lambda v: tuple(int(part) for part in v.split(".")))


@nox.session
def tests_torch_floor(session: nox.Session) -> None:
    """CPU test suite (default tier) on the oldest torch the distributions declare
    (``torch>=`` in their pyproject.toml): the floor is a version that is tested."""
    torch = f"torch=={_torch_floor()}.*"
    session.install(torch, TRITON)
    session.install(torch, TRITON, *_package_paths(), *TEST_DEPS)
    session.run("python", "-c", "import torch; print('torch', torch.__version__)")
    _run_pytest(session, "-m", "not full", env=_cpu_env())


@nox.session
def tests_latest(session: nox.Session) -> None:
    """CPU test suite against the newest triton release (torch stays pinned)."""
    session.install("--upgrade", TORCH, "triton")
    session.install(TORCH, *_package_paths(), *TEST_DEPS)
    session.run("python", "-c", "import triton; print('triton', triton.__version__)")
    _run_pytest(session, "-m", "not full", env=_cpu_env())


# `nox -s examples` runs, by default, every tutorial program (examples/3*) and one program for
# each part of the API the tutorials leave out (the functional RMA API with flags, every
# all_reduce variant, send/recv, a fused reduce op), at the first (odd) world size of
# EXAMPLE_WORLDS, EXAMPLE_JOBS programs side by side. `nox -s examples -- --all` runs every
# example at each world size of EXAMPLE_WORLDS. `-- --gpu` runs them on the cuda backend with
# the machine's torch and triton, at each world size of EXAMPLE_GPU_WORLDS however many GPUs
# there are (ranks beyond them share GPUs), with the decoder layer and MoE examples too, one
# at a time.
EXAMPLE_WORLDS = (3, 1)
EXAMPLE_GPU_WORLDS = (2, 3)
EXAMPLE_TUTORIALS = "3[0-9]_*.py"
EXAMPLE_DEFAULTS = ("05_message_passing", "10_all_reduce", "18_send_recv", "20_matmul_all_reduce")
EXAMPLE_GPU_DEFAULTS = EXAMPLE_DEFAULTS + ("25_tp_decoder", "26_moe_layer")
EXAMPLE_JOBS = 2
#: Seconds one example may run before it is killed with every process it started.
EXAMPLE_TIMEOUT = 600

# Runs `script@world` pairs under torchrun, `jobs` at a time, each in its own process group;
# prints each run's output as it finishes, then a summary; exits 1 if any run failed.
_EXAMPLE_RUNNER = """
import os, signal, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor, as_completed

jobs, timeout, runs = int(sys.argv[1]), float(sys.argv[2]), [a.rsplit("@", 1) for a in sys.argv[3:]]

def run(script, world):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", script]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output, rc = output + f"\\nkilled after {timeout:g} s", -9
    return script, world, rc, time.monotonic() - start, output

start, results = time.monotonic(), []
with ThreadPoolExecutor(jobs) as pool:
    for done in as_completed([pool.submit(run, s, w) for s, w in runs]):
        script, world, rc, seconds, output = done.result()
        results.append(done.result())
        verdict = "passed" if rc == 0 else f"FAILED (exit code {rc})"
        print(f"--- {script}, {world} rank(s): {verdict} in {seconds:.1f} s", flush=True)
        print(output.rstrip(), flush=True)
failed = [r for r in results if r[2] != 0]
print(f"\\n{len(results)} example run(s) in {time.monotonic() - start:.0f} s, {jobs} side by side; "
      f"{len(results) - len(failed)} passed, {len(failed)} failed:")
for script, world, rc, seconds, _ in sorted(results):
    print(f"  {'ok    ' if rc == 0 else 'FAILED'} {script:42} {world} rank(s) {seconds:6.1f} s")
sys.exit(1 if failed else 0)
"""


# The machine's torch (a CUDA build, for --gpu) shows through the venv; the CPU form installs
# the pinned CPU build over it.
@nox.session(venv_params=["--system-site-packages"])
def examples(session: nox.Session) -> None:
    """Run examples under torchrun and print their results: on the cpu backend, or with
    ``--gpu`` on the cuda backend.

    By default every tutorial program and a few other examples with 3 ranks, two at a time
    (a few minutes on 2 cores, installs included). Arguments after ``--``:
    ``--all`` runs every example with 3 ranks and with 1; names (or parts of them, e.g.
    ``03 05``) run only the matching examples, with 3 ranks and with 1; ``--jobs=N`` runs N
    at a time (1: one after another); ``--gpu`` runs on the cuda backend with the machine's
    torch and triton (nothing heavy installed), the same examples plus the decoder layer and
    MoE ones (``--all``: every example) at 2 and 3 ranks each, one at a time unless
    ``--jobs`` says otherwise, on however many GPUs there are: ranks beyond them share GPUs.
    """
    run_all, gpu, jobs, names = False, False, None, []
    for arg in session.posargs:
        if arg == "--all":
            run_all = True
        elif arg == "--gpu":
            gpu = True
        elif arg.startswith("--jobs=") and arg[7:].isdigit() and int(arg[7:]) > 0:
            jobs = int(arg[7:])
        elif arg.startswith("-"):
            session.error(f"unknown argument {arg!r}: use --all, --gpu, --jobs=N or parts of example names")
        else:
            names.append(arg)
    if gpu and shutil.which("nvidia-smi") is None:
        session.skip("--gpu: nvidia-smi not found, no NVIDIA GPUs on this machine")
    everything = sorted((ROOT / "examples").glob("[0-9]*.py"))
    if names:
        scripts = [s for s in everything if any(name in s.name for name in names)]
    elif run_all:
        scripts = everything
    else:
        tutorials = set((ROOT / "examples").glob(EXAMPLE_TUTORIALS))
        defaults = EXAMPLE_GPU_DEFAULTS if gpu else EXAMPLE_DEFAULTS
        scripts = [s for s in everything if s in tutorials or s.stem in defaults]
    if not scripts:
        session.skip("no matching examples/*.py found")
    if gpu:
        worlds = EXAMPLE_GPU_WORLDS
        session.install("--no-deps", *_package_paths())
        env = {"IRIS_BACKEND": "cuda", "OMP_NUM_THREADS": "1"}
    else:
        worlds = EXAMPLE_WORLDS if run_all or names else EXAMPLE_WORLDS[:1]
        # One pip call; --no-compile: pip does not byte-compile all of torch (the modules the
        # examples import are compiled when first imported).
        session.install("--no-compile", TORCH, TRITON, *_package_paths())
        env = {**_cpu_env(), "OMP_NUM_THREADS": "1"}  # what torchrun would set, without its banner
    runs = [f"{script.relative_to(ROOT)}@{n}" for script in scripts for n in worlds]
    runner = Path(session.create_tmp()) / "run_examples.py"
    runner.write_text(_EXAMPLE_RUNNER)
    jobs = jobs or (1 if gpu else EXAMPLE_JOBS)
    session.run("python", str(runner), str(jobs), str(EXAMPLE_TIMEOUT), *runs, env=env)


@nox.session(venv_params=["--system-site-packages"])
def gpu_tests(session: nox.Session) -> None:
    """GPU tests (``-m gpu``) using the system's CUDA torch/triton; installs nothing heavy."""
    if shutil.which("nvidia-smi") is None:
        session.skip("nvidia-smi not found: no NVIDIA GPUs on this machine")
    session.install("--no-deps", *_package_paths())
    session.install(*TEST_DEPS)
    _run_pytest(session, "-m", "gpu", env={"IRIS_BACKEND": "cuda"})


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint and format check over the whole repository."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def _check_wheel_contents(wheel: Path) -> None:
    """Fail unless ``wheel`` holds only ``iris/<x>/**`` (its own package) and its dist-info.

    The namespace ``iris`` is shared by all distributions (PEP 420), so a wheel that ships
    ``iris/__init__.py`` or files of another subpackage would break the others.
    """
    dist = wheel.name.split("-")[0].replace("_", "-")
    prefix = f"iris/{_import_name(dist)}/"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    bad = [
        n
        for n in names
        if n == "iris/__init__.py" or not (n.startswith(prefix) or n.split("/")[0].endswith(".dist-info"))
    ]
    if bad:
        raise RuntimeError(f"{wheel.name}: entries outside {prefix} (or iris/__init__.py): {bad}")
    if not any(n.startswith(prefix) for n in names):
        raise RuntimeError(f"{wheel.name}: contains nothing under {prefix}")
    print(f"{wheel.name}: {len(names)} entries, all under {prefix} or .dist-info/")


_IMPORT_CHECK = """
import importlib, importlib.metadata
for dist, mod_name in [{pairs}]:
    mod = importlib.import_module(mod_name)
    assert mod.__file__ is not None, f"{{mod_name}} must be a regular package with an __init__.py"
    version = getattr(mod, "__version__", None) or importlib.metadata.version(dist)
    print(f"{{mod_name}} ({{dist}}) {{version}} from {{mod.__file__}}")
import iris
assert iris.__file__ is None, f"iris must be a namespace package, got {{iris.__file__}}"
print("iris is a namespace package:", list(iris.__path__))
"""


_NO_IRIS_DEVICE = """
import iris.mem
try:
    import iris.device
except ModuleNotFoundError as e:
    print("iris-mem alone:", e)
else:
    raise SystemExit("iris.device is importable without the iris-compat wheel")
"""


@nox.session
def build(session: nox.Session) -> None:
    """Build sdists and wheels, check them, and install the wheels into a fresh venv."""
    session.install("build", "twine")
    dist_dir = ROOT / "dist"
    shutil.rmtree(dist_dir, ignore_errors=True)
    for pkg in PACKAGES:
        session.run("python", "-m", "build", "--outdir", str(dist_dir), f"packages/{pkg}")
    session.run("twine", "check", *sorted(glob.glob(str(dist_dir / "*"))))

    wheels = sorted(dist_dir.glob("*.whl"))
    for wheel in wheels:
        _check_wheel_contents(wheel)

    pairs = ", ".join(f"({p!r}, {'iris.' + _import_name(p)!r})" for p in PACKAGES)
    tmp = tempfile.mkdtemp(prefix="iris-wheel-check-")
    try:
        session.run("python", "-m", "venv", tmp)
        py = os.path.join(tmp, "bin", "python")
        mem_wheels = [str(w) for w in wheels if w.name.startswith("iris_mem-")]
        if "iris-compat" in PACKAGES and mem_wheels:
            # iris-compat alone provides iris.device: with only iris-mem installed it is absent.
            session.run(py, "-m", "pip", "install", "--quiet", TORCH, TRITON, *mem_wheels, external=True)
            session.run(py, "-I", "-c", _NO_IRIS_DEVICE, external=True, env={"IRIS_BACKEND": "cpu"})
        session.run(py, "-m", "pip", "install", "--quiet", TORCH, TRITON, *map(str, wheels), external=True)
        # -I: isolated mode, so neither the cwd nor PYTHONPATH can shadow the installed wheels.
        session.run(
            py, "-I", "-c", _IMPORT_CHECK.format(pairs=pairs), external=True, env={"IRIS_BACKEND": "cpu"}
        )
        example = ROOT / "examples" / "10_all_reduce.py"
        if "iris-ccl" in PACKAGES and example.exists():
            # The installed wheels, not the source tree, serve the example (its folder is the
            # only one of the repository on the ranks' sys.path).
            session.run(
                py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(example),
                external=True, env={"IRIS_BACKEND": "cpu"},
            )  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _check_install_steps(session)


def _install_steps() -> list[str]:
    """The commands of the block docs/getting-started.md marks ``install-steps``."""
    text = (ROOT / "docs" / "getting-started.md").read_text()
    block = text.split("<!-- install-steps", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def _check_install_steps(session: nox.Session) -> None:
    """Run getting-started's install steps as written, from the repository's root, in a fresh
    venv (``python`` there being the venv's); torch and triton are installed first from their
    pins, as the page advises for CPU-only machines."""
    tmp = tempfile.mkdtemp(prefix="iris-install-steps-")
    try:
        session.run("python", "-m", "venv", tmp)
        bindir = os.path.join(tmp, "bin")
        session.run(
            os.path.join(bindir, "python"), "-m", "pip", "install", "--quiet", TORCH, TRITON, external=True
        )
        env = {"PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "IRIS_BACKEND": "cpu"}
        for line in _install_steps():
            session.run("bash", "-c", f"cd {str(ROOT)!r} && {line}", external=True, env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the Sphinx documentation into docs/_build/html, warnings as errors. The build
    also fails when a public name of a package is missing from its API page (docs/conf.py)."""
    session.install("sphinx", "myst-parser", TORCH, TRITON)
    session.install(TORCH, TRITON, *_package_paths())
    shutil.rmtree(ROOT / "docs" / "_build", ignore_errors=True)  # no stale pages or search index
    session.run(
        "sphinx-build",
        "-W",
        "--keep-going",
        "-b",
        "html",
        "docs",
        "docs/_build/html",
        env={"IRIS_BACKEND": "cpu"},
    )
