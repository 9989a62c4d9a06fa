"""``gather``: rank ``dst`` receives every rank's input, concatenated in group order.

Each program handles one tile of every input: after a start barrier the root pulls the
tile from every member, and a closing barrier keeps the inputs unchanged until the root
has read them (:func:`iris.ccl.triton.tiles.gather_pull`). Inputs on a symmetric heap
spanning exactly the group are read in place; others are staged through the group's
staging buffer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from iris.mem.runtime import group_ranks

from . import _host, _rooted, entry
from .config import Config
from .work import Work


def _check(out: torch.Tensor | None, inp: torch.Tensor, dst: int, *, group, **_) -> None:
    _rooted.member_index(dst, group, "dst", "gather")
    _host.check_tensor(inp, "inp")
    if dist.get_rank() == dst:
        if out is None:
            raise ValueError(f"gather: out is None on the destination rank {dst}; pass the output tensor")
        _host.check_pair(out, inp, "gather", len(group_ranks(group)) * inp.numel())


@entry.op("gather", tensors=("out", "inp"), outputs=("out",), device="inp", validate=_check)
def gather(
    out: torch.Tensor | None, inp: torch.Tensor, dst: int, *, group=None, async_op: bool = False,
    config: Config | None = None,
) -> Work | None:  # fmt: skip
    """Write ``inp`` of the ``i``-th rank of ``group`` into chunk ``i`` of ``out`` on rank
    ``dst`` (chunks in flat element order).

    :param out: on ``dst``, ``group size * inp.numel()`` elements of ``inp``'s dtype (for
        example ``[group size, *inp.shape]``, like ``torch.distributed.gather``'s list
        stacked), any tensor (only written locally); ignored, and may be None, on the other
        ranks.
    :param inp: this rank's contribution: any shape, contiguous or not, the same number of
        elements and dtype on every rank.
    :param dst: global rank of the root (as in ``torch.distributed``), a member of ``group``.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config`; None picks by size.
    """
    root, is_root, m, comm, in_place, cfg = _rooted.setup_chunked("gather", inp, dst, group, config)
    src_all = _rooted.flat(inp)
    dst_all = _rooted.flat_out(out) if is_root else None

    def buffers(start, length):
        src = src_all[start : start + length]
        ksrc = src if in_place else comm.staged_copy("in", src)
        # Only the root writes its output: any pointer does elsewhere.
        return ksrc, dst_all[start:] if is_root else ksrc, m, None

    args = (comm, cfg, in_place, m, inp.element_size(), root, src_all, dst_all, out, buffers)
    return _rooted.execute("gather", *args, async_op)
