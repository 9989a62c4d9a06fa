"""``Tracing``: the device-side event recorder of a :class:`~iris.mem.triton.Context`.

``Context.initialize(context, RANK, WORLD, tracing=True)`` gives ``ctx.tracing`` a recorder
whose buffer the host set up with ``heap.tracing.enable(max_events=...)``; every RMA method
of the context then records one event per call and program (operation, program id, rank,
target rank, lowest address, bytes, start and end time, SM id). Kernels record their own
regions around any code::

    ctx = Context.initialize(context, RANK, WORLD, tracing=TRACE)
    handle = ctx.tracing.record_event_start(REGION, target_rank=peer, address=buf + offs, mask=mask)
    ...                                   # the region being timed
    ctx.tracing.record_event_end(handle)

``REGION`` is a :class:`~iris.mem.trace_format.TraceEvent` code or a code returned by
``heap.tracing.register("name")``, passed to the kernel as an argument (usually
``tl.constexpr``).

With ``tracing=False`` (the default) every recording call compiles to nothing: the kernel
is instruction for instruction the one written without tracing. The buffer layout and
recording protocol are documented in :mod:`iris.mem.trace_format`; the host side
(enable, reset, export to Chrome/Perfetto JSON, render) is :mod:`iris.mem.tracing`.

What the timestamps measure: ``START`` is read just before the operation's instructions
are issued and ``END`` just after. A store (or put) is complete for the issuing program
once issued, but reaches the peer later; a load's data may still be in flight at ``END``
until the program uses it.
"""

import triton
import triton.language as tl

from .. import trace_format as fmt
from ..utils import global_timer, sm_id
from ._compat import aggregate, constexpr_function

_COUNTER: tl.constexpr = tl.constexpr(fmt.COUNTER)
_CAPACITY: tl.constexpr = tl.constexpr(fmt.CAPACITY)
_HEADER_WORDS: tl.constexpr = tl.constexpr(fmt.HEADER_WORDS)
_EVENT_WORDS: tl.constexpr = tl.constexpr(fmt.EVENT_WORDS)
_KIND: tl.constexpr = tl.constexpr(fmt.KIND)
_PROGRAM: tl.constexpr = tl.constexpr(fmt.PROGRAM)
_RANK: tl.constexpr = tl.constexpr(fmt.RANK)
_TARGET: tl.constexpr = tl.constexpr(fmt.TARGET)
_ADDRESS: tl.constexpr = tl.constexpr(fmt.ADDRESS)
_BYTES: tl.constexpr = tl.constexpr(fmt.BYTES)
_START: tl.constexpr = tl.constexpr(fmt.START)
_END: tl.constexpr = tl.constexpr(fmt.END)
_SM: tl.constexpr = tl.constexpr(fmt.SM)
_ARG: tl.constexpr = tl.constexpr(fmt.ARG)
_NO_ADDRESS: tl.constexpr = tl.constexpr(2**63 - 1)


@triton.jit
def _program_id():
    """Linear id of this program: ``pid0 + pid1 * n0 + pid2 * n0 * n1``."""
    n0 = tl.num_programs(0).to(tl.int64)
    n1 = tl.num_programs(1).to(tl.int64)
    pid = tl.program_id(0).to(tl.int64) + tl.program_id(1).to(tl.int64) * n0
    return pid + tl.program_id(2).to(tl.int64) * n0 * n1


@triton.jit
def footprint(pointer, mask=None):
    """``(lowest address, bytes)`` of the active lanes of a pointer block, as int64.

    :param pointer: a pointer or block of pointers, or None (gives ``(0, 0)``).
    :param mask: active lanes (broadcast like ``tl.load`` does), or None for all.
    :returns: the lowest active address (0 when no lane is active) and the number of
        active lanes times the element size in bytes.

    Only elementwise ops and full reductions, no new blocks: Gluon kernels (explicit
    layouts) compile it too, so :class:`iris.mem.gluon.Tracing` records with it.
    """
    if pointer is None:
        lowest = tl.cast(0, tl.int64)
        nbytes = tl.cast(0, tl.int64)
    else:
        element_bytes: tl.constexpr = (pointer.dtype.element_ty.primitive_bitwidth + 7) // 8
        address = pointer.to(tl.int64)
        if mask is None:
            lanes = tl.cast(address.numel, tl.int64)
            lowest = address
        else:
            lanes = tl.where(mask, address * 0 + 1, 0)  # the mask broadcast over the block
            lowest = tl.where(mask, address, _NO_ADDRESS)
        if lowest.type.is_block():
            lowest = tl.min(lowest)
            if mask is not None:
                lanes = tl.sum(lanes)
        if mask is not None:
            lowest = tl.where(lanes > 0, lowest, 0)
        nbytes = lanes * element_bytes
    return lowest, nbytes


@aggregate
class Tracing:
    """Device-side event recorder (``ctx.tracing``).

    Fields: ``enabled`` (constexpr bool: False compiles every call away), ``rank``
    (constexpr, the recording rank), ``buffer`` (pointer to the int64 trace buffer; an
    unused placeholder when disabled).
    """

    enabled: tl.constexpr
    rank: tl.constexpr
    buffer: tl.tensor

    @constexpr_function
    def __init__(self, enabled, rank, buffer):
        self.enabled = tl.constexpr(enabled)
        self.rank = tl.constexpr(rank)
        self.buffer = buffer

    @staticmethod
    @triton.jit
    def initialize(heap_bases, rank: tl.constexpr, world_size: tl.constexpr, enabled: tl.constexpr):
        """Recorder of ``rank``; ``heap_bases`` points at the heap bases of the context
        tensor, whose next word (index ``world_size``) holds the trace buffer's address."""
        if enabled:
            buffer = tl.load(heap_bases + world_size).to(tl.pointer_type(tl.int64))
        else:
            buffer = heap_bases
        return Tracing(enabled, rank, buffer)

    @triton.jit
    def record_event_start(self, event_id, target_rank=-1, address=None, mask=None, arg=0):
        """Open an event; returns its handle for :meth:`record_event_end`.

        :param event_id: a :class:`~iris.mem.trace_format.TraceEvent` code or a code from
            ``heap.tracing.register(name)``.
        :param target_rank: the peer the event concerns (-1: none).
        :param address: pointer or block of pointers the event touches, or None: the
            event records the lowest active address and active lanes x element bytes.
        :param mask: active lanes of ``address`` (None: all).
        :param arg: any int64 to keep with the event (exported as ``args.arg``).
        :returns: the event's slot, or -1 when the buffer is full (the event is counted
            as dropped). A constant -1 when tracing is disabled.
        """
        handle = -1
        if self.enabled:
            lowest, nbytes = footprint(address, mask)
            slot = tl.atomic_add(self.buffer + _COUNTER, 1, sem="relaxed", scope="gpu")
            written = slot < tl.load(self.buffer + _CAPACITY)
            event = self.buffer + _HEADER_WORDS + slot * _EVENT_WORDS
            tl.store(event + _KIND, event_id, mask=written)
            tl.store(event + _PROGRAM, _program_id(), mask=written)
            tl.store(event + _RANK, self.rank, mask=written)
            tl.store(event + _TARGET, target_rank, mask=written)
            tl.store(event + _ADDRESS, lowest, mask=written)
            tl.store(event + _BYTES, nbytes, mask=written)
            tl.store(event + _SM, sm_id(), mask=written)
            tl.store(event + _ARG, arg, mask=written)
            tl.store(event + _END, 0, mask=written)
            tl.store(event + _START, global_timer(), mask=written)
            handle = tl.where(written, slot, -1)
        return handle

    @triton.jit
    def record_event_end(self, handle):
        """Close the event ``handle`` (from :meth:`record_event_start`): store its end time."""
        if self.enabled:
            end = global_timer()
            tl.store(self.buffer + _HEADER_WORDS + handle * _EVENT_WORDS + _END, end, mask=handle >= 0)
