"""The device trace buffer: event codes and word layout, shared by every recorder.

The Triton recorder (:class:`iris.mem.triton.Tracing`), any other device recorder (Gluon)
and the host side (:mod:`iris.mem.tracing`) all read these numbers from here, so a buffer
written by one is read correctly by the other. Plain Python: importing it needs neither
torch nor triton.

Buffer
------
One int64 tensor on the heap's device (not on the symmetric heap; only its own rank
writes it)::

    word 0                      COUNTER   events claimed so far (atomic add; keeps counting
                                          past CAPACITY, so COUNTER - CAPACITY were dropped)
    word 1                      CAPACITY  max_events
    words 2 .. HEADER_WORDS-1   reserved (zero)
    HEADER_WORDS + i * EVENT_WORDS + f    field f of event i, 0 <= i < CAPACITY
    then GUARD_WORDS words of GUARD       never written by a recorder (checked by the host)

Its address is the last word of the context tensor (``heap.get_device_context()``), at
index ``HEAP_BASES_OFFSET + world_size``. While tracing is not enabled that word points at
a buffer of capacity 0: recorders still count, but write nothing.

Event fields (int64 each)
-------------------------
``KIND`` (a :class:`TraceEvent` code), ``PROGRAM`` (linear program id:
``pid0 + pid1 * n0 + pid2 * n0 * n1``), ``RANK`` (the recording rank), ``TARGET`` (the
peer rank whose memory the operation touches; -1 for none), ``ADDRESS`` (lowest address of
the active lanes, in the recording rank's address space; 0 for none), ``BYTES`` (active
lanes x element bytes), ``START`` and ``END`` (device clock in ns; END is 0 until the
event is closed), ``SM`` (SM id, -1 where unknown), ``ARG`` (user value; the source rank
of a ``copy``).

Recording protocol
------------------
1. claim ``slot = atomic_add(COUNTER, 1)`` (relaxed);
2. if ``slot < CAPACITY`` write every field of event ``slot`` with ``END = 0``, then read
   the clock into ``START``; the handle is ``slot``, else ``-1`` and nothing is written;
3. after the operation, if the handle is not -1, write the clock into ``END``.
"""

from __future__ import annotations

import enum

#: Words before the first event.
HEADER_WORDS = 8
#: Header word counting claimed events.
COUNTER = 0
#: Header word holding max_events.
CAPACITY = 1

#: Fields of one event, in order; ``EVENT_WORDS`` int64 words per event.
FIELDS = ("kind", "program", "rank", "target", "address", "bytes", "start", "end", "sm", "arg")
KIND, PROGRAM, RANK, TARGET, ADDRESS, BYTES, START, END, SM, ARG = range(len(FIELDS))
EVENT_WORDS = len(FIELDS)

#: Words after the last event that hold ``GUARD`` and must never change.
GUARD_WORDS = 8
#: Pattern of the guard words ("IRISGRD!" as a little-endian int64).
GUARD = int.from_bytes(b"IRISGRD!", "little", signed=True)


class TraceEvent(enum.IntEnum):
    """Event codes: 0-13 the RMA operations (recorded by ``Context`` itself), 1024-3073
    predefined user regions, 4096 and up names registered with
    ``heap.tracing.register(name)``."""

    LOAD = 0
    STORE = 1
    GET = 2
    PUT = 3
    COPY = 4
    ATOMIC_ADD = 5
    ATOMIC_SUB = 6
    ATOMIC_XCHG = 7
    ATOMIC_XOR = 8
    ATOMIC_AND = 9
    ATOMIC_OR = 10
    ATOMIC_MIN = 11
    ATOMIC_MAX = 12
    ATOMIC_CAS = 13
    FETCH = 1024
    COMPUTE = 2048
    REDUCE = 2049
    WAIT = 3072
    BARRIER = 3073


#: First code handed out by ``heap.tracing.register``.
USER_EVENT_BASE = 4096
#: Codes below this are RMA operations of ``Context``.
RMA_EVENT_LIMIT = 1024


def event_name(code: int, names: dict[int, str] | None = None) -> str:
    """Display name of event ``code``: a registered name, a :class:`TraceEvent` name in
    lower case, else ``event <code>``."""
    if names and code in names:
        return names[code]
    try:
        return TraceEvent(code).name.lower()
    except ValueError:
        return f"event {code}"


def buffer_words(max_events: int) -> int:
    """Length in int64 words of a buffer for ``max_events`` events."""
    return HEADER_WORDS + max_events * EVENT_WORDS + GUARD_WORDS
