"""Checks of every translation in Triton's interpreter (the ``cpu`` backend).

On the ``cpu`` backend every rank's heap is mapped into every process. A translation with a
wrong rank (the two rank arguments of a functional call swapped, a rank that is not one) or
of a pointer that is not on the heap makes an address that nothing maps, and the process
dies by SIGSEGV with no message. So in the interpreter :func:`iris.mem.triton.translate`
calls :func:`check_translation` first, on the host, before any memory is touched: it raises
:class:`~iris.mem.HeapPointerError` naming the call and the rank argument that is out of
place. (Compiled kernels check in the kernel, in debug mode only: ``IRIS_DEBUG``.)

The check reads the context tensor that ``heap_bases`` points into
(``[rank, world_size, heap_size, flags, base_0, ...]``) and costs a few microseconds per
translation, next to the tens of microseconds the interpreter spends on the translation
itself.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

import numpy as np

from ..errors import HeapPointerError

#: Words of the context tensor before the heap bases, counted back from ``heap_bases``.
_RANK_WORD, _WORLD_WORD, _HEAP_SIZE_WORD = -4, -3, -2
_WORD_BYTES = 8

#: The modules whose frames are Iris's device API (the check names the outermost such call).
_OPS_FILE = os.path.realpath(os.path.join(os.path.dirname(__file__), "ops.py"))
_CONTEXT_FILE = os.path.realpath(os.path.join(os.path.dirname(__file__), "context.py"))

#: Functional forms: the argument naming the calling rank (whose heap the pointer is in),
#: the one naming the rank whose heap is accessed, and how the call orders them.
_FUNCTIONAL_RANKS = {
    "translate": ("from_rank", "to_rank", "translate(ptr, from_rank, to_rank, heap_bases, ...)"),
    "load": ("to_rank", "from_rank", "load(pointer, to_rank, from_rank, heap_bases, ...)"),
    "get": ("to_rank", "from_rank", "get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, ...)"),
    "store": ("from_rank", "to_rank", "store(pointer, value, from_rank, to_rank, heap_bases, ...)"),
    "put": ("from_rank", "to_rank", "put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, ...)"),
    "copy": ("cur_rank", None, "copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, ...)"),
    "atomic_cas": (
        "from_rank",
        "to_rank",
        "atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, ...)",
    ),
}
#: Context methods that read from ``from_rank`` (the others write to, or update at, ``to_rank``).
_CONTEXT_READS = ("load", "get")


def _word(address: int) -> int:
    return ctypes.c_int64.from_address(address).value


def _scalar(value: Any) -> int:
    """A rank as the interpreter passes it: an int, a constexpr or a one-element tensor."""
    value = getattr(value, "value", value)  # tl.constexpr
    handle = getattr(value, "handle", None)
    return int(np.asarray(handle.data).reshape(-1)[0]) if handle is not None else int(value)


def _active_addresses(ptr: Any, mask: Any) -> np.ndarray:
    """The addresses of the lanes of ``ptr`` that ``mask`` leaves active, as uint64."""
    addresses = np.asarray(ptr.handle.data, dtype=np.uint64)
    if mask is None:
        return addresses.reshape(-1)
    addresses, lanes = np.broadcast_arrays(addresses, np.asarray(mask.handle.data, dtype=bool))
    return addresses[lanes]


def check_translation(ptr: Any, from_rank: Any, to_rank: Any, heap_bases: Any, mask: Any) -> None:
    """Raise :class:`~iris.mem.HeapPointerError` unless both ranks are ranks of the heap and
    every active lane of ``ptr`` lies in ``from_rank``'s heap (see the module docstring)."""
    table = heap_bases.handle.data.item()
    world = _word(table + _WORLD_WORD * _WORD_BYTES)
    heap_size = _word(table + _HEAP_SIZE_WORD * _WORD_BYTES)
    source, target = _scalar(from_rank), _scalar(to_rank)
    if 0 <= source < world and 0 <= target < world:
        # Unsigned: an address below the base wraps to a huge offset, so one comparison covers
        # both ends. Masked-out lanes may hold any pointer: they are never dereferenced.
        outside = (ptr.handle.data - np.uint64(_word(table + source * _WORD_BYTES))) >= np.uint64(heap_size)
        if mask is not None:
            outside = outside & mask.handle.data  # broadcast like tl.load: either may be the larger
        if not outside.any():
            return
    elif mask is not None and not np.any(mask.handle.data):
        # No lane active: nothing is dereferenced (a kernel may compute a rank it never uses
        # under a mask that is all false); only the table's word at that rank is read.
        return
    raise HeapPointerError(_explain(table, world, heap_size, source, target, _active_addresses(ptr, mask)))


def _explain(table: int, world: int, heap_size: int, source: int, target: int, addresses: np.ndarray) -> str:
    rank = _word(table + _RANK_WORD * _WORD_BYTES)
    call, source_name, target_name, order = _calling_api(target)
    for name, value in ((source_name, source), (target_name, target)):
        if not 0 <= value < world:
            return (
                f"{call}: rank {rank}: {name}={value} is not a rank of the symmetric heap (ranks 0 to "
                f"{world - 1}); ranks are heap ranks (heap.rank of each process), not global ranks of a job "
                "spanning nodes"
            )
    bases = [_word(table + r * _WORD_BYTES) for r in range(world)]
    base = np.uint64(bases[source])
    address = int(addresses[(addresses - base) >= np.uint64(heap_size)][0])
    owner = next((r for r, b in enumerate(bases) if b <= address < b + heap_size), None)
    offset = address - bases[source]
    text = (
        f"{call}: rank {rank} translated a pointer to rank {target} at byte offset {offset} of rank "
        f"{source}'s heap, which holds {heap_size} bytes"
    )
    if owner is None:
        return (
            f"{text}: the pointer is not in the symmetric heap (an ordinary tensor, or an index past the end "
            "of its allocation); allocate what kernels translate with the heap's factories"
        )
    if owner == target and order is not None:
        return (
            f"{text}: the pointer lies in rank {target}'s heap, so `{source_name}` and `{target_name}` look "
            f"swapped: in {order} the calling rank, whose heap the pointer is in ({target} here), is "
            f"`{source_name}`"
        )
    return (
        f"{text}: the pointer lies in rank {owner}'s heap as this process maps it; pass pointers into the "
        f"calling rank's own heap (rank {source}, {source_name}) and let Iris translate them"
    )


def _calling_api(target: int) -> tuple[str, str, str, str | None]:
    """``(the call, the name of its calling-rank argument, of its target-rank argument, its
    rank order or None)`` of the outermost call of Iris's device API on the stack: the one
    the kernel made."""
    outermost = None
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.realpath(frame.f_code.co_filename)
        if filename in (_OPS_FILE, _CONTEXT_FILE) and not frame.f_code.co_name.startswith("_"):
            outermost = frame
        frame = frame.f_back
    if outermost is None:
        return "iris.mem.triton.translate", "from_rank", "to_rank", None
    name = outermost.f_code.co_name
    target_name = _copy_target(outermost.f_locals, target) if name == "copy" else None
    if os.path.realpath(outermost.f_code.co_filename) == _CONTEXT_FILE:
        if target_name is None:
            target_name = "from_rank" if name in _CONTEXT_READS else "to_rank"
        return f"Context.{name}", "`rank` of Context.initialize", target_name, None
    source_name, default_target, order = _FUNCTIONAL_RANKS.get(
        name, ("from_rank", "to_rank", f"{name}(pointer, val, from_rank, to_rank, heap_bases, ...)")
    )
    return f"iris.mem.triton.{name}", source_name, target_name or default_target, order


def _copy_target(local_names: dict, target: int) -> str:
    """Which end of a copy the translation was for (its source is translated first)."""
    try:
        if _scalar(local_names.get("from_rank")) == target:
            return "from_rank"
    except (TypeError, ValueError):
        pass
    return "to_rank"
