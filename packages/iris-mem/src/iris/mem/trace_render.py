"""Read exported traces (:func:`load_trace`) and draw them as a PNG timeline with matplotlib.

Ranks are rows, separated by a gap; inside a rank, every program (Triton block) that
recorded an event is one lane. RMA operations are bars coloured by kind; user regions
are taller, lighter bars behind them, so the operations inside a region stay visible.
Events opened but never closed are drawn as ticks. Command line:
``python -m iris.mem.tracing render trace.json trace.png``.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .trace_format import RMA_EVENT_LIMIT, TraceEvent

__all__ = ["load_trace", "render"]

#: Legend order: RMA operations by code, then user regions by name.
_RMA_ORDER = {e.name.lower(): int(e) for e in TraceEvent if e < RMA_EVENT_LIMIT}
#: Lanes of one rank beyond which lane labels are left out (they would overlap).
_MAX_LABELLED_LANES = 24


def load_trace(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> dict[str, Any]:
    """Read one or more exported trace files into one trace dict (events concatenated,
    ``otherData["ranks"]`` combined)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    merged: dict[str, Any] = {"traceEvents": [], "otherData": {"ranks": []}}
    for path in paths:
        with open(path) as f:
            trace = json.load(f)
        if not isinstance(trace, dict) or "traceEvents" not in trace:
            raise ValueError(f"{os.fspath(path)} is not a Chrome trace-event JSON object (no traceEvents)")
        merged["traceEvents"].extend(trace["traceEvents"])
        merged["otherData"]["ranks"].extend(trace.get("otherData", {}).get("ranks", []))
    return merged


def _pyplot():
    """matplotlib's pyplot on the Agg (file-only) backend, imported on first use: matplotlib
    is an optional dependency (``pip install iris-mem[trace]``)."""
    try:
        import matplotlib  # optional: matplotlib
    except ImportError:
        raise ImportError(
            "rendering a trace needs matplotlib: pip install matplotlib (or iris-mem[trace])"
        ) from None
    matplotlib.use("Agg")  # draw into files: no display needed, and none is opened
    import matplotlib.pyplot as plt  # optional: matplotlib (after use(): pyplot reads it at import)

    return plt


def _lanes(events: list[dict[str, Any]]) -> tuple[dict[tuple[int, int], float], dict[int, float]]:
    """y position of every (rank, program) lane, and the centre of every rank's row."""
    programs: dict[int, set[int]] = defaultdict(set)
    for e in events:
        programs[e["pid"]].add(e["tid"])
    lanes: dict[tuple[int, int], float] = {}
    centres: dict[int, float] = {}
    y = 0.0
    for rank in sorted(programs):
        first = y
        for tid in sorted(programs[rank]):
            lanes[(rank, tid)] = y
            y += 1.0
        centres[rank] = (first + y - 1.0) / 2.0
        y += 0.75  # gap between ranks
    return lanes, centres


def _time_unit(events: list[dict[str, Any]]) -> tuple[str, float]:
    """Unit of the time axis for the trace's span, and microseconds per unit."""
    span = max(e["ts"] + e.get("dur", 0.0) for e in events) - min(e["ts"] for e in events)
    for unit, per_us in (("s", 1e6), ("ms", 1e3)):
        if span >= 10 * per_us:
            return unit, per_us
    return "us", 1.0


def render(
    traces: str | os.PathLike | Sequence[str | os.PathLike],
    output: str | os.PathLike,
    title: str | None = None,
) -> str:
    """Draw the trace file(s) ``traces`` (per-rank or merged exports) into ``output``.

    :returns: the path of the PNG written.
    :raises ValueError: the files hold no events to draw.
    """
    trace = load_trace(traces)
    events = [e for e in trace["traceEvents"] if e.get("ph") in ("X", "i")]
    if not events:
        raise ValueError(f"no trace events to render in {traces}")
    plt = _pyplot()
    lanes, centres = _lanes(events)
    names = sorted({e["name"] for e in events}, key=lambda n: (n not in _RMA_ORDER, _RMA_ORDER.get(n, 0), n))
    # An operation keeps its colour from trace to trace; user regions take pale ones.
    strong, pale = plt.get_cmap("tab10").colors, plt.get_cmap("Set2").colors
    users = [n for n in names if n not in _RMA_ORDER]
    colours = {n: strong[_RMA_ORDER[n] % len(strong)] for n in names if n in _RMA_ORDER}
    colours.update({n: pale[i % len(pale)] for i, n in enumerate(users)})
    unit, per_us = _time_unit(events)
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e.get("dur", 0.0) for e in events)
    span = max(end - start, 1e-3) / per_us
    min_width = span / 1500.0  # keep zero-length events visible

    n_lanes = len(lanes) + 0.75 * len(centres)
    fig, ax = plt.subplots(figsize=(13, min(40.0, 1.6 + 0.28 * n_lanes)))
    for layer in ("user", "rma"):
        groups: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        ticks: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for e in events:
            if (e.get("cat") == "user") != (layer == "user"):
                continue
            y = lanes[(e["pid"], e["tid"])]
            x = (e["ts"] - start) / per_us
            if e["ph"] == "X":
                groups[e["name"]].append((x, max(e["dur"] / per_us, min_width), y))
            else:
                ticks[e["name"]].append((x, y))
        height, alpha = (0.9, 0.6) if layer == "user" else (0.6, 0.95)
        for name, bars in groups.items():
            left, width, y = zip(*bars)
            ax.barh(y, width, left=left, height=height, color=colours[name], alpha=alpha, label=name, lw=0)
        for name, points in ticks.items():
            x, y = zip(*points)
            ax.scatter(x, y, marker="|", s=60, color=colours[name], label=None if name in groups else name)

    ax.set_xlim(-0.01 * span, span * 1.01)
    ax.invert_yaxis()
    labelled = len(lanes) <= _MAX_LABELLED_LANES * max(1, len(centres))
    if labelled:
        ax.set_yticks(list(lanes.values()), [f"r{r} p{p}" for r, p in lanes], fontsize=7)
    else:
        ax.set_yticks(list(centres.values()), [f"rank {r}" for r in centres])
    for rank, centre in centres.items():
        ax.annotate(
            f"rank {rank}", (1.0, centre), xycoords=("axes fraction", "data"), xytext=(4, 0),
            textcoords="offset points", va="center", fontsize=9, fontweight="bold",
        )  # fmt: skip
    ax.set_xlabel(f"time since the first event ({unit})")
    ax.set_ylabel("rank / program" if labelled else "rank")
    ax.grid(True, axis="x", alpha=0.3)
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    ax.legend([handles[n] for n in names], names, loc="upper left", bbox_to_anchor=(1.06, 1.0), fontsize=8)
    dropped = sum(r.get("dropped", 0) for r in trace["otherData"]["ranks"])
    heading = title or f"iris trace: {len(centres)} rank(s), {len(events)} events"
    if dropped:
        heading += f" ({dropped} dropped)"
    ax.set_title(heading)
    fig.tight_layout()
    output = os.fspath(output)
    folder = os.path.dirname(output)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output
