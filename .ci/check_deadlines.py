"""Compare the durations a test run recorded with the deadlines of its multi-rank worlds.

Every world (``iris.mem.testing.run_world`` / ``launch_world``), example run
(``run_example``) and torchrun launch of the tests appends a JSON line to the file named by
``IRIS_TEST_DURATIONS``: the test, the world size, the deadline and the seconds it took.
This script prints the worlds closest to their deadline and exits 1 when one of them took
more than ``1 / ratio`` of its deadline (``--ratio``, default 3): on a loaded machine such a
test could run out of time and fail a good submission.

``--warn-only`` prints the same table and a warning but exits 0: for runs on a machine that
may be loaded (CI), where a slow world says more about the machine than about the test.

Usage: ``python .ci/check_deadlines.py DURATIONS.jsonl [--ratio 3] [--warn-only] [--top 15]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: Path) -> list[dict]:
    """The records of ``path``, one per line (a missing file: no records)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def worst_per_test(records: list[dict]) -> list[dict]:
    """One record per (test, what, world size): the one that used most of its deadline,
    sorted from the closest to its deadline. Runs killed at their deadline are left out: their
    test failed, or (a test of the deadline itself) meant them to be killed."""
    worst: dict[tuple, dict] = {}
    for r in records:
        if r.get("timed_out"):
            continue
        key = (r["test"], r.get("what", ""), r["world_size"])
        if key not in worst or r["seconds"] / r["timeout"] > worst[key]["seconds"] / worst[key]["timeout"]:
            worst[key] = r
    return sorted(worst.values(), key=lambda r: r["seconds"] / r["timeout"], reverse=True)


def report(rows: list[dict], ratio: float, top: int) -> tuple[list[str], list[dict]]:
    """The table of the ``top`` worlds closest to their deadline and a line per world with
    less than ``ratio`` margin; and those worlds."""
    total = sum(r["seconds"] for r in rows)
    lines = [
        f"{len(rows)} multi-rank runs, {total:.0f} s in all; closest to their deadline:",
        f"{'deadline/duration':>18} {'seconds':>8} {'deadline':>8}  world  test",
    ]
    for r in rows[:top]:
        margin = r["timeout"] / max(r["seconds"], 1e-9)
        label = r["test"] + (f" ({r['what']})" if r.get("what") else "")
        lines.append(f"{margin:18.1f} {r['seconds']:8.1f} {r['timeout']:8.0f}  {r['world_size']:5d}  {label}")
    tight = [r for r in rows if r["timeout"] < ratio * r["seconds"]]
    for r in tight:
        lines.append(
            f"{r['test']} ({r.get('what', '')}, world {r['world_size']}) took {r['seconds']:.1f} s of its "
            f"{r['timeout']:g} s deadline: less than {ratio:g}x margin"
        )
    if not tight:
        lines.append(f"every deadline is at least {ratio:g}x the recorded duration")
    return lines, tight


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("durations", type=Path)
    parser.add_argument("--ratio", type=float, default=3.0, help="deadline / duration must be at least this")
    parser.add_argument("--warn-only", action="store_true", help="report, but exit 0")
    parser.add_argument("--top", type=int, default=15, help="rows of the table")
    args = parser.parse_args(argv)
    if args.ratio <= 1:
        parser.error("--ratio must be greater than 1")
    rows = worst_per_test(load(args.durations))
    if not rows:
        print(f"check_deadlines: no records in {args.durations}")
        return 0
    lines, tight = report(rows, args.ratio, args.top)
    for line in lines:
        print(f"check_deadlines: {line}")
    if tight and args.warn_only:
        print("check_deadlines: WARNING only (--warn-only): the machine may have been loaded")
        return 0
    return 1 if tight else 0


if __name__ == "__main__":
    sys.exit(main())
