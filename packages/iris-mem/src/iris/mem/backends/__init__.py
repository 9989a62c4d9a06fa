"""Backends: the only place where the CPU and GPU code paths differ.

A backend makes this rank's heap memory, maps every peer's heap into this process, and
says how kernels run (the interface: :class:`~iris.mem.backends.base.Backend`). Everything
above (allocation, context tensor, barriers, device API) is shared.
"""

from __future__ import annotations

from ..bootstrap import Communicator
from .base import Backend
from .cpu import CpuBackend
from .cuda import CudaBackend


def create_backend(name: str, comm: Communicator) -> Backend:
    """Instantiate the backend called ``name``."""
    if name == "cpu":
        return CpuBackend()
    if name == "cuda":
        return CudaBackend(comm)
    raise ValueError(f"unknown backend {name!r}; use 'cpu' or 'cuda'")


__all__ = ["Backend", "create_backend"]
