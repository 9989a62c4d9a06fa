"""The watchdog: a peer process that exits stops every wait on it within about a second.

A device-side wait cannot tell a peer that is late (a JIT compile, a checkpoint: waited
for, up to ``IRIS_WAIT_TIMEOUT``) from one whose process is gone. The watchdog can. A
daemon thread of each process, started with its first heap, looks at the processes of the
heap's peers on this machine every ``IRIS_WATCHDOG_INTERVAL`` seconds (default 0.2)
through ``/proc``. When one has exited, whatever the cause (SIGKILL, an uncaught
exception, ``sys.exit``, a crash), it aborts every open heap of this process that the
peer belongs to (:meth:`~iris.mem.SymmetricHeap.abort`): the waits of the kernels on the
heap stop, running ones included, and the call raises :class:`~iris.mem.AbortedError`
naming the peer and how it ended. A peer whose program ended normally (it may have
finished its part: a last send whose receiver runs later) only stops the waits that are
still unmet, which raise; calls whose data is all there go on. A peer that failed (killed,
an exception, a crash) aborts the heap: every later use raises.

How it ended comes from the peer itself where it could say: a process with a heap
reports an uncaught exception ("raised ValueError: ...") or a normal end of Python
through the job's store (torch.distributed's default store) before it exits. Otherwise,
while the process is a zombie its parent has not collected, ``/proc`` gives its exit code
or signal; failing both, the error says the process ended without a word (a signal such
as SIGKILL, ``os._exit``, or a crash).

Limits: peers are watched through ``/proc``, so only those on this host and in this pid
namespace (processes of other containers are not); a peer that is alive but stuck (a
deadlock, a kernel that never returns) is not detected: the wait timeout covers it. The
watchdog costs one read of ``/proc/<pid>/stat`` per peer and look. ``IRIS_WATCHDOG=0``
turns it off.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass

from . import _process, settings
from .bootstrap import job_store

_log = logging.getLogger("iris.mem.watchdog")

#: Store keys under which processes report how they ended (followed by the pid namespace and pid).
_REPORT_KEY = "iris/exit"
#: The report of a process whose Python program ended without an exception.
CLEAN_END = "its Python program ended (normally or by sys.exit) without an exception"


@dataclass(frozen=True)
class Peer:
    """A process of the heap's group on this machine."""

    rank: int  #: its heap rank
    global_rank: int  #: its rank in the default process group
    pid: int
    started: int | None  #: start time, telling the process apart from a later one with its pid


_lock = threading.Lock()
_watched: dict[int, tuple[weakref.ref, list[Peer]]] = {}
_thread: threading.Thread | None = None
_reporting = False
_reported = False


def identity() -> tuple[str, str | None, int, int | None]:
    """What peers need to watch this process (exchanged when a heap is made)."""
    return _process.identity()


def watch(heap, identities: list[tuple]) -> None:
    """Watch the processes of the peers of ``heap`` (a :class:`~iris.mem.SymmetricHeap`;
    ``identities[r]``: :func:`identity` of heap rank ``r``) that run on this host and pid
    namespace, until the heap is closed or aborted. Also makes this process report how it
    ends."""
    _install_reports()
    if not settings.watchdog():
        return
    host, namespace = identities[heap.rank][:2]
    if namespace is None:
        return
    ranks = heap.global_ranks
    peers = [
        Peer(r, ranks[r], ident[2], ident[3])
        for r, ident in enumerate(identities)
        if r != heap.rank and tuple(ident[:2]) == (host, namespace)
    ]
    if not peers:
        return
    global _thread
    with _lock:
        _watched[id(heap)] = (weakref.ref(heap), peers)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(
                target=_run, args=(settings.watchdog_interval(),), name="iris-watchdog", daemon=True
            )
            _thread.start()


def watching() -> bool:
    """Whether the watchdog thread of this process is running (it ends once no open heap
    has peers to watch)."""
    return _thread is not None and _thread.is_alive()


def _run(interval: float) -> None:
    global _thread
    while True:
        time.sleep(interval)
        with _lock:
            items = list(_watched.items())
        for key, (ref, peers) in items:
            heap = ref()
            if heap is None or heap.closed or heap.aborted:
                with _lock:
                    _watched.pop(key, None)
                continue
            gone = [p for p in peers if _process.exited(p.pid, p.started)]
            if gone:
                with _lock:  # each peer is reported once; the heap stays watched until aborted
                    if key in _watched:
                        _watched[key] = (ref, [p for p in peers if p not in gone])
                _report(heap, gone)
        heap = None  # not kept alive while the thread sleeps
        with _lock:
            if not _watched:
                _thread = None
                return


def _report(heap, gone: list[Peer]) -> None:
    """Stop ``heap`` for the peers that exited: a failed one first (it aborts the heap)."""
    ended = []
    for peer in gone:
        try:
            ended.append((peer, *how_it_ended(peer)))
        except Exception:  # noqa: BLE001 - the watchdog must go on for the other heaps
            _log.exception("finding how rank %d ended failed", peer.rank)
            ended.append((peer, "it ended (how could not be read)", False))
    ended.sort(key=lambda e: e[2])  # failed (not clean) first: it aborts the heap
    for peer, how, clean in ended:
        try:
            heap._abort_for_peer(peer, how, clean)
        except Exception:  # noqa: BLE001 - the watchdog must go on for the other heaps
            _log.exception("stopping the heap after rank %d exited failed", peer.rank)


def how_it_ended(peer: Peer) -> tuple[str, bool]:
    """What is known of how ``peer``'s process ended, and whether it ended cleanly (its
    Python program ran to its end, or exited with code 0, with no exception)."""
    status = _process.exit_status(peer.pid)
    report = _read_report(peer.pid)
    clean = (report == CLEAN_END or (report is None and status == "exited with code 0")) and status in (
        None,
        "exited with code 0",
    )
    if report and status:
        return f"{report}; {status}", clean
    if report or status:
        return report or status, clean  # type: ignore[return-value]
    return (
        "it ended without a word: killed by a signal (such as SIGKILL, or the out-of-memory "
        "killer), os._exit, or a crash"
    ), False


def _key(pid: int) -> str:
    return f"{_REPORT_KEY}/{_process.pid_namespace()}/{pid}"


def report_exit(how: str) -> None:
    """Tell the peers' watchdogs how this process is about to end (``how``: "raised
    ValueError: bad input", ...). The first report of a process counts. Launchers that
    catch a program's exception themselves (instead of letting Python end with it) call
    it before the process exits; Iris does so for uncaught exceptions and normal ends."""
    global _reported
    if _reported:
        return
    store = job_store()
    if store is None:
        return
    try:
        store.set(_key(os.getpid()), how)
        _reported = True
    except Exception:  # noqa: BLE001 - the store may be gone already
        pass


def describe_exception(exc: BaseException) -> str:
    """``"raised ValueError: bad input"`` (the text cut at 300 characters)."""
    text = str(exc)
    if len(text) > 300:
        text = text[:297] + "..."
    return f"raised {type(exc).__name__}: {text}" if text else f"raised {type(exc).__name__}"


def _read_report(pid: int) -> str | None:
    store = job_store()
    if store is None:
        return None
    try:
        key = _key(pid)
        if store.check([key]):
            return store.get(key).decode(errors="replace")
    except Exception:  # noqa: BLE001 - a store whose server went with the peer
        return None
    return None


def _install_reports() -> None:
    """Once per process: report an uncaught exception, and a normal end of Python."""
    global _reporting
    with _lock:
        if _reporting:
            return
        _reporting = True
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            report_exit(describe_exception(value))
        else:
            report_exit("interrupted (KeyboardInterrupt)")
        previous(kind, value, tb)

    sys.excepthook = excepthook
    # Registered after torch.distributed's own exit handlers, so it runs before them.
    atexit.register(report_exit, CLEAN_END)


__all__ = [
    "CLEAN_END",
    "Peer",
    "describe_exception",
    "how_it_ended",
    "identity",
    "report_exit",
    "watch",
    "watching",
]
