"""Plot ``results.json`` of bench_rma.py: bandwidth against message size, one panel per mode.

python benchmarks/mem/plot_rma.py benchmarks/mem/results/results.json
"""

from __future__ import annotations

import json
import os
import sys


def plot(rows: list[dict], path: str) -> None:
    """Write a PNG of GB/s per op against size, for one direction and both at once (0 <-> 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for ax, both in zip(axes, (False, True)):
        sel = [r for r in rows if r["both"] == both and r["src"] == 0 and r["dst"] == 1]
        for op in sorted({r["op"] for r in sel}, key=lambda o: (o in ("copy_engine", "local_copy"), o)):
            pts = sorted((r["bytes"], r["GBps"]) for r in sel if r["op"] == op)
            style = "--" if op in ("copy_engine", "local_copy") else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=op)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_title(
            "GPU 0 -> GPU 1" + (" and 1 -> 0 at once (per direction)" if both else ", one direction")
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    source = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/mem/results/results.json"
    with open(source) as f:
        data = json.load(f)
    target = os.path.join(os.path.dirname(source), "rma_bandwidth.png")
    plot(data["bandwidth"], target)
    print(target)
