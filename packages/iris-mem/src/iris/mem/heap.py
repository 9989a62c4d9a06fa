"""The symmetric heap: one equal-sized region per rank, allocated in lockstep.

Every rank allocates and frees the same sequence of tensors, so a tensor at byte offset
``o`` in this rank's heap has a twin at offset ``o`` in every peer's heap; a kernel reaches
the twin on rank ``r`` by translating its pointer with the table of heap bases (see
:func:`iris.mem.triton.translate`). Allocation is deterministic first fit
(:mod:`iris.mem._alloc`); memory comes back through :meth:`SymmetricHeap.free`,
:meth:`SymmetricHeap.scope` and :meth:`SymmetricHeap.close`, never through garbage
collection, whose order differs between ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef

from . import settings as _settings
from ._alloc import FirstFit, MemoryStats
from .backends import Backend, create_backend
from .bootstrap import Communicator, ensure_initialized, node_group, resolve_group
from .errors import AbortedError, HeapMismatchError, UseAfterFreeError
from .log import get_logger
from .machine import Capabilities, capabilities, capturing
from .runtime import exchange

_log = get_logger(__name__)

#: Byte alignment of every allocation (enough for 16-byte vector accesses and 128-byte lines).
ALIGNMENT = 256
#: Layout of the device-context tensor:
#: ``[rank, world_size, heap_size, flags, base_0, ..., base_{world_size-1}, trace_buffer]``.
CONTEXT_HEADER = 4
CONTEXT_FLAG_DEBUG = 1

#: Every open heap of this process, so a tensor can be traced back to its heap.
_OPEN_HEAPS: weakref.WeakSet = weakref.WeakSet()
#: Weak references to the storages of closed heaps, so :func:`check_live` refuses their
#: tensors (they do not keep the memory alive; expired ones are dropped at each close).
_CLOSED_STORAGES: list[StorageWeakRef] = []


def _parse_size(size: tuple[Any, ...]) -> tuple[int, ...]:
    """Accept ``f(2, 3)``, ``f((2, 3))`` and ``f(torch.Size([2, 3]))`` like torch."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dims = []
    for d in size:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise TypeError(f"size must be a sequence of ints, got {size!r}")
        if d < 0:
            raise ValueError(f"size must not be negative, got {size!r}")
        dims.append(int(d))
    return tuple(dims)


def _align(value: int) -> int:
    return (value + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclasses.dataclass(eq=False)
class _Allocation:
    """One live allocation: where it is, what it holds, and its place in the sequence."""

    index: int  # number of the caller's allocation (-1: the heap's own bookkeeping)
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    live: bool = True

    def describe(self) -> str:
        what = f"allocation #{self.index}" if self.index >= 0 else "internal allocation"
        return f"{what} at offset {self.offset}, {self.nbytes} bytes, shape {list(self.shape)}, {self.dtype}"


class SymmetricHeap:
    """This rank's view of the job's symmetric heap. Create it with :func:`iris.mem.init`.

    Attributes ``rank`` and ``world_size`` are this process's rank in the heap's group and
    the group's size; ``device`` is where heap tensors live; ``backend`` the backend's name;
    ``heap_size`` the bytes per rank.
    """

    def __init__(
        self,
        heap_size: int = 1 << 30,
        *,
        backend: str | None = None,
        group: dist.ProcessGroup | None = None,
    ):
        if isinstance(heap_size, bool) or not isinstance(heap_size, numbers.Integral) or heap_size <= 0:
            raise ValueError(f"heap_size must be a positive number of bytes, got {heap_size!r}")
        requested, heap_size = int(heap_size), _align(int(heap_size))
        name = backend if backend is not None else _settings.default_backend()
        if name not in _settings.BACKENDS:
            raise ValueError(f"backend={name!r} is not a backend; use one of {', '.join(_settings.BACKENDS)}")
        self._owns_process_group = ensure_initialized(name)
        # a heap spans one node: in a job over several, this node's ranks of the group
        self._comm = Communicator(node_group(resolve_group(group), name))
        self.rank: int = self._comm.rank
        self.world_size: int = self._comm.world_size
        self.heap_size: int = heap_size
        self.debug: bool = _settings.debug()
        from . import watchdog

        exchanged = exchange(
            self._comm.group, "iris.mem.init", ((heap_size, name, self.debug), watchdog.identity()),
            HeapMismatchError,
        )  # fmt: skip
        settings = [e[0] for e in exchanged]
        if len(set(settings)) != 1:
            table = ", ".join(
                f"rank {r}: heap_size={s[0]} backend={s[1]} debug={s[2]}" for r, s in enumerate(settings)
            )
            raise HeapMismatchError(f"ranks passed different settings to iris.mem.init(): {table}")
        from .runtime import SyncState

        minimum = SyncState.heap_bytes(self.world_size, 1)  # the device barrier's, allocated first
        if heap_size < minimum:
            raise ValueError(
                f"heap_size={requested} bytes is below the minimum heap size of {minimum} bytes for "
                f"{self.world_size} rank(s): the heap keeps the sync flags of its device barrier there. "
                f"Pass heap_size >= {minimum} (plus what you allocate) to iris.mem.init()"
            )
        self._backend: Backend = create_backend(name, self._comm)
        self._closed = False
        self._aborted: AbortedError | None = None
        self._ended = 0  # mask of the heap ranks whose program ended normally (watchdog)
        self._ended_errors: dict[int, AbortedError] = {}
        self._abort_lock = threading.Lock()
        self._sync_states: weakref.WeakSet = weakref.WeakSet()  # stopped by abort()
        self._close_callbacks: list[Callable[[], object]] = []
        self._finalizer = weakref.finalize(self, self._backend.close)
        self._heap, bases = self._backend.map_heaps(heap_size, self._comm)
        self._base = self._heap.data_ptr()
        self._allocator = FirstFit(heap_size, ALIGNMENT)
        self._records: dict[int, _Allocation] = {}  # offset -> live allocation (non-empty ones)
        self._allocations = 0  # the caller's allocations so far (numbers them)
        self._frees = 0  # the caller's frees so far (numbers them in debug checks)
        self._scopes: list[list[_Allocation]] = []
        self._unscoped = 0
        header = [self.rank, self.world_size, heap_size, CONTEXT_FLAG_DEBUG if self.debug else 0]
        self._context = torch.tensor(header + bases + [0], dtype=torch.int64, device=self.device)
        # Imported here, not at the top: ``python -m iris.mem.tracing`` must find the module
        # unimported after the package itself is.
        from .tracing import HeapTracing

        #: Device tracing of this heap: enable, reset, register, export (see :mod:`iris.mem.tracing`).
        self.tracing = HeapTracing(
            self._comm,
            self.device,
            self._context[-1:],
            self._base,
            heap_size,
            self._backend.synchronize,
            self._backend.interpreted,
            name,
        )
        # The device barrier's sync state, allocated first on every rank.
        self._sync = SyncState(
            self, range(self.world_size), 1, "device_barrier",
            "a rank did not reach the barrier: check that every rank calls device_barrier() the same "
            "number of times",
        )  # fmt: skip
        _OPEN_HEAPS.add(self)
        # Peers may signal this rank's flags as soon as they leave init: zero them first.
        self._backend.synchronize()
        self._comm.barrier()
        watchdog.watch(self, [e[1] for e in exchanged])
        _log.debug("heap: %d bytes on %s, %d ranks", heap_size, self.device, self.world_size)

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        """Device of heap tensors (``cpu`` or ``cuda:N``)."""
        return self._backend.device

    @property
    def capabilities(self) -> Capabilities:
        """What kernels on this heap's device can do (:class:`iris.mem.Capabilities`)."""
        return capabilities(self.device)

    @property
    def backend(self) -> str:
        """Name of the backend: ``cpu`` or ``cuda``."""
        return self._backend.name

    @property
    def num_ranks(self) -> int:
        """Alias of ``world_size``."""
        return self.world_size

    @property
    def used_bytes(self) -> int:
        """Bytes of this rank's heap held by live allocations (including alignment padding)."""
        return self._allocator.in_use

    @property
    def free_bytes(self) -> int:
        """Bytes of this rank's heap not held by an allocation (possibly in several ranges:
        :meth:`memory_stats` gives the largest)."""
        return self.heap_size - self._allocator.in_use

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The torch.distributed group the heap spans (None: the default group)."""
        return self._comm.group

    @property
    def global_ranks(self) -> list[int]:
        """Global torch.distributed rank of each heap rank (index = heap rank)."""
        return list(self._comm.global_ranks)

    def get_rank(self) -> int:
        """This process's rank in the heap's group."""
        return self.rank

    def get_num_ranks(self) -> int:
        """Number of ranks sharing the heap."""
        return self.world_size

    def get_heap_bases(self) -> torch.Tensor:
        """int64 tensor ``[world_size]`` on the heap's device: the address, in this process,
        of every rank's heap. Pass it to the functional device API (``iris.mem.triton.load``...).
        """
        self._check_open()
        return self._context[CONTEXT_HEADER : CONTEXT_HEADER + self.world_size]

    def get_device_context(self) -> torch.Tensor:
        """The encoded int64 context tensor that :class:`iris.mem.triton.Context` decodes:
        ``[rank, world_size, heap_size, flags, heap_base_0, ..., heap_base_{n-1}, trace_buffer]``
        (``trace_buffer``: address of the buffer that kernels built with ``tracing=True``
        record into, see :mod:`iris.mem.tracing`).
        """
        self._check_open()
        return self._context

    # ------------------------------------------------------------------ allocation
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this SymmetricHeap is closed")
        self._raise_if_aborted()

    def _raise_if_aborted(self) -> None:
        error = self._aborted
        if error is not None:
            raise AbortedError(str(error), error.rank, error.reason)

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype, check: bool = True) -> torch.Tensor:
        """A tensor on the heap. ``check=False``: the heap's own bookkeeping (sync flags),
        left out of the caller's numbering, of the debug check and of scopes."""
        self._check_open()
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        if nbytes > self.heap_size:
            offset = None
        else:  # empty tensors take no space: they sit at offset 0
            offset = self._allocator.allocate(nbytes) if nbytes else 0
        if offset is None:
            raise MemoryError(
                f"symmetric heap exhausted on rank {self.rank}: requested {nbytes} bytes "
                f"(shape {list(shape)}, {dtype}); {self.memory_stats().summary()}. Memory comes back "
                "only through heap.free(), heap.scope() and heap.close() (dropping a tensor frees nothing); "
                "free what you no longer need, or pass a larger heap_size to iris.mem.init()"
            )
        if check and self.debug:
            try:
                self._check_sequence(offset, nbytes, shape, dtype)
            except BaseException:
                if nbytes:
                    self._allocator.release(offset, undo=True)
                raise
        record = _Allocation(self._allocations if check else -1, offset, nbytes, tuple(shape), dtype)
        if nbytes:
            self._records[offset] = record
            if check and self._scopes and not self._unscoped:
                self._scopes[-1].append(record)
        if check:  # number user allocations from 0; internal ones come first on every rank
            self._allocations += 1
        return self._heap[offset : offset + nbytes].view(dtype).view(shape)

    def _undo(self, tensor: torch.Tensor) -> None:
        """Give back the allocation just made for ``tensor`` (a factory whose fill failed),
        as if it had not been made."""
        self._allocations -= 1
        record = self._records.pop(self._offset_of(tensor), None)
        if record is not None:
            record.live = False
            self._allocator.release(record.offset, undo=True)

    def _offset_of(self, tensor: torch.Tensor) -> int:
        return tensor.data_ptr() - self._base

    # ------------------------------------------------------------------ giving memory back
    def free(self, *tensors: torch.Tensor, sync: bool = True) -> None:
        """Give the allocations of ``tensors`` back to the heap (collective: every rank frees
        the same allocations in the same order). Later allocations reuse the space.

        Each tensor must start where its allocation starts: the tensor a factory returned,
        or a view of it beginning at its first element. Views of a freed tensor keep
        pointing at the freed range, which a later allocation may reuse: do not use them.
        With ``IRIS_DEBUG=1`` the ranks check that they free the same allocations in the same
        order, and Iris's collectives and ops reject tensors in freed ranges.

        :param sync: first wait until every rank's work queued before this call (on the
            current stream) has finished, so no peer still reads or writes the range when it
            is reused: a device barrier on GPUs, capturable and without a host
            synchronisation; a host barrier where kernels complete on launch (the CPU
            backend). ``False`` skips it, for callers that have synchronised already (for
            instance right after a collective that ends with a barrier).
        :raises ValueError: a tensor is not on this heap, was freed already, does not start
            its allocation, or appears twice.
        :raises RuntimeError: called while a CUDA graph is being captured (allocate and free
            outside the capture).
        """
        self._check_open()
        records = self._records_of(tensors, "free")
        self._release(records, sync)

    @contextlib.contextmanager
    def scope(self) -> Iterator[SymmetricHeap]:
        """``with heap.scope():`` frees every allocation made inside it at exit (collective,
        like :meth:`free`, in reverse order of allocation, after one synchronisation);
        allocations already freed inside are skipped. Scopes nest: an inner scope gives
        back its own allocations at its exit.

        When the block raises, the allocations are given back without synchronising with
        the peers (a peer may not have raised), and the exception propagates.
        """
        self._check_open()
        frame: list[_Allocation] = []
        self._scopes.append(frame)
        try:
            yield self
        except BaseException:
            self._scopes.remove(frame)
            self._release_local([r for r in reversed(frame) if r.live])
            raise
        self._scopes.remove(frame)
        self._release([r for r in reversed(frame) if r.live], sync=True)

    @contextlib.contextmanager
    def unscoped(self) -> Iterator[SymmetricHeap]:
        """Allocations made inside belong to no enclosing :meth:`scope`: for libraries that
        keep buffers beyond the caller's scope (iris.ops' workspaces) and free them
        themselves."""
        self._unscoped += 1
        try:
            yield self
        finally:
            self._unscoped -= 1

    def memory_stats(self) -> MemoryStats:
        """Bytes in use, free, peak, the largest free range, allocation counts
        (:class:`~iris.mem.MemoryStats`; ``.as_dict()`` for a dict). The heap's own sync
        flags count as in use."""
        return self._allocator.stats()

    def _records_of(self, tensors, what: str) -> list[_Allocation]:
        """The live allocations ``tensors`` start, checked (and, in debug mode, agreed by
        every rank before any is given back)."""
        records, problem = [], None
        for i, tensor in enumerate(tensors):
            if not isinstance(tensor, torch.Tensor):
                problem = TypeError(f"{what}: argument {i} is a {type(tensor).__name__}, not a heap tensor")
                break
            if not self.is_symmetric(tensor):
                problem = ValueError(f"{what}: argument {i} is not on this symmetric heap")
                break
            if tensor.numel() == 0 or tensor.element_size() == 0:
                continue  # empty tensors hold no space
            record = self._records.get(self._offset_of(tensor))
            if record is None or self._records_owner(tensor) is not record:
                problem = ValueError(
                    f"{what}: argument {i} ({list(tensor.shape)}, {tensor.dtype}) does not start a live "
                    "allocation of this heap: it was freed already, or it is a view that does not begin "
                    "where its allocation does (pass the tensor the factory returned)"
                )
                break
            if record in records:
                problem = ValueError(f"{what}: argument {i} frees the same allocation twice")
                break
            records.append(record)
        if self.debug:
            self._check_frees(records, problem)
        if problem is not None:
            raise problem
        return records

    def _check_frees(self, records: list[_Allocation], problem: Exception | None) -> None:
        entry = f"error: {problem}" if problem is not None else [r.describe() for r in records]
        entries = exchange(self._comm.group, "heap free", (self._frees, entry), HeapMismatchError)
        self._frees += 1
        if len({repr(e) for e in entries}) != 1:
            table = "; ".join(
                f"rank {r}: free #{n} of " + (e if isinstance(e, str) else ", ".join(e) or "nothing")
                for r, (n, e) in enumerate(entries)
            )
            raise HeapMismatchError(
                "ranks freed different allocations of the symmetric heap (IRIS_DEBUG); every rank must free "
                f"the same allocations in the same order: {table}"
            )

    def _release(self, records: list[_Allocation], sync: bool) -> None:
        if not records:
            return
        if capturing(self.device):
            raise RuntimeError(
                "heap.free() and heap.scope() cannot run while a CUDA graph is captured: allocate and free "
                "outside the capture (the graph replays its kernels, not the host's bookkeeping)"
            )
        if sync:
            self._quiesce()
        self._release_local(records)

    def _release_local(self, records: list[_Allocation]) -> None:
        for record in records:
            record.live = False
            del self._records[record.offset]
            self._allocator.release(record.offset)

    def _quiesce(self) -> None:
        """Wait until every rank's queued work on the heap has finished (see :meth:`free`)."""
        if self._backend.interpreted:  # launches complete before they return
            self._comm.barrier()
        else:
            self.device_barrier()

    def _records_owner(self, tensor: torch.Tensor) -> _Allocation | None:
        """The live allocation holding all of ``tensor`` (on this heap), or None."""
        start, end = self._span(tensor)
        offset = self._allocator.owner(start - self._base, end - self._base)
        return None if offset is None else self._records.get(offset)

    def check_live(self, tensor: torch.Tensor, name: str = "tensor") -> None:
        """Raise :class:`~iris.mem.UseAfterFreeError` when ``tensor`` (on this heap) lies in a
        range that is not one live allocation. Iris's collectives and ops call it in debug
        mode; empty tensors always pass."""
        if tensor.numel() and self.is_symmetric(tensor) and self._records_owner(tensor) is None:
            start, end = self._span(tensor)
            raise UseAfterFreeError(
                f"{name} ({list(tensor.shape)}, {tensor.dtype}) lies in bytes [{start - self._base}, "
                f"{end - self._base}) of the symmetric heap, which no live allocation holds: it (or the "
                "tensor it is a view of) was freed with heap.free() or at the end of a heap.scope()"
            )

    def _check_sequence(self, offset: int, nbytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        entry = (self._allocations, offset, nbytes, tuple(shape), str(dtype))
        entries = exchange(self._comm.group, "heap allocation", entry, HeapMismatchError)
        if len(set(entries)) != 1:
            table = "; ".join(
                f"rank {r}: allocation #{e[0]} at offset {e[1]}, {e[2]} bytes, shape {list(e[3])}, {e[4]}"
                for r, e in enumerate(entries)
            )
            raise HeapMismatchError(
                "ranks allocated different sequences on the symmetric heap (IRIS_DEBUG); every rank must "
                f"allocate the same shapes and dtypes in the same order: {table}"
            )

    def _factory(
        self,
        size: tuple[Any, ...],
        dtype: torch.dtype | None,
        device: Any,
        requires_grad: bool,
        out: torch.Tensor | None,
        default_dtype: torch.dtype | None = None,
        fill: Callable[[torch.Tensor], object] | None = None,
    ) -> torch.Tensor:
        """Allocate (or validate ``out``), then ``fill`` the tensor in place. A fill that
        raises (an unsupported dtype, a value out of range) gives the space back, so a failed
        call leaves the heap as it was on every rank."""
        shape = _parse_size(size)
        if device is not None and torch.device(device) != self.device:
            if not (
                torch.device(device).type == self.device.type == "cuda" and torch.device(device).index is None
            ):
                raise ValueError(
                    f"device={device!r} does not match the heap's device {self.device}; heap tensors "
                    "always live on the heap's device (leave device=None)"
                )
        dtype = dtype or default_dtype or torch.get_default_dtype()
        if out is not None:
            self.require_symmetric(out, "out")
            if tuple(out.shape) != shape or out.dtype != dtype:
                raise ValueError(
                    f"out has shape {list(out.shape)} and dtype {out.dtype}; expected {list(shape)}, {dtype}"
                )
            tensor = out
        else:
            tensor = self._allocate(shape, dtype)
        if fill is not None:
            try:
                with torch.no_grad():
                    fill(tensor)
            except Exception:
                if out is None:
                    self._undo(tensor)
                raise
        if requires_grad:
            tensor.requires_grad_(True)
        return tensor

    def require_symmetric(self, tensor: Any, name: str = "tensor") -> torch.Tensor:
        """Return ``tensor`` if it lies on this heap, else raise an error naming ``name``.

        For APIs that hand a tensor's pointer to a kernel that translates it: a tensor
        outside the heap would be translated to an unrelated address on the peer.

        :raises TypeError: ``tensor`` is not a torch.Tensor.
        :raises ValueError: ``tensor`` is on another device, or on this device but not
            on this heap.
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor on the symmetric heap, got {type(tensor).__name__}"
            )
        if tensor.device != self.device:
            raise ValueError(
                f"{name} is on {tensor.device}, not on this symmetric heap (which lives on {self.device}); "
                "allocate it with the heap's factories (heap.zeros, heap.empty, ...) or copy it with "
                "heap.as_symmetric()"
            )
        if not self.is_symmetric(tensor):
            raise ValueError(
                f"{name} is not on this symmetric heap (an ordinary {tensor.device} tensor, or another "
                "heap's); allocate it with the heap's factories (heap.zeros, heap.empty, ...) or copy it "
                "there with heap.as_symmetric()"
            )
        return tensor

    def empty(
        self, *size, dtype=None, device=None, requires_grad=False, out=None, **_torch_kwargs
    ) -> torch.Tensor:
        """Uninitialised tensor on the heap, like :func:`torch.empty`."""
        with torch.no_grad():
            return self._factory(size, dtype, device, requires_grad, out)

    def zeros(
        self, *size, dtype=None, device=None, requires_grad=False, out=None, **_torch_kwargs
    ) -> torch.Tensor:
        """Tensor of zeros on the heap, like :func:`torch.zeros`."""
        with torch.no_grad():
            return self._factory(size, dtype, device, requires_grad, out, fill=torch.Tensor.zero_)

    def ones(
        self, *size, dtype=None, device=None, requires_grad=False, out=None, **_torch_kwargs
    ) -> torch.Tensor:
        """Tensor of ones on the heap, like :func:`torch.ones`."""
        with torch.no_grad():
            return self._factory(size, dtype, device, requires_grad, out, fill=lambda t: t.fill_(1))

    def full(
        self, size, fill_value, *, dtype=None, device=None, requires_grad=False, out=None, **_
    ) -> torch.Tensor:
        """Tensor filled with ``fill_value`` on the heap, like :func:`torch.full`."""
        if dtype is None:
            dtype = torch.full((), fill_value).dtype
        with torch.no_grad():
            shape = (size,) if isinstance(size, int) else tuple(size)
            return self._factory(shape, dtype, device, requires_grad, out, fill=lambda t: t.fill_(fill_value))

    def rand(self, *size, generator=None, dtype=None, device=None, requires_grad=False, out=None, **_):
        """Uniform random numbers in [0, 1) on the heap, like :func:`torch.rand`."""
        with torch.no_grad():
            fill = lambda t: t.uniform_(0, 1, generator=generator)  # noqa: E731
            return self._factory(size, dtype, device, requires_grad, out, fill=fill)

    def randn(self, *size, generator=None, dtype=None, device=None, requires_grad=False, out=None, **_):
        """Standard normal random numbers on the heap, like :func:`torch.randn`."""
        with torch.no_grad():
            fill = lambda t: t.normal_(0, 1, generator=generator)  # noqa: E731
            return self._factory(size, dtype, device, requires_grad, out, fill=fill)

    def randint(self, *args, generator=None, dtype=None, device=None, requires_grad=False, out=None, **_):
        """Random integers in [low, high) on the heap: ``randint(high, size)`` or
        ``randint(low, high, size)``, like :func:`torch.randint` (default dtype int64)."""
        if len(args) == 2:
            low, (high, size) = 0, args
        elif len(args) == 3:
            low, high, size = args
        else:
            raise TypeError("randint takes (high, size) or (low, high, size)")
        if high <= low:
            raise ValueError(f"randint needs low < high, got low={low}, high={high}")
        with torch.no_grad():
            fill = lambda t: t.random_(low, high, generator=generator)  # noqa: E731
            return self._factory((tuple(size),), dtype, device, requires_grad, out, torch.int64, fill)

    def arange(self, start, end=None, step=1, *, dtype=None, device=None, requires_grad=False, out=None, **_):
        """1-D tensor from ``start`` to ``end`` (exclusive) in ``step``, like :func:`torch.arange`."""
        if end is None:
            start, end = 0, start
        values = torch.arange(start, end, step, dtype=dtype)
        return self._from_values(values, device, requires_grad, out)

    def linspace(self, start, end, steps, *, dtype=None, device=None, requires_grad=False, out=None, **_):
        """``steps`` evenly spaced values from ``start`` to ``end``, like :func:`torch.linspace`."""
        values = torch.linspace(start, end, steps, dtype=dtype)
        return self._from_values(values, device, requires_grad, out)

    def _from_values(self, values: torch.Tensor, device, requires_grad: bool, out) -> torch.Tensor:
        return self._factory(
            tuple(values.shape), values.dtype, device, requires_grad, out, fill=lambda t: t.copy_(values)
        )

    def zeros_like(self, input: torch.Tensor, *, dtype=None, requires_grad=False, **_) -> torch.Tensor:
        """Zeros on the heap with the shape (and dtype) of ``input``."""
        return self.zeros(tuple(input.shape), dtype=dtype or input.dtype, requires_grad=requires_grad)

    def ones_like(self, input: torch.Tensor, *, dtype=None, requires_grad=False, **_) -> torch.Tensor:
        """Ones on the heap with the shape (and dtype) of ``input``."""
        return self.ones(tuple(input.shape), dtype=dtype or input.dtype, requires_grad=requires_grad)

    def empty_like(self, input: torch.Tensor, *, dtype=None, requires_grad=False, **_) -> torch.Tensor:
        """Uninitialised heap tensor with the shape (and dtype) of ``input``."""
        return self.empty(tuple(input.shape), dtype=dtype or input.dtype, requires_grad=requires_grad)

    def as_symmetric(self, tensor: torch.Tensor) -> torch.Tensor:
        """A heap tensor holding a copy of ``tensor`` (same shape and dtype, contiguous).

        Collective by convention, like every allocation. A tensor already on the heap is
        returned as it is.
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"as_symmetric needs a torch.Tensor, got {type(tensor).__name__}")
        if self.is_symmetric(tensor):
            return tensor
        out = self.empty(tuple(tensor.shape), dtype=tensor.dtype)
        with torch.no_grad():
            out.copy_(tensor)
        return out

    def is_symmetric(self, tensor: torch.Tensor) -> bool:
        """Whether every byte ``tensor`` can address lies in this rank's heap."""
        if not isinstance(tensor, torch.Tensor) or self._closed:
            return False
        if tensor.device != self.device:
            return False
        start, end = self._span(tensor)
        return self._base <= start and end <= self._base + self.heap_size

    @staticmethod
    def _span(tensor: torch.Tensor) -> tuple[int, int]:
        """Addresses of the first byte ``tensor`` can address and one past its last."""
        if tensor.numel() == 0:
            # data_ptr() of an empty tensor is 0; its storage offset still says where it is.
            start = tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()
            return start, start
        lo = sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if st < 0)
        hi = sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if st > 0)
        start = tensor.data_ptr() + lo * tensor.element_size()
        return start, tensor.data_ptr() + (hi + 1) * tensor.element_size()

    def peer_tensor(self, tensor: torch.Tensor, rank: int) -> torch.Tensor:
        """A tensor of this process aliasing ``tensor``'s twin in ``rank``'s heap (same
        shape and dtype; ``tensor`` contiguous and on this heap).

        For host-issued transfers and inspection: ``peer.copy_(x)`` or ``x.copy_(peer)``
        moves the bytes over the link with the copy engines on GPUs (``cudaMemcpyAsync``
        on the peer mapping), with a plain memory copy on the CPU backend. Nothing orders
        it against the peer's own accesses: synchronise first (a device barrier, or a
        collective). ``rank`` may be this rank (``tensor`` itself is returned). Valid until
        the heap is closed.
        """
        self._check_open()
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"peer_tensor needs a torch.Tensor, got {type(tensor).__name__}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"peer_tensor: rank must be an int in [0, {self.world_size}), got {rank!r}")
        if not tensor.is_contiguous() or not self.is_symmetric(tensor):
            raise ValueError(
                "peer_tensor needs a contiguous tensor on this heap (made by its factories, or "
                "as_symmetric()); got one that is "
                + ("not contiguous" if not tensor.is_contiguous() else "not on the heap")
            )
        nbytes = tensor.numel() * tensor.element_size()
        if rank == self.rank or nbytes == 0:
            return tensor
        offset = tensor.data_ptr() - self._base
        raw = self._backend.heap_bytes(rank)[offset : offset + nbytes]
        return raw.view(tensor.dtype).view(tensor.shape)

    # ------------------------------------------------------------------ synchronisation
    def barrier(self) -> None:
        """Host barrier: wait for this rank's queued device work, then for every rank."""
        self._check_open()
        self._backend.synchronize()
        self.check_device_errors()
        self._comm.barrier()

    def device_barrier(self) -> None:
        """Device barrier, ordered on the current stream and capturable in a CUDA graph.

        Every rank signals every peer with a release store at system scope and waits
        (acquire) until all peers have reached the same barrier generation. Generations
        are counted on the device, so no state needs resetting between calls or graph
        replays. A wait longer than ``IRIS_WAIT_TIMEOUT`` seconds records an error that
        :meth:`check_device_errors` raises (at once on the CPU backend).
        """
        self._check_open()
        from .runtime import launch
        from .sync import device_barrier_kernel

        launch(device_barrier_kernel, 1, self._sync)

    def check_device_errors(self) -> None:
        """Raise the first error a device-side wait of this heap recorded, and clear it.

        Reads device memory: on GPUs call it after synchronising (``barrier()`` does).
        """
        self._sync.check()

    def broadcast(self, value: Any, src: int = 0) -> Any:
        """Broadcast a Python object or tensor from rank ``src``; returns it on every rank.

        Tensors come back on the heap's device (as ordinary tensors, not heap tensors).
        """
        self._check_open()
        if not isinstance(src, int) or not 0 <= src < self.world_size:
            raise ValueError(f"src={src!r} is not a rank of this heap (0..{self.world_size - 1})")
        payload = value.detach().cpu() if isinstance(value, torch.Tensor) else value
        result = self._comm.broadcast_object(payload if self.rank == src else None, src)
        if isinstance(result, torch.Tensor):
            return result.to(self.device)
        return result

    # ------------------------------------------------------------------ lifetime
    def abort(self, reason: str | None = None) -> None:
        """Stop this heap: every device-side wait of the kernels on it gives up, those running
        now (spinning on a peer that will never come) included, and every later use of the
        heap raises :class:`~iris.mem.AbortedError` (the running call raises it too).

        For frameworks that handle failures themselves. Safe from any thread, while a kernel
        spins; idempotent; :meth:`close` still releases the heap. The abort is this rank's
        own: peers stop when they abort too, or when this process exits (their watchdogs see
        it). The watchdog calls it when a peer process of the heap exits
        (:mod:`iris.mem.watchdog`).

        :param reason: said in the errors (default: "heap.abort() was called").
        """
        reason = reason or "heap.abort() was called"
        self._abort(
            AbortedError(
                f"rank {self.rank}: this symmetric heap was aborted ({reason}): its device-side waits were "
                "stopped and it cannot be used again; close it (and make a new heap to go on)",
                None,
                reason,
            )
        )

    def _abort_for_peer(self, peer, how: str, clean: bool) -> None:
        """The watchdog's stop: heap rank ``peer.rank``'s process exited, ``how``. A peer that
        failed (killed, an exception, a crash) aborts the heap. A peer whose program ended
        normally may have finished its part (a last send whose receiver has not run yet):
        only the waits on it stop, and raise; everything else goes on."""
        text = (
            f"rank {self.rank}: rank {peer.rank} of the symmetric heap (global rank {peer.global_rank}, "
            f"pid {peer.pid}) exited: {how}."
        )
        if not clean or peer.rank >= 63:
            self._abort(
                AbortedError(
                    f"{text} The heap was aborted: its device-side waits were stopped and it cannot be used "
                    "again",
                    peer.rank,
                    how,
                )
            )
            return
        with self._abort_lock:
            if self._aborted is not None or self._closed:
                return
            self._ended_errors[peer.rank] = AbortedError(f"{text} A wait for it was stopped", peer.rank, how)
            self._ended |= 1 << peer.rank
            mask = self._ended
        _log.info("%s", text)
        for state in list(self._sync_states):
            state.mark_ended(mask)

    def _abort(self, error: AbortedError) -> None:
        with self._abort_lock:
            if self._aborted is not None or self._closed:
                return
            self._aborted = error  # before the waits stop: the host raises this, not a timeout
        _log.warning("%s", error)
        for state in list(self._sync_states):
            state.stop()

    @property
    def aborted(self) -> bool:
        """Whether :meth:`abort` was called, or the watchdog aborted the heap (a peer
        process failed): every use of the heap raises :class:`~iris.mem.AbortedError`."""
        return self._aborted is not None

    def _raise_if_ended(self, rank: int) -> None:
        error = self._ended_errors.get(rank)
        if error is not None:
            raise AbortedError(str(error), error.rank, error.reason)

    def on_close(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` when :meth:`close` runs, before the heap's memory is released.

        For libraries that keep state on or about a heap (iris.ccl keeps the sync flags of
        collectives run in place on it): the callback drops it, so that closing the heap
        releases the mapping, its file descriptor and its pages. Callbacks run once, in the
        order they were registered, with :attr:`closed` already true; they must not use the
        heap. An exception in one is logged and the others still run. Not called when the
        heap is only garbage-collected or the interpreter exits.
        """
        self._check_open()
        self._close_callbacks.append(callback)

    def close(self) -> None:
        """Release this rank's heap and peer mappings. Tensors allocated on the heap must
        not be used by kernels afterwards. Idempotent; also run at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        _OPEN_HEAPS.discard(self)
        _CLOSED_STORAGES[:] = [r for r in _CLOSED_STORAGES if not r.expired()]
        _CLOSED_STORAGES.append(StorageWeakRef(self._heap.untyped_storage()))
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one library's failure must not keep the heap open
                _log.exception("heap.on_close callback %r failed", callback)
        self._finalizer()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> SymmetricHeap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.used_bytes}/{self.heap_size} bytes used"
        return (
            f"SymmetricHeap(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
            f"device={self.device}, {state})"
        )


def heap_of(tensor: torch.Tensor) -> SymmetricHeap | None:
    """The open heap of this process that ``tensor`` lies on, or None. In debug mode
    (``IRIS_DEBUG=1``) a tensor in a freed range of the heap raises
    :class:`~iris.mem.UseAfterFreeError`."""
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


def init(
    heap_size: int = 1 << 30,
    *,
    backend: str | None = None,
    group: dist.ProcessGroup | None = None,
) -> SymmetricHeap:
    """Create the symmetric heap of this job (collective: every rank of ``group`` calls it).

    :param heap_size: bytes per rank (rounded up to 256), the same on every rank.
    :param backend: ``"cpu"`` or ``"cuda"``; None reads ``IRIS_BACKEND``, else picks
        ``cuda`` when a GPU is visible and ``cpu`` otherwise.
    :param group: a torch.distributed group (``dist.new_group``) of which this process is a
        member; the heap spans its ranks, numbered by group rank. None is the world.
        torch.distributed is initialised from the launcher's environment (torchrun) if the
        caller has not; a lone process needs no launcher.
    """
    return SymmetricHeap(heap_size, backend=backend, group=group)
