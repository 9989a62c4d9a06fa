"""``all_gather``: every rank ends with every rank's input, concatenated in group-rank order
(like ``torch.distributed.all_gather_into_tensor``).

Variants (``Config.variant``):

* ``ll``: no barrier: every 8-byte word on the link carries a flag beside 32 bits of
  data, and the receiver polls its own memory until the
  flags of a tile are this launch's (:mod:`iris.ccl._ll`); for small messages. Any tensors.
* ``boxed``: one barrier per launch; each rank stores what a member needs into a box on
  it and combines the boxes it received locally (:mod:`iris.ccl._boxed`). Any tensors.
* ``push``: each rank stores its tile into every member's output at its own chunk
  (``index * n``), between a start barrier (no member's output is written before that
  member has entered the collective) and an end barrier (every tile has arrived). Needs
  the output on the heap; the input is read locally only.
* ``pull``: after a start barrier (every input is ready) each rank loads the tile of every
  member's input into its own output; an end barrier keeps the inputs unchanged until
  every member has read them. Needs the input on the heap; the output is written locally.
* ``gluon``: ``push`` in a Gluon kernel whose explicit layout gives each thread 16-byte
  runs, stored into the peers as 16-byte vectors (:mod:`iris.ccl.gluon.all_gather`). Needs
  the ``cuda`` backend.
* ``copy_engine``: the copy engines (DMA) copy the input into every peer's output between
  a start and an end barrier (:mod:`iris.ccl._copy_engine`), for large messages. Needs the
  output on the heap (otherwise it runs ``push``).

All move ``(G-1)`` tiles per tile per rank. A message larger than one launch covers is
split into the same sub-range of every rank's chunk per launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import _copy_engine, _host, _plan, entry
from ._plan import Plan
from .config import Config
from .gluon.all_gather import _push_kernel as _gluon_push_kernel
from .triton import tiles
from .triton.sync import enter_tiles
from .variants import Variant
from .work import Work


@triton.jit
def _exchange_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, n_per_rank, src_per_rank,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    PUSH: tl.constexpr, HINT: tl.constexpr = None,
    SIG=0,
):  # fmt: skip
    """Persistent: program ``p`` pushes (``PUSH``: stores its input into every member's
    output) or pulls (loads every member's input; ``src_per_rank``: see
    :func:`~iris.ccl.triton.tiles.all_gather_pull`) tiles ``p, p + P, ...`` between one start
    and one end barrier (which orders the remote stores before it: a CTA barrier and a
    release)."""
    ctx, group, pid, ntiles = enter_tiles(
        context, members, flags, epochs, status, budget, n, RANK, WORLD, GROUP, ME, BLOCK, SIG
    )
    t = pid
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        if PUSH:
            tiles.all_gather_push(ctx, group, src, dst, offs, offs < n, n_per_rank, pid, False, HINT)
        else:
            tiles.all_gather_pull(
                ctx, group, src, dst, offs, offs < n, n_per_rank, pid, src_per_rank, False, HINT
            )
        t += tl.num_programs(0)
    group.sync(ctx, pid)


def _exchange(plan: Plan, kernel, push: bool) -> None:
    """``push`` and ``gluon`` (``push``: members store into the outputs) or ``pull``
    (members load from the inputs) with ``kernel``."""
    comm, cfg, src_all, dst_all, n = plan.comm, plan.cfg, plan.src, plan.dst, plan.count
    itemsize = src_all.element_size()
    # in place, the input may be this member's chunk of the output (in-place all-gather)
    aliased = src_all.data_ptr() == dst_all.data_ptr() + comm.index * n * itemsize
    # Staged, one launch covers `length` elements of every member's chunk in the staging
    # buffer (push: size * length outputs; pull: length inputs).
    for start, length in plan.launches(itemsize * comm.size):
        src = src_all[start : start + length]
        # where each member's input is (pull; see tiles.all_gather_pull): the Gluon kernel only pushes
        extra = () if kernel is not _exchange_kernel else (0,)
        if plan.in_place:
            ksrc, kdst, stride = src, dst_all[start:], n
            if aliased and not push:  # every member's input is its own chunk of its output
                ksrc, extra = dst_all[start:], (n,)
        elif push:  # the input is read locally only; members push into the staged output
            ksrc, stride = src, length
            kdst = comm.staging("out", comm.size * length * itemsize)[: comm.size * length * itemsize]
            kdst = kdst.view(src_all.dtype)
        else:  # members pull from the staged input; the output is written locally
            ksrc, kdst, stride = comm.staged_copy("in", src), dst_all[start:], n
        grid = _host.persistent_grid(comm, cfg, length)
        strides = (stride * itemsize, *(e * itemsize for e in extra))
        hint = _host.vector_hint((ksrc, kdst), strides)
        meta = {"PUSH": push} if kernel is _exchange_kernel else {}
        _host.launch(kernel, grid, comm, cfg, ksrc, kdst, length, stride, *extra, HINT=hint, **meta)
        if not plan.in_place and push:
            dst_all.view(comm.size, n)[:, start : start + length].copy_(kdst.view(comm.size, length))


_variant = functools.partial(Variant, collective="all_gather")
_ON_HEAP = {"in_place": True, "fallback": "push"}
REGISTERED = (
    _variant(name="push", run=functools.partial(_exchange, kernel=_exchange_kernel, push=True), default=True),
    _variant(name="pull", run=functools.partial(_exchange, kernel=_exchange_kernel, push=False)),
    _variant(
        name="gluon",
        run=functools.partial(_exchange, kernel=_gluon_push_kernel, push=True),
        compiled_only="Gluon kernels compile for NVIDIA GPUs only and do not run in Triton's interpreter "
        "(the cpu backend)",
    ),
    # the copies need the output on the heap
    _variant(
        name="copy_engine", run=functools.partial(_copy_engine.scatter_copies, chunked=False), **_ON_HEAP
    ),
)


def _check(out: torch.Tensor, inp: torch.Tensor, *, group, config, **_) -> None:
    _plan.validate("all_gather", out, inp, group, config, lambda size: size * inp.numel())


@entry.op("all_gather", tensors=("out", "inp"), outputs=("out",), device="inp", validate=_check)
def all_gather(
    out: torch.Tensor, inp: torch.Tensor, *, group=None, async_op: bool = False,
    config: Config | None = None,
) -> Work | None:  # fmt: skip
    """Gather ``inp`` from every rank of ``group`` into ``out`` on every rank.

    :param out: result with ``G * inp.numel()`` elements (G: the group's size), same dtype
        and device as ``inp``; viewed flat it is the concatenation of every member's
        flattened ``inp`` in group-rank order (shape ``(G * d0, ...)`` or any other). It may
        hold ``inp`` as its chunk of this rank (in-place all-gather).
    :param inp: this rank's contribution; any shape, contiguous or not.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config` (variants: ``iris.ccl.VARIANTS["all_gather"]``, described
        above); None picks by size.

    Tensors on a symmetric heap spanning exactly ``group`` are used in place; others are
    copied through the collective's staging buffers.
    """
    _, index = _host.group_position(group)
    own_chunk = index * inp.numel() * inp.element_size()
    # An input overlapping the output anywhere but at this rank's chunk would be overwritten
    # while still needed: gather from a copy of it.
    return _plan.run(
        "all_gather", out, inp, inp.numel(), group=group, config=config, async_op=async_op,
        overlap_ok=lambda src, dst: src.data_ptr() == dst.data_ptr() + own_chunk,
    )  # fmt: skip
