"""Sphinx configuration for the Iris documentation."""

from __future__ import annotations

import os

# Autodoc reads the Triton device API as compiled-mode ``JITFunction`` objects, which keep
# their docstrings (the interpreter's wrappers do not); nothing is launched, so no GPU is
# needed. Set before anything imports triton.
os.environ["IRIS_BACKEND"] = "cpu"
os.environ["TRITON_INTERPRET"] = "0"

project = "Iris"
author = "Iris developers"
copyright = "Iris developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# torch and triton are installed in the docs environment, so nothing is mocked.
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = True

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

nitpicky = False
suppress_warnings = [
    # Re-exported names (iris.mem.SymmetricHeap is also iris.mem.heap.SymmetricHeap) make
    # some Python cross-references ambiguous; either target is correct.
    "ref.python",
    # Links to torch/triton objects cannot resolve: there is no intersphinx (no network).
    "myst.xref_missing",
]

html_theme = "alabaster"
html_title = "Iris"


# ---- API coverage: every public name of every public module is on its API page ---------------

import importlib
import inspect
import types
import warnings

from sphinx.util import logging as _sphinx_logging

#: The public modules of each distribution, by the API page that documents them.
API_PAGES = {
    "api/mem": (
        "iris.mem", "iris.mem.triton", "iris.mem.gluon", "iris.mem.machine", "iris.mem.settings",
        "iris.mem.runtime", "iris.mem.tracing", "iris.mem.trace_format", "iris.mem.log",
        "iris.mem.utils", "iris.mem.testing", "iris.mem.watchdog",
    ),
    "api/ccl": (
        "iris.ccl", "iris.ccl.triton", "iris.ccl.triton.ll", "iris.ccl.variants", "iris.ccl.settings",
        "iris.ccl.backend", "iris.ccl.functional", "iris.ccl.tuning",
    ),
    "api/ops": ("iris.ops",),
    "api/compat": (
        "iris.device", "iris.device.triton", "iris.device.triton.context", "iris.device.triton.ops",
        "iris.device.triton.tracing", "iris.device.gluon", "iris.device.gluon.context",
        "iris.device.gluon.tracing", "iris.device.utils",
    ),
}  # fmt: skip

#: Pages of modules that are deprecated aliases (iris-compat): the names they bind are the
#: very objects of the iris.mem module they alias (iris-compat's tests check ``is``), so only
#: the old names they serve through ``__getattr__`` need entries of their own.
ALIAS_PAGES = {"api/compat"}

_api_log = _sphinx_logging.getLogger("iris.api_coverage")


def public_names(module: types.ModuleType) -> list[str]:
    """``__all__``, else the functions and classes the module defines without a leading ``_``."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return sorted(
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or callable(obj))
        and getattr(obj, "__module__", None) == module.__name__
    )


def _resolve(dotted: str):
    """The object named ``dotted`` (module path, then attributes), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _check_jit_methods(cls, name: str, objects: dict[str, str], page: str, seen: set[int]) -> None:
    """The JIT methods of a Triton aggregate (autodoc lists them only when asked by name)
    are documented under one of the names the class is documented under."""
    if id(cls) in seen:
        return
    seen.add(id(cls))
    documented = [n for n in objects if _resolve(n) is cls] or [name]
    for attr, member in vars(cls).items():
        if attr.startswith("_") or not hasattr(member, "fn"):
            continue
        if not any(f"{n}.{attr}" in objects for n in documented):
            _api_log.warning(f"{documented[0]}.{attr} (a device method) is not documented", location=page)


def _check_api_coverage(app, env) -> None:
    """Warn (an error under ``-W``) for each public name missing from its API page.

    A name counts as documented when its page documents ``module.name`` itself, or when the
    module re-exports an object that is documented elsewhere under the same name (or, for
    functions and classes, under any name): ``iris.ops.Work`` is ``iris.ccl.Work``. Names a
    module serves only through ``__getattr__`` (the deprecated aliases of iris-compat) must
    be documented themselves.
    """
    domain = env.get_domain("py")
    objects = {name: entry.docname for name, entry in domain.objects.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        by_id: dict[int, set[str]] = {}
        alive = []  # the resolved objects stay referenced, so that no id is reused
        for name in objects:
            obj = _resolve(name)
            if obj is not None:
                alive.append(obj)
                by_id.setdefault(id(obj), set()).add(name.rpartition(".")[2])
        seen: set[int] = set()
        for page, modules in API_PAGES.items():
            for modname in modules:
                if objects.get(modname) != page:
                    _api_log.warning(f"module {modname} is not documented on {page}", location=page)
                module = importlib.import_module(modname)
                for name in public_names(module):
                    obj = getattr(module, name)
                    if getattr(obj, "__triton_aggregate__", False):
                        _check_jit_methods(obj, f"{modname}.{name}", objects, page, seen)
                    if objects.get(f"{modname}.{name}") == page:
                        continue
                    if page in ALIAS_PAGES and name in vars(module):
                        continue
                    if isinstance(obj, types.ModuleType):
                        if obj.__name__ in objects:
                            continue
                    elif name in vars(module) and id(obj) in by_id:
                        scalar = not (inspect.isclass(obj) or callable(obj))
                        if not scalar or name in by_id[id(obj)]:
                            continue
                    _api_log.warning(
                        f"{modname}.{name} is public ({modname}.__all__ or a public definition) "
                        f"but not documented on {page}",
                        location=page,
                    )


# ---- Triton and Gluon device functions -----------------------------------------------------


def _jit_signature(fn) -> str:
    """``(a, b, C: tl.constexpr = 4)`` for a Python function, less a leading ``self``."""
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    parts = []
    for p in params:
        text = p.name
        if p.annotation is not inspect.Parameter.empty:
            ann = p.annotation
            text += ": tl.constexpr" if getattr(ann, "__name__", "") == "constexpr" else f": {ann}"
        if p.default is not inspect.Parameter.empty:
            text += f" = {p.default!r}" if ": " in text else f"={p.default!r}"
        parts.append(("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + text)
    return "(" + ", ".join(parts) + ")"


def _device_signature(app, what, name, obj, options, signature, return_annotation):
    """Signatures of ``@triton.jit`` / ``@gluon.jit`` functions and methods (autodoc sees
    only the JIT object's ``(*args, **kwargs)``) are those of the Python function they wrap;
    Triton aggregates (``Context``, ``Group``, ``Tracing``) are built in kernels by their
    ``initialize`` method, so their classes show no constructor signature."""
    fn = getattr(obj, "fn", None)
    if what in ("function", "method") and inspect.isfunction(fn):
        return _jit_signature(fn), None
    if what == "class" and getattr(obj, "__triton_aggregate__", False):
        return "", None
    return None


def setup(app):
    app.connect("autodoc-process-signature", _device_signature)
    app.connect("env-check-consistency", _check_api_coverage)
    return {"parallel_read_safe": True}
