"""Every old ``iris.device`` path and name resolves to the canonical ``iris.mem`` object
and warns exactly once, with the warning attributed to the line that used the old path."""

import importlib
import inspect
import subprocess
import sys
import types
import warnings

import pytest
from compat_catalog import OLD_MODULES, OLD_NAMES

import iris.mem  # noqa: F401 - loaded once, before any shim

pytestmark = pytest.mark.timeout(120)

OLD_CODE = "<old code>"  # file name of the snippets of old code the tests execute


def forget_shims() -> None:
    """Drop every loaded ``iris.device`` module, so the next import runs it afresh."""
    for name in [m for m in sys.modules if m == "iris.device" or m.startswith("iris.device.")]:
        del sys.modules[name]


@pytest.fixture
def fresh():
    forget_shims()
    yield
    forget_shims()


class Deprecations(list):
    """The DeprecationWarnings raised inside the ``with`` block, every one (no dedup)."""

    def __enter__(self):
        self._cm = warnings.catch_warnings(record=True)
        self._caught = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        self.extend(w for w in self._caught if issubclass(w.category, DeprecationWarning))

    @property
    def messages(self) -> list[str]:
        return [str(w.message) for w in self]


def run_old_code(source: str) -> dict:
    """Execute ``source`` as if it were a user's module; returns its namespace."""
    namespace = {"__name__": "old_code"}
    exec(compile(source, OLD_CODE, "exec"), namespace)
    return namespace


def canonical(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def public_names(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    return [n for n in names if n != "__version__" and not inspect.ismodule(getattr(module, n))]


# --------------------------------------------------------------------------- old modules


@pytest.mark.parametrize("old", OLD_MODULES)
def test_old_module_warns_once_at_the_import_line(fresh, old):
    with Deprecations() as caught:
        run_old_code(f"x = 1\nimport {old}\n")
    # Importing iris.device.triton.context also imports its parents; only it warns.
    assert caught.messages == [f"{old} is deprecated: import {OLD_MODULES[old]} instead"]
    assert (caught[0].filename, caught[0].lineno) == (OLD_CODE, 2)


@pytest.mark.parametrize("old", OLD_MODULES)
def test_old_module_holds_the_canonical_objects(old):
    with Deprecations():
        shim = importlib.import_module(old)
    new = importlib.import_module(OLD_MODULES[old])
    names = public_names(new)
    assert names, f"{new.__name__} exports nothing?"
    for name in names:
        assert getattr(shim, name) is getattr(new, name), f"{old}.{name}"
    assert set(names) <= set(shim.__all__)


@pytest.mark.parametrize(
    "statement",
    [
        "import iris.device.triton.context as old",
        "from iris.device.triton import context",
        "from iris.device.triton.context import Context, __translate",
    ],
)
def test_every_import_form_warns_at_the_users_line(fresh, statement):
    with Deprecations() as caught:
        run_old_code("import iris.mem\nimport iris.device.triton\n" + statement)
    assert [(w.filename, w.lineno) for w in caught] == [(OLD_CODE, 2), (OLD_CODE, 3)]
    assert (
        caught.messages[-1]
        == "iris.device.triton.context is deprecated: import iris.mem.triton.context instead"
    )


def test_import_module_warns_at_the_callers_line(fresh):
    with Deprecations() as caught:
        line = inspect.currentframe().f_lineno + 1
        importlib.import_module("iris.device.triton.ops")
    assert len(caught) == 1 and (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_submodule_reached_as_an_attribute_warns_at_that_line(fresh):
    with Deprecations() as caught:
        import iris.device

        line = inspect.currentframe().f_lineno + 1
        ops = iris.device.triton.ops
    assert ops is sys.modules["iris.device.triton.ops"]
    assert [(w.filename, w.lineno) for w in caught][1:] == [(__file__, line)] * 2
    assert caught.messages[1:] == [
        "iris.device.triton is deprecated: import iris.mem.triton instead",
        "iris.device.triton.ops is deprecated: import iris.mem.triton.ops instead",
    ]


def test_an_error_filter_turns_the_import_into_an_error(fresh):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(DeprecationWarning, match="import iris.mem.triton instead"):
            import iris.device.triton  # noqa: F401
    assert "iris.device.triton" not in sys.modules


def test_a_script_shows_the_warning_under_default_filters(tmp_path):
    """Python shows DeprecationWarnings attributed to ``__main__`` by default: the warning
    must point into the user's script, not into iris or importlib."""
    script = tmp_path / "old_script.py"
    script.write_text("import iris.mem\nfrom iris.device.triton import DeviceContext\nprint('ran')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "DeprecationWarning" in ln]
    assert lines == [
        f"{script}:2: DeprecationWarning: iris.device.triton is deprecated: import iris.mem.triton instead",
        f"{script}:2: DeprecationWarning: iris.device.triton.DeviceContext is deprecated: "
        "use iris.mem.triton.Context (from iris.mem.triton import Context)",
    ], proc.stderr


# --------------------------------------------------------------------------- old names


@pytest.mark.parametrize(("old", "name", "new"), OLD_NAMES)
def test_old_name_is_the_canonical_object_and_warns_once(old, name, new):
    with Deprecations():
        module = importlib.import_module(old)
    with Deprecations() as caught:
        line = inspect.currentframe().f_lineno + 1
        obj = getattr(module, name)
    assert obj is canonical(new)
    new_module, _, new_name = new.rpartition(".")
    assert caught.messages == [f"{old}.{name} is deprecated: use {new} (from {new_module} import {new_name})"]
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


@pytest.mark.parametrize(("old", "name", "new"), OLD_NAMES)
def test_from_import_of_an_old_name_warns_once(old, name, new):
    with Deprecations():
        importlib.import_module(old)
    with Deprecations() as caught:
        namespace = run_old_code(f"from {old} import {name}\n")
    assert namespace[name] is canonical(new)
    assert [(w.filename, w.lineno) for w in caught] == [(OLD_CODE, 1)], caught.messages


def test_star_import_binds_the_old_names_and_warns_for_each(fresh):
    with Deprecations() as caught:
        namespace = run_old_code("from iris.device.triton import *\n")
    assert namespace["DeviceContext"] is canonical("iris.mem.triton.Context")
    assert namespace["load"] is canonical("iris.mem.triton.load")
    old_names = sorted(n for o, n, _ in OLD_NAMES if o == "iris.device.triton")
    assert caught.messages[0] == "iris.device.triton is deprecated: import iris.mem.triton instead"
    assert sorted(m.split()[0].rpartition(".")[2] for m in caught.messages[1:]) == old_names


def test_translate_is_reexported_explicitly():
    """A star import skips ``__translate``; the shim must bind it by name."""
    with Deprecations():
        namespace = run_old_code("from iris.device.triton.context import __translate\n")
    import iris.mem.triton.context as new

    assert namespace["__translate"] is vars(new)["__translate"] is iris.mem.triton.translate


def test_dir_lists_old_names_and_unknown_names_raise():
    with Deprecations():
        import iris.device.triton as old
    assert {"DeviceContext", "Context", "context", "ops", "load"} <= set(dir(old))
    with pytest.raises(AttributeError, match="'iris.device.triton' has no attribute 'NoSuchThing'"):
        old.NoSuchThing  # noqa: B018
