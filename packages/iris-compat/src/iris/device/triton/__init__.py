"""Deprecated: use :mod:`iris.mem.triton` (``DeviceContext`` is now ``Context``)."""

from .. import _shim

_shim.alias(
    globals(),
    "iris.mem.triton",
    renamed={"DeviceContext": "iris.mem.triton.Context"},
    submodules=("context", "ops"),
)
