"""Host side of device tracing: ``heap.tracing``, trace export, and the render command.

Every heap has a :class:`HeapTracing` as ``heap.tracing``. Kernels that build their
``Context`` with ``tracing=True`` record events into its buffer (layout:
:mod:`iris.mem.trace_format`; device side: :class:`iris.mem.triton.Tracing`)::

    heap.tracing.enable(max_events=100_000)      # collective: every rank calls it
    my_kernel[grid](heap.get_device_context(), ..., TRACE=True)
    heap.tracing.export("trace.json")                 # trace_rank{r}.json on every rank
    heap.tracing.export("trace.json", merge=True)     # one file on rank 0 (collective)

Exported files are Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and
``chrome://tracing`` open: one process per rank (``pid`` = rank), one thread per program
(``tid`` = linear program id), one complete event (``"ph": "X"``) per recorded event with
``ts``/``dur`` in microseconds and ``args`` holding the target rank, bytes, address, heap
offset and SM id. ``otherData`` holds per-rank counts (recorded, dropped), the clock
calibration and the machine.

Clocks: device timestamps are converted to the host's monotonic clock (one clock for all
processes of a machine) with a (host, device) clock pair measured at :meth:`enable` and
again at export, and shifted so that 0 is the earliest ``enable()`` of any rank. Per-rank
files therefore line up with each other, and a merged file is their union.

Render a trace to a PNG timeline (ranks as rows, programs as lanes, events coloured by
kind; needs matplotlib, ``pip install iris-mem[trace]``)::

    python -m iris.mem.tracing render trace.json trace.png
"""

from __future__ import annotations

import argparse
import json
import numbers
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from .. import trace_format as fmt
from .._version import __version__
from ..bootstrap import Communicator
from ..log import get_logger
from ..machine import kept_tensor
from ..trace_render import load_trace, render
from ..utils import global_timer

__all__ = ["HeapTracing", "load_trace", "main", "render"]

_log = get_logger(__name__)
#: Clock pairs taken this far apart (ns) or more also correct for drift between the clocks.
_DRIFT_SPAN_NS = 1_000_000_000
_CALIBRATION_SAMPLES = 5


@triton.jit
def _read_clock_kernel(out):
    """Store the device clock (ns) in ``out[0]``."""
    tl.store(out, global_timer())


class HeapTracing:
    """Device tracing of one heap (``heap.tracing``): the buffer kernels record into,
    user event names, and export.

    Made by the heap; not constructed directly.
    """

    def __init__(
        self,
        comm: Communicator,
        device: torch.device,
        trace_word: torch.Tensor,
        heap_base: int,
        heap_size: int,
        synchronize: Callable[[], None],
        interpreted: bool,
        backend: str,
    ):
        self._comm = comm
        self._device = device
        self._trace_word = trace_word  # the context tensor's word holding the buffer address
        self._heap_base = heap_base
        self._heap_size = heap_size
        self._synchronize = synchronize
        self._interpreted = interpreted
        self._backend = backend
        self._names: dict[int, str] = {}
        self._idle = self._idle_buffer()
        self._buffer = self._idle
        self._clock0: tuple[int, int] | None = None
        self._origin_ns = 0
        self._trace_word.fill_(self._idle.data_ptr())

    # ------------------------------------------------------------------ state
    @property
    def enabled(self) -> bool:
        """Whether :meth:`enable` was called (kernels with ``tracing=True`` record)."""
        return self._buffer is not self._idle

    @property
    def max_events(self) -> int:
        """Capacity of the buffer in events (0 before :meth:`enable`)."""
        return int(self._buffer[fmt.CAPACITY].item())

    @property
    def buffer(self) -> torch.Tensor:
        """The raw int64 trace buffer on the heap's device (layout: :mod:`iris.mem.trace_format`)."""
        return self._buffer

    def _idle_buffer(self) -> torch.Tensor:
        """The buffer of a heap that is not tracing (no room for events), kept for the heap's
        life: made outside any CUDA graph pool (a heap made by an op's first call inside
        ``torch.compile(mode="reduce-overhead")`` would otherwise leave it there)."""
        words = [0] * fmt.buffer_words(0)
        words[fmt.CAPACITY] = 0
        words[-fmt.GUARD_WORDS :] = [fmt.GUARD] * fmt.GUARD_WORDS
        return kept_tensor(words, torch.int64, self._device)

    def _new_buffer(self, max_events: int) -> torch.Tensor:
        buffer = torch.zeros(fmt.buffer_words(max_events), dtype=torch.int64, device=self._device)
        buffer[fmt.CAPACITY] = max_events
        buffer[-fmt.GUARD_WORDS :] = fmt.GUARD
        return buffer

    # ------------------------------------------------------------------ control
    def enable(self, max_events: int = 1_000_000) -> None:
        """Give kernels a buffer of ``max_events`` events and start the trace clock.

        Collective: every rank of the heap calls it (the ranks agree on the time origin).
        Calling it again replaces the buffer (recorded events are discarded). Events past
        ``max_events`` are counted as dropped, never written.

        :param max_events: capacity in events (``EVENT_WORDS`` int64 words, 80 bytes, each).
        """
        if isinstance(max_events, bool) or not isinstance(max_events, numbers.Integral) or max_events <= 0:
            raise ValueError(f"max_events must be a positive number of events, got {max_events!r}")
        self._synchronize()  # no kernel may still write into the buffer being replaced
        self._buffer = self._new_buffer(int(max_events))
        self._trace_word.fill_(self._buffer.data_ptr())
        self._clock0 = self._calibrate()
        self._origin_ns = min(self._comm.all_gather_object(self._clock0[0]))
        self._synchronize()
        _log.debug("tracing enabled: %d events (%d bytes)", max_events, self._buffer.numel() * 8)

    def reset(self) -> None:
        """Forget the recorded events (and the dropped count); keep the buffer and clock."""
        self._synchronize()
        self._buffer[fmt.COUNTER] = 0

    def register(self, name: str) -> int:
        """Event code for a user region called ``name`` (the same code for the same name).

        Pass the code to a kernel (usually as ``tl.constexpr``) for
        ``ctx.tracing.record_event_start``; exports show ``name``. Codes start at
        ``USER_EVENT_BASE`` (4096) in registration order.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        for code, known in self._names.items():
            if known == name:
                return code
        code = fmt.USER_EVENT_BASE + len(self._names)
        self._names[code] = name
        return code

    # ------------------------------------------------------------------ reading
    def stats(self) -> dict[str, Any]:
        """Counts of this rank's buffer (waits for queued kernels first).

        :returns: ``{"max_events", "recorded", "dropped", "guard_intact"}``: events
            written, events counted past the capacity (before :meth:`enable` every event
            is dropped), and whether the words after the buffer are unchanged.
        """
        self._synchronize()
        header = self._buffer[: fmt.HEADER_WORDS].tolist()
        claimed, capacity = header[fmt.COUNTER], header[fmt.CAPACITY]
        guard = self._buffer[-fmt.GUARD_WORDS :].tolist()
        return {
            "max_events": capacity,
            "recorded": min(claimed, capacity),
            "dropped": max(0, claimed - capacity),
            "guard_intact": all(g == fmt.GUARD for g in guard),
        }

    def events(self) -> list[dict[str, Any]]:
        """This rank's recorded events, in slot order, as dicts with the fields of
        :data:`iris.mem.trace_format.FIELDS` plus ``name``, ``slot`` and ``heap_offset``
        (byte offset of ``address`` in the heap, None outside it). Times are raw device ns."""
        recorded = self.stats()["recorded"]
        words = self._buffer[fmt.HEADER_WORDS : fmt.HEADER_WORDS + recorded * fmt.EVENT_WORDS]
        out = []
        for slot, row in enumerate(words.view(recorded, fmt.EVENT_WORDS).tolist()):
            event = dict(zip(fmt.FIELDS, row))
            offset = event["address"] - self._heap_base
            event["heap_offset"] = offset if 0 <= offset < self._heap_size and event["bytes"] else None
            event["name"] = fmt.event_name(event["kind"], self._names)
            event["slot"] = slot
            out.append(event)
        return out

    # ------------------------------------------------------------------ export
    def export(self, path: str | os.PathLike = "trace.json", merge: bool = False) -> str | None:
        """Write the trace as Chrome/Perfetto JSON.

        :param path: file name. Without ``merge`` each rank writes its own file: ``path``
            with ``{rank}`` replaced, or ``_rank<r>`` inserted before the extension
            (``trace.json`` -> ``trace_rank0.json``).
        :param merge: collective: rank 0 gathers every rank's events and writes one file,
            ``path``, with the ranks' clocks aligned.
        :returns: the path this rank wrote, or None (ranks other than 0 with ``merge``).
        :raises RuntimeError: tracing was never enabled.
        """
        if not self.enabled:
            raise RuntimeError("tracing is not enabled on this heap; call heap.tracing.enable() first")
        stats = self.stats()
        if stats["dropped"]:
            _log.warning(
                "%d trace events dropped: the buffer holds max_events=%d; pass a larger max_events to "
                "heap.tracing.enable()",
                stats["dropped"],
                stats["max_events"],
            )
        if not stats["guard_intact"]:
            _log.error("the words after the trace buffer were overwritten: the trace may be corrupt")
        to_host = self._host_clock(self._clock0, self._calibrate())
        part = (self._chrome_events(to_host), self._rank_metadata(stats))
        rank = self._comm.rank
        if not merge:
            out = _rank_path(os.fspath(path), rank)
            _write_trace(out, [part], self._comm.world_size)
            return out
        parts = self._comm.gather_object(part, 0)
        if parts is None:
            return None
        out = os.fspath(path)
        _write_trace(out, parts, self._comm.world_size)
        return out

    def _calibrate(self) -> tuple[int, int]:
        """A (host monotonic ns, device clock ns) pair read at (nearly) the same moment."""
        if self._interpreted:  # the interpreter's device clock is the host clock
            now = time.monotonic_ns()
            return now, now
        out = torch.zeros(1, dtype=torch.int64, device=self._device)
        best: tuple[int, int, int] | None = None
        for _ in range(_CALIBRATION_SAMPLES):  # keep the sample with the tightest window
            self._synchronize()
            before = time.monotonic_ns()
            _read_clock_kernel[(1,)](out)
            self._synchronize()
            after = time.monotonic_ns()
            if best is None or after - before < best[0]:
                best = (after - before, (before + after) // 2, int(out.item()))
        assert best is not None
        return best[1], best[2]

    def _host_clock(self, first: tuple[int, int] | None, second: tuple[int, int]) -> Callable[[int], float]:
        """Map device ns to ns since the trace origin, from two (host, device) pairs."""
        assert first is not None
        (h0, d0), (h1, d1) = first, second
        slope = (h1 - h0) / (d1 - d0) if d1 - d0 >= _DRIFT_SPAN_NS else 1.0
        origin = self._origin_ns
        return lambda d: h0 - origin + (d - d0) * slope

    def _chrome_events(self, to_host: Callable[[int], float]) -> list[dict[str, Any]]:
        out = []
        for e in self.events():
            ts = to_host(e["start"]) / 1000.0
            args: dict[str, Any] = {"slot": e["slot"]}
            if e["target"] >= 0:
                args["target"] = e["target"]
            if e["bytes"]:
                args["bytes"] = e["bytes"]
                args["address"] = hex(e["address"])
            if e["heap_offset"] is not None:
                args["heap_offset"] = e["heap_offset"]
            if e["sm"] >= 0:
                args["sm"] = e["sm"]
            if e["kind"] == fmt.TraceEvent.COPY:
                args["source"] = e["arg"]
            elif e["arg"]:
                args["arg"] = e["arg"]
            event = {
                "name": e["name"],
                "cat": "rma" if e["kind"] < fmt.RMA_EVENT_LIMIT else "user",
                "pid": e["rank"],
                "tid": e["program"],
                "ts": round(ts, 3),
                "args": args,
            }
            if e["end"]:
                event.update(ph="X", dur=round(max(0.0, to_host(e["end"]) / 1000.0 - ts), 3))
            else:  # opened but never closed: an instant
                event.update(ph="i", s="t")
            out.append(event)
        return out

    def _rank_metadata(self, stats: dict[str, Any]) -> dict[str, Any]:
        device: dict[str, Any] = {"device": str(self._device)}
        if self._device.type == "cuda":
            props = torch.cuda.get_device_properties(self._device)
            device.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                          sm_count=props.multi_processor_count)  # fmt: skip
        else:
            device.update(device_name=platform.processor() or platform.machine(), sm_count=0)
        assert self._clock0 is not None
        return {
            "rank": self._comm.rank,
            "host": socket.gethostname(),
            "backend": self._backend,
            **device,
            "heap_base": hex(self._heap_base),
            "heap_size": self._heap_size,
            "clock": {"host_ns": self._clock0[0], "device_ns": self._clock0[1], "origin_ns": self._origin_ns},
            "names": {str(k): v for k, v in self._names.items()},
            **stats,
        }


def _rank_path(path: str, rank: int) -> str:
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    root, ext = os.path.splitext(path)
    return f"{root}_rank{rank}{ext or '.json'}"


def _write_trace(path: str, parts: Sequence[tuple[list[dict], dict]], world_size: int) -> None:
    """Write ``(events, rank metadata)`` parts as one Chrome trace-event JSON file."""
    events: list[dict[str, Any]] = []
    for rank_events, meta in parts:
        rank = meta["rank"]
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        for tid in sorted({e["tid"] for e in rank_events}):
            name = {"name": f"program {tid}"}
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": name})
        events.extend(sorted(rank_events, key=lambda e: (e["tid"], e["ts"])))
    metas = [meta for _, meta in parts]
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "format": "iris.mem trace 1",
            "iris_mem_version": __version__,
            "world_size": world_size,
            "ranks": metas,
            "recorded_events": sum(m["recorded"] for m in metas),
            "dropped_events": sum(m["dropped"] for m in metas),
            "command": " ".join(sys.argv),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(trace, f)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m iris.mem.tracing render TRACE [TRACE ...] [OUT.png] [--title T]``."""
    parser = argparse.ArgumentParser(prog="python -m iris.mem.tracing", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    draw = commands.add_parser("render", help="draw exported trace JSON file(s) as a PNG timeline")
    draw.add_argument("files", nargs="+", help="trace JSON files (per-rank or merged), optionally OUT.png")
    draw.add_argument("-o", "--output", help="PNG to write (default: the first trace's name with .png)")
    draw.add_argument("--title", help="figure title")
    args = parser.parse_args(argv)
    files = list(args.files)
    output = args.output
    if output is None and len(files) > 1 and files[-1].lower().endswith(".png"):
        output = files.pop()
    if output is None:
        output = os.path.splitext(files[0])[0] + ".png"
    print(render(files, output, title=args.title))
    return 0
