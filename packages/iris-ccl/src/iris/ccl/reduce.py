"""``reduce``: rank ``dst`` receives the reduction of every rank's input.

Each program handles one tile: after a start barrier the root pulls the tile from every
member and reduces it in member order (fp32 accumulation for floating types, bitwise the
same as ``all_reduce``), and a closing barrier keeps every input unchanged until the root
has read it (:func:`iris.ccl.triton.tiles.reduce_pull`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _host, _rooted, entry
from .config import Config
from .reduce_op import ReduceOp
from .work import Work


def _check(out: torch.Tensor | None, inp: torch.Tensor, dst: int, *, op, group, **_) -> None:
    _rooted.member_index(dst, group, "dst", "reduce")
    _host.check_tensor(inp, "inp")
    if out is not None:
        _host.check_pair(out, inp, "reduce", inp.numel())
    _host.check_op(ReduceOp.parse(op), inp.dtype)
    if dist.get_rank() == dst and out is None:
        raise ValueError(f"reduce: out is None on the destination rank {dst}; pass the tensor to reduce into")


@entry.op("reduce", tensors=("out", "inp"), outputs=("out",), device="inp", validate=_check)
def reduce(
    out: torch.Tensor | None, inp: torch.Tensor, dst: int, *, op: ReduceOp | str = ReduceOp.SUM, group=None,
    async_op: bool = False, config: Config | None = None,
) -> Work | None:  # fmt: skip
    """Reduce ``inp`` over the ranks of ``group`` into ``out`` on rank ``dst`` only.

    Unlike ``torch.distributed.reduce`` (in place, and leaving the other ranks' tensors
    unspecified), the result goes to ``out``, which is written on ``dst`` only: the other
    ranks' ``out`` is left untouched and may be None there.

    :param out: result on ``dst``: same number of elements, dtype and device as ``inp``;
        any shape, contiguous or not; may be ``inp``.
    :param inp: this rank's contribution; any shape, contiguous or not.
    :param dst: global rank of the root (as in ``torch.distributed``), a member of ``group``.
    :param op: SUM, AVG (floating types), MAX, MIN or PRODUCT.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config`; None picks by size.

    Inputs on a symmetric heap spanning exactly ``group`` are used in place; others are
    staged. ``out`` is only written locally, so it may be any tensor.
    """
    root = _rooted.member_index(dst, group, "dst", "reduce")
    rop = ReduceOp.parse(op)
    is_root = dist.get_rank() == dst
    n = inp.numel()
    comm, in_place, cfg = _host.setup(
        "reduce", [inp], group, config, n * inp.element_size(), op=rop, root=dst
    )
    if is_root:
        src_all, dst_all = _host.contiguous_pair(inp, out)
    else:
        src_all, dst_all = _rooted.flat(inp), None

    def buffers(start, length):
        src = src_all[start : start + length]
        ksrc = src if in_place else comm.staged_copy("in", src)
        # Non-root ranks write nothing: any pointer does as their dst.
        return ksrc, dst_all[start : start + length] if is_root else ksrc, 0, None

    meta = {"OP": rop.value, "ACC_FP32": _host.acc_fp32(inp.dtype)}
    args = (comm, cfg, in_place, n, inp.element_size(), root, src_all, dst_all, out, buffers)
    return _rooted.execute("reduce", *args, async_op, **meta)
