"""The symmetric heap: one equal-sized region per rank, allocated in lockstep.

Every rank allocates the same sequence of tensors, so a tensor at byte offset ``o`` in
this rank's heap has a twin at offset ``o`` in every peer's heap; a kernel reaches the
twin on rank ``r`` by translating its pointer with the table of heap bases (see
:func:`iris.mem.triton.translate`).
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from . import settings as _settings
from .backends import Backend, create_backend
from .bootstrap import Communicator, ensure_initialized, resolve_group
from .errors import HeapMismatchError
from .log import get_logger
from .machine import Capabilities, capabilities

_log = get_logger(__name__)

#: Byte alignment of every allocation (enough for 16-byte vector accesses and 128-byte lines).
ALIGNMENT = 256
#: Layout of the device-context tensor:
#: ``[rank, world_size, heap_size, flags, base_0, ..., base_{world_size-1}, trace_buffer]``.
CONTEXT_HEADER = 4
CONTEXT_FLAG_DEBUG = 1

#: Every open heap of this process, so a tensor can be traced back to its heap.
_OPEN_HEAPS: weakref.WeakSet = weakref.WeakSet()


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
        heap_size = _align(int(heap_size))
        name = backend if backend is not None else _settings.default_backend()
        if name not in _settings.BACKENDS:
            raise ValueError(f"backend={name!r} is not a backend; use one of {', '.join(_settings.BACKENDS)}")
        self._owns_process_group = ensure_initialized(name)
        self._comm = Communicator(resolve_group(group))
        self.rank: int = self._comm.rank
        self.world_size: int = self._comm.world_size
        self.heap_size: int = heap_size
        self.debug: bool = _settings.debug()
        settings = self._comm.all_gather_object((heap_size, name, self.debug))
        if len(set(settings)) != 1:
            table = ", ".join(
                f"rank {r}: heap_size={s[0]} backend={s[1]} debug={s[2]}" for r, s in enumerate(settings)
            )
            raise HeapMismatchError(f"ranks passed different settings to iris.mem.init(): {table}")
        self._backend: Backend = create_backend(name, self._comm)
        self._closed = False
        self._finalizer = weakref.finalize(self, self._backend.close)
        self._heap, bases = self._backend.map_heaps(heap_size, self._comm)
        self._base = self._heap.data_ptr()
        self._offset = 0
        self._allocations = 0
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
        from .runtime import SyncState

        self._sync = SyncState(
            self, range(self.world_size), 1, "device_barrier",
            "a rank did not reach the barrier: check that every rank calls device_barrier() the same "
            "number of times",
        )  # fmt: skip
        _OPEN_HEAPS.add(self)
        # Peers may signal this rank's flags as soon as they leave init: zero them first.
        self._backend.synchronize()
        self._comm.barrier()
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
        """Bytes of this rank's heap handed out so far (including alignment padding)."""
        return self._offset

    @property
    def free_bytes(self) -> int:
        """Bytes of this rank's heap still free."""
        return self.heap_size - self._offset

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

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype, check: bool = True) -> torch.Tensor:
        self._check_open()
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        offset = self._offset
        end = offset + _align(nbytes)
        if end > self.heap_size:
            raise MemoryError(
                f"symmetric heap exhausted on rank {self.rank}: requested {nbytes} bytes "
                f"(shape {list(shape)}, {dtype}), {self.heap_size - offset} of {self.heap_size} bytes free; "
                "pass a larger heap_size to iris.mem.init()"
            )
        if check and self.debug:
            self._check_sequence(offset, nbytes, shape, dtype)
        self._offset = end
        if check:  # number user allocations from 0; internal ones come first on every rank
            self._allocations += 1
        return self._heap[offset : offset + nbytes].view(dtype).view(shape)

    def _check_sequence(self, offset: int, nbytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        entry = (self._allocations, offset, nbytes, tuple(shape), str(dtype))
        entries = self._comm.all_gather_object(entry)
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
            offset, allocations = self._offset, self._allocations
            tensor = self._allocate(shape, dtype)
        if fill is not None:
            try:
                with torch.no_grad():
                    fill(tensor)
            except Exception:
                if out is None:
                    self._offset, self._allocations = offset, allocations
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
        if tensor.numel() == 0:
            # data_ptr() of an empty tensor is 0; its storage offset still says where it is.
            start = end = (
                tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()
            )
        else:
            lo = sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if st < 0)
            hi = sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if st > 0)
            start = tensor.data_ptr() + lo * tensor.element_size()
            end = tensor.data_ptr() + (hi + 1) * tensor.element_size()
        return self._base <= start and end <= self._base + self.heap_size

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
    def close(self) -> None:
        """Release this rank's heap and peer mappings. Tensors allocated on the heap must
        not be used by kernels afterwards. Idempotent; also run at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        _OPEN_HEAPS.discard(self)
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
    """The open heap of this process that ``tensor`` lies on, or None."""
    for heap in list(_OPEN_HEAPS):
        if heap.is_symmetric(tensor):
            return heap
    return None


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
