"""Developer and CI sessions for the Iris monorepo.

Run ``nox -s tests`` for the CPU test suite (Triton interpreter, no GPU needed; the
exhaustive cases marked ``full`` run in ``nox -s tests_full``),
``nox -s gpu_tests`` on a machine with NVIDIA GPUs, ``nox -s lint``, ``nox -s build``
and ``nox -s docs``. Sessions use the interpreter nox itself runs under.
"""

from __future__ import annotations

import glob
import os
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
TEST_DEPS = ["pytest>=8", "pytest-timeout", "hypothesis>=6", "hatchling>=1.21", "matplotlib"]

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


@nox.session
def tests_latest(session: nox.Session) -> None:
    """CPU test suite against the newest triton release (torch stays pinned)."""
    session.install("--upgrade", TORCH, "triton")
    session.install(TORCH, *_package_paths(), *TEST_DEPS)
    session.run("python", "-c", "import triton; print('triton', triton.__version__)")
    _run_pytest(session, "-m", "not full", env=_cpu_env())


# World sizes the examples session runs every example at: an odd world, and a world of one.
EXAMPLE_WORLDS = (3, 1)


@nox.session
def examples(session: nox.Session) -> None:
    """Run every ``examples/*.py`` under torchrun on the cpu backend (worlds of 3 and 1).

    ``nox -s examples -- 03 05`` runs only the examples whose file names contain a posarg.
    """
    session.install(TORCH, TRITON)
    session.install(TORCH, TRITON, *_package_paths())
    scripts = sorted((ROOT / "examples").glob("[0-9]*.py"))
    if session.posargs:
        scripts = [s for s in scripts if any(arg in s.name for arg in session.posargs)]
    if not scripts:
        session.skip("no matching examples/*.py found")
    for script in scripts:
        for n in EXAMPLE_WORLDS:
            session.log(f"{script.name} with {n} rank(s)")
            session.run(
                "torchrun",
                "--standalone",
                f"--nproc_per_node={n}",
                str(script.relative_to(ROOT)),
                env=_cpu_env(),
            )


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
