"""``reduce``: rank ``dst`` receives the reduction of every rank's input.

Each program handles one tile: after a start barrier the root pulls the tile from every
member and reduces it in member order (fp32 accumulation for floating types, bitwise the
same as ``all_reduce``), and a closing barrier keeps every input unchanged until the root
has read it (:func:`iris.ccl.triton.tiles.reduce_pull`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from iris.mem.triton import Context

from . import _host, _rooted
from .config import Config
from .reduce_op import ReduceOp
from .triton import Group, tiles
from .work import Work


@triton.jit
def _reduce_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, root,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    OP: tl.constexpr, ACC_FP32: tl.constexpr,
):  # fmt: skip
    """On member ``root``: ``dst[i] = OP over members m of src_m[i]`` for ``i < n``."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, flags, epochs, status, budget, GROUP, ME)
    pid = tl.program_id(0)
    t = pid  # persistent: tiles pid, pid + P, ... (the same program on every member)
    while t < tl.cdiv(n, BLOCK):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tiles.reduce_pull(ctx, group, src, dst, offs, offs < n, root, pid, OP, ACC_FP32)
        t += tl.num_programs(0)


def reduce(
    out: torch.Tensor | None,
    inp: torch.Tensor,
    dst: int,
    *,
    op: ReduceOp | str = ReduceOp.SUM,
    group=None,
    async_op: bool = False,
    config: Config | None = None,
) -> Work | None:
    """Reduce ``inp`` over the ranks of ``group`` into ``out`` on rank ``dst`` only.

    Unlike ``torch.distributed.reduce`` (in place, and leaving the other ranks' tensors
    unspecified), the result goes to ``out``, which is written on ``dst`` only: the other
    ranks' ``out`` is left untouched and may be None there.

    :param out: result on ``dst``: same number of elements, dtype and device as ``inp``;
        any shape, contiguous or not; may be ``inp``.
    :param inp: this rank's contribution; any shape, contiguous or not.
    :param dst: global rank of the root (as in ``torch.distributed``), a member of ``group``.
    :param op: SUM, AVG (floating types), MAX or MIN.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config`; None picks by size.

    Inputs on a symmetric heap spanning exactly ``group`` are used in place; others are
    staged. ``out`` is only written locally, so it may be any tensor.
    """
    root = _rooted.member_index(dst, group, "dst", "reduce")
    _host.check_tensor(inp, "inp")
    if out is not None:
        _host.check_pair(out, inp, "reduce", inp.numel())
    rop = ReduceOp.parse(op)
    _host.check_op(rop, inp.dtype)
    is_root = dist.get_rank() == dst
    if is_root and out is None:
        raise ValueError(f"reduce: out is None on the destination rank {dst}; pass the tensor to reduce into")
    n = inp.numel()
    comm, in_place, cfg = _host.setup(
        "reduce", [inp], group, config, n * inp.element_size(), op=rop, root=dst
    )
    if n == 0:
        return _host.finish(comm, async_op)
    if is_root:
        src_all, dst_all = _host.contiguous_pair(inp, out)
    else:
        src_all, dst_all = _rooted.flat(inp), None
    if comm.size == 1:
        dst_all.copy_(src_all)
        _host.copy_back(out, dst_all)
        return _host.finish(comm, async_op)
    per_launch = _host.max_elements(cfg, inp.element_size(), not in_place, comm)
    for start, length in _host.chunks(n, per_launch):
        src = src_all[start : start + length]
        ksrc = src if in_place else comm.staged_copy("in", src)
        # Non-root ranks write nothing: any pointer does as their dst.
        kdst = dst_all[start : start + length] if is_root else ksrc
        grid = _host.persistent_grid(comm, cfg, length)
        _host.launch(
            _reduce_kernel, grid, comm, cfg, ksrc, kdst, length, root,
            OP=rop.value, ACC_FP32=_host.acc_fp32(inp.dtype),
        )  # fmt: skip
    if is_root:
        _host.copy_back(out, dst_all)
    return _host.finish(comm, async_op)
