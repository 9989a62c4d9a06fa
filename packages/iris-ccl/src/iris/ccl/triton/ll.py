"""Device-side pieces of the flag-in-data exchange of the ``ll`` variant, for kernels that
run the exchange themselves (``iris.ops.all_reduce_rmsnorm`` does).

A *line* is one 8-byte word: 4 bytes of data in its low half and a 4-byte flag (a positive
number that identifies the launch) in its high half, written together by one store. A
receiver polls its own memory until every line it needs carries the flag it expects; the
data beside that flag is then the data of that launch, with nothing else to order or
acknowledge. :func:`pack` makes lines from a block of elements, :func:`receive` waits for
lines and :func:`unpack` turns them back into elements. Elements of 1, 2, 4 or 8 bytes are
packed (narrow ones several to a line, 8-byte ones over two lines), so a block of ``n``
elements of ``b`` bytes makes ``n * b / 4`` lines.

Import it as ``iris.ccl.triton.ll``; it is not re-exported by ``iris.ccl.triton``.
"""

import triton
import triton.language as tl

from iris.mem.utils import global_timer, keep_waiting, record_timeout

from .._ll import _from_words, _to_words


@triton.jit
def pack(x, flag):
    """Lines (int64) holding the bytes of the 1-D block ``x`` and ``flag`` (an integer
    scalar below ``2**31``) in each high half."""
    return (_to_words(x).to(tl.int64) & 0xFFFFFFFF) | (flag.to(tl.int64) << 32)


@triton.jit
def unpack(lines, ELEM: tl.constexpr):
    """Inverse of :func:`pack`: the elements of type ``ELEM`` in the low halves of ``lines``."""
    return _from_words(lines.to(tl.int32), ELEM)


@triton.jit
def receive(ctx, group, base, offs, mask, flag, peer):
    """The lines ``base[offs]`` (this rank's memory) once every one under ``mask`` carries
    ``flag``: volatile loads of the whole block (all in flight at once) until it has, for at
    most ``group.budget`` ns; then the timeout is recorded (naming member ``peer``, the
    sender) for the host and the lines are returned as they are. Once a timeout is recorded
    in ``group.status``, later calls do not wait at all (a kernel with many blocks to
    receive from a dead peer ends after one budget, not one per block). Lanes outside
    ``mask`` read as 0."""
    lines = tl.load(base + offs, mask=mask, other=0, volatile=True)
    start = global_timer()
    budget = tl.where(tl.load(group.status, volatile=True) == 0, group.budget, 0)
    missing = tl.sum((((lines >> 32) != flag) & mask).to(tl.int32))
    while (missing > 0) & keep_waiting(start, budget, group.status, group.rank(peer)):
        lines = tl.load(base + offs, mask=mask, other=0, volatile=True)
        missing = tl.sum((((lines >> 32) != flag) & mask).to(tl.int32))
    if missing > 0:
        record_timeout(group.status, ctx.rank, group.rank(peer), base)
    return lines


__all__ = ["pack", "receive", "unpack"]
