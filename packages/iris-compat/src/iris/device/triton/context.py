"""Deprecated: use :mod:`iris.mem.triton.context` (``DeviceContext`` is now ``Context``).

``__translate`` (the reference's translation helper, the same function as
:func:`iris.mem.triton.translate`) is re-exported by name, since star imports skip it.
"""

from .. import _shim

_shim.alias(
    globals(),
    "iris.mem.triton.context",
    renamed={"DeviceContext": "iris.mem.triton.Context"},
    extra=("__translate",),
)
