"""The symmetric heap: one equal-sized region per rank, allocated in lockstep.

Every rank allocates and frees the same sequence of tensors, so a tensor at byte offset
``o`` in this rank's heap has a twin at offset ``o`` in every peer's heap; a kernel reaches
the twin on rank ``r`` by translating its pointer with the table of heap bases (see
:func:`iris.mem.triton.translate`). Allocation is deterministic first fit
(:mod:`iris.mem._alloc`, records in :mod:`iris.mem._records`); memory comes back through
:meth:`SymmetricHeap.free`, :meth:`SymmetricHeap.scope` and :meth:`SymmetricHeap.close`,
never through garbage collection, whose order differs between ranks.

:class:`SymmetricHeap` itself maps the heaps (through a backend), turns allocations into
tensors and back, synchronises the ranks and owns the heap's lifetime (abort, close); its
torch-like factories come from :class:`iris.mem._factories.TensorFactories`.
"""

from __future__ import annotations

import contextlib
import numbers
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from . import _registry, settings, watchdog
from ._alloc import ALIGNMENT, MemoryStats
from ._factories import TensorFactories
from ._records import Allocation, AllocationTable
from .backends import Backend, create_backend
from .bootstrap import Communicator, ensure_initialized, exchange, resolve_group
from .errors import AbortedError, HeapMismatchError, UseAfterFreeError
from .log import get_logger
from .machine import Capabilities, capabilities, capturing, kept_tensor
from .nodes import node_group
from .runtime import SyncState, WaitStops, launch
from .sync import device_barrier_kernel
from .tracing import HeapTracing

_log = get_logger(__name__)

#: Layout of the device-context tensor:
#: ``[rank, world_size, heap_size, flags, base_0, ..., base_{world_size-1}, trace_buffer]``.
CONTEXT_HEADER = 4
CONTEXT_FLAG_DEBUG = 1


def _checked_size(heap_size: Any) -> int:
    if isinstance(heap_size, bool) or not isinstance(heap_size, numbers.Integral) or heap_size <= 0:
        raise ValueError(f"heap_size must be a positive number of bytes, got {heap_size!r}")
    return int(heap_size)


def _checked_backend(backend: str | None) -> str:
    name = backend if backend is not None else settings.default_backend()
    if name not in settings.BACKENDS:
        raise ValueError(f"backend={name!r} is not a backend; use one of {', '.join(settings.BACKENDS)}")
    return name


class SymmetricHeap(TensorFactories):
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
        requested = _checked_size(heap_size)
        heap_size = -(-requested // ALIGNMENT) * ALIGNMENT
        name = _checked_backend(backend)
        self._owns_process_group = ensure_initialized(name)
        # a heap spans one node: in a job over several, this node's ranks of the group
        self._comm = Communicator(node_group(resolve_group(group), name))
        self.rank: int = self._comm.rank
        self.world_size: int = self._comm.world_size
        self.heap_size: int = heap_size
        self.debug: bool = settings.debug()
        identities = self._agree_on_settings(name)
        self._check_minimum_size(requested)
        self._backend: Backend = create_backend(name, self._comm)
        self._closed = False
        self._stops = WaitStops()  # abort() and the watchdog stop the waits of the heap's kernels
        self._close_callbacks: list[Callable[[], object]] = []
        self._finalizer = weakref.finalize(self, self._backend.close)
        self._heap, bases = self._backend.map_heaps(heap_size, self._comm)
        self._base = self._heap.data_ptr()
        self._table = AllocationTable(heap_size, self.rank, self._comm.group, self.debug, self._locate)
        header = [self.rank, self.world_size, heap_size, CONTEXT_FLAG_DEBUG if self.debug else 0]
        # Kept for the heap's life: made outside any CUDA graph pool of this thread.
        self._context = kept_tensor(header + bases + [0], torch.int64, self.device)
        #: Device tracing of this heap: enable, reset, register, export (see :mod:`iris.mem.tracing`).
        self.tracing = HeapTracing(
            self._comm, self.device, self._context[-1:], self._base, heap_size,
            self._backend.synchronize, self._backend.interpreted, name,
        )  # fmt: skip
        # The device barrier's sync state, allocated first on every rank.
        self._sync = SyncState(
            self, range(self.world_size), 1, "device_barrier",
            "a rank did not reach the barrier: check that every rank calls device_barrier() the same "
            "number of times",
        )  # fmt: skip
        _registry.opened(self)
        # Peers may signal this rank's flags as soon as they leave init: zero them first.
        self._backend.synchronize()
        self._comm.barrier()
        watchdog.watch(self, identities)
        _log.debug("heap: %d bytes on %s, %d ranks", heap_size, self.device, self.world_size)

    def _agree_on_settings(self, backend: str) -> list[tuple]:
        """Check that every rank passed the same settings; returns every rank's watchdog
        identity (exchanged in the same round)."""
        mine = (self.heap_size, backend, self.debug)
        exchanged = exchange(
            self._comm.group, "iris.mem.init", (mine, watchdog.identity()), HeapMismatchError
        )
        chosen = [e[0] for e in exchanged]
        if len(set(chosen)) != 1:
            table = ", ".join(
                f"rank {r}: heap_size={s[0]} backend={s[1]} debug={s[2]}" for r, s in enumerate(chosen)
            )
            raise HeapMismatchError(f"ranks passed different settings to iris.mem.init(): {table}")
        return [e[1] for e in exchanged]

    def _check_minimum_size(self, requested: int) -> None:
        minimum = SyncState.heap_bytes(self.world_size, 1)  # the device barrier's, allocated first
        if self.heap_size < minimum:
            raise ValueError(
                f"heap_size={requested} bytes is below the minimum heap size of {minimum} bytes for "
                f"{self.world_size} rank(s): the heap keeps the sync flags of its device barrier there. "
                f"Pass heap_size >= {minimum} (plus what you allocate) to iris.mem.init()"
            )

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
        return self._table.allocator.in_use

    @property
    def free_bytes(self) -> int:
        """Bytes of this rank's heap not held by an allocation (possibly in several ranges:
        :meth:`memory_stats` gives the largest)."""
        return self.heap_size - self._table.allocator.in_use

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
        self._stops.raise_if_aborted()

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype, internal: bool = False) -> torch.Tensor:
        """A tensor on the heap. ``internal``: the heap's own bookkeeping (sync flags), left
        out of the caller's numbering, of the debug check and of scopes."""
        self._check_open()
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        record = self._table.allocate(shape, dtype, internal)
        return self._heap[record.offset : record.offset + record.nbytes].view(dtype).view(shape)

    def _undo(self, tensor: torch.Tensor) -> None:
        """Give back the allocation just made for ``tensor`` (a factory whose fill failed),
        as if it had not been made."""
        self._table.undo(self._offset_of(tensor))

    def _release_internal(self, tensors: list[torch.Tensor]) -> None:
        """Give back internal allocations on this rank alone (every rank fails alike while
        making a sync state, so none needs to wait for the others)."""
        self._table.release([self._table.owner(*self._locate(t)) for t in tensors])

    def _offset_of(self, tensor: torch.Tensor) -> int:
        return tensor.data_ptr() - self._base

    def _locate(self, tensor: torch.Tensor) -> tuple[int, int] | None:
        """Bytes ``[start, end)`` of the heap that ``tensor`` can address, as offsets, or
        None when it is not on this heap."""
        if not self.is_symmetric(tensor):
            return None
        start, end = self._span(tensor)
        return start - self._base, end - self._base

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
        self._release(self._table.records_of(tensors, "free"), sync)

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
        frame = self._table.open_scope()
        try:
            yield self
        except BaseException:
            self._table.release(self._table.close_scope(frame))
            raise
        self._release(self._table.close_scope(frame), sync=True)

    @contextlib.contextmanager
    def unscoped(self) -> Iterator[SymmetricHeap]:
        """Allocations made inside belong to no enclosing :meth:`scope`: for libraries that
        keep buffers beyond the caller's scope (iris.ops' workspaces) and free them
        themselves."""
        with self._table.unscoped():
            yield self

    def memory_stats(self) -> MemoryStats:
        """Bytes in use, free, peak, the largest free range, allocation counts
        (:class:`~iris.mem.MemoryStats`; ``.as_dict()`` for a dict). The heap's own sync
        flags count as in use."""
        return self._table.stats()

    def _release(self, records: list[Allocation], sync: bool) -> None:
        if not records:
            return
        if capturing(self.device):
            raise RuntimeError(
                "heap.free() and heap.scope() cannot run while a CUDA graph is captured: allocate and free "
                "outside the capture (the graph replays its kernels, not the host's bookkeeping)"
            )
        if sync:
            self._quiesce()
        self._table.release(records)

    def _quiesce(self) -> None:
        """Wait until every rank's queued work on the heap has finished (see :meth:`free`)."""
        if self._backend.interpreted:  # launches complete before they return
            self._comm.barrier()
        else:
            self.device_barrier()

    # ------------------------------------------------------------------ mapping
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

    def check_live(self, tensor: torch.Tensor, name: str = "tensor") -> None:
        """Raise :class:`~iris.mem.UseAfterFreeError` when ``tensor`` (on this heap) lies in a
        range that is not one live allocation. Iris's collectives and ops call it in debug
        mode; empty tensors always pass."""
        if tensor.numel() and self.is_symmetric(tensor) and self._table.owner(*self._locate(tensor)) is None:
            start, end = self._span(tensor)
            raise UseAfterFreeError(
                f"{name} ({list(tensor.shape)}, {tensor.dtype}) lies in bytes [{start - self._base}, "
                f"{end - self._base}) of the symmetric heap, which no live allocation holds: it (or the "
                "tensor it is a view of) was freed with heap.free() or at the end of a heap.scope()"
            )

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
        launch(device_barrier_kernel, 1, self._sync)

    def check_device_errors(self) -> None:
        """Raise the first error a device-side wait of this heap recorded, and clear it.

        Reads device memory: on GPUs call it after synchronising (``barrier()`` does). A
        closed heap has nothing to report.
        """
        if not self._closed:
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
        # The ended-peer mask is one int64 status word (bits 0-62 stay positive): a peer beyond
        # it cannot be stopped alone, so it aborts the heap like a failed one.
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
        if not self._closed and self._stops.peer_ended(
            peer.rank, AbortedError(f"{text} A wait for it was stopped", peer.rank, how)
        ):
            _log.info("%s", text)

    def _abort(self, error: AbortedError) -> None:
        if not self._closed and self._stops.abort(error):
            _log.warning("%s", error)

    @property
    def aborted(self) -> bool:
        """Whether :meth:`abort` was called, or the watchdog aborted the heap (a peer
        process failed): every use of the heap raises :class:`~iris.mem.AbortedError`."""
        return self._stops.error is not None

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
        _registry.closed(self, self._heap)
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one library's failure must not keep the heap open
                _log.exception("heap.on_close callback %r failed", callback)
        # The heap's own views of its memory go first (the sync state also holds the heap:
        # a cycle that would keep the mapping until the garbage collector runs), so the
        # mapping is released now unless the caller still holds tensors on it.
        self._sync = None
        self._heap = None
        self._table.forget_heap()
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
