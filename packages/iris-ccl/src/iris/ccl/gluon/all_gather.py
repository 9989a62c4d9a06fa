"""Gluon all-gather (push): the kernel behind ``all_gather(..., config=Config(variant="gluon"))``.

The Triton ``push`` variant's algorithm and code (:func:`iris.ccl.triton.tiles.all_gather_push`
and :meth:`iris.ccl.triton.Group.sync`: per-program flags on the heap, generation counters,
release/acquire at system scope, bounded spins that record a timeout), run in a Gluon
kernel whose explicit layout gives every thread 16-byte runs of the tile; whole tiles go
without a mask, so with ``HINT=16`` (every chunk 16-byte aligned, decided on the host) each
run is one 16-byte vector store into each peer over NVLink. The variants share the
communicator's flags and can be mixed call by call.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from iris.mem.gluon import Context

from ..triton import Group, tiles

#: Bytes each thread owns per run of a tile.
VECTOR_BYTES = 16


@gluon.constexpr_function
def vector_width(dtype, block, num_warps):
    """Elements per thread-owned run: 16 bytes of ``dtype``, fewer when a tile of ``block``
    elements would not give every one of the ``num_warps * 32`` threads a whole run."""
    width = max(1, VECTOR_BYTES * 8 // dtype.primitive_bitwidth)
    while width > 1 and width * 32 * num_warps > block:
        width //= 2
    return width


@gluon.jit
def _push_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, n_per_rank,
    RANK: gl.constexpr, WORLD: gl.constexpr, GROUP: gl.constexpr, ME: gl.constexpr, BLOCK: gl.constexpr,
    HINT: gl.constexpr = None,
):  # fmt: skip
    """Persistent, like the Triton ``push`` kernel: program ``p`` pushes tiles ``p, p + P,
    ...`` of the local ``src`` (``n`` elements) into every member's ``dst`` (on the heap) at
    ``ME * n_per_rank``, between one start and one end barrier of sync slot ``p``. ``HINT``:
    16 when every chunk is 16-byte aligned, else None. ``RANK`` and ``WORLD`` are unused:
    the Gluon context reads them from ``context``."""
    ctx = Context.initialize(context)
    group = Group.initialize(members, flags, epochs, status, budget, GROUP, ME)
    VEC: gl.constexpr = vector_width(src.dtype.element_ty, BLOCK, gl.num_warps())
    lanes = gl.arange(0, BLOCK, layout=gl.BlockedLayout([VEC], [32], [gl.num_warps()], [0]))
    pid = gl.program_id(0)
    group.sync(ctx, pid, False)
    t = pid
    ntiles = gl.cdiv(n, BLOCK)
    while t < ntiles:
        offs = t * BLOCK + lanes
        if (t + 1) * BLOCK <= n:  # a whole tile: unmasked, so each thread's run is one vector
            tiles.all_gather_push(ctx, group, src, dst, offs, None, n_per_rank, pid, False, HINT)
        else:
            tiles.all_gather_push(ctx, group, src, dst, offs, offs < n, n_per_rank, pid, False, HINT)
        t += gl.num_programs(0)
    group.sync(ctx, pid)  # orders the remote stores before it (CTA barrier + release)
