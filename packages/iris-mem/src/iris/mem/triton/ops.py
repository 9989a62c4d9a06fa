"""Remote memory access from Triton kernels: the functional API.

Every function takes ``heap_bases`` (``heap.get_heap_bases()``) and two ranks, and
translates a pointer that is valid in one rank's heap into the same offset of another
rank's heap. Argument orders follow the reference Iris API, so code ports by changing
imports; note that they differ between functions:

* ``load(pointer, to_rank, from_rank, ...)``: ``to_rank`` is the calling rank, the data
  comes *from* ``from_rank``.
* ``store(pointer, value, from_rank, to_rank, ...)``: ``from_rank`` is the calling rank.
* atomics ``(pointer, val, from_rank, to_rank, ...)``: ``from_rank`` is the calling rank.

Memory model: ``sem`` is one of ``"acquire"``, ``"release"``, ``"acq_rel"`` (default) or
``"relaxed"``; ``scope`` one of ``"cta"``, ``"gpu"`` (default) or ``"sys"``. A flag that
another GPU (or process) polls must be written and read with ``scope="sys"``.

``hint`` (a constexpr int or tuple) re-asserts alignment and contiguity of the
translated pointer (``tl.multiple_of`` + ``tl.max_contiguous``), so accesses stay
vectorised after translation: pass the block's contiguous length, e.g. ``hint=16`` or
``hint=(1, BLOCK_N)``.

Every translation is checked on the ``cpu`` backend (Triton's interpreter): a rank that is
not one, or a pointer that is not in the calling rank's heap (two rank arguments swapped,
an ordinary tensor, an index past the end of its allocation), raises
:class:`~iris.mem.HeapPointerError` naming the call and the argument, before any memory is
touched (see :mod:`iris.mem.triton._checks`). Compiled kernels check in the kernel when
``IRIS_DEBUG=1`` is set before import: a bad translation stops the kernel with a message
naming the rank, the peer and the offset.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import settings as _settings
from ._checks import check_translation
from ._compat import jit

#: ``IRIS_DEBUG``, read at import: kernels are compiled with or without the checks it asks for.
_DEBUG: tl.constexpr = tl.constexpr(_settings.debug())
_INTERPRETED: tl.constexpr = tl.constexpr(_settings.interpreted())
#: Whether a translation checks in the kernel that the pointer lies in the source heap:
#: compiled kernels do in debug mode; the interpreter checks every translation on the host
#: instead, debug or not (:func:`_check_on_host`).
_CHECK_IN_KERNEL: tl.constexpr = tl.constexpr(_DEBUG.value and not _INTERPRETED.value)
#: Word of the context tensor, counted back from ``heap_bases``, holding the heap size.
_HEAP_SIZE_WORD: tl.constexpr = tl.constexpr(-2)

if _settings.interpreted():
    # A plain Python function: the interpreter calls it like a device function, at no cost of
    # a device-function call, and it reads the host's memory directly.
    _check_on_host = check_translation
else:

    @triton.jit
    def _check_on_host(ptr, from_rank, to_rank, heap_bases, mask):
        """Compiled kernels have no host to ask: nothing (never called, see translate)."""
        pass


@triton.jit
def _out_of_heap(from_rank, to_rank, offset, heap_size):
    """Compiled: print the culprit, then trap (stops the kernel without TRITON_DEBUG)."""
    tl.device_print(
        "IRIS_DEBUG pointer outside the symmetric heap: rank, peer, byte offset, heap bytes",
        from_rank,
        to_rank,
        offset,
        heap_size,
    )
    tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _check_in_heap(offset, from_rank, to_rank, heap_bases, mask):
    heap_size = tl.load(heap_bases + _HEAP_SIZE_WORD).to(tl.uint64)
    bad = offset >= heap_size  # unsigned: a pointer below the base wraps to a huge offset
    if mask is not None:
        bad = bad & mask
    # Only elementwise ops and a full reduction, no new blocks: Gluon kernels (explicit
    # layouts) compile this check too. A bad offset is >= heap_size > 0, so the largest
    # flagged lane (0 elsewhere) tells whether there is one.
    worst = tl.where(bad, offset, 0)
    if worst.type.is_block():
        worst = tl.max(worst)
    if worst >= heap_size:
        _out_of_heap(from_rank, to_rank, worst, heap_size)


@jit
def translate(ptr, from_rank, to_rank, heap_bases, hint: tl.constexpr = None, mask=None):
    """Translate ``ptr`` from ``from_rank``'s heap to the same offset in ``to_rank``'s heap.

    :param ptr: pointer or block of pointers into ``from_rank``'s heap, as mapped in this
        process.
    :param from_rank: rank whose heap ``ptr`` points into.
    :param to_rank: rank whose heap the result points into.
    :param heap_bases: pointer to the int64 table of heap bases (``heap.get_heap_bases()``).
    :param hint: optional contiguity/alignment hint re-applied to the result.
    :param mask: lanes to check in debug mode (masked-out lanes may hold any pointer).
    :returns: pointer(s) of the same type as ``ptr``, valid in this process only.
    """
    if _INTERPRETED:  # before the loads below: a rank that is not one would read past the table
        _check_on_host(ptr, from_rank, to_rank, heap_bases, mask)
    from_base = tl.load(heap_bases + from_rank)
    to_base = tl.load(heap_bases + to_rank)
    offset = ptr.to(tl.uint64, bitcast=True) - from_base.to(tl.uint64)
    if _CHECK_IN_KERNEL:
        _check_in_heap(offset, from_rank, to_rank, heap_bases, mask)
    translated = (to_base.to(tl.pointer_type(tl.int8)) + offset).to(ptr.dtype, bitcast=True)
    if hint is not None:
        translated = tl.max_contiguous(tl.multiple_of(translated, hint), hint)
    return translated


@jit
def load(
    pointer,
    to_rank,
    from_rank,
    heap_bases,
    mask=None,
    other=None,
    cache_modifier=None,
    volatile=False,
    hint=None,
):
    """Load from ``from_rank``'s heap at the offset of ``pointer`` (valid for ``to_rank``,
    the calling rank). Returns the loaded block."""
    tl.static_assert(
        not (volatile and cache_modifier is not None and cache_modifier != ""),
        "iris load: volatile=True cannot be combined with a cache_modifier (PTX has no volatile .cg load)",
    )
    src = translate(pointer, to_rank, from_rank, heap_bases, hint, mask)
    return tl.load(src, mask=mask, other=other, cache_modifier=cache_modifier, volatile=volatile)


@jit
def store(pointer, value, from_rank, to_rank, heap_bases, mask=None, hint=None, cache_modifier=None):
    """Store ``value`` into ``to_rank``'s heap at the offset of ``pointer`` (valid for
    ``from_rank``, the calling rank)."""
    dst = translate(pointer, from_rank, to_rank, heap_bases, hint, mask)
    tl.store(dst, value, mask=mask, cache_modifier=cache_modifier)


@jit
def copy(
    src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases,
    mask=None, other=None, load_cache_modifier=None, store_cache_modifier=None, hint=None,
):  # fmt: skip
    """Copy from ``from_rank``'s heap at ``src_ptr`` to ``to_rank``'s heap at ``dst_ptr``.

    Both pointers are given in ``cur_rank``'s (the calling rank's) address space; either
    end may be local or remote.
    """
    src = translate(src_ptr, cur_rank, from_rank, heap_bases, hint, mask)
    dst = translate(dst_ptr, cur_rank, to_rank, heap_bases, hint, mask)
    data = tl.load(src, mask=mask, other=other, cache_modifier=load_cache_modifier)
    tl.store(dst, data, mask=mask, cache_modifier=store_cache_modifier)


@jit
def get(
    from_ptr, to_ptr, from_rank, to_rank, heap_bases,
    mask=None, other=None, load_cache_modifier=None, store_cache_modifier=None, hint=None,
):  # fmt: skip
    """Remote read: load ``from_rank``'s data at ``from_ptr`` and store it locally at
    ``to_ptr``. ``to_rank`` is the calling rank; both pointers are in its space."""
    src = translate(from_ptr, to_rank, from_rank, heap_bases, hint, mask)
    data = tl.load(src, mask=mask, other=other, cache_modifier=load_cache_modifier)
    tl.store(to_ptr, data, mask=mask, cache_modifier=store_cache_modifier)


@jit
def put(
    from_ptr, to_ptr, from_rank, to_rank, heap_bases,
    mask=None, other=None, load_cache_modifier=None, store_cache_modifier=None, hint=None,
):  # fmt: skip
    """Remote write: load local data at ``from_ptr`` and store it into ``to_rank``'s heap
    at ``to_ptr``. ``from_rank`` is the calling rank; both pointers are in its space."""
    data = tl.load(from_ptr, mask=mask, other=other, cache_modifier=load_cache_modifier)
    dst = translate(to_ptr, from_rank, to_rank, heap_bases, hint, mask)
    tl.store(dst, data, mask=mask, cache_modifier=store_cache_modifier)


# --------------------------------------------------------------------------- atomics
# Every remote atomic is one translation and one of Triton's atomics, which returns the
# previous value(s) at the target: _atomic, told which by the constexpr ``op``. The public
# functions below (and Context's methods) are calls of it.


@jit
def _atomic(op: tl.constexpr, pointer, cmp, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint):
    """Atomic ``op`` (``"add"``, ``"sub"``, ``"xchg"``, ``"xor"``, ``"and"``, ``"or"``,
    ``"min"``, ``"max"`` or ``"cas"``, which alone uses ``cmp`` and takes no mask) of ``val``
    at ``pointer`` in ``to_rank``'s heap; returns the previous value(s)."""
    target = translate(pointer, from_rank, to_rank, heap_bases, hint, mask)
    if op == "add":
        old = tl.atomic_add(target, val, mask=mask, sem=sem, scope=scope)
    elif op == "sub":  # Triton has no atomic subtract: add the negation
        old = tl.atomic_add(target, -val, mask=mask, sem=sem, scope=scope)
    elif op == "xchg":
        old = tl.atomic_xchg(target, val, mask=mask, sem=sem, scope=scope)
    elif op == "xor":
        old = tl.atomic_xor(target, val, mask=mask, sem=sem, scope=scope)
    elif op == "and":
        old = tl.atomic_and(target, val, mask=mask, sem=sem, scope=scope)
    elif op == "or":
        old = tl.atomic_or(target, val, mask=mask, sem=sem, scope=scope)
    elif op == "min":
        old = tl.atomic_min(target, val, mask=mask, sem=sem, scope=scope)
    elif op == "max":
        old = tl.atomic_max(target, val, mask=mask, sem=sem, scope=scope)
    else:
        tl.static_assert(op == "cas", "iris atomic: unknown op")
        old = tl.atomic_cas(target, cmp, val, sem=sem, scope=scope)
    return old


@jit
def atomic_add(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint=None):
    """Atomically add ``val`` at ``pointer`` in ``to_rank``'s heap (integers, fp32, fp16, bf16)."""
    return _atomic("add", pointer, None, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@jit
def atomic_sub(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint=None):
    """Atomically subtract ``val`` at ``pointer`` in ``to_rank``'s heap: an add of ``-val``,
    for the types :func:`atomic_add` takes."""
    return _atomic("sub", pointer, None, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@jit
def atomic_xchg(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint=None):
    """Atomically write ``val`` at ``pointer`` in ``to_rank``'s heap, returning the value it
    replaces (integers, fp32). With ``sem="release", scope="sys"`` it raises a flag that a peer
    waits on: everything this thread wrote before is visible to whoever sees the new value."""
    return _atomic("xchg", pointer, None, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@jit
def atomic_xor(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint=None):
    """Atomic bitwise xor at ``pointer`` in ``to_rank``'s heap (integer types only)."""
    return _atomic("xor", pointer, None, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@jit
def atomic_and(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint=None):
    """Atomic bitwise and at ``pointer`` in ``to_rank``'s heap (integer types only): clears
    the bits that are 0 in ``val``."""
    return _atomic("and", pointer, None, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@jit
def atomic_or(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint=None):
    """Atomic bitwise or at ``pointer`` in ``to_rank``'s heap (integer types only): sets the
    bits that are 1 in ``val``, so ranks can each set their own bit of one shared mask word
    without losing the others'."""
    return _atomic("or", pointer, None, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@jit
def atomic_min(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint=None):
    """Atomic minimum at ``pointer`` in ``to_rank``'s heap (integers, fp32): the value there
    becomes the smaller of itself and ``val``."""
    return _atomic("min", pointer, None, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@jit
def atomic_max(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint=None):
    """Atomic maximum at ``pointer`` in ``to_rank``'s heap (integers, fp32). A counter that
    only grows (a barrier's generation) is published with it: a late, smaller write cannot
    move it back."""
    return _atomic("max", pointer, None, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@jit
def atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, sem=None, scope=None, hint=None):
    """Atomic compare-and-swap at ``pointer`` in ``to_rank``'s heap: where the value equals
    ``cmp``, write ``val``. Returns the previous value (equal to ``cmp`` on success)."""
    return _atomic("cas", pointer, cmp, val, from_rank, to_rank, heap_bases, None, sem, scope, hint)
