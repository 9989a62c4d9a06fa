"""Split sizes of the uneven ``all_to_all`` on the host (:mod:`iris.ccl._uneven` runs it):
the checks of one rank's call, the comparison of every rank's sizes in debug mode, and the
small device table of row counts and offsets that the kernel reads.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections import OrderedDict
from collections.abc import Sequence

import torch

import iris.mem
from iris.mem import runtime

from . import _host
from .config import Config

#: Split rows and header payloads travel as 32-bit numbers.
MAX_ROWS = (1 << 31) - 1


@dataclasses.dataclass(frozen=True)
class Splits:
    """A validated call's sizes: the group's ``size``, this rank's ``index`` in it, rows
    sent to (``in_rows``) and received from (``out_rows``) each member, and elements per
    ``row``."""

    size: int
    index: int
    in_rows: list[int]
    out_rows: list[int]
    row: int

    def table(self, device: torch.device) -> torch.Tensor:
        """The kernel's ``[4, G]`` table: send offsets, send counts, receive offsets,
        receive counts (rows), from :func:`split_table`."""
        values = [*_offsets(self.in_rows), *self.in_rows, *_offsets(self.out_rows), *self.out_rows]
        return split_table(device, values)


def _split_rows(sizes, name: str, t: torch.Tensor, tname: str, size: int) -> list[int]:
    """``sizes`` as a list of ``size`` non-negative ints summing to ``t.shape[0]`` (None:
    equal splits of dim 0), or a clear TypeError / ValueError naming ``name``."""
    rows = t.shape[0]
    if sizes is None:
        if rows % size:
            raise ValueError(
                f"all_to_all: {name} is None (equal splits) but {tname} has {rows} rows (shape "
                f"{list(t.shape)}), which {size} ranks do not divide; pass {name} explicitly"
            )
        return [rows // size] * size
    if isinstance(sizes, torch.Tensor):
        if sizes.device.type != "cpu" or sizes.dim() != 1 or sizes.dtype.is_floating_point:
            raise TypeError(
                f"all_to_all: {name} must be a list of ints or a 1-d integer tensor on the CPU, got a "
                f"{sizes.dtype} tensor of shape {list(sizes.shape)} on {sizes.device} (sizes on a GPU "
                "would need a host synchronisation to read: call .tolist() where that is acceptable)"
            )
        sizes = sizes.tolist()
    elif not isinstance(sizes, (list, tuple)) and callable(getattr(sizes, "tolist", None)):
        sizes = sizes.tolist()  # a numpy array
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise TypeError(f"all_to_all: {name} must be a list of ints or None, got {type(sizes).__name__}")
    bad = [s for s in sizes if isinstance(s, bool) or not hasattr(type(s), "__index__")]
    if bad:
        raise TypeError(f"all_to_all: {name} must hold ints (rows of dim 0), got {bad[0]!r} in {list(sizes)}")
    sizes = [operator.index(s) for s in sizes]
    if len(sizes) != size:
        raise ValueError(
            f"all_to_all: {name} has {len(sizes)} entries, the group has {size} ranks: give one size per rank"
        )
    if any(s < 0 for s in sizes):
        raise ValueError(f"all_to_all: {name} has a negative size: {list(sizes)}")
    if sum(sizes) != rows:
        raise ValueError(
            f"all_to_all: {name} sums to {sum(sizes)} rows but {tname} has {rows} rows (shape "
            f"{list(t.shape)}); the sizes count rows of dim 0 and must add up to it"
        )
    return sizes


def _check_shapes(out: torch.Tensor, inp: torch.Tensor) -> int:
    """Elements per row of dim 0, the same for ``out`` and ``inp``."""
    for t, name in ((out, "out"), (inp, "inp")):
        if t.dim() == 0:
            raise ValueError(f"all_to_all: {name} is a scalar; split sizes count rows of dim 0: give it one")
    row = math.prod(inp.shape[1:])
    if math.prod(out.shape[1:]) != row:
        raise ValueError(
            f"all_to_all: out (shape {list(out.shape)}) and inp (shape {list(inp.shape)}) have rows of "
            f"{math.prod(out.shape[1:])} and {row} elements; the rows of dim 0 must have the same size"
        )
    if max(out.shape[0], inp.shape[0]) > MAX_ROWS:
        raise ValueError(f"all_to_all with split sizes moves at most {MAX_ROWS} rows per rank")
    return row


def validate(out, inp, output_split_sizes, input_split_sizes, group, config) -> Splits:
    """The call's :class:`Splits`: local checks, then in debug mode the comparison of every
    rank's call (a rank whose sizes are wrong makes every rank raise)."""
    _host.check_tensor(out, "out")
    _host.check_tensor(inp, "inp")
    _host.check_config(config)
    size, index = _host.group_position(group)
    _host.check_pair(out, inp, "all_to_all", out.numel())  # dtypes and devices
    problem = None
    try:
        row = _check_shapes(out, inp)
        in_rows = _split_rows(input_split_sizes, "input_split_sizes", inp, "inp", size)
        out_rows = _split_rows(output_split_sizes, "output_split_sizes", out, "out", size)
        if in_rows[index] != out_rows[index]:
            raise ValueError(
                f"all_to_all: this rank (index {index} of the group) sends itself {in_rows[index]} rows "
                f"(input_split_sizes[{index}]) but expects {out_rows[index]} (output_split_sizes[{index}]); "
                "they must be equal"
            )
    except (TypeError, ValueError) as e:
        problem = e
    if iris.mem.debug_enabled():
        _host.check_consistent(
            "all_to_all", group, shapes=[list(out.shape[1:]), list(inp.shape[1:])],
            dtypes=[str(out.dtype), str(inp.dtype)], op=None,
            variant=config.variant if isinstance(config, Config) else "auto", root=None,
            split_sizes="given", problem=None if problem is None else str(problem),
        )  # fmt: skip
    if problem is not None:
        raise problem
    if iris.mem.debug_enabled():
        _check_pairs(group, in_rows, out_rows)
    return Splits(size, index, in_rows, out_rows, row)


def _check_pairs(group, in_rows: list[int], out_rows: list[int]) -> None:
    """Debug mode: rank ``i``'s ``input_split_sizes[j]`` equals rank ``j``'s
    ``output_split_sizes[i]`` for every pair, else the same ValueError on every rank."""
    ranks = runtime.group_ranks(group)
    sizes = (in_rows, out_rows)
    everyone = runtime.exchange(group, "iris.ccl all_to_all split sizes", sizes, ValueError, ranks)
    wrong = [
        f"rank {ranks[i]} sends {everyone[i][0][j]} rows to rank {ranks[j]} (its input_split_sizes[{j}]) "
        f"but rank {ranks[j]} expects {everyone[j][1][i]} (its output_split_sizes[{i}])"
        for i in range(len(ranks))
        for j in range(len(ranks))
        if everyone[i][0][j] != everyone[j][1][i]
    ]
    if wrong:
        raise ValueError(
            "all_to_all (IRIS_DEBUG): the split sizes of the ranks do not match: "
            + "; ".join(wrong[:8])
            + (f"; and {len(wrong) - 8} more" if len(wrong) > 8 else "")
            + ". Rank i's input_split_sizes[j] must equal rank j's output_split_sizes[i]"
        )


def _offsets(rows: list[int]) -> list[int]:
    return [sum(rows[:k]) for k in range(len(rows))]


#: Split tables by (device, values), most recent last; at most this many besides those
#: captured in CUDA graphs (kept for the graphs' replays).
_TABLES: OrderedDict = OrderedDict()
_CAPTURED: dict = {}
_MAX_TABLES = 64


def split_table(device: torch.device, values: list[int]) -> torch.Tensor:
    """The int64 tensor of ``values`` on ``device``: made once per distinct ``values``. Kept
    tables are made outside any CUDA graph pool of this thread (:func:`iris.mem.kept_tensor`:
    a call in the first run of a ``torch.compile(mode="reduce-overhead")`` function would
    otherwise leave them in its pool); while a CUDA graph is captured, from pinned memory by
    an asynchronous copy that the graph replays (the graph keeps the table)."""
    key = (device, tuple(values))
    capturing = iris.mem.capturing(device)
    table = _CAPTURED.get(key)
    if table is None:
        table = _TABLES.pop(key, None)
    if table is None:
        if capturing:
            host = torch.tensor(values, dtype=torch.int64).pin_memory()
            table = (torch.empty(len(values), dtype=torch.int64, device=device), host)
            table[0].copy_(host, non_blocking=True)
        else:
            table = (iris.mem.kept_tensor(values, torch.int64, device), None)
    if capturing:
        _CAPTURED[key] = table
    elif key not in _CAPTURED:
        if iris.mem.capabilities(device).streams:  # an evicted table waits for the kernels reading it
            table[0].record_stream(torch.cuda.current_stream(device))
        _TABLES[key] = table
        while len(_TABLES) > _MAX_TABLES:
            _TABLES.popitem(last=False)
    return table[0]
