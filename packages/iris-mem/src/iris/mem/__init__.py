"""iris.mem: the symmetric heap and remote memory access from Triton kernels.

Host side: :func:`init` creates a :class:`SymmetricHeap`, whose torch-like factories
allocate tensors that every rank can reach. Device side: :mod:`iris.mem.triton`
(``Context`` and the functional ``load``/``store``/``get``/``put``/``copy``/``atomic_*``).

Importing this package fixes how kernels run: with the ``cpu`` backend (``IRIS_BACKEND=cpu``,
or no GPU visible) it turns on Triton's interpreter, unless ``TRITON_INTERPRET`` is set.
"""

from . import settings

settings.configure_triton()

from ._version import __version__  # noqa: E402
from .errors import DeviceWaitTimeout, HeapMismatchError, HeapPointerError, IrisError  # noqa: E402
from .heap import SymmetricHeap, heap_of, init  # noqa: E402
from .machine import Capabilities, capabilities, capturing, default_device, synchronize  # noqa: E402
from .settings import debug as debug_enabled  # noqa: E402
from .settings import wait_budget_ns, wait_timeout  # noqa: E402

__all__ = [
    "Capabilities",
    "DeviceWaitTimeout",
    "HeapMismatchError",
    "HeapPointerError",
    "IrisError",
    "SymmetricHeap",
    "__version__",
    "capabilities",
    "capturing",
    "debug_enabled",
    "default_device",
    "heap_of",
    "init",
    "synchronize",
    "wait_budget_ns",
    "wait_timeout",
]
