"""``Work``: the handle an ``async_op=True`` collective returns, a ``torch.distributed.Work``."""

from __future__ import annotations

import datetime
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

import iris.mem


def hidden_from_dynamo(*private: str):
    """Class decorator: run the class's public methods (and the ``private`` ones torch calls)
    eagerly under ``torch.compile``; dynamo would trace into them from a compiled frame (a
    DDP model rebuilding its buckets, a handle waited on in compiled code) and fail on the
    C++ objects they touch."""

    def hide(cls: type) -> type:
        for name, fn in list(vars(cls).items()):
            if inspect.isfunction(fn) and (not name.startswith("_") or name in private):
                setattr(cls, name, torch.compiler.disable(fn, recursive=True))
        return cls

    return hide


@hidden_from_dynamo()
class Work(dist.Work):
    """Completion handle of a collective queued on the current stream: a
    ``torch.distributed.Work``, so code written for torch.distributed's handles (``wait()``,
    ``is_completed()``, ``is_success()``, ``exception()``, ``get_future()``, ``result()``)
    takes it as it is.

    Collectives are stream-ordered: everything they do, including copies into the caller's
    tensors, is queued on the current stream. ``wait()`` makes the current stream wait for
    that work (useful after switching streams), as NCCL's handles do; on the CPU backend
    collectives have finished before they return, and ``wait()`` returns at once.

    Errors. A collective that failed on the device (a wait that timed out, ranks that made
    different calls, an aborted heap or a peer that exited) raises its error from ``wait()``;
    ``exception()`` returns it, ``is_success()`` is False and the future is completed with
    it. On the CPU backend every such error is known when the call returns. On GPUs it is
    known once the collective has finished: ``wait()`` raises it when the device is done by
    then, ``wait(timeout)`` blocks the host until it is (or until ``timeout``, then raises
    ``torch.distributed.DistBackendError``), and ``exception()`` / ``is_success()`` look
    when the device is done.

    ``get_future()`` returns a ``torch.futures.Future`` completed with the collective's
    output tensors, as a list (the output, or the tensor a broadcast, send or recv used;
    empty for a barrier and for a reduce or gather on ranks other than the root that
    passed no output). On GPUs the future is CUDA-aware: ``future.wait()`` and callbacks
    added with ``then()`` run after the collective on the stream that waits, without
    blocking the host.

    :param device: the device the collective ran on.
    :param outputs: the tensors the future is completed with.
    :param error: the device-side error the collective raised, if any.
    :param pending: for work that is queued, not started (the ``iris`` backend's isend and
        irecv): ``pending(timeout)`` starts it, and every queued call before it, with
        device-side waits of at most ``timeout`` seconds (None: the group's); ``wait()``,
        ``is_completed()``, ``exception()`` and ``get_future()`` call it first. It calls
        :meth:`finish` on the handles it completes.
    :param check: raises the device-side errors the collective recorded (reads device
        memory; called once the device has finished it).
    """

    def __init__(
        self, device: torch.device, outputs: Sequence[torch.Tensor] = (), *,
        error: BaseException | None = None, pending: Callable[[float | None], None] | None = None,
        check: Callable[[], None] | None = None,
    ):  # fmt: skip
        super().__init__()
        caps = iris.mem.capabilities(device)
        self._device = caps.device if caps.streams else device  # with its index
        self._streams = caps.streams
        self._event = None
        self._outputs: list[torch.Tensor] = [t for t in outputs if t is not None]
        self._future: torch.futures.Future | None = None
        self._error = error
        self._pending = pending
        self._check = check
        if pending is None:
            self.finish(error)

    # ---- completion ------------------------------------------------------------------------

    def finish(self, error: BaseException | None = None) -> None:
        """Mark the work started (GPUs: record its event on the current stream) and complete
        its future, with ``error`` when it failed."""
        self._pending = None
        self._error = self._error or error
        if self._streams:  # work queued on streams: the handle records an event
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(self._device))
        self._complete_future()

    def _set_outputs(self, outputs: Sequence[torch.Tensor]) -> None:
        """Complete the future with ``outputs`` (a new future: the handle is not shared yet)."""
        self._outputs = [t for t in outputs if t is not None]
        if self._pending is None:
            self._complete_future()

    def _complete_future(self) -> None:
        self._future = torch.futures.Future(devices=[self._device] if self._streams else None)
        if self._error is not None:
            self._future.set_exception(self._error)
        else:
            self._future.set_result(self._outputs)

    def _start(self, timeout: float | None = None) -> None:
        """Start queued work (see ``pending``); a failure of it becomes this work's error."""
        pending = self._pending
        if pending is None:
            return
        try:
            pending(timeout)
        except Exception as e:  # noqa: BLE001 - kept as the work's error, raised by wait()
            if self._pending is not None:
                self.finish(e)
        if self._pending is not None:  # the queue did not complete this handle
            self.finish(RuntimeError("internal: a queued call was not started by its group"))

    def _look(self) -> None:
        """Where the device has finished the work, read the errors it recorded."""
        if self._check is None or self._error is not None:
            return
        if self._event is not None and not self._event.query():
            return
        check, self._check = self._check, None
        try:
            if self._event is not None:
                # read the status words on a stream of their own: the current one may hold
                # newer work the read would wait for
                with torch.cuda.stream(torch.cuda.Stream(self._device)):
                    check()
            else:
                check()
        except Exception as e:  # noqa: BLE001 - the collective's error, kept for wait()
            self._error = e
            self._complete_future()

    # ---- torch.distributed.Work ------------------------------------------------------------

    def wait(self, timeout: Any = None) -> bool:
        """Order the current stream after the collective and raise its error, if any.

        :param timeout: None, a ``datetime.timedelta`` or seconds (zero: none). With a
            timeout, block the host until the device has finished (device-side waits of
            queued work started now give up after it too), raise
            ``torch.distributed.DistBackendError`` when it has not, and raise the
            collective's device-side error.
        """
        seconds = _seconds(timeout)
        self._start(seconds)
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
            if seconds is not None:
                deadline = time.monotonic() + seconds
                while not self._event.query():
                    if time.monotonic() > deadline:
                        raise dist.DistBackendError(
                            f"Work.wait(timeout={seconds:g} s): the collective on {self._device} has not "
                            "finished; its device-side waits give up after the group's timeout"
                        )
                    time.sleep(1e-4)
        self._look()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """Whether the device has finished the collective (starts queued work first)."""
        self._start()
        return self._event.query() if self._event is not None else True

    def is_success(self) -> bool:
        """Whether the collective is known not to have failed (see the class)."""
        return self.exception() is None

    def exception(self) -> BaseException | None:
        """The collective's error, or None (see the class)."""
        self._start()
        self._look()
        return self._error

    def result(self) -> list[torch.Tensor]:
        """The output tensors (the future's value)."""
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with the output tensors (see the class)."""
        self._start()
        return self._future


@hidden_from_dynamo()
class BarrierWork(Work):
    """A barrier's handle: ``wait()`` also blocks the host until the device has passed it,
    as torch.distributed's barrier does."""

    def wait(self, timeout: Any = None) -> bool:
        super().wait(timeout)
        if self._event is not None:
            self._event.synchronize()
        return True


def _seconds(timeout: Any) -> float | None:
    """Seconds of a ``wait`` timeout: None for none (None, zero or negative, as torch's
    ``kNoTimeout`` and unset timeouts are)."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return seconds if seconds > 0 else None
