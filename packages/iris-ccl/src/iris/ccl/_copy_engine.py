"""The ``copy_engine`` variant of all_reduce, all_gather and all_to_all: the bulk bytes move
by the GPUs' copy engines (DMA, ``cudaMemcpyAsync`` between the heaps' peer mappings), for
large messages on a heap.

On 2 x H200 a copy engine moves 391 GB/s per direction with both directions busy, where a
kernel's remote stores reach 366 GB/s and its remote loads 337 GB/s (benchmarks/mem); only
the copies and a few one-program barrier kernels cross the link. The collectives fork two
side streams from the caller's stream and join them back, so a call stays ordered on the
current stream and can be captured in a CUDA graph.

all_reduce (output not overlapping the input, both on the heap), ``G`` members, member
``j`` owning chunk ``j`` of ``n // G`` elements, split into pieces:

1. start barrier (every member has entered: its input is ready and its output free);
2. per piece, on the first side stream: copy chunk ``j`` of the local input into member
   ``j``'s output (with two members at chunk ``j`` itself, the one place of a member's
   output nobody else writes; with more at chunk ``ME``), then a barrier: every member's
   contributions to this piece have landed;
3. on the caller's stream: reduce the piece of the own chunk (own input and the received
   contributions, in member order, fp32 accumulation for floating types) into the output;
   with more than two members, then a barrier: every member has consumed the contributions
   that the next step overwrites;
4. on the second side stream: copy the reduced piece into every peer's output;
5. join, end barrier (every member's copies into this one have landed).

Pieces pipeline the three steps (copies of piece ``k + 1`` while piece ``k`` is reduced).
The ``n % G`` elements left over go through ``boxed``. all_gather and all_to_all copy the
local input (or its chunk ``j``) into every member ``j``'s output between a start and an
end barrier, one side stream per peer.

On the CPU backend the same steps run one after another on the host (``Tensor.copy_``
between the processes' shared-memory heaps), which is what the CPU tier tests.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from iris.mem import runtime
from iris.mem.triton import Context

from . import _host
from ._plan import Plan
from .config import Config
from .triton import Group, tiles
from .triton.accumulate import convert

#: Pieces a copy_engine all_reduce is split into by default: two measured fastest at
#: 256 MiB and 1 GiB on 2 x H200 (more pieces add a copy and barrier launch each).
DEFAULT_PIECES = 2
#: Most pieces (two sync slots each, after slot 0).
MAX_PIECES = 1024
#: Elements per program of the local reduction kernel.
_REDUCE_BLOCK = 4096


@triton.jit
def _barrier_kernel(
    context, members, flags, epochs, status, budget, slot,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    SIG=0,
):  # fmt: skip
    """One program: barrier of sync slot ``slot``. Nothing remote precedes it in this
    kernel (copies before it on the stream have completed), so no fence."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, flags, epochs, status, budget, GROUP, ME, SIG)
    group.sync(ctx, slot, False)


@triton.jit
def _reduce_kernel(
    own, slots, dst, stride, n,
    ME: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr, ACC_FP32: tl.constexpr,
):  # fmt: skip
    """Local: ``dst[t]`` = the reduction over members ``i`` of ``own[t]`` (``i == ME``) or
    ``slots[i * stride + t]``, in member order."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tiles.reduce_slots(own, slots, stride, offs, mask, ME, GROUP, OP, ACC_FP32)
    tl.store(dst + offs, convert(acc, dst.dtype.element_ty), mask=mask)


def peer_view(comm, t: torch.Tensor, member: int) -> torch.Tensor:
    """``t`` (flat, contiguous, on the communicator's heap) on member ``member``."""
    return comm.heap.peer_tensor(t, comm.members[member])


class _Streams:
    """The caller's stream and two side streams forked from it (CUDA), or nothing (CPU:
    every step runs in order on the host)."""

    def __init__(self, comm):
        self.cuda = comm.capabilities.streams
        if self.cuda:
            self.main = torch.cuda.current_stream(comm.device)
            self.side = comm.side_streams()
            for s in self.side:
                s.wait_stream(self.main)

    def on(self, i: int):
        """Context manager: work queued inside runs on side stream ``i``."""
        return torch.cuda.stream(self.side[i]) if self.cuda else contextlib.nullcontext()

    def record(self, i: int | None = None):
        """An event after what is queued so far on side stream ``i`` (None: the caller's)."""
        if not self.cuda:
            return None
        return (self.main if i is None else self.side[i]).record_event()

    def wait(self, event, i: int | None = None) -> None:
        if event is not None:
            (self.main if i is None else self.side[i]).wait_event(event)

    def join(self) -> None:
        if self.cuda:
            for s in self.side:
                self.main.wait_stream(s)


def _barrier(comm, cfg: Config, slot: int) -> None:
    _host.launch(_barrier_kernel, 1, comm, cfg, slot)


def all_reduce(comm, cfg: Config, src: torch.Tensor, dst: torch.Tensor, op: str) -> int:
    """Reduce ``src`` into ``dst`` (flat, on ``comm``'s heap, not overlapping) with copy
    engine transfers; returns how many leading elements it covered (a multiple of ``G``:
    the caller runs the rest another way)."""
    size, me = comm.size, comm.index
    chunk = src.numel() // size
    if chunk == 0:
        return 0
    piece = cfg.chunk_elements or -(-chunk // DEFAULT_PIECES)
    piece = max(piece, -(-chunk // MAX_PIECES))
    piece = min(piece, 1 << 30)  # int32 offsets in the reduction kernel
    pieces = -(-chunk // piece)
    acc_fp32 = _host.acc_fp32(src.dtype)
    # Where member j's contributions to chunk c arrive on member c: two members, in the
    # output's chunk c itself; more, at chunk j (each member's AG copy overwrites it later).
    spread = size > 2
    _barrier(comm, cfg, 0)
    streams = _Streams(comm)  # forked after the start barrier
    reduced = []
    for k in range(pieces):
        lo = k * piece
        hi = min(chunk, lo + piece)
        with streams.on(0):
            for step in range(1, size):
                j = (me + step) % size
                at = (me if spread else j) * chunk
                peer_view(comm, dst[at + lo : at + hi], j).copy_(src[j * chunk + lo : j * chunk + hi])
            _barrier(comm, cfg, 1 + k)
            landed = streams.record(0)
        streams.wait(landed)
        own = src[me * chunk + lo :]
        out = dst[me * chunk + lo :]
        slots = dst[lo:] if spread else out
        meta = {"ME": me, "GROUP": size, "BLOCK": _REDUCE_BLOCK, "OP": op, "ACC_FP32": acc_fp32}
        grid = (triton.cdiv(hi - lo, _REDUCE_BLOCK),)
        # one interpreted kernel at a time per process (Triton's interpreter has global state)
        with runtime.INTERPRETER_LOCK if comm.capabilities.interpreted else contextlib.nullcontext():
            _reduce_kernel[grid](own, slots, out, chunk if spread else 0, hi - lo, **meta)
        if spread:
            _barrier(comm, cfg, 1 + pieces + k)
        reduced.append(streams.record())
        with streams.on(1):
            streams.wait(reduced[k], 1)
            part = dst[me * chunk + lo : me * chunk + hi]
            for step in range(1, size):
                peer_view(comm, part, (me + step) % size).copy_(part)
    streams.join()
    _barrier(comm, cfg, 0)
    return chunk * size


def scatter_copies(plan: Plan, chunked: bool) -> None:
    """all_gather (``chunked`` False: every member gets all of ``plan.src``) or all_to_all
    (``chunked``: member ``j`` gets chunk ``j`` of ``plan.src``): the data lands in member
    ``j``'s ``plan.dst`` at chunk ``ME``; ``dst`` is flat on the heap, ``src`` any flat tensor
    on the same device (in all_gather it may be the own chunk of ``dst``)."""
    comm, cfg, src, dst, per_member = plan.comm, plan.cfg, plan.src, plan.dst, plan.count
    size, me = comm.size, comm.index
    _barrier(comm, cfg, 0)
    streams = _Streams(comm)  # forked after the start barrier
    mine = dst[me * per_member : (me + 1) * per_member]
    for step in range(1, size):
        j = (me + step) % size
        with streams.on(step % 2):
            part = src[j * per_member : (j + 1) * per_member] if chunked else src
            peer_view(comm, mine, j).copy_(part)
    part = src[me * per_member : (me + 1) * per_member] if chunked else src
    if part.data_ptr() != mine.data_ptr():
        mine.copy_(part)
    streams.join()
    _barrier(comm, cfg, 0)
