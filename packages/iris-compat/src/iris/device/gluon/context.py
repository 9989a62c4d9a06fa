"""Deprecated: use :mod:`iris.mem.gluon.context` (``IrisDeviceCtx`` is now ``Context``)."""

from .. import _shim

_shim.alias(globals(), "iris.mem.gluon.context", renamed={"IrisDeviceCtx": "iris.mem.gluon.Context"})
