"""The ``boxed`` variant of all_reduce, all_gather, reduce_scatter and all_to_all: one
barrier per launch, for small and medium messages.

Every member's staging buffer "push" holds two banks (launch parity) of ``G`` boxes, box
``i`` receiving member ``i``'s data. Program ``p`` of a launch:

1. stores its tiles ``p, p + P, ...`` of what member ``j`` needs (the whole input, or
   chunk ``j`` of it) into box ``ME`` of bank ``parity`` on every other member ``j``;
2. synchronises once with program ``p`` of every member (release/acquire, system scope):
   its tiles from everyone have arrived;
3. combines the same tiles locally: its own data and the ``G - 1`` boxes, in member order
   (a reduction, bitwise the same on every rank, or a copy into each member's chunk).

A member may run ahead into the next launch while a peer still reads its boxes of this one:
the next launch uses the other bank. It cannot get two launches ahead, because the next
launch's barrier needs every peer to have started it, which needs them to have finished
this one (kernels of a stream run one after another). The bank is bit 20 of the launch
counter ``launches[0]``: every launch adds exactly ``2**20`` to it, split among its
programs (``2**20 // P`` each, program 0 also the remainder) with atomics whose result
nobody waits for. A program reads the counter at its start; whatever part of this launch's
additions it sees is below ``2**20``, so every program of a launch reads the same bank, and
consecutive launches read different banks whatever their grids (the counter wraps after
4096 launches, an even number, so the alternation survives the wrap).

Against ``push``/``pull`` it saves one barrier per launch (the start barrier: boxes are
always free) and writes only the caller's local memory, so inputs and outputs may be any
tensors; it costs a local pass over the boxes and launches of at most one box each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.mem.triton.group import enter_group

from . import _host
from ._plan import Plan
from .triton import tiles
from .triton.accumulate import convert
from .triton.sync import advance_launch_counter, enter_launch
from .variants import Variant

#: Bytes before the boxes in the staging buffer: the launch counter.
_HEADER = 256
#: What every launch adds to the launch counter; its bit 20 selects the bank.
_LAUNCH_UNIT: tl.constexpr = tl.constexpr(1 << 20)
#: What each collective sends to member ``j`` and what it does with what arrives.
MODES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@triton.jit
def _boxed_kernel(
    context, members, flags, epochs, status, budget, src, dst, boxes, launches, n, src_stride, dst_stride,
    box_stride,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    MODE: tl.constexpr, OP: tl.constexpr, ACC_FP32: tl.constexpr, HINT: tl.constexpr,
    PDL: tl.constexpr = False,
    SIG=0,
):  # fmt: skip
    """Member ``j`` is sent ``src[j * src_stride + t]`` (``src_stride`` 0: the same data to
    everyone); member ``i``'s data ends in ``dst[i * dst_stride + t]`` (reductions: ``dst[t]``)."""
    enter_launch(PDL)
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    ntiles = tl.cdiv(n, BLOCK)
    bank = boxes + ((tl.load(launches) >> 20) & 1).to(tl.int64) * GROUP * box_stride
    mine = bank + ME * box_stride
    t = pid
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tiles.store_chunks(ctx, group, src, src_stride, mine, offs, offs < n, ME, GROUP, HINT)
        t += tl.num_programs(0)
    group.sync(ctx, pid)  # orders the remote stores before it (CTA barrier + release)
    own = src + tl.cast(ME, tl.int64) * src_stride
    t = pid
    while t < ntiles:
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if MODE == "all_reduce" or MODE == "reduce_scatter":
            acc = tiles.reduce_slots(own, bank, box_stride, offs, mask, ME, GROUP, OP, ACC_FP32)
            tl.store(dst + offs, convert(acc, dst.dtype.element_ty), mask=mask)
        else:
            for i in tl.static_range(GROUP):
                x = tl.load((own if i == ME else bank + i * box_stride) + offs, mask=mask)
                tl.store(dst + tl.cast(i, tl.int64) * dst_stride + offs, x, mask=mask)
        t += tl.num_programs(0)
    advance_launch_counter(launches, _LAUNCH_UNIT)  # this launch's 2**20 (module docstring)


def run(plan: Plan) -> None:
    """Run ``plan`` over ``plan.count`` elements per member: ``plan.src`` and ``plan.dst`` are
    flat, contiguous and may be any tensors (``dst`` may be ``src`` for an all-reduce)."""
    comm, cfg, src_all, dst_all, mode = plan.comm, plan.cfg, plan.src, plan.dst, plan.collective
    itemsize = src_all.element_size()
    buf = comm.staging("push", 0, zero=True)
    launches = buf[:8].view(torch.int32)
    # Two banks of G boxes, each a multiple of 64 elements so every box is 16-byte aligned.
    box_stride = (buf.numel() - _HEADER) // (2 * comm.size * itemsize) // 64 * 64
    boxes = buf[_HEADER : _HEADER + 2 * comm.size * box_stride * itemsize].view(src_all.dtype)
    src_stride = plan.count if mode in ("reduce_scatter", "all_to_all") else 0
    dst_stride = plan.count if mode in ("all_gather", "all_to_all") else 0
    meta = {"MODE": mode, "OP": plan.op_value, "ACC_FP32": _host.acc_fp32(src_all.dtype)}
    for start, length in _host.chunks(plan.count, min(box_stride, cfg.chunk_elements or box_stride)):
        src, dst = src_all[start:], dst_all[start:]
        strides = (src_stride * itemsize, dst_stride * itemsize, box_stride * itemsize)
        meta["HINT"] = _host.vector_hint((src, dst, boxes), strides)
        _host.launch(
            _boxed_kernel, _host.persistent_grid(comm, cfg, length), comm, cfg,
            src, dst, boxes, launches, length, src_stride, dst_stride, box_stride, **meta,
        )  # fmt: skip


REGISTERED = tuple(Variant(collective=mode, name="boxed", run=run, staged=True) for mode in MODES)
