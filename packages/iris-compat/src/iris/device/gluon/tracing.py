"""Deprecated: use :mod:`iris.mem.gluon.tracing` (``GluonDeviceTracing`` is now ``Tracing``)."""

from .. import _shim

_shim.alias(globals(), "iris.mem.gluon.tracing", renamed={"GluonDeviceTracing": "iris.mem.gluon.Tracing"})
