"""``broadcast``: every rank's tensor becomes a copy of rank ``src``'s, in place.

Each program handles one tile: after a start barrier every member but the root pulls the
tile from the root's heap, and a closing barrier keeps the root's buffer unchanged until
all have read it (:func:`iris.ccl.triton.tiles.broadcast_pull`).
"""

from __future__ import annotations

import torch

from . import _host, _rooted, entry
from .config import Config
from .work import Work


def _check(tensor: torch.Tensor, src: int, *, group, **_) -> None:
    _rooted.member_index(src, group, "src", "broadcast")
    _host.check_tensor(tensor, "tensor")


@entry.op("broadcast", tensors=("tensor",), outputs=("tensor",), device="tensor", validate=_check)
def broadcast(
    tensor: torch.Tensor, src: int, *, group=None, async_op: bool = False, config: Config | None = None,
) -> Work | None:  # fmt: skip
    """Copy rank ``src``'s ``tensor`` into ``tensor`` on every rank of ``group``, in place.

    :param tensor: data on ``src``, result elsewhere; same number of elements and dtype on
        every rank; any shape, contiguous or not.
    :param src: global rank of the source (as in ``torch.distributed``), a member of ``group``.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config`; None picks by size.

    A contiguous tensor on a symmetric heap spanning exactly ``group`` is used in place;
    others are staged (the root copies its tensor into the staging buffer).
    """
    root = _rooted.member_index(src, group, "src", "broadcast")
    n = tensor.numel()
    comm, in_place, cfg = _host.setup(
        "broadcast", [tensor], group, config, n * tensor.element_size(), root=src
    )
    data = _rooted.flat(tensor)

    def buffers(start, length):
        dst = data[start : start + length]
        if in_place:
            return dst, dst, 0, None
        return (comm.staged_copy if comm.index == root else comm.staging_like)("in", dst), dst, 0, None

    args = (comm, cfg, in_place, n, tensor.element_size(), root, data, data, tensor, buffers)
    return _rooted.execute("broadcast", *args, async_op)
