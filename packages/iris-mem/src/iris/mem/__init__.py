"""iris.mem: the symmetric heap and remote memory access from Triton kernels.

Host side: :func:`init` creates a :class:`SymmetricHeap`, whose torch-like factories
allocate tensors that every rank can reach. Device side: :mod:`iris.mem.triton`
(``Context`` and the functional ``load``/``store``/``get``/``put``/``copy``/``atomic_*``).

Importing this package fixes how kernels run: with the ``cpu`` backend (``IRIS_BACKEND=cpu``,
or no GPU visible) it turns on Triton's interpreter, unless ``TRITON_INTERPRET`` is set.
"""

from . import settings

# First of all: Triton fixes whether a kernel is interpreted when the kernel is defined, so
# the choice must be made before anything (Iris's modules, then the caller's) defines one.
_TURNED_INTERPRETER_ON = settings.configure_triton()

from .triton._compat import interpret_triton_library  # noqa: E402

if _TURNED_INTERPRETER_ON:
    interpret_triton_library()  # triton may have been imported (compiled) before this

from ._alloc import MemoryStats  # noqa: E402
from ._registry import check_live, heap_of  # noqa: E402
from ._version import __version__  # noqa: E402
from .errors import (  # noqa: E402
    AbortedError,
    CallMismatchError,
    DeviceWaitTimeout,
    HeapMismatchError,
    HeapPointerError,
    IrisError,
    UseAfterFreeError,
)
from .heap import SymmetricHeap, init  # noqa: E402
from .machine import (  # noqa: E402
    Capabilities,
    SharedGpuWarning,
    capabilities,
    capturing,
    default_device,
    kept_tensor,
    synchronize,
)
from .nodes import NodeLayout, node_layout  # noqa: E402
from .settings import debug as debug_enabled  # noqa: E402
from .settings import wait_budget_ns, wait_timeout  # noqa: E402

__all__ = [
    "AbortedError",
    "CallMismatchError",
    "Capabilities",
    "DeviceWaitTimeout",
    "HeapMismatchError",
    "HeapPointerError",
    "IrisError",
    "MemoryStats",
    "NodeLayout",
    "SharedGpuWarning",
    "SymmetricHeap",
    "UseAfterFreeError",
    "__version__",
    "capabilities",
    "capturing",
    "kept_tensor",
    "check_live",
    "debug_enabled",
    "default_device",
    "heap_of",
    "init",
    "node_layout",
    "synchronize",
    "wait_budget_ns",
    "wait_timeout",
]
