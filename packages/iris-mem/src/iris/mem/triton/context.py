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

from . import ops
from ._compat import aggregate, constexpr_function
from .ops import translate

#: Index of the first heap base in the context tensor (see ``SymmetricHeap.get_device_context``).
HEAP_BASES_OFFSET: tl.constexpr = tl.constexpr(4)

# The reference exposed its translation helper under this private module-level name;
# it stays importable here for ported code (``iris.device.triton.context.__translate``).
__translate = translate


@aggregate
class Context:
    """Device-side handle on the symmetric heap for one rank.

    Fields: ``rank`` and ``world_size`` (constexpr), ``heap_bases`` (pointer to the int64
    table of heap bases), ``tracing`` (constexpr bool).
    """

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: tl.constexpr

    @constexpr_function
    def __init__(self, rank, world_size, heap_bases, tracing):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases
        self.tracing = tl.constexpr(tracing)

    @staticmethod
    @triton.jit
    def initialize(
        context_tensor, rank: tl.constexpr, world_size: tl.constexpr, tracing: tl.constexpr = False
    ):
        """Decode ``heap.get_device_context()`` for the calling ``rank`` (constexpr).

        :param context_tensor: pointer to the int64 context tensor.
        :param rank: this kernel's rank (``tl.constexpr``).
        :param world_size: number of ranks (``tl.constexpr``).
        :param tracing: must be False: device-side event tracing is not part of this release.
        """
        tl.static_assert(not tracing, "device tracing is not enabled in this build of iris.mem")
        return Context(rank, world_size, context_tensor + HEAP_BASES_OFFSET, tracing)

    @triton.jit
    def translate(self, ptr, to_rank, hint: tl.constexpr = None):
        """Pointer(s) into ``to_rank``'s heap at the offset of ``ptr`` in this rank's heap."""
        return ops.translate(ptr, self.rank, to_rank, self.heap_bases, hint)

    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier=None, volatile=False, hint=None):
        """Load from ``from_rank``'s heap at the offset of ``pointer``."""
        return ops.load(
            pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile, hint
        )

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier=None, hint=None):
        """Store ``value`` into ``to_rank``'s heap at the offset of ``pointer``."""
        ops.store(pointer, value, self.rank, to_rank, self.heap_bases, mask, hint, cache_modifier)

    @triton.jit
    def get(
        self,
        from_ptr,
        to_ptr,
        from_rank,
        mask=None,
        other=None,
        load_cache_modifier=None,
        store_cache_modifier=None,
        hint=None,
    ):
        """Copy ``from_rank``'s data at ``from_ptr`` into this rank's ``to_ptr``."""
        ops.get(
            from_ptr,
            to_ptr,
            from_rank,
            self.rank,
            self.heap_bases,
            mask,
            other,
            load_cache_modifier,
            store_cache_modifier,
            hint,
        )

    @triton.jit
    def put(
        self,
        from_ptr,
        to_ptr,
        to_rank,
        mask=None,
        other=None,
        load_cache_modifier=None,
        store_cache_modifier=None,
        hint=None,
    ):
        """Copy this rank's data at ``from_ptr`` into ``to_rank``'s heap at ``to_ptr``."""
        ops.put(
            from_ptr,
            to_ptr,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            other,
            load_cache_modifier,
            store_cache_modifier,
            hint,
        )

    @triton.jit
    def copy(
        self,
        src_ptr,
        dst_ptr,
        from_rank,
        to_rank,
        mask=None,
        other=None,
        load_cache_modifier=None,
        store_cache_modifier=None,
        hint=None,
    ):
        """Copy from ``from_rank``'s heap at ``src_ptr`` to ``to_rank``'s at ``dst_ptr``."""
        ops.copy(
            src_ptr,
            dst_ptr,
            from_rank,
            to_rank,
            self.rank,
            self.heap_bases,
            mask,
            other,
            load_cache_modifier,
            store_cache_modifier,
            hint,
        )

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic add in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic subtract in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic exchange in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic xor in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic and in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic or in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic minimum in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint=None):
        """Atomic maximum in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem=None, scope=None, hint=None):
        """Atomic compare-and-swap in ``to_rank``'s heap; returns the previous value."""
        return ops.atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem, scope, hint)
