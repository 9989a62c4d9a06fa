"""``Workspace``: the heap buffers and flags a fused op keeps between calls.

A workspace is prepared by the first call that uses it (collectively: every rank of the
group makes the same call) and bound to that call's signature: the op, the group, the
shapes, the dtype, the resolved :class:`~iris.ops.Config` and the heap. Later calls with
the same signature reuse it as it is: they allocate nothing and reset nothing (flags hold
call generations, see ``_sync.py``), so they can be captured in a CUDA graph and replayed.

Its buffers live on the heap of the op's output when that output is on a symmetric heap
spanning exactly the group (the op then writes peers' outputs in place); otherwise on a
heap the workspace makes for itself, sized to fit, and released by :meth:`Workspace.close`.

A workspace belongs to one process-group object, never to a member list: two groups with
the same members (``dist.new_group([0, 1])`` twice) are independent streams of calls, each
with its own flags. One on the output's heap is dropped when that heap closes
(:meth:`iris.mem.SymmetricHeap.on_close`), so closing the heap releases its memory.

The workspaces the ops keep for calls made without ``workspace=`` are a cache per group of at
most :data:`MAX_KEPT` (least recently used first out). Every rank of a group makes the same
calls in the same order, so every rank evicts the same workspace at the same call, without
exchanging anything; closing it is collective and synchronised (no peer still writes into
it). :func:`release_workspaces` (all groups, or one) and :func:`workspace_scope` (those made
inside a block) release them on request.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import weakref
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

import iris.mem
from iris.mem import CallMismatchError, SymmetricHeap
from iris.mem.log import get_logger
from iris.mem.runtime import STATUS_WORDS, SyncState, exchange

from ._sync import STATE_WORDS
from .config import MAX_PROGRAMS

_log = get_logger(__name__)

#: Every prepared workspace of this process (for :func:`check_errors`).
_LIVE: weakref.WeakSet = weakref.WeakSet()
#: Workspaces the ops keep for calls that pass none: per process-group object (weakly: the
#: entry goes with the group; the default group under its current ProcessGroup object), then
#: per signature, least recently used first.
_IMPLICIT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Most workspaces kept per group for calls made without ``workspace=``. A call with a new
#: signature beyond it first closes the least recently used one (collectively: the ranks
#: make the same calls, so they close the same one). Set it alike on every rank, before
#: the calls (shapes that vary call after call, such as decode batches, each keep one: pad
#: them to a few sizes to keep the workspaces prepared).
MAX_KEPT = 32
#: Open :func:`workspace_scope` blocks, innermost last: the (group, signature) of the
#: workspaces made inside each.
_SCOPES: list[list[tuple[weakref.ref, tuple]]] = []


class _AllGroups:
    """The type of :data:`ALL`."""

    def __repr__(self) -> str:
        return "ALL"


#: ``group`` of :func:`release_workspaces` when every group's workspaces go (its default).
ALL = _AllGroups()
#: Caller heaps that drop their workspaces when they close (one on_close callback each).
_WATCHED: weakref.WeakSet = weakref.WeakSet()
_ALIGN = 256


class Workspace:
    """Reusable state of one fused op: buffers and flags on a symmetric heap.

    Pass the same ``Workspace()`` to every call of one op with the same shapes, dtype,
    group and config; the first call prepares it. A call whose signature differs raises
    ``ValueError`` (make another workspace for it). Ops called without ``workspace=`` keep
    one per signature themselves (see :func:`release_workspaces`).

    Attributes: ``heap`` (the heap holding the buffers, None until prepared), ``op`` (the
    op it serves), ``buffers`` (name -> tensor).
    """

    def __init__(self) -> None:
        self.op: str | None = None
        self.heap: SymmetricHeap | None = None
        self.buffers: dict[str, torch.Tensor] = {}
        self.sync: SyncState | None = None
        self._signature: tuple | None = None
        self._group: weakref.ref | None = None  # the process-group object it serves
        self._owns_heap = False
        self._allocations: list[torch.Tensor] = []  # the heap tensors behind ``buffers``

    @property
    def prepared(self) -> bool:
        """Whether a call has prepared the workspace (and it is not closed)."""
        return self._signature is not None and self.heap is not None and not self.heap.closed

    def close(self) -> None:
        """Release the workspace: close its heap when it made one, else give its buffers
        back to the heap it used (:meth:`iris.mem.SymmetricHeap.free`). Collective: every
        rank closes its workspace; each first waits until every rank's work queued on it has
        finished (no peer still writes into it), so no barrier is needed before. A closed
        workspace can be prepared again."""
        heap = self.heap
        try:
            if self._owns_heap and heap is not None:
                if not heap.closed and not heap.aborted:
                    heap.barrier()  # every rank's kernels on it have finished: nobody writes here
            elif self.sync is not None:
                self.sync.release(*self._allocations)  # heap.free synchronises the ranks first
        finally:
            if self._owns_heap and heap is not None:
                heap.close()
            self._forget()

    def _forget(self) -> None:
        """Unbind from the heap and group (nothing of the heap is kept)."""
        self.heap, self.buffers, self._signature, self.op, self._owns_heap = None, {}, None, None, False
        self.sync, self._allocations, self._group = None, [], None
        _LIVE.discard(self)

    def check(self) -> None:
        """Raise the wait timeout a kernel of this workspace recorded, if any (reads device
        memory: call it after synchronising on GPUs)."""
        if self.sync is not None:
            self.sync.check()

    def __repr__(self) -> str:
        if not self.prepared:
            return "Workspace(unprepared)"
        nbytes = sum(t.numel() * t.element_size() for t in self.buffers.values())
        return f"Workspace(op={self.op!r}, {nbytes} bytes on {self.heap!r})"


def _group_key(group) -> dist.ProcessGroup:
    """The object a workspace is bound to for ``group`` (None: the default group)."""
    return dist.group.WORLD if group is None else group


def _describe(signature: tuple) -> str:
    names = ("op", "group ranks", "shapes", "dtype", "config", "heap")
    return ", ".join(f"{n}={v!r}" for n, v in zip(names, signature))


def _agree(signature: tuple, group) -> None:
    """Compare what every rank of ``group`` prepares a workspace for (the op, shapes, dtype,
    config, output kind and extra fields of ``signature``: the heap and the ranks are
    per-process): ranks that make different calls get a CallMismatchError naming both,
    instead of kernels waiting on each other's flags. Once per workspace."""
    op, _, shapes, dtype, cfg, (_, in_place_out), *extra = signature
    mine = f"iris.ops.{op}(shapes={shapes}, dtype={dtype}, config={cfg}, out on a heap={in_place_out}"
    mine += f", {extra[0]})" if extra and extra[0] else ")"
    calls = exchange(group, f"iris.ops.{op} workspace", mine, CallMismatchError)
    me = dist.get_rank(group) if group is not None else dist.get_rank()
    for rank, theirs in enumerate(calls):
        if theirs != mine:
            raise CallMismatchError(
                f"rank {me}: this rank called {mine}, but rank {rank} called {theirs}: every rank of the "
                "group must call the same op with the same shapes",
                me,
                rank,
                mine,
                theirs,
            )


def acquire(
    workspace: Workspace | None,
    signature: tuple,
    heap: SymmetricHeap | None,
    group,
    group_size: int,
    device: torch.device,
    specs: Sequence[tuple[str, int, torch.dtype]],
) -> Workspace:
    """The workspace to run a call with ``signature`` on, prepared if needed.

    :param workspace: the caller's workspace, or None for the op's own one per signature.
    :param heap: the heap to allocate on (the output's), or None to make one.
    :param specs: ``(name, elements, dtype)`` of the op's buffers; flags (int32) are zeroed.
    """
    key = _group_key(group)
    if workspace is None:
        workspace = _kept(key, signature)
    elif not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must be an iris.ops.Workspace or None, got {type(workspace).__name__}")
    if workspace.prepared:
        if workspace._signature != signature:
            raise ValueError(
                f"this workspace was prepared for {_describe(workspace._signature)}; this call has "
                f"{_describe(signature)}. Use one workspace per op and signature"
            )
        if workspace._group is None or workspace._group() is not key:
            raise ValueError(
                f"this workspace was prepared for another process group (ranks {list(signature[1])}): a "
                "workspace serves one group object, and groups with the same members are independent. "
                "Use one workspace per group"
            )
        return workspace
    _prepare(workspace, signature, heap, group, group_size, device, specs)
    workspace._group = weakref.ref(key)
    return workspace


def _kept(key, signature: tuple) -> Workspace:
    """The workspace the ops keep for ``signature`` on group ``key`` (unprepared when new),
    now the most recently used; making a new one beyond :data:`MAX_KEPT` first closes the
    least recently used (collective, the same one on every rank)."""
    table = _IMPLICIT.get(key)
    if table is None:
        table = _IMPLICIT[key] = collections.OrderedDict()
    workspace = table.get(signature)
    if workspace is not None and workspace.prepared:
        table.move_to_end(signature)
        return workspace
    for old, kept in list(table.items()):  # released ones (closed, or their heap closed) go first
        if not kept.prepared:
            del table[old]
    for old, kept in list(table.items()):
        if len(table) < max(MAX_KEPT, 1):
            break
        del table[old]
        kept.close()
    workspace = table[signature] = Workspace()
    if _SCOPES:
        _SCOPES[-1].append((weakref.ref(key), signature))
    return workspace


def _heap_closed(heap_ref: weakref.ref) -> None:
    """A caller's heap closed: its workspaces forget it (their buffers, flags and views of
    it), and the ops' own entries for it go."""
    heap = heap_ref()
    for workspace in list(_LIVE):
        if workspace.heap is heap:
            workspace._forget()
    for table in list(_IMPLICIT.values()):
        for signature, workspace in list(table.items()):
            if not workspace.prepared:
                del table[signature]


def _prepare(workspace, signature, heap, group, group_size, device, specs) -> None:
    if iris.mem.capturing(device):
        raise RuntimeError(
            f"iris.ops.{signature[0]}: the first call with a workspace prepares it (collectively, with "
            "allocations and a host barrier), which a CUDA graph cannot capture; call the op once with the "
            "same shapes before capturing"
        )
    op = signature[0]
    _agree(signature, group)
    every = [("state", STATE_WORDS, torch.int32)] + list(specs)
    owns = heap is None
    if owns:
        members, flags = (group_size, torch.int32), (MAX_PROGRAMS * group_size, torch.int32)
        sizes = [(n, dt) for _, n, dt in every] + [members, flags, (MAX_PROGRAMS, torch.int32)]
        sizes.append((STATUS_WORDS, torch.int64))
        nbytes = sum(-(-max(n, 1) * dt.itemsize // _ALIGN) * _ALIGN for n, dt in sizes) + (64 << 10)
        heap = iris.mem.init(nbytes, backend=iris.mem.capabilities(device).backend, group=group)
    buffers: dict[str, torch.Tensor] = {}
    allocations: list[torch.Tensor] = []
    sync = None
    try:
        # The workspace outlives the caller's heap.scope(), if any: it frees its buffers itself.
        with heap.unscoped():
            # Members are the group's heap ranks: the heap spans exactly the group, in group order.
            sync = SyncState(
                heap, range(group_size), MAX_PROGRAMS, f"iris.ops.{op}",
                "every rank of the group must call the same op with the same shapes. The workspace is "
                "no longer consistent: close it and use a new one",
            )  # fmt: skip
            for name, numel, dtype in every:  # at least one element each, so every pointer is valid
                make = heap.zeros if dtype in (torch.int32, torch.int64) else heap.empty
                allocations.append(make(max(numel, 1), dtype=dtype))
                buffers[name] = allocations[-1][:numel]
    except MemoryError as e:
        if owns:
            heap.close()
        elif sync is not None:  # every rank ran out at the same allocation: give back the rest
            sync.release(*allocations)
        raise MemoryError(
            f"{e}. iris.ops keeps its workspace on the heap of the output tensor when the output is on a "
            "symmetric heap; make that heap larger, or pass an output that is not on a heap"
        ) from None
    heap.barrier()  # every rank's flags are zero before any peer can signal them
    if not owns and heap not in _WATCHED:
        heap.on_close(functools.partial(_heap_closed, weakref.ref(heap)))
        _WATCHED.add(heap)
    workspace.op, workspace.heap, workspace.buffers, workspace.sync = op, heap, buffers, sync
    workspace._signature, workspace._owns_heap, workspace._allocations = signature, owns, allocations
    _log.debug(
        "workspace for %s prepared: %d buffers, %d bytes, on %s heap",
        _describe(signature),
        len(buffers),
        sum(b.numel() * b.element_size() for b in buffers.values()),
        "its own" if owns else "the output's",
    )
    _LIVE.add(workspace)


def release_workspaces(group=ALL) -> None:
    """Close the workspaces the ops keep for calls made without ``workspace=``: every group's
    (default), or those of ``group`` (a process group; None: the default group).

    Collective over each group concerned (every rank calls it), and safe by itself: each
    workspace waits until every rank's work queued on it has finished before it is freed,
    so no barrier is needed before the call. Also runs at interpreter exit through the
    heaps' finalizers."""
    keys = list(_IMPLICIT.keys()) if group is ALL else [_group_key(group)]
    for key in keys:
        table = _IMPLICIT.pop(key, None) or {}
        for workspace in list(table.values()):
            workspace.close()


@contextlib.contextmanager
def workspace_scope() -> Iterator[None]:
    """``with iris.ops.workspace_scope():`` releases, at the end of the block, the workspaces
    the ops made for calls inside it without ``workspace=`` (collectively, as
    :func:`release_workspaces` does); those made before stay. Scopes nest: an inner one
    releases its own. When the block raises, its workspaces are kept (a peer may not have
    raised: releasing waits for every rank) and go with the next release."""
    frame: list[tuple[weakref.ref, tuple]] = []
    _SCOPES.append(frame)
    try:
        yield
    finally:
        # by identity: an equal (empty) frame of another scope is not this one
        del _SCOPES[next(i for i, f in enumerate(_SCOPES) if f is frame)]
    for key_ref, signature in frame:
        key = key_ref()
        table = _IMPLICIT.get(key) if key is not None else None
        workspace = table.pop(signature, None) if table is not None else None
        if workspace is not None:
            workspace.close()


def check_errors() -> None:
    """Raise the first wait timeout any fused op of this process recorded.

    Where kernels are interpreted ops raise by themselves; on GPUs kernels only record the
    timeout, so call this after a synchronisation point (it synchronises the devices itself).
    """
    for workspace in list(_LIVE):
        if workspace.prepared:
            iris.mem.synchronize(workspace.heap.device)
            workspace.check()
