"""Deprecated: use :mod:`iris.mem.gluon` (``IrisDeviceCtx`` is now ``Context``,
``GluonDeviceTracing`` is now ``Tracing``).

Gluon kernels need the ``cuda`` backend, but this module imports anywhere, like
:mod:`iris.mem.gluon` itself.
"""

from .. import _shim

_shim.alias(
    globals(),
    "iris.mem.gluon",
    renamed={"IrisDeviceCtx": "iris.mem.gluon.Context", "GluonDeviceTracing": "iris.mem.gluon.Tracing"},
    submodules=("context", "tracing"),
)
