"""The built wheels, installed into a fresh virtual environment: ``iris-mem`` alone has
no ``iris.device``; adding the ``iris-compat`` wheel brings it, as aliases of ``iris.mem``.

The environment is a new venv without system site-packages. ``pip`` installs the two
wheels built from this checkout into it and resolves their declared dependencies; only
the heavy third-party ones (torch, triton, numpy, ...) are not downloaded again: a folder
of links to the running interpreter's site-packages, with every ``iris`` distribution
left out, is put on the venv's path. ``nox -s build`` repeats the check with torch and
triton installed into the venv for real.
"""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from compat_catalog import OLD_MODULES, OLD_NAMES

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]


def _run(*cmd, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["IRIS_BACKEND"] = "cpu"
    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=timeout, env=env)


def _check(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (
        f"{proc.args}\nexit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


def _third_party_site(folder: Path) -> Path:
    """Links to everything in this interpreter's site-packages except Iris itself."""
    folder.mkdir()
    skip_prefixes = ("iris", "_editable_impl_iris", "__editable__", "pip", "_distutils_hack")
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(site).iterdir():
            if (
                entry.name.startswith(skip_prefixes)
                or entry.suffix == ".pth"
                or (folder / entry.name).exists()
            ):
                continue
            (folder / entry.name).symlink_to(entry)
    return folder


CHECK_COMPAT = f"""
import importlib, warnings, iris
assert iris.__file__ is None, "iris must stay a namespace package"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for old, new in {dict(OLD_MODULES)!r}.items():
        shim = importlib.import_module(old)
        assert shim.__file__.startswith(PREFIX), shim.__file__
    for old, name, new in {OLD_NAMES!r}:
        module, _, attr = new.rpartition(".")
        assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(module), attr)
assert caught and all(issubclass(w.category, DeprecationWarning) for w in caught)
print("iris.device OK from", importlib.import_module("iris.device").__file__)
"""


def test_compat_wheel_adds_iris_device_to_an_iris_mem_install(tmp_path):
    if _run(sys.executable, "-c", "import hatchling").returncode != 0:
        pytest.fail("building the wheels needs hatchling in the test environment (it is in nox's TEST_DEPS)")
    wheels = tmp_path / "wheels"
    packages = (ROOT / "packages/iris-mem", ROOT / "packages/iris-compat")
    _check(_run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                "--wheel-dir", wheels, *packages))  # fmt: skip
    mem_wheel, compat_wheel = (next(wheels.glob(f"{d}-*.whl")) for d in ("iris_mem", "iris_compat"))
    names = zipfile.ZipFile(compat_wheel).namelist()
    outside = [n for n in names if not n.startswith("iris/device/") and ".dist-info/" not in n]
    assert outside == [] and "iris/__init__.py" not in names

    venv = tmp_path / "venv"
    _check(_run(sys.executable, "-m", "venv", "--without-pip", venv))
    py = venv / "bin" / "python"
    prefix = _check(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")).strip()
    (Path(prefix) / "third_party.pth").write_text(f"{_third_party_site(tmp_path / 'third_party')}\n")
    pip = (sys.executable, "-m", "pip", "--python", py, "install", "--quiet", "--no-index")

    _check(_run(*pip, mem_wheel))
    only_mem = _run(py, "-I", "-c", "import iris.mem; import iris.device")
    assert only_mem.returncode != 0
    assert "ModuleNotFoundError: No module named 'iris.device'" in only_mem.stderr, only_mem.stderr

    _check(_run(*pip, compat_wheel))  # resolves its iris-mem requirement against the wheel above
    out = _check(_run(py, "-I", "-c", f"PREFIX = {prefix!r}\n" + CHECK_COMPAT))
    assert "iris.device OK from " + prefix in out
