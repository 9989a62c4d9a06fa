"""``scatter``: rank ``src`` splits its input into one chunk per rank; rank ``i`` receives
chunk ``i``.

Each program handles one tile of every chunk: after a start barrier (every member's
output is free) the root pushes chunk ``i``'s tile into member ``i``'s output, and a
closing barrier makes the tiles visible (:func:`iris.ccl.triton.tiles.scatter_push`).
Outputs on a symmetric heap spanning exactly the group are written in place; others are
staged through the group's staging buffer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from iris.mem.runtime import group_ranks

from . import _host, _rooted, entry
from .config import Config
from .work import Work


def _check(out: torch.Tensor, inp: torch.Tensor | None, src: int, *, group, **_) -> None:
    _rooted.member_index(src, group, "src", "scatter")
    _host.check_tensor(out, "out")
    if dist.get_rank() != src:
        return  # inp is read on the source only
    if inp is None:
        raise ValueError(f"scatter: inp is None on the source rank {src}; pass the tensor to scatter")
    _host.check_pair(out, inp, "scatter", out.numel())
    size = len(group_ranks(group))
    if inp.numel() != size * out.numel():
        raise ValueError(
            f"scatter: inp has {inp.numel()} elements (shape {list(inp.shape)}), expected "
            f"{size} ranks x {out.numel()} elements of out (shape {list(out.shape)})"
        )


@entry.op("scatter", tensors=("out", "inp"), outputs=("out",), device="out", validate=_check)
def scatter(
    out: torch.Tensor, inp: torch.Tensor | None, src: int, *, group=None, async_op: bool = False,
    config: Config | None = None,
) -> Work | None:  # fmt: skip
    """Split ``inp`` of rank ``src`` into ``group``'s size equal chunks (in flat element
    order) and write chunk ``i`` into ``out`` of the ``i``-th rank of ``group``: the mirror
    of :func:`~iris.ccl.gather`, with the roles of ``out`` and ``inp`` swapped.

    :param out: this rank's chunk, as ``inp`` of :func:`~iris.ccl.gather` (any shape and
        layout; the same number of elements and dtype on every rank).
    :param inp: on ``src``, as ``out`` of :func:`~iris.ccl.gather` (for example ``[group
        size, *out.shape]``, like ``torch.distributed.scatter``'s list stacked), any tensor
        (only read locally); ignored, and may be None, on the other ranks.
    :param src: global rank of the source (as in ``torch.distributed``), a member of ``group``.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config`; None picks by size.
    """
    root, is_root, m, comm, in_place, cfg = _rooted.setup_chunked("scatter", out, src, group, config)
    src_all = _rooted.flat(inp) if is_root else None
    dst_all = _rooted.flat_out(out)

    def buffers(start, length):
        dst = dst_all[start : start + length]
        kdst = dst if in_place else comm.staging_like("out", dst)
        # Only the root reads its input: any pointer does elsewhere.
        return src_all[start:] if is_root else kdst, kdst, m, None if in_place else lambda: dst.copy_(kdst)

    args = (comm, cfg, in_place, m, out.element_size(), root, src_all, dst_all, out, buffers)
    return _rooted.execute("scatter", *args, async_op)
