"""Deprecated: use :mod:`iris.mem.utils` (device intrinsics: timers, SM id)."""

from . import _shim

_shim.alias(globals(), "iris.mem.utils")
