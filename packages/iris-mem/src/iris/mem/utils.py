"""Device intrinsics for Triton kernels: a global clock, the id of the running SM, and the
bounded flag wait every waiting kernel of Iris is built on.

Compiled for NVIDIA GPUs they read PTX special registers; in Triton's interpreter (the
``cpu`` backend), where inline assembly cannot run, they read the host instead. Which
version a kernel gets is decided when this module is imported, like the rest of
:mod:`iris.mem`.

``global_timer()``
    int64 nanoseconds. On NVIDIA the GPU's ``%globaltimer`` (one clock per GPU, shared by
    all its SMs; its resolution depends on the GPU and driver, from 32 ns to 1 us). In the
    interpreter the host's ``time.monotonic_ns()``, one clock for every process of the
    machine.
``sm_id()``
    int32 id of the SM running the program (``%smid``); -1 in the interpreter.
``wait_at_least(flag, target, budget, status=None, peer=None)``
    Poll a local flag (acquire, system scope) until it reaches ``target``, ``budget`` ns
    of ``global_timer()`` have passed, or the host stopped the waits of the sync state
    ``status`` belongs to; returns the last value read.
``keep_waiting(start, budget, status, peer=None)``
    The condition every waiting loop of Iris polls: within the budget and not stopped.
``record_mismatch(status, rank, peer, mine, theirs)``
    Record that ``peer`` made another call (its call signature ``theirs``, not ``mine``).
``record_timeout(status, rank, peer, flag)``
    Record a wait that gave up as ``[1, rank, peer, flag address]`` in an int64 ``status``
    array (unless one is recorded already), for the host to raise as ``DeviceWaitTimeout``.
"""

from __future__ import annotations

import time

import triton
import triton.language as tl

from . import settings as _settings

__all__ = [
    "ABORT_POLL_NS",
    "STATUS_ABORTED",
    "STATUS_MISMATCH",
    "global_timer",
    "keep_waiting",
    "record_mismatch",
    "record_timeout",
    "sm_id",
    "wait_at_least",
]

if _settings.interpreted():

    def _host_clock_ns() -> int:
        return time.monotonic_ns()

    @triton.jit
    def global_timer():
        """Interpreter: the host's monotonic clock in ns."""
        return tl.full([], _host_clock_ns(), tl.int64)

    @triton.jit
    def sm_id():
        """Interpreter: no SM, -1."""
        return tl.full([], -1, tl.int32)

else:

    @triton.jit
    def global_timer():
        """The GPU's global nanosecond timer (``%globaltimer``)."""
        return tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )

    @triton.jit
    def sm_id():
        """Id of the SM running this program (``%smid``)."""
        return tl.inline_asm_elementwise(
            "mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )


#: ``status[0]`` of a sync state whose waits the host stopped (``iris.mem.runtime.STATUS_ABORTED``).
STATUS_ABORTED: tl.constexpr = tl.constexpr(2)
#: ``status[0]`` of a sync state on which ranks made different calls (:func:`record_mismatch`).
STATUS_MISMATCH: tl.constexpr = tl.constexpr(3)
#: A wait reads its state's status word only once it has waited this long (ns): waits that
#: end sooner (nearly all) cost no extra memory access. Time on the GPU's clock, like the
#: budget: where ranks share a GPU and the waiting kernel is switched out, both keep running.
ABORT_POLL_NS: tl.constexpr = tl.constexpr(20_000)


@triton.jit
def keep_waiting(start, budget, status, peer=None):
    """Whether a wait that began at ``start`` (:func:`global_timer`) may go on polling: fewer
    than ``budget`` ns have passed and, once it has waited ``ABORT_POLL_NS``, the waits of its
    sync state were not stopped: by the host (``status[0] == STATUS_ABORTED``: the heap was
    aborted, or a peer process failed), by a call that does not match the peers'
    (``STATUS_MISMATCH``, :func:`record_mismatch`), by a wait of the same state that already
    gave up (a timeout recorded: the call has failed, so its later waits do not each take a
    budget of their own), or, for a wait on heap rank ``peer``, because that peer's process
    has ended (bit ``peer`` of ``status[4]``, set by the host). ``status`` is the state's int64
    status array; None: the budget alone. Every waiting loop of Iris ends on it."""
    elapsed = global_timer() - start
    go = elapsed < budget
    if status is not None:
        late = elapsed > ABORT_POLL_NS
        go = go & (tl.load(status, mask=late, other=0, volatile=True) == 0)  # nothing recorded
        if peer is not None:
            ended = tl.load(status + 4, mask=late, other=0, volatile=True)
            go = go & (((ended >> tl.cast(peer, tl.int64)) & 1) == 0)
    return go


@triton.jit
def wait_at_least(flag, target, budget, status=None, peer=None):
    """Poll the local integer ``*flag`` (acquire, system scope: what its writer released
    before raising it is visible after) until it is at least ``target``, or ``budget`` ns of
    :func:`global_timer` have passed (``iris.mem.wait_budget_ns()``, from
    ``IRIS_WAIT_TIMEOUT``), or the waits of the sync state whose int64 ``status`` array is
    given were stopped, for all peers or for heap rank ``peer``, the one expected to raise the
    flag (see :func:`keep_waiting`). Returns the last value read: below ``target`` when the
    wait gave up, which the caller reports (:func:`record_timeout`)."""
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    start = global_timer()
    while (seen < target) & keep_waiting(start, budget, status, peer):
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    return seen


@triton.jit
def record_timeout(status, rank, peer, flag):
    """Record ``[1, rank, peer, flag address]`` in the int64 ``status`` array unless an
    error is already recorded there (the host raises it as ``DeviceWaitTimeout``); on a
    state the host stopped (``STATUS_ABORTED``), mark instead that a wait was cut short
    (``status[1] = 1``: the launch's results are incomplete). Scalars
    are made with ``tl.cast`` (no layout needed), so Gluon kernels compile this too."""
    code = tl.cast(1, tl.int64)
    old = tl.atomic_cas(status, code - 1, code, sem="relaxed", scope="gpu")
    if old == 0:
        tl.store(status + 1, tl.cast(rank, tl.int64))
        tl.store(status + 2, tl.cast(peer, tl.int64))  # an argument equal to 1 arrives as a constexpr
        tl.store(status + 3, flag.to(tl.int64, bitcast=True))
    elif old == STATUS_ABORTED:  # the host stopped the waits: say that this one was cut short
        tl.store(status + 1, code)


@triton.jit
def record_mismatch(status, rank, peer, mine, theirs):
    """Record ``[STATUS_MISMATCH, rank + (mine << 32), peer, theirs]`` in the int64 ``status``
    array unless an error is already recorded there: this call's signature is ``mine``,
    member ``peer`` published ``theirs`` (int32 signatures, see
    :func:`iris.mem.runtime.call_signature`). The host raises it as
    :class:`~iris.mem.CallMismatchError`; meanwhile the waits over the state stop
    (:func:`keep_waiting`)."""
    code = tl.cast(STATUS_MISMATCH, tl.int64)
    if tl.atomic_cas(status, tl.cast(0, tl.int64), code, sem="relaxed", scope="gpu") == 0:
        tl.store(status + 1, tl.cast(rank, tl.int64) + (tl.cast(mine, tl.int64) << 32))
        tl.store(status + 2, tl.cast(peer, tl.int64))
        tl.store(status + 3, tl.cast(theirs, tl.int64))
