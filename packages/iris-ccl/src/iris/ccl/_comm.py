"""Collective state: which heap a collective runs on, its sync flags and staging buffers.

A collective runs on a :class:`Communicator` bound to one symmetric heap whose ranks are
exactly the collective's group. When the caller's tensors already live on such a heap they
are used in place; otherwise the collective runs on a heap of its own for the group (made
on first use, collectively) and copies the caller's tensors through its staging buffers.
Send/recv run on a small heap of the group's own too, holding their mailboxes (:func:`p2p`).

The owner of a group may give it :class:`GroupSettings` (:func:`configure`): the size of
its own heap and how long device-side waits of its kernels poll.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

import iris.mem
from iris.mem import CallMismatchError, DeviceWaitTimeout, SymmetricHeap, runtime
from iris.mem import settings as mem_settings
from iris.mem.log import get_logger
from iris.mem.runtime import MAX_SLOTS, SyncState, exchange, group_ranks

from .settings import MIN_STAGING_BYTES, p2p_bytes, staging_bytes

_log = get_logger(__name__)

#: The staging buffers a communicator may make (iris.ccl's own heaps are sized for all).
STAGING_NAMES = ("in", "out", "acc", "locks", "push", "ll")
#: Those that kernels read flags or counters from, zeroed when made: on iris.ccl's own heaps
#: they are made with the communicator (see :class:`Communicator`).
ZEROED_STAGING = ("locks", "push", "ll")
#: Bytes of one point-to-point tile: a mailbox slot is split into tiles of this size, each
#: moved by one program with its own sequence counters (see p2p.py).
P2P_TILE_BYTES = 16 << 10


#: Bytes of iris.ccl's own heap for a group beyond its staging buffers: the sync state (up to
#: 800.5 KiB over 8 ranks) and small buffers (locks, ll banks).
OWN_HEAP_EXTRA_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class GroupSettings:
    """What the owner of a group sets for its Iris state (:func:`configure`).

    Attributes:
        heap_bytes: bytes of iris.ccl's own heap for the group; its staging buffers share
            what is left after :data:`OWN_HEAP_EXTRA_BYTES`. None: six staging buffers of
            ``IRIS_CCL_STAGING_BYTES``.
        wait_timeout: seconds a device-side wait of the group's kernels polls before it gives
            up, unless ``IRIS_WAIT_TIMEOUT`` is set (which wins). None: ``IRIS_WAIT_TIMEOUT``.
    """

    heap_bytes: int | None = None
    wait_timeout: float | None = None

    def staging_bytes(self, caps) -> int:
        """Bytes of each staging buffer of the group's own heap."""
        if self.heap_bytes is None:
            return staging_bytes(caps)
        each = (self.heap_bytes - OWN_HEAP_EXTRA_BYTES) // len(STAGING_NAMES) // 4096 * 4096
        if each < MIN_STAGING_BYTES:
            least = OWN_HEAP_EXTRA_BYTES + len(STAGING_NAMES) * MIN_STAGING_BYTES
            raise ValueError(
                f"heap_size {self.heap_bytes} is too small for a group's heap; use at least {least} bytes"
            )
        return each

    def heap_size(self, caps) -> int:
        """Bytes of the group's own heap."""
        if self.heap_bytes is not None:
            self.staging_bytes(caps)  # checks it is large enough
            return self.heap_bytes
        return len(STAGING_NAMES) * staging_bytes(caps) + OWN_HEAP_EXTRA_BYTES


#: The settings of groups whose owner gave some, keyed by the group object (weakly).
_SETTINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def configure(group: dist.ProcessGroup, settings: GroupSettings) -> None:
    """Give ``group`` its settings; before its first collective (its heap is made then)."""
    _SETTINGS[group] = settings


def settings_of(group: dist.ProcessGroup | None) -> GroupSettings:
    """The settings of ``group`` (None: the default group): defaults unless configured."""
    key = dist.group.WORLD if group is None else group
    return _SETTINGS.get(key, GroupSettings()) if key is not None else GroupSettings()


class _GroupSync(SyncState):
    """A sync state whose kernels wait at most ``wait_timeout`` seconds (when given and
    ``IRIS_WAIT_TIMEOUT`` is unset); ``limit`` caps it further for a while (a ``Work.wait``
    with a timeout, see :meth:`Communicator.wait_limit`)."""

    def __init__(self, *args, wait_timeout: float | None = None):
        super().__init__(*args)
        self.wait_timeout = wait_timeout
        self.limit: float | None = None

    def timeout(self) -> float | None:
        """Seconds a wait polls, when not ``IRIS_WAIT_TIMEOUT``'s; None otherwise."""
        own = self.wait_timeout if mem_settings.text("IRIS_WAIT_TIMEOUT") is None else None
        if self.limit is not None:
            return min(self.limit, own if own is not None else mem_settings.wait_timeout())
        return own

    def kernel_args(self) -> tuple:
        args = super().kernel_args()
        seconds = self.timeout()
        if seconds is None:
            return args
        # the wait budget in ns is the last leading argument (iris.mem.runtime)
        return (*args[:-1], max(1, round(min(seconds, 4e9) * 1e9)))

    def check(self) -> None:
        try:
            super().check()
        except DeviceWaitTimeout as e:
            seconds = self.timeout()
            said = f"IRIS_WAIT_TIMEOUT={mem_settings.wait_timeout():g} s"
            if seconds is None or said not in str(e):
                raise
            raise DeviceWaitTimeout(str(e).replace(said, f"{seconds:g} s (the group's timeout)")) from None


def p2p_heap_bytes(group_size: int) -> int:
    """Heap bytes of the send/recv state of a group: mailboxes and counters (with slack)."""
    tiles = p2p_bytes(P2P_TILE_BYTES) // P2P_TILE_BYTES
    return group_size * p2p_bytes(P2P_TILE_BYTES) + 4 * group_size * tiles * 4 + (64 << 10)


class Communicator:
    """Sync state and staging of collectives over ``group`` on ``heap``."""

    def __init__(
        self, heap: SymmetricHeap, ranks: Sequence[int], owns_heap: bool,
        settings: GroupSettings | None = None, p2p: bool = False,
    ):  # fmt: skip
        settings = settings or GroupSettings()
        self.heap = heap
        self.owns_heap = owns_heap
        self.global_ranks = list(ranks)
        heap_ranks = heap.global_ranks
        self.members = [heap_ranks.index(r) for r in self.global_ranks]
        self.size = len(self.members)
        self.index = self.members.index(heap.rank)
        self.sync = _GroupSync(
            heap, self.members, MAX_SLOTS, "a collective",
            "every rank of the group must call the same collectives in the same order with the same sizes "
            "and tensors of the same kind (all on a symmetric heap spanning the group, or none)",
            wait_timeout=settings.wait_timeout,
        )  # fmt: skip
        self.capabilities = heap.capabilities
        #: Bytes of each staging buffer (on iris.ccl's own heap: as the group's settings say).
        caps = self.capabilities
        self.staging_bytes = settings.staging_bytes(caps) if owns_heap else staging_bytes(caps)
        #: The call signature the kernels launched now publish (see :meth:`signed`).
        self.sig = 0
        self._side_streams: list | None = None
        self._staging: dict[str, torch.Tensor] = {}
        # send/recv state, on a group's send/recv heap only (see p2p.py): one mailbox slot
        # per sender, and int32 counters [4 (seq, ack, sent, received), size, tiles].
        self.p2p_mailbox = self.p2p_counters = None
        # The communicator keeps its buffers for the group's life: on the caller's heap they
        # belong to no heap.scope() of the caller (which would free them at its end).
        with heap.unscoped():
            if p2p:
                nbytes = p2p_bytes(P2P_TILE_BYTES)
                self.p2p_mailbox = heap.empty(self.size * nbytes, dtype=torch.uint8)
                self.p2p_counters = heap.zeros(4 * self.size * (nbytes // P2P_TILE_BYTES), dtype=torch.int32)
            elif owns_heap:
                # Buffers whose flags and counters peers write must be zero on every member
                # before any peer writes them: zeroed here, before the barrier that ends the
                # making of the communicator, so that no call needs a host barrier of its own
                # later (made on first use they cost one, in the middle of a call that has none
                # otherwise).
                for name in ZEROED_STAGING:
                    self._staging[name] = heap.zeros(self.staging_bytes, dtype=torch.uint8)
        heap.barrier()
        _log.debug(
            "communicator for group %s on %s heap (%d bytes, %s)",
            self.global_ranks,
            "its own" if owns_heap else "the caller's",
            heap.heap_size,
            heap.device,
        )

    @property
    def device(self) -> torch.device:
        return self.heap.device

    def side_streams(self) -> list:
        """Two CUDA streams of this communicator's device for work that overlaps the
        caller's stream (copy_engine), made on first use."""
        if self._side_streams is None:
            self._side_streams = [torch.cuda.Stream(self.device) for _ in range(2)]
        return self._side_streams

    def staging(self, name: str, nbytes: int, zero: bool = False) -> torch.Tensor:
        """A uint8 heap buffer of at least ``nbytes`` named ``name`` (one of
        :data:`STAGING_NAMES`). Made on first use of the name (collective: every member makes
        the same calls), zeroed then if ``zero``."""
        if name not in STAGING_NAMES:
            raise RuntimeError(f"internal: staging buffer {name!r} is not one of {STAGING_NAMES}")
        buf = self._staging.get(name)
        if buf is None:
            with self.heap.unscoped():  # kept by the communicator, beyond any scope of the caller
                buf = self.heap.empty(max(nbytes, self.staging_bytes), dtype=torch.uint8)
            _log.debug("staging buffer %r: %d bytes, group %s", name, buf.numel(), self.global_ranks)
            if zero:
                buf.zero_()
                self.heap.barrier()
            self._staging[name] = buf
        if buf.numel() < nbytes:
            raise RuntimeError(
                f"internal: staging buffer {name!r} holds {buf.numel()} bytes, {nbytes} needed"
            )
        return buf

    def staging_like(self, name: str, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A flat heap tensor with ``like``'s element count (and dtype, unless given)."""
        dtype = dtype or like.dtype
        buf = self.staging(name, like.numel() * dtype.itemsize)
        return buf[: like.numel() * dtype.itemsize].view(dtype)

    def staged_copy(self, name: str, src: torch.Tensor) -> torch.Tensor:
        """``src`` copied into the staging buffer ``name``."""
        buf = self.staging_like(name, src)
        buf.copy_(src)
        return buf

    @contextlib.contextmanager
    def signed(self, what: str, **fields) -> Iterator[None]:
        """Kernels launched inside publish the call signature of ``what`` and ``fields``
        (:func:`iris.mem.runtime.call_signature`): what every member must pass alike."""
        self.sig = runtime.call_signature(what, **fields)
        try:
            yield
        finally:
            self.sig = 0

    def check(self) -> None:
        """Raise the first wait timeout or call mismatch a kernel of this communicator
        recorded (reads device memory: after a synchronisation where kernels run
        asynchronously). After a mismatch the members' sync slots are out of step: the
        communicator is dropped, and the group's next collective makes a new one."""
        try:
            self.sync.check()
        except CallMismatchError:
            discard(self)
            raise

    def kernel_args(self) -> tuple:
        """Leading arguments of every collective kernel (see :mod:`iris.mem.runtime`)."""
        return self.sync.kernel_args()

    def kernel_meta(self) -> dict:
        """Leading constexprs of every collective kernel."""
        return self.sync.kernel_meta()

    @contextlib.contextmanager
    def wait_limit(self, seconds: float | None) -> Iterator[None]:
        """Kernels launched inside give up their device-side waits after at most ``seconds``
        (None: no change)."""
        previous = self.sync.limit
        if seconds is not None:
            self.sync.limit = seconds if previous is None else min(previous, seconds)
        try:
            yield
        finally:
            self.sync.limit = previous


#: The communicators of each torch.distributed group, keyed by the group object (weakly: the
#: entry goes with the group; the default group under its current ProcessGroup object):
#: ``{None: on iris.ccl's own heap, heap: on that heap, in place, P2P: send/recv's}``. Never
#: keyed by the member list: two groups with the same members are independent streams of
#: collectives (torch's ``dist.new_group([0, 1])`` twice), each with its own sync flags and
#: staging buffers.
_BY_GROUP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _communicators(group: dist.ProcessGroup | None) -> dict:
    """The communicators of ``group`` (None: the default group); made empty on first use,
    after forgetting those of destroyed groups (:func:`_forget_destroyed`)."""
    key = dist.group.WORLD if group is None else group
    table = _BY_GROUP.get(key)
    if table is None:
        _forget_destroyed()
        table = _BY_GROUP[key] = {}
    return table


def _destroyed(group: dist.ProcessGroup) -> bool:
    """Whether torch.distributed has destroyed ``group`` (it no longer knows its ranks)."""
    try:
        dist.get_process_group_ranks(group)
    except Exception:  # noqa: BLE001 - KeyError in torch 2.x; whatever a later torch raises
        return True
    return False


def _forget_destroyed() -> None:
    """Drop the communicators of groups that torch.distributed has destroyed, closing
    iris.ccl's own heaps under them. The table is keyed weakly by the group, but a group's
    own heap holds the group (its host collectives run over it), so an entry would keep its
    key, and a heap a rank, alive forever. A destroyed group runs nothing more: its members
    have left its collectives. Checked when a group is first used (rare: a new group), so
    a destroyed group's state goes at the next first use of a group, or at exit."""
    for key in list(_BY_GROUP.keys()):
        if _destroyed(key):
            for comm in _BY_GROUP.pop(key, {}).values():
                if comm.owns_heap:
                    comm.heap.close()


def _every_communicator() -> list[Communicator]:
    return [comm for table in list(_BY_GROUP.values()) for comm in list(table.values())]


def spanning_heap(tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> SymmetricHeap | None:
    """The open heap holding every tensor of ``tensors``, when that heap spans exactly
    ``group`` and every tensor is contiguous on it; else None."""
    heap = iris.mem.heap_of(tensors[0]) if tensors else None
    if heap is None or heap.global_ranks != group_ranks(group):
        return None
    if not all(t.is_contiguous() and heap.is_symmetric(t) for t in tensors):
        return None
    return heap


def in_place(
    tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None, collective: str = "a collective"
) -> Communicator | None:
    """The communicator of :func:`spanning_heap` (the tensors are used in place), or None
    (the collective must stage).

    Every rank must pass tensors of the same kind (all on such a heap, or not), so that all
    ranks make the same choice: the first call of each kind over a group checks it (see
    :func:`_agree`); later ones would wait on different flags until ``IRIS_WAIT_TIMEOUT``.
    """
    heap = spanning_heap(tensors, group)
    if heap is None:
        return None
    table = _communicators(group)
    comm = table.get(heap)
    if comm is None:
        _agree(group, collective, heap_kind(heap))
        comm = table[heap] = Communicator(heap, group_ranks(group), owns_heap=False)
        # closing the heap drops the communicator (its flags hold the heap's memory)
        heap.on_close(functools.partial(table.pop, heap, None))
    return comm


def own(
    group: dist.ProcessGroup | None,
    device: torch.device,
    collective: str = "a collective",
    kind: str | None = None,
) -> Communicator:
    """The communicator on iris.ccl's own heap for ``group`` (made on first use, collectively;
    the group's :class:`GroupSettings`, else ``IRIS_CCL_STAGING_BYTES``, size it). ``kind``:
    what the call that makes it runs on, which the ranks agree on first (:func:`_agree`;
    default :data:`STAGED`: the caller's tensors are copied through this heap)."""
    ranks = group_ranks(group)  # validates group
    table = _communicators(group)
    comm = table.get(None)
    if comm is None or comm.heap.closed:
        caps = iris.mem.capabilities(device)
        settings = settings_of(group)
        size = settings.heap_size(caps)
        _agree(group, collective, kind or STAGED)
        heap = iris.mem.init(size, backend=caps.backend, group=group)
        comm = table[None] = Communicator(heap, ranks, owns_heap=True, settings=settings)
        # send/recv's heap too, if the group has none: a later send/recv between two of its
        # ranks need not wait for the others
        p2p(group, device)
    return comm


#: The key of a group's send/recv communicator in its table.
P2P = "p2p"


def p2p(group: dist.ProcessGroup | None, device: torch.device) -> Communicator:
    """The communicator of send/recv over ``group``: on a small heap of its own holding one
    mailbox per sender (``IRIS_CCL_P2P_BYTES``) on every rank. Made on first use,
    collectively (the ``iris`` backend makes it when it makes a group; :func:`own` when it
    makes the group's own heap)."""
    ranks = group_ranks(group)
    table = _communicators(group)
    comm = table.get(P2P)
    if comm is None or comm.heap.closed:
        caps = iris.mem.capabilities(device)
        size = p2p_heap_bytes(len(ranks)) + SyncState.heap_bytes(len(ranks), MAX_SLOTS) + (1 << 20)
        heap = iris.mem.init(size, backend=caps.backend, group=group)
        # the group's device-wait budget; the size is the mailboxes'
        settings = GroupSettings(wait_timeout=settings_of(group).wait_timeout)
        comm = table[P2P] = Communicator(heap, ranks, owns_heap=True, settings=settings, p2p=True)
    return comm


#: The kind of a call whose tensors are copied through iris.ccl's own heap.
STAGED = "staged through iris.ccl's own heap"


def heap_kind(heap: SymmetricHeap) -> str:
    """The kind of a call whose tensors are used in place on ``heap``."""
    return f"in place on a heap of {heap.heap_size} bytes"


def _agree(group: dist.ProcessGroup | None, collective: str, kind: str) -> None:
    """Before a communicator is made (host collectives over the group follow): every rank
    must be making one of the same kind, else the same ``ValueError`` on every rank.

    A rank whose tensors are on a heap spanning the group and a rank whose tensors are not
    would make different communicators, with different host collectives: they would hang in
    them until the group's timeout. Making state costs host collectives anyway, so this check
    costs nothing per call; once both kinds exist for a group, mismatched calls wait on
    different flags and give up after ``IRIS_WAIT_TIMEOUT`` (debug mode checks every call)."""
    ranks = group_ranks(group)
    entries = exchange(group, "iris.ccl communicator", (collective, kind), ValueError, names=ranks)
    kinds = [k for _, k in entries]
    if len(set(kinds)) == 1:
        return
    groups: dict[str, list[int]] = {}
    for rank, k in zip(ranks, kinds):
        groups.setdefault(k, []).append(rank)
    passed = " and ".join(
        f"ranks {members} passed "
        + (
            "tensors on a symmetric heap spanning the group (" + k + ")"
            if k != STAGED
            else f"other tensors ({k})"
        )
        for k, members in groups.items()
    )
    calls = sorted({c for c, _ in entries})
    raise ValueError(
        f"{' / '.join(calls)}: {passed}. Every rank must pass tensors of the same kind: all on a symmetric "
        "heap spanning the group (heap.zeros, heap.as_symmetric, ...; used in place), or none (copied "
        "through iris.ccl's own heap)"
    )


def check_errors() -> None:
    """Raise the first wait timeout any collective of this process recorded.

    Where kernels are interpreted collectives raise by themselves; on GPUs kernels only
    record the timeout, so call this after a synchronisation point (it synchronises the
    device itself).
    """
    for comm in _every_communicator():
        if not comm.heap.closed:
            iris.mem.synchronize(comm.device)
            comm.check()


def discard(comm: Communicator) -> None:
    """Forget ``comm`` (its sync state is unusable): the next collective of its group makes a
    new one; iris.ccl's own heap under it is closed (the caller's heap keeps the state's
    memory until it is closed)."""
    for table in list(_BY_GROUP.values()):
        for key, value in list(table.items()):
            if value is comm:
                table.pop(key, None)
    if comm.owns_heap:
        comm.heap.close()


def abort(group: dist.ProcessGroup | None = None, reason: str | None = None) -> None:
    """Stop the collectives of ``group`` (None: the default group), running ones included:
    abort every heap they run on (:meth:`iris.mem.SymmetricHeap.abort`): iris.ccl's own heap
    of the group, and the heaps of the caller on which its collectives ran in place. Their
    device-side waits give up at once, and every later collective on those heaps (and any
    other use of them) raises :class:`iris.mem.AbortedError`. For frameworks that handle
    failures themselves; safe from any thread; this rank's own (each rank calls it, or the
    peers' watchdogs stop them when this process exits). Close the heaps you made yourself;
    a group whose collectives were aborted cannot be used with iris.ccl again (make a new
    one)."""
    key = dist.group.WORLD if group is None else group
    if key is None:  # torch.distributed is not initialised: no collective ran
        return
    for comm in list(_BY_GROUP.get(key, {}).values()):
        comm.heap.abort(reason or "iris.ccl.abort() was called")


def close_all() -> None:
    """Close the heaps iris.ccl made for itself (also at interpreter exit)."""
    for comm in _every_communicator():
        if comm.owns_heap:
            comm.heap.close()
    _BY_GROUP.clear()
