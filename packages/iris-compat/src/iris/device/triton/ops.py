"""Deprecated: use :mod:`iris.mem.triton.ops` (the functional RMA forms)."""

from .. import _shim

_shim.alias(globals(), "iris.mem.triton.ops")
