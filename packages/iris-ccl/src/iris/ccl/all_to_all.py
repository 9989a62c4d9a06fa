"""``all_to_all``: chunk ``j`` of every rank's input goes to rank ``j``, which stores the
chunks in group-rank order (like ``torch.distributed.all_to_all_single``). Without split
sizes the chunks are equal (the variants below); with split sizes the chunks are rows of
dim 0 of any sizes (:mod:`iris.ccl._uneven`).

Variants (``Config.variant``):

* ``ll``: no barrier: every 8-byte word on the link carries a flag beside 32 bits of
  data, and the receiver polls its own memory until the
  flags of a tile are this launch's (:mod:`iris.ccl._ll`); for small messages. Any tensors.
* ``boxed``: one barrier per launch; each rank stores what a member needs into a box on
  it and combines the boxes it received locally (:mod:`iris.ccl._boxed`). Any tensors.
* ``push``: after a start barrier (no member's output is written before that member has
  entered the collective) each rank stores its chunk ``j`` into member ``j``'s output at
  chunk ``index``; an end barrier makes every chunk visible. Needs the output on the heap;
  the input is read locally only.
* ``pull``: after a start barrier (every input is ready) each rank loads chunk ``index`` of
  every member ``j``'s input into its own output at chunk ``j``; an end barrier keeps the
  inputs unchanged until every member has read them. Needs the input on the heap.
* ``copy_engine``: the copy engines (DMA) copy chunk ``j`` into member ``j``'s output
  between a start and an end barrier (:mod:`iris.ccl._copy_engine`), for large messages.
  Needs the output on the heap (otherwise it runs ``push``).

An output overlapping the input (``out`` is ``inp``, say) works on a copy of the input. A
message larger than one launch covers is split into the same sub-range of every chunk per
launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import _copy_engine, _host, _plan, _uneven, entry
from ._plan import Plan
from .config import Config
from .triton import tiles
from .triton.sync import enter_tiles
from .variants import Variant
from .work import Work


@triton.jit
def _exchange_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, src_per_rank, dst_per_rank,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    PUSH: tl.constexpr, HINT: tl.constexpr,
    SIG=0,
):  # fmt: skip
    """Persistent: program ``p`` pushes (``PUSH``: stores remotely) or pulls (loads
    remotely) tiles ``p, p + P, ...`` of every chunk between one start and one end barrier
    (which orders the remote stores before it: a CTA barrier and a release)."""
    ctx, group, pid, ntiles = enter_tiles(
        context, members, flags, epochs, status, budget, n, RANK, WORLD, GROUP, ME, BLOCK, SIG
    )
    t = pid
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        sp, dp = src_per_rank, dst_per_rank
        if PUSH:
            tiles.all_to_all_push(ctx, group, src, dst, offs, mask, sp, dp, pid, False, HINT)
        else:
            tiles.all_to_all_pull(ctx, group, src, dst, offs, mask, sp, dp, pid, False, HINT)
        t += tl.num_programs(0)
    group.sync(ctx, pid)


def _exchange(plan: Plan, push: bool) -> None:
    """``push`` (members store chunk ``j`` into member ``j``'s output) or ``pull`` (members
    load their chunk of every member's input)."""
    comm, cfg, src_all, dst_all, m = plan.comm, plan.cfg, plan.src, plan.dst, plan.count
    itemsize = src_all.element_size()
    # Staged, one launch covers `length` elements of every chunk in the staging buffer.
    nbytes_per = comm.size * itemsize
    for start, length in plan.launches(itemsize * comm.size):
        grid = _host.persistent_grid(comm, cfg, length)
        ksrc, kdst, src_stride, dst_stride = src_all[start:], dst_all[start:], m, m
        if not plan.in_place:
            name = "out" if push else "in"
            buf = comm.staging(name, nbytes_per * length)[: nbytes_per * length].view(src_all.dtype)
            if push:  # members push into the staged output; the input is read locally
                kdst, dst_stride = buf, length
            else:  # members pull from the staged input; the output is written locally
                buf.view(comm.size, length).copy_(src_all.view(comm.size, m)[:, start : start + length])
                ksrc, src_stride = buf, length
        hint = _host.vector_hint((ksrc, kdst), (src_stride * itemsize, dst_stride * itemsize))
        strides = (src_stride, dst_stride)
        _host.launch(_exchange_kernel, grid, comm, cfg, ksrc, kdst, length, *strides, PUSH=push, HINT=hint)
        if not plan.in_place and push:
            dst_all.view(comm.size, m)[:, start : start + length].copy_(kdst.view(comm.size, length))


_variant = functools.partial(Variant, collective="all_to_all")
_ON_HEAP = {"in_place": True, "fallback": "push"}
REGISTERED = (
    _variant(name="push", run=functools.partial(_exchange, push=True), default=True),
    _variant(name="pull", run=functools.partial(_exchange, push=False)),
    # the copies need the output on the heap
    _variant(
        name="copy_engine", run=functools.partial(_copy_engine.scatter_copies, chunked=True), **_ON_HEAP
    ),
)


def _check(
    out: torch.Tensor, inp: torch.Tensor, output_split_sizes, input_split_sizes, *, group, config, **_
) -> None:
    if output_split_sizes is not None or input_split_sizes is not None:
        return  # the uneven exchange checks its split sizes itself
    size, _ = _plan.validate("all_to_all", out, inp, group, config, lambda size: inp.numel())
    if inp.numel() % size:
        raise ValueError(
            f"all_to_all: inp has {inp.numel()} elements (shape {list(inp.shape)}), which the group of "
            f"{size} ranks does not divide into equal chunks; pad inp (and out) to a multiple of {size}, "
            "or pass split sizes"
        )


@entry.op("all_to_all", tensors=("out", "inp"), outputs=("out",), device="inp", validate=_check)
def all_to_all(
    out: torch.Tensor, inp: torch.Tensor, output_split_sizes=None, input_split_sizes=None, *, group=None,
    async_op: bool = False, config: Config | None = None,
) -> Work | None:  # fmt: skip
    """Exchange chunks of ``inp`` between the ranks of ``group``: chunk ``j`` goes to rank
    ``j``, which receives the chunks of every rank in ``out`` in group-rank order (like
    ``torch.distributed.all_to_all_single``).

    :param out: the result, same dtype and device as ``inp``.
    :param inp: this rank's data, contiguous or not.
    :param output_split_sizes: rows of dim 0 of ``out`` received from each rank (a list of
        one int per rank, summing to ``out.shape[0]``), or None.
    :param input_split_sizes: rows of dim 0 of ``inp`` sent to each rank (summing to
        ``inp.shape[0]``), or None.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config` (variants: ``iris.ccl.VARIANTS["all_to_all"]``, described
        above); None picks by size.

    Without split sizes (both None) the chunks are equal and flat: ``inp`` and ``out`` have
    the same element count, divisible by the group size, any shapes. With split sizes (one
    of them may be None: equal splits of that tensor's dim 0) ``out`` and ``inp`` have rows
    of the same size, zero-row chunks are allowed, and rank ``i``'s
    ``input_split_sizes[j]`` must equal rank ``j``'s ``output_split_sizes[i]`` (checked
    across the ranks in debug mode, ``IRIS_DEBUG=1``); every rank passes split sizes, or
    none does. ``out`` may be ``inp`` or overlap it (the exchange then works on a copy of the
    input). Tensors on a symmetric heap spanning exactly ``group`` are used in place; others
    are copied through the collective's staging buffers (uneven calls read and write them
    directly and stage only what crosses the link).
    """
    if output_split_sizes is not None or input_split_sizes is not None:
        return _uneven.all_to_all(out, inp, output_split_sizes, input_split_sizes, group, async_op, config)
    size, _ = _host.group_position(group)
    # an output overlapping the input (out is inp, say): every member reads or writes chunks
    # the others still need, so the exchange works on a copy of the input
    return _plan.run(
        "all_to_all", out, inp, inp.numel() // size, group=group, config=config, async_op=async_op
    )
