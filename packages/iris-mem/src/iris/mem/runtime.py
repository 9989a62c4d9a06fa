"""The runtime of kernels whose programs wait for their twins on other ranks.

Every such kernel (the heap's device barrier, every collective of iris.ccl, every fused op
of iris.ops) runs over a :class:`SyncState` on a symmetric heap: the member table of its
group, one sync slot per program (a flag per member and a generation counter, see
:func:`iris.mem.triton.sync.group_sync`) and the status words in which a wait that gave up
records what it waited for. :func:`launch` starts such a kernel with the state's leading
arguments and constexprs, never with more programs than the device keeps resident, and on
machines where kernels finish before their launch returns, raises what they recorded.

The leading arguments of every such kernel, in order: the heap's context tensor, the member
table (int32 heap ranks), the flags, the generations, the status words and the wait budget
in ns; its leading constexprs: ``RANK``, ``WORLD`` (the heap's), ``GROUP``, ``ME`` (the
group's size and this rank's index in it). ``iris.mem.triton.Group.initialize`` takes them.
"""

from __future__ import annotations

import threading
import weakref
import zlib
from collections.abc import Sequence
from typing import Any

import torch
from triton.runtime.errors import InterpreterError
from triton.runtime.jit import JITFunction

from . import settings
from ._alloc import ALIGNMENT

# Host-group helpers that kernels' callers need beside the runtime; they live with the other
# host collectives, and stay importable from here.
from .bootstrap import exchange, group_index, group_ranks, job_store
from .errors import AbortedError, CallMismatchError, DeviceWaitTimeout
from .machine import Capabilities
from .triton._compat import compiled_kernel_error, iris_error_of

#: int64 status words of a sync state: ``[code, rank, peer, flag address]`` that a waiting
#: kernel writes, then the mask of the heap ranks whose process has ended (the host sets it:
#: waits on those ranks stop).
STATUS_WORDS = 5
#: ``code`` of a wait that gave up (``iris.mem.utils.record_timeout`` writes it).
STATUS_TIMEOUT = 1
#: ``code`` the host posts to stop every wait over the state (an aborted heap; waits poll it,
#: see :func:`iris.mem.utils.keep_waiting`).
STATUS_ABORTED = 2
#: ``code`` of a barrier that found a peer making another call (``record_mismatch`` writes it).
STATUS_MISMATCH = 3
#: Sync slots (programs per launch) a state may have at most.
MAX_SLOTS = 8192


def _layout(members: int, slots: int) -> tuple[tuple[int, torch.dtype], ...]:
    """``(elements, dtype)`` of a state's arrays: member table, flags (per slot: a flag per
    member, then two call signatures per member), generations, status."""
    return (
        (members, torch.int32),
        (slots * members * 3, torch.int32),
        (slots, torch.int32),
        (STATUS_WORDS, torch.int64),
    )


class SyncState:
    """Sync slots and status words of one group of ranks on one heap.

    :param heap: the :class:`~iris.mem.SymmetricHeap` holding the state (every member's, at
        the same offsets).
    :param members: the members' ranks on ``heap`` (heap ranks, in group order; this rank
        among them).
    :param slots: sync slots, one per program of the largest launch.
    :param what: names the kernels in error messages ("a collective", "iris.ops.x", ...).
    :param advice: the sentence that ends a wait-timeout message.

    Allocation is collective: every member makes the same states in the same order.
    """

    def __init__(self, heap, members: Sequence[int], slots: int, what: str, advice: str):
        if not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots must be in [1, {MAX_SLOTS}], got {slots}")
        self.heap = heap
        self.members = list(members)
        self.size = len(self.members)
        self.index = self.members.index(heap.rank)
        self.slots = slots
        self.what, self.advice = what, advice
        # Not the caller's allocations: left out of the debug check of allocation sequences.
        made: list[torch.Tensor] = []
        try:
            for numel, dtype in _layout(self.size, slots):
                made.append(heap._allocate((numel,), dtype, internal=True).zero_())
        except MemoryError:  # every rank fails at the same allocation: give back the others
            heap._release_internal(made)
            raise
        self.member_table, self.flags, self.epochs, self.status = made
        self.member_table.copy_(torch.tensor(self.members, dtype=torch.int32))
        heap._stops.add(self)  # stopped when the heap is aborted, or a peer ends

    @staticmethod
    def heap_bytes(members: int, slots: int) -> int:
        """Bytes of a heap that a state of ``members`` ranks and ``slots`` sync slots takes:
        its member table, flags, generations and status words, each rounded up to the heap's
        alignment (256 bytes). A collective's communicator (8192 slots) over 2, 3, 4 or 8
        ranks takes 224.5, 320.5, 416.5 or 800.5 KiB; the heap's device barrier (1 slot) 1 KiB."""
        sizes = (numel * dtype.itemsize for numel, dtype in _layout(members, slots))
        return sum(-(-nbytes // ALIGNMENT) * ALIGNMENT for nbytes in sizes)

    @property
    def capabilities(self) -> Capabilities:
        return self.heap.capabilities

    def stop(self) -> None:
        """Stop every wait of the kernels over this state, running or later ones (``status``
        code :data:`STATUS_ABORTED`, posted without waiting for them). Any thread."""
        self.heap._backend.post(self.status[:1], STATUS_ABORTED)

    def mark_ended(self, mask: int) -> None:
        """Stop the waits over this state on the heap ranks of ``mask`` (bit ``r``: rank
        ``r``'s process has ended), running or later ones. Any thread."""
        self.heap._backend.post(self.status[4:5], mask)

    def release(self, *buffers: torch.Tensor) -> None:
        """Give the state's memory (and ``buffers``, heap tensors kept beside it) back to the
        heap: collective over the heap's ranks, after a synchronisation
        (:meth:`~iris.mem.SymmetricHeap.free`). Kernels must not use the state afterwards.
        Nothing to give back on a closed or aborted heap."""
        if not self.heap.closed and not self.heap.aborted:
            self.heap.free(*buffers, self.member_table, self.flags, self.epochs, self.status)

    def kernel_args(self) -> tuple:
        """The leading arguments of a kernel over this state (see the module docstring)."""
        return (
            self.heap.get_device_context(),
            self.member_table,
            self.flags,
            self.epochs,
            self.status,
            settings.wait_budget_ns(),
        )

    def kernel_meta(self) -> dict:
        """The leading constexprs of a kernel over this state."""
        return {"RANK": self.heap.rank, "WORLD": self.heap.world_size, "GROUP": self.size, "ME": self.index}

    def describe(self, address: int) -> str:
        """``"flag at 0x..."``, and when the address is one of the sync flags its slot, this
        rank's generation of it and what every member has published there (its own entry is
        its own generation: a member publishes only to its peers). A member below the
        generation has not reached that barrier; all at it means the ranks are in step and
        the peer came later than the timeout. Reads device memory: synchronise first."""
        where = f"flag at {address:#x}"
        offset = address - self.flags.data_ptr()
        if not 0 <= offset < self.flags.numel() * self.flags.element_size():
            return where
        slot = offset // self.flags.element_size() // (3 * self.size)
        published = self.flags[3 * slot * self.size : (3 * slot + 1) * self.size].tolist()
        generation = int(self.epochs[slot])
        published[self.index] = generation
        return f"{where}: sync slot {slot}, generation {generation} here, members published {published}"

    def check(self) -> None:
        """Raise the first wait timeout a kernel over this state recorded, as
        :class:`~iris.mem.DeviceWaitTimeout`, and clear it. Reads device memory: on machines
        where kernels run asynchronously, call it after synchronising."""
        code, rank, peer, address, _ = (int(v) for v in self.status.tolist())
        if self.heap.aborted:
            # Raise when a wait of the launch was cut short (or the status cannot tell); a launch
            # whose waits were all met before the abort (a peer that failed after it) stands.
            if code != STATUS_ABORTED or any((rank, peer, address)):
                self.status[1:4].zero_()
                self.heap._stops.raise_if_aborted()
            return
        if code == 0:
            return
        self.status[:4].zero_()
        if code == STATUS_TIMEOUT:
            self.heap._stops.raise_if_ended(peer)  # the wait was on a peer whose process has ended
        if code == STATUS_MISMATCH:
            self._raise_mismatch(rank, peer, address)
        if code != STATUS_TIMEOUT:
            raise DeviceWaitTimeout(f"rank {rank}: {self.what}: device-side wait failed with code {code}")
        raise DeviceWaitTimeout(
            f"rank {rank}: {self.what} gave up waiting for rank {peer} ({self.describe(address)}) after "
            f"IRIS_WAIT_TIMEOUT={settings.wait_timeout():g} s; {self.advice}"
        )

    def _raise_mismatch(self, packed: int, peer: int, theirs: int) -> None:
        rank, mine = packed & 0xFFFFFFFF, packed >> 32
        mine_text, theirs_text = describe_signature(mine), describe_signature(theirs)
        raise CallMismatchError(
            f"rank {rank}: {self.what}: this rank called {mine_text}, but rank {peer} called {theirs_text}. "
            f"{self.advice}",
            rank,
            peer,
            mine_text,
            theirs_text,
        )


class WaitStops:
    """What stops the device-side waits of the kernels over one heap's sync states, from any
    thread and at once (running kernels poll their status words): an abort stops every wait
    for good (:meth:`abort`); a peer whose program ended normally stops only the waits on
    that peer (:meth:`peer_ended`), since it may have finished its part. Every heap has one
    (``heap._stops``); each :class:`SyncState` adds itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the watchdog's thread and the caller's may stop at once
        self._states: weakref.WeakSet = weakref.WeakSet()
        self.error: AbortedError | None = None  # the abort, once there was one
        self.ended = 0  # mask of the heap ranks whose program ended normally
        self._ended_errors: dict[int, AbortedError] = {}

    def add(self, state: SyncState) -> None:
        """Stop ``state``'s waits too: at once when the heap was aborted, and on the peers
        that have ended so far."""
        self._states.add(state)
        if self.error is not None:
            state.stop()
        elif self.ended:
            state.mark_ended(self.ended)

    def abort(self, error: AbortedError) -> bool:
        """Stop every wait, for good; ``error`` is what the heap raises from now on. False
        when an earlier abort stands."""
        with self._lock:
            if self.error is not None:
                return False
            self.error = error  # before the waits stop: the host raises this, not a timeout
        for state in list(self._states):
            state.stop()
        return True

    def peer_ended(self, rank: int, error: AbortedError) -> bool:
        """Stop the waits on heap rank ``rank``, whose program ended; a wait that was cut
        short raises ``error``. False when the heap was aborted already."""
        with self._lock:
            if self.error is not None:
                return False
            self._ended_errors[rank] = error
            self.ended |= 1 << rank
            mask = self.ended
        for state in list(self._states):
            state.mark_ended(mask)
        return True

    def raise_if_aborted(self) -> None:
        error = self.error
        if error is not None:
            raise AbortedError(str(error), error.rank, error.reason)

    def raise_if_ended(self, rank: int) -> None:
        error = self._ended_errors.get(rank)
        if error is not None:
            raise AbortedError(str(error), error.rank, error.reason)


#: Signature -> description of the calls this process made (bounded: the oldest go first).
_DESCRIPTIONS: dict[int, str] = {}
_SIGNATURES: dict[tuple, int] = {}
_MAX_SIGNATURES = 4096
_SIGNATURE_KEY = "iris/call"


def call_signature(what: str, **fields: Any) -> int:
    """The signature of a call that every member of a group must make alike: a positive
    int32 hash of ``what`` ("all_reduce", ...) and ``fields`` (element count, dtype,
    reduction, root, variant...), which kernels publish with their barriers and flags
    (:func:`launch`'s ``sig``). A rank that sees a peer's differ raises
    :class:`~iris.mem.CallMismatchError` naming both calls: the description of each new
    signature is recorded once in the job's store, so that peers can name it."""
    key = (what, *sorted(fields.items()))
    sig = _SIGNATURES.get(key)
    if sig is not None:
        return sig
    text = what + "(" + ", ".join(f"{k}={_field(v)}" for k, v in sorted(fields.items())) + ")"
    sig = (zlib.crc32(text.encode()) & 0x7FFFFFFF) | 1  # odd: never specialised as divisible by 16
    if sig == 1:  # kernels specialise an argument equal to 1: keep every signature one kind
        sig = 3
    if len(_SIGNATURES) >= _MAX_SIGNATURES:
        _SIGNATURES.pop(next(iter(_SIGNATURES)))
        _DESCRIPTIONS.pop(next(iter(_DESCRIPTIONS)), None)
    _SIGNATURES[key] = sig
    if sig not in _DESCRIPTIONS:
        _DESCRIPTIONS[sig] = text
        store = job_store()
        if store is not None:
            try:
                store.set(_store_key(sig), text)
            except Exception:  # noqa: BLE001 - the description is for messages only
                pass
    return sig


def _field(value: Any) -> str:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else str(value)


def _store_key(sig: int) -> str:
    # By the low 16 bits: flags in data carry only those (iris.ccl's ll variant).
    return f"{_SIGNATURE_KEY}/{sig & 0xFFFF:04x}"


def describe_signature(sig: int) -> str:
    """What call ``sig`` stands for (or ``sig``'s low 16 bits, all that flags in data
    carry): this process's own, else as the peer that made it recorded it in the job's
    store, else the number."""
    if sig == 0:
        return "a call that publishes no signature"
    text = _DESCRIPTIONS.get(sig)
    if text is None and sig <= 0xFFFF:
        text = next((t for s, t in _DESCRIPTIONS.items() if s & 0xFFFF == sig), None)
    if text is None:
        store = job_store()
        try:
            key = _store_key(sig)
            if store is not None and store.check([key]):
                text = store.get(key).decode(errors="replace")
        except Exception:  # noqa: BLE001 - the number will do
            text = None
    return text or f"another call (signature {sig:#x})"


#: Held while :func:`launch` runs a kernel in Triton's interpreter (``capabilities.interpreted``):
#: the interpreter keeps global state (the program being run, its patched ``tl`` functions),
#: so kernels of two threads of one process must not run at once. Libraries that launch
#: interpreted kernels of their own beside Iris's may hold it too.
INTERPRETER_LOCK = threading.RLock()


def launch(
    kernel, grid: int, state: SyncState, *args, programs: int | None = None, sig: int = 0, **meta
) -> None:
    """Launch ``kernel`` on ``grid`` programs with ``state``'s leading arguments and
    constexprs, then ``args`` and ``meta``.

    The programs of such a kernel wait for their twins on the peers, so ``grid`` may not
    exceed the resident programs of the device (``programs`` when the caller chose fewer):
    a waiting program could otherwise hold the SM its peer's twin needs. A kernel with a
    ``PDL`` constexpr that the caller leaves unset gets programmatic dependent launch where
    the device has it. A kernel with a ``SIG`` argument gets ``sig``, the call's
    :func:`call_signature`, which its barriers compare across the members. Where kernels
    finish before the launch returns (the interpreter), a wait timeout or mismatch they
    recorded is raised at once, and launches from several threads of the process run one
    after another (:data:`INTERPRETER_LOCK`); an :class:`~iris.mem.IrisError` a device
    function raised there (a bad translation) is raised itself, not inside Triton's
    ``InterpreterError``.
    """
    caps = state.capabilities
    if caps.interpreted and isinstance(kernel, JITFunction):  # compiled mode: defined before import iris.mem
        raise compiled_kernel_error(kernel.__name__)
    limit = min(state.slots, programs or caps.resident_programs)
    if not 1 <= grid <= limit:
        name = getattr(kernel, "__name__", kernel)
        raise RuntimeError(f"internal: {grid} programs of {name} exceed the {limit} that may wait on peers")
    if sig and "SIG" in getattr(kernel, "arg_names", ()):
        meta = {**meta, "SIG": sig}
    if "PDL" in getattr(kernel, "arg_names", ()) and "PDL" not in meta:
        meta = {**meta, "PDL": caps.pdl, "launch_pdl": caps.pdl}
    elif meta.get("PDL"):
        meta = {**meta, "launch_pdl": True}
    if not caps.interpreted:
        kernel[(grid,)](*state.kernel_args(), *args, **state.kernel_meta(), **meta)
        return
    with INTERPRETER_LOCK:  # one interpreted kernel at a time per process
        try:
            kernel[(grid,)](*state.kernel_args(), *args, **state.kernel_meta(), **meta)
        except InterpreterError as e:
            cause = iris_error_of(e)
            if cause is None:
                raise
            raise cause from None
    state.check()


__all__ = [
    "INTERPRETER_LOCK",
    "MAX_SLOTS",
    "STATUS_ABORTED",
    "STATUS_MISMATCH",
    "STATUS_TIMEOUT",
    "STATUS_WORDS",
    "SyncState",
    "call_signature",
    "describe_signature",
    "exchange",
    "group_index",
    "group_ranks",
    "launch",
]
