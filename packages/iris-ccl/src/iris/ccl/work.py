"""``Work``: the handle an ``async_op=True`` collective returns."""

from __future__ import annotations

import torch

import iris.mem


class Work:
    """Completion handle of a collective queued on the current stream.

    Collectives are stream-ordered: everything they do, including copies into the caller's
    tensors, is queued on the current stream. ``wait()`` makes the current stream wait for
    that work (useful after switching streams); on the CPU backend collectives have
    finished before they return.
    """

    def __init__(self, device: torch.device):
        self._device = device
        self._event = None
        if iris.mem.capabilities(device).streams:
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(device))

    def wait(self) -> bool:
        """Order the current stream after the collective; returns True."""
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        """Whether the device has finished the collective."""
        return self._event.query() if self._event is not None else True
