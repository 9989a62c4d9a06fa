"""``Work``: the handle an ``async_op=True`` collective returns, a ``torch.distributed.Work``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

import iris.mem


class Work(dist.Work):
    """Completion handle of a collective queued on the current stream: a
    ``torch.distributed.Work``, so code written for torch.distributed's handles (``wait()``,
    ``is_completed()``, ``get_future()``, ``result()``) takes it as it is.

    Collectives are stream-ordered: everything they do, including copies into the caller's
    tensors, is queued on the current stream. ``wait()`` makes the current stream wait for
    that work (useful after switching streams), as NCCL's handles do; on the CPU backend
    collectives have finished before they return, and ``wait()`` returns at once.

    ``get_future()`` returns a ``torch.futures.Future`` completed with the collective's
    output tensors, as a list (the output, or the tensor a broadcast, send or recv used;
    empty for a barrier and for a reduce or gather on ranks other than the root that
    passed no output). On GPUs the future is CUDA-aware: ``future.wait()`` and callbacks
    added with ``then()`` run after the collective on the stream that waits, without
    blocking the host.

    :param device: the device the collective ran on.
    :param outputs: the tensors the future is completed with.
    """

    def __init__(self, device: torch.device, outputs: Sequence[torch.Tensor] = ()):
        super().__init__()
        self._device = device
        self._event = None
        caps = iris.mem.capabilities(device)
        if caps.streams:  # work queued on streams: the handle records an event
            self._device = caps.device  # with its index
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(self._device))
        self._outputs: list[torch.Tensor] = []
        self._future: torch.futures.Future | None = None
        self._set_outputs(outputs)

    def _set_outputs(self, outputs: Sequence[torch.Tensor]) -> None:
        """Complete the future with ``outputs`` (a new future: the handle is not shared yet)."""
        self._outputs = [t for t in outputs if t is not None]
        self._future = torch.futures.Future(devices=[self._device] if self._event is not None else None)
        self._future.set_result(self._outputs)

    def wait(self, timeout: Any = None) -> bool:
        """Order the current stream after the collective; returns True (``timeout`` is
        accepted for compatibility and unused: nothing blocks the host)."""
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        """Whether the device has finished the collective."""
        return self._event.query() if self._event is not None else True

    def is_success(self) -> bool:
        """True: a collective that fails raises when it is called."""
        return True

    def exception(self) -> None:
        """None: a collective that fails raises when it is called."""
        return None

    def result(self) -> list[torch.Tensor]:
        """The output tensors (the future's value)."""
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with the output tensors (see the class)."""
        return self._future
