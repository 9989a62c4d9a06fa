"""``Tracing``: the device-side event recorder of a Gluon :class:`~iris.mem.gluon.Context`.

``Context.initialize(context, tracing=True)`` gives ``ctx.tracing`` a recorder writing the
buffer the host set up with ``heap.tracing.enable(max_events=...)``, in the same layout and
with the same event codes as :class:`iris.mem.triton.Tracing` (see
:mod:`iris.mem.trace_format`), so ``heap.tracing.export()`` reads Triton and Gluon events
alike. Every RMA method of the context records one event per call and program; kernels
time their own regions with ``record_event_start``/``record_event_end``::

    ctx = Context.initialize(context, tracing=TRACE)
    handle = ctx.tracing.record_event_start(REGION, target_rank=peer, address=buf + offs, mask=mask)
    ...
    ctx.tracing.record_event_end(handle)

The recording methods are the Triton recorder's own; only the rank differs, a scalar read
from the context tensor instead of a constexpr. With ``tracing=False`` every call
compiles to nothing.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..triton._compat import aggregate, constexpr_function, jit_methods_of
from ..triton.tracing import Tracing as _TritonTracing


@aggregate
@jit_methods_of(_TritonTracing)
class Tracing:
    """Device-side event recorder (``ctx.tracing``) of a Gluon kernel.

    Fields: ``enabled`` (constexpr bool: False compiles every call away), ``rank`` (int32
    scalar, the recording rank), ``buffer`` (pointer to the int64 trace buffer; an unused
    placeholder when disabled).
    """

    enabled: gl.constexpr
    rank: gl.tensor
    buffer: gl.tensor

    @constexpr_function
    def __init__(self, enabled, rank, buffer):
        self.enabled = gl.constexpr(enabled)
        self.rank = rank
        self.buffer = buffer

    @staticmethod
    @gluon.jit
    def initialize(heap_bases, rank, world_size, enabled: gl.constexpr):
        """Recorder of ``rank``; ``heap_bases`` points at the heap bases of the context
        tensor, whose next word (index ``world_size``) holds the trace buffer's address."""
        if enabled:
            buffer = gl.load(heap_bases + world_size).to(gl.pointer_type(gl.int64))
        else:
            buffer = heap_bases
        return Tracing(enabled, rank, buffer)
