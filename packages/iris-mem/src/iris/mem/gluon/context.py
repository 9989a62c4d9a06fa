"""``Context``: the device API of the symmetric heap for Gluon kernels.

Gluon (``triton.experimental.gluon``) is Triton's lower-level dialect with explicit
layouts. A Gluon kernel receives ``heap.get_device_context()``, builds a :class:`Context`
once, and calls the same methods as in a Triton kernel; the difference is that the rank
and the world size are read from the context tensor when the kernel runs, so they need
not be ``constexpr`` arguments::

    @gluon.jit
    def kernel(context, buf, n, BLOCK: gl.constexpr):
        ctx = Context.initialize(context)
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
        offs = gl.arange(0, BLOCK, layout=layout)
        peer = (ctx.rank + 1) % ctx.world_size
        ctx.store(buf + offs, offs.to(gl.float32), peer, mask=offs < n)

One implementation serves both dialects: a ``@triton.jit`` function called from a Gluon
kernel is compiled with Gluon's semantics (the layouts of its arguments carry through), so
the methods below are :class:`iris.mem.triton.Context`'s own, over the functional API of
:mod:`iris.mem.triton.ops` (translation, ``IRIS_DEBUG`` bounds checks, hints). Gluon
kernels do not run in Triton's interpreter: they need the ``cuda`` backend.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..triton._compat import aggregate, constexpr_function, jit_methods_of
from ..triton.context import HEAP_BASES_OFFSET
from ..triton.context import Context as _TritonContext
from .tracing import Tracing

#: Words of the context tensor holding the rank and the world size
#: (``[rank, world_size, heap_size, flags, heap_base_0, ...]``).
RANK_WORD: gl.constexpr = gl.constexpr(0)
WORLD_SIZE_WORD: gl.constexpr = gl.constexpr(1)


@aggregate
@jit_methods_of(_TritonContext)
class Context:
    """Device-side handle on the symmetric heap for the calling rank, in a Gluon kernel.

    Fields: ``rank`` and ``world_size`` (int32 scalars read from the context tensor),
    ``heap_bases`` (pointer to the int64 table of heap bases), ``tracing`` (the
    :class:`~iris.mem.gluon.Tracing` recorder; ``tracing.enabled`` is the constexpr flag
    given to :meth:`initialize`). Every other method is :class:`iris.mem.triton.Context`'s
    own (shared with ``jit_methods_of``): the same arguments and
    recorded events, translating from ``self.rank`` whether that is a constexpr (Triton) or
    a scalar loaded at run time (Gluon).
    """

    rank: gl.tensor
    world_size: gl.tensor
    heap_bases: gl.tensor
    tracing: Tracing

    @constexpr_function
    def __init__(self, rank, world_size, heap_bases, tracing):
        self.rank = rank
        self.world_size = world_size
        self.heap_bases = heap_bases
        self.tracing = tracing

    @staticmethod
    @gluon.jit
    def initialize(context_tensor, tracing: gl.constexpr = False):
        """Decode ``heap.get_device_context()``; rank and world size are loaded from it.

        :param context_tensor: pointer to the int64 context tensor.
        :param tracing: record an event for every RMA call (``gl.constexpr``); the host
            sets the buffer up with ``heap.tracing.enable()``. False compiles every
            recording away.
        """
        rank = gl.load(context_tensor + RANK_WORD).to(gl.int32)
        world_size = gl.load(context_tensor + WORLD_SIZE_WORD).to(gl.int32)
        heap_bases = context_tensor + HEAP_BASES_OFFSET
        recorder = Tracing.initialize(heap_bases, rank, world_size, tracing)
        return Context(rank, world_size, heap_bases, recorder)
