"""How every ``iris.device`` module aliases its ``iris.mem`` counterpart (internal).

A shim module calls :func:`alias` once, from its body. That copies the target module's
public names into the shim (the very same objects, so ``is``, ``isinstance`` and Triton's
kernel cache see no difference), installs a PEP 562 module ``__getattr__`` that serves the
old class names, the shim's submodules and any other attribute of the target, and warns
that the module is deprecated.

Warnings are attributed to the user's line, not to this package or to importlib: the
frames of the import system and of ``iris.device`` itself are skipped, on every Python
from 3.10 (``warnings.warn(skip_file_prefixes=...)`` only exists from 3.12).
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

PACKAGE = "iris.device"

__all__ = ["PACKAGE", "alias"]


def _is_plumbing(frame: types.FrameType) -> bool:
    """True for frames between the user's code and a shim: importlib's and this package's."""
    filename = frame.f_code.co_filename
    module = frame.f_globals.get("__name__") or ""
    return (
        ("importlib" in filename and "_bootstrap" in filename)  # CPython's own test for these
        or module == "importlib"  # importlib.import_module
        or module == PACKAGE
        or module.startswith(PACKAGE + ".")
    )


def _outside(frame: types.FrameType | None) -> tuple[types.FrameType | None, str | None]:
    """The first frame outside the plumbing, and the outermost module import under way
    in the plumbing crossed to reach it (None when no import is under way)."""
    requested = None
    while frame is not None and _is_plumbing(frame):
        if frame.f_code.co_name == "_find_and_load":
            requested = frame.f_locals.get("name", requested)
        frame = frame.f_back
    return frame, requested


def _warn(message: str, frame: types.FrameType | None) -> None:
    """``warnings.warn(message, DeprecationWarning)`` as if issued from ``frame``'s line."""
    if frame is None:  # no user frame at all (e.g. imported during interpreter start-up)
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return
    globs = frame.f_globals
    warnings.warn_explicit(
        message,
        DeprecationWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=globs.get("__name__") or "<string>",
        registry=globs.setdefault("__warningregistry__", {}),
    )


def _public_names(module: types.ModuleType) -> list[str]:
    """What ``from module import *`` binds, less submodules."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return [n for n in names if not isinstance(getattr(module, n), types.ModuleType)]


def alias(
    namespace: dict[str, Any],
    target: str,
    *,
    renamed: Mapping[str, str] | None = None,
    submodules: Iterable[str] = (),
    extra: Iterable[str] = (),
    keep: Iterable[str] = (),
) -> None:
    """Make the module whose globals are ``namespace`` a deprecated alias of ``target``.

    :param namespace: the shim module's ``globals()``.
    :param target: the canonical module, e.g. ``"iris.mem.triton"``.
    :param renamed: old name -> canonical dotted name, e.g.
        ``{"DeviceContext": "iris.mem.triton.Context"}``; each access warns.
    :param submodules: the shim package's own submodules, imported on first access.
    :param extra: names of ``target`` that a star import would skip but the shim must
        hold (``__translate``).
    :param keep: names the shim defines itself and the copy must not overwrite.
    """
    old = namespace["__name__"]
    renamed = dict(renamed or {})
    submodules = tuple(submodules)
    module = importlib.import_module(target)
    keep = set(keep)
    exported = [n for n in _public_names(module) if n not in keep]
    for name in [*exported, *extra]:
        namespace[name] = getattr(module, name)

    def __getattr__(name: str) -> Any:
        if name in renamed:
            new_module, _, new_name = renamed[name].rpartition(".")
            obj = getattr(importlib.import_module(new_module), new_name)
            caller = sys._getframe(1)
            # ``from pkg import X`` first probes ``hasattr(pkg, "X")`` in importlib's
            # _handle_fromlist, then reads it again: warn for the read only.
            if caller.f_code.co_name != "_handle_fromlist":
                _warn(
                    f"{old}.{name} is deprecated: use {new_module}.{new_name} "
                    f"(from {new_module} import {new_name})",
                    _outside(caller)[0],
                )
            return obj
        if name in submodules:
            return importlib.import_module(f"{old}.{name}")
        if not (name.startswith("__") and name.endswith("__")):
            try:
                return getattr(module, name)
            except AttributeError:
                pass
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *renamed, *submodules})

    namespace["__getattr__"] = __getattr__
    namespace["__dir__"] = __dir__
    # Submodules stay out of __all__: a star import would import (and warn about) them all.
    namespace["__all__"] = sorted({*exported, *renamed})

    user, requested = _outside(sys._getframe(1))
    # Importing iris.device.triton.context imports iris.device and iris.device.triton
    # first; only the module the user asked for warns.
    if requested is None or requested == old or not requested.startswith(old + "."):
        _warn(f"{old} is deprecated: import {target} instead", user)
