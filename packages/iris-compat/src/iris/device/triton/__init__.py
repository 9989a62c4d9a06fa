"""Deprecated: use :mod:`iris.mem.triton` (``DeviceContext`` is now ``Context``,
``DeviceTracing`` is now ``Tracing``)."""

from .. import _shim

_shim.alias(
    globals(),
    "iris.mem.triton",
    renamed={"DeviceContext": "iris.mem.triton.Context", "DeviceTracing": "iris.mem.triton.Tracing"},
    submodules=("context", "ops", "tracing"),
)
