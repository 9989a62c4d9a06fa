"""Every symmetric heap of this process, so that a tensor can be traced back to its heap
(:func:`heap_of`) and a tensor of a closed heap refused (:func:`check_live`)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .errors import UseAfterFreeError

#: Every open heap of this process (weakly: a heap that is only garbage-collected drops out).
_OPEN_HEAPS: weakref.WeakSet = weakref.WeakSet()
#: Weak references to the storages of closed heaps, so :func:`check_live` refuses their
#: tensors (they do not keep the memory alive; expired ones are dropped at each close).
_CLOSED_STORAGES: list[StorageWeakRef] = []


def opened(heap: Any) -> None:
    """Record ``heap`` (a :class:`~iris.mem.SymmetricHeap`) as open."""
    _OPEN_HEAPS.add(heap)


def closed(heap: Any, memory: torch.Tensor) -> None:
    """Record that ``heap`` was closed; ``memory`` is its own heap's bytes, whose tensors
    :func:`check_live` refuses from now on."""
    _OPEN_HEAPS.discard(heap)
    _CLOSED_STORAGES[:] = [r for r in _CLOSED_STORAGES if not r.expired()]
    _CLOSED_STORAGES.append(StorageWeakRef(memory.untyped_storage()))


def heap_of(tensor: torch.Tensor) -> Any:
    """The open heap (a :class:`~iris.mem.SymmetricHeap`) of this process that ``tensor``
    lies on, or None. In debug mode (``IRIS_DEBUG=1``) a tensor in a freed range of the heap
    raises :class:`~iris.mem.UseAfterFreeError`."""
    for heap in list(_OPEN_HEAPS):
        if heap.is_symmetric(tensor):
            if heap.debug:
                heap.check_live(tensor)
            return heap
    return None


def check_live(tensor: torch.Tensor, name: str = "tensor") -> None:
    """Raise :class:`~iris.mem.UseAfterFreeError` when ``tensor`` lies on a heap that was
    closed (always), or in a freed range of an open heap (debug mode, ``IRIS_DEBUG=1``);
    otherwise do nothing. Libraries built on iris.mem (iris.ccl, iris.ops) call it on every
    tensor they are given."""
    if _CLOSED_STORAGES and isinstance(tensor, torch.Tensor) and tensor.numel():
        cdata = tensor.untyped_storage()._cdata
        if any(r.cdata == cdata and not r.expired() for r in _CLOSED_STORAGES):
            raise UseAfterFreeError(
                f"{name} ({list(tensor.shape)}, {tensor.dtype}) lies on a symmetric heap that was closed: "
                "its memory may be released and peers no longer map it; allocate it on an open heap"
            )
    for heap in list(_OPEN_HEAPS):
        if heap.debug:
            heap.check_live(tensor, name)
