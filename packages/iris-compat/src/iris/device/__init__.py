"""Deprecated: ``iris.device`` is now :mod:`iris.mem`.

This package (distribution ``iris-compat``) keeps code written against the old layout
running: every name of :mod:`iris.mem` is here as the identical object, and the old
device-side modules map one to one onto the new ones (``iris.device.triton`` ->
:mod:`iris.mem.triton`, ...). Importing it warns with a :class:`DeprecationWarning`
naming the new import; see the migration guide (``docs/migration.md``).
"""

from . import _shim
from ._version import __version__ as __version__

_shim.alias(globals(), "iris.mem", submodules=("triton", "gluon", "utils"), keep=("__version__",))
