"""``Context``: the object-oriented device API for Triton kernels.

A kernel receives ``heap.get_device_context()`` and its rank and world size as
``tl.constexpr`` arguments, builds a :class:`Context` once, and calls its methods; each
method translates pointers from ``self.rank``'s heap, so the calling rank never appears
in the arguments::

    @triton.jit
    def kernel(context, buf, n, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
        ctx = Context.initialize(context, RANK, WORLD)
        offs = tl.arange(0, BLOCK)
        peer = (RANK + 1) % WORLD
        ctx.store(buf + offs, offs.to(tl.float32), peer, mask=offs < n)
"""

import triton
import triton.language as tl

from ..trace_format import TraceEvent
from . import ops
from ._compat import aggregate, constexpr_function, jit
from .ops import translate
from .tracing import Tracing

#: Index of the first heap base in the context tensor (see ``SymmetricHeap.get_device_context``).
HEAP_BASES_OFFSET: tl.constexpr = tl.constexpr(4)

_LOAD: tl.constexpr = tl.constexpr(int(TraceEvent.LOAD))
_STORE: tl.constexpr = tl.constexpr(int(TraceEvent.STORE))
_GET: tl.constexpr = tl.constexpr(int(TraceEvent.GET))
_PUT: tl.constexpr = tl.constexpr(int(TraceEvent.PUT))
_COPY: tl.constexpr = tl.constexpr(int(TraceEvent.COPY))


@constexpr_function
def _atomic_event(op):
    """The trace event of atomic ``op`` (``"add"``: ``TraceEvent.ATOMIC_ADD``, ...)."""
    return int(TraceEvent["ATOMIC_" + op.upper()])


# The reference exposed its translation helper under this private module-level name;
# it stays importable here for ported code (``iris.device.triton.context.__translate``).
__translate = translate


@aggregate
class Context:
    """Device-side handle on the symmetric heap for one rank.

    Fields: ``rank`` and ``world_size`` (constexpr), ``heap_bases`` (pointer to the int64
    table of heap bases), ``tracing`` (the :class:`~iris.mem.triton.Tracing` recorder;
    ``tracing.enabled`` is the constexpr flag given to :meth:`initialize`).

    With tracing enabled every method records one event per call and program: the
    operation, the peer (``to_rank``/``from_rank``; for ``copy`` the destination, with
    the source rank in ``arg``), the lowest address of the active lanes of the remote-side
    pointer (``pointer``, ``to_ptr`` for put, ``from_ptr`` for get, ``dst_ptr`` for copy)
    and active lanes x element bytes.
    """

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: Tracing

    @constexpr_function
    def __init__(self, rank, world_size, heap_bases, tracing):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases
        self.tracing = tracing

    @staticmethod
    @triton.jit
    def initialize(
        context_tensor, rank: tl.constexpr, world_size: tl.constexpr, tracing: tl.constexpr = False
    ):
        """Decode ``heap.get_device_context()`` for the calling ``rank`` (constexpr).

        :param context_tensor: pointer to the int64 context tensor.
        :param rank: this kernel's rank (``tl.constexpr``).
        :param world_size: number of ranks (``tl.constexpr``).
        :param tracing: record an event for every RMA call (``tl.constexpr``); the host
            sets the buffer up with ``heap.tracing.enable()``. False compiles every
            recording away.
        """
        heap_bases = context_tensor + HEAP_BASES_OFFSET
        if tracing:
            recorder = Tracing.initialize(heap_bases, rank, world_size, tracing)
        else:  # built here: no device-function call, which the interpreter makes costly
            recorder = Tracing(False, rank, heap_bases)
        return Context(rank, world_size, heap_bases, recorder)

    @jit
    def translate(self, ptr, to_rank, hint: tl.constexpr = None):
        """Pointer(s) into ``to_rank``'s heap at the offset of ``ptr`` in this rank's heap."""
        return ops.translate(ptr, self.rank, to_rank, self.heap_bases, hint)

    # Every method tests ``tracing.enabled`` (a constexpr) itself rather than calling the
    # recorder unconditionally: compiled, both compile away; in the interpreter a device
    # function call costs about a millisecond, which the test suites would pay on every op.

    @jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier=None, volatile=False, hint=None):
        """Load from ``from_rank``'s heap at the offset of ``pointer``."""
        if self.tracing.enabled:
            event = self.tracing.record_event_start(_LOAD, from_rank, pointer, mask)
        result = ops.load(
            pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile, hint
        )
        if self.tracing.enabled:
            self.tracing.record_event_end(event)
        return result

    @jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier=None, hint=None):
        """Store ``value`` into ``to_rank``'s heap at the offset of ``pointer``."""
        if self.tracing.enabled:
            event = self.tracing.record_event_start(_STORE, to_rank, pointer, mask)
        ops.store(pointer, value, self.rank, to_rank, self.heap_bases, mask, hint, cache_modifier)
        if self.tracing.enabled:
            self.tracing.record_event_end(event)

    @jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier=None,
            store_cache_modifier=None, hint=None):  # fmt: skip
        """Copy ``from_rank``'s data at ``from_ptr`` into this rank's ``to_ptr``."""
        if self.tracing.enabled:
            event = self.tracing.record_event_start(_GET, from_rank, from_ptr, mask)
        ops.get(from_ptr, to_ptr, from_rank, self.rank, self.heap_bases,
                mask, other, load_cache_modifier, store_cache_modifier, hint)  # fmt: skip
        if self.tracing.enabled:
            self.tracing.record_event_end(event)

    @jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier=None,
            store_cache_modifier=None, hint=None):  # fmt: skip
        """Copy this rank's data at ``from_ptr`` into ``to_rank``'s heap at ``to_ptr``."""
        if self.tracing.enabled:
            event = self.tracing.record_event_start(_PUT, to_rank, to_ptr, mask)
        ops.put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases,
                mask, other, load_cache_modifier, store_cache_modifier, hint)  # fmt: skip
        if self.tracing.enabled:
            self.tracing.record_event_end(event)

    @jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None, load_cache_modifier=None,
             store_cache_modifier=None, hint=None):  # fmt: skip
        """Copy from ``from_rank``'s heap at ``src_ptr`` to ``to_rank``'s at ``dst_ptr``."""
        if self.tracing.enabled:  # the event's target is the destination; the source goes in ``arg``
            event = self.tracing.record_event_start(_COPY, to_rank, dst_ptr, mask, from_rank)
        ops.copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases,
                 mask, other, load_cache_modifier, store_cache_modifier, hint)  # fmt: skip
        if self.tracing.enabled:
            self.tracing.record_event_end(event)

    # Every atomic is one call of _atomic, which records the event and calls the functional
    # form's implementation (:func:`iris.mem.triton.ops._atomic`) with ``self.rank``.

    @jit
    def _atomic(self, op: tl.constexpr, pointer, cmp, val, to_rank, mask, sem, scope, hint):
        if self.tracing.enabled:
            event = self.tracing.record_event_start(_atomic_event(op), to_rank, pointer, mask)
        old = ops._atomic(op, pointer, cmp, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        if self.tracing.enabled:
            self.tracing.record_event_end(event)
        return old

    @jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic add in ``to_rank``'s heap; returns the previous value."""
        return self._atomic("add", pointer, None, val, to_rank, mask, sem, scope, hint)

    @jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic subtract in ``to_rank``'s heap (an add of ``-val``); returns the previous
        value."""
        return self._atomic("sub", pointer, None, val, to_rank, mask, sem, scope, hint)

    @jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic exchange in ``to_rank``'s heap; returns the previous value. With
        ``sem="release", scope="sys"``: raise a flag a peer waits on
        (:func:`~iris.mem.triton.atomic_xchg`)."""
        return self._atomic("xchg", pointer, None, val, to_rank, mask, sem, scope, hint)

    @jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic xor in ``to_rank``'s heap (integer types); returns the previous value."""
        return self._atomic("xor", pointer, None, val, to_rank, mask, sem, scope, hint)

    @jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic and in ``to_rank``'s heap (integer types): clears the bits that are 0 in
        ``val``; returns the previous value."""
        return self._atomic("and", pointer, None, val, to_rank, mask, sem, scope, hint)

    @jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic or in ``to_rank``'s heap (integer types): sets the bits that are 1 in
        ``val``, so several ranks can set their own bits of one word; returns the previous
        value."""
        return self._atomic("or", pointer, None, val, to_rank, mask, sem, scope, hint)

    @jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic minimum in ``to_rank``'s heap; returns the previous value."""
        return self._atomic("min", pointer, None, val, to_rank, mask, sem, scope, hint)

    @jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic maximum in ``to_rank``'s heap; returns the previous value. A generation
        counter is published with it: a late, smaller write cannot move it back."""
        return self._atomic("max", pointer, None, val, to_rank, mask, sem, scope, hint)

    @jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem=None, scope=None, hint=None):
        """Atomic compare-and-swap in ``to_rank``'s heap; returns the previous value."""
        return self._atomic("cas", pointer, cmp, val, to_rank, None, sem, scope, hint)
