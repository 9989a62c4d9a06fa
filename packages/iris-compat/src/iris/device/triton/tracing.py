"""Deprecated: use :mod:`iris.mem.triton.tracing` (``DeviceTracing`` is now ``Tracing``)."""

from .. import _shim

_shim.alias(
    globals(),
    "iris.mem.triton.tracing",
    renamed={"DeviceTracing": "iris.mem.triton.Tracing"},
)
