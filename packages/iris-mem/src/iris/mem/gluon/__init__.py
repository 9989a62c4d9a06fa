"""Device-side API for Gluon kernels (``triton.experimental.gluon``): :class:`Context`
and its event recorder :class:`Tracing`.

Gluon kernels compile for NVIDIA GPUs only (the ``cuda`` backend); they do not run in
Triton's interpreter, so the ``cpu`` backend cannot execute them.
"""

from ..triton.context import HEAP_BASES_OFFSET
from .context import Context
from .tracing import Tracing

__all__ = ["HEAP_BASES_OFFSET", "Context", "Tracing"]
