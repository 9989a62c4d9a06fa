"""Gluon all-gather (push): the kernel behind ``all_gather(..., config=Config(variant="gluon"))``.

The same algorithm as the Triton ``push`` variant (see :mod:`iris.ccl.all_gather`), written
with an explicit layout: every thread owns 16-byte runs of the tile, so each remote store to
a peer over NVLink is one 16-byte vector per thread. Synchronisation is the Triton variants'
own (:meth:`iris.ccl.triton.Group.sync`: per-program flags on the heap, generation
counters, release/acquire at system scope, bounded spins that record a timeout), so the
variants share the communicator's flags and can be mixed call by call.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from iris.mem.gluon import Context

from ..triton import Group

#: Bytes each thread moves per vector access.
VECTOR_BYTES: gl.constexpr = gl.constexpr(16)


@gluon.constexpr_function
def vector_width(dtype, block, num_warps):
    """Elements per thread-owned run: 16 bytes of ``dtype``, fewer when a tile of ``block``
    elements would not give every one of the ``num_warps * 32`` threads a whole run."""
    width = max(1, VECTOR_BYTES * 8 // dtype.primitive_bitwidth)
    while width > 1 and width * 32 * num_warps > block:
        width //= 2
    return width


# n_per_rank == 1 would be specialised to a constexpr, which folds the alignment test and
# trips an assertion in Triton 3.6's lowering of this kernel: keep it a runtime value.
@gluon.jit(do_not_specialize=["n_per_rank"])
def _push_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, n_per_rank,
    RANK: gl.constexpr, WORLD: gl.constexpr, GROUP: gl.constexpr, ME: gl.constexpr, BLOCK: gl.constexpr,
):  # fmt: skip
    """Program ``p`` loads tile ``p`` of the local ``src`` (``n`` elements) and stores it into
    every member's ``dst`` (on the heap) at ``ME * n_per_rank``, between two barriers of sync
    slot ``p`` (see :func:`iris.ccl.triton.tiles.all_gather_push`). A whole tile whose
    destination is 16-byte aligned goes out as 16-byte vectors; the last, partial tile and
    unaligned layouts (``n_per_rank`` not a multiple of 16 bytes) take a masked path.
    ``RANK`` and ``WORLD`` are unused: the Gluon context reads them from ``context``."""
    ctx = Context.initialize(context)
    group = Group.initialize(members, flags, epochs, status, budget, GROUP, ME)
    VEC: gl.constexpr = vector_width(src.dtype.element_ty, BLOCK, gl.num_warps())
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [gl.num_warps()], [0])
    pid = gl.program_id(0)
    offs = pid * BLOCK + gl.arange(0, BLOCK, layout=layout)
    at = dst + gl.cast(ME, gl.int64) * n_per_rank
    whole = (pid + 1) * BLOCK <= n
    # hint=VECTOR_BYTES promises 16-byte-aligned runs: every member's chunk must start on one.
    PER_VECTOR: gl.constexpr = VECTOR_BYTES // (src.dtype.element_ty.primitive_bitwidth // 8)
    aligned = (n_per_rank % PER_VECTOR == 0) & (at.to(gl.int64, bitcast=True) % VECTOR_BYTES == 0)
    if whole & aligned:
        x = gl.load(src + offs)
        group.sync(ctx, pid)
        for i in gl.static_range(GROUP):
            ctx.store(at + offs, x, group.rank((ME + i) % GROUP), hint=VECTOR_BYTES)
    else:
        mask = offs < n
        x = gl.load(src + offs, mask=mask)
        group.sync(ctx, pid)
        for i in gl.static_range(GROUP):
            ctx.store(at + offs, x, group.rank((ME + i) % GROUP), mask=mask)
    group.sync(ctx, pid)
