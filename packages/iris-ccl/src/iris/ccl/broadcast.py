"""``broadcast``: every rank's tensor becomes a copy of rank ``src``'s, in place.

Each program handles one tile: after a start barrier every member but the root pulls the
tile from the root's heap, and a closing barrier keeps the root's buffer unchanged until
all have read it (:func:`iris.ccl.triton.tiles.broadcast_pull`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.mem.triton import Context

from . import _host, _rooted
from .config import Config
from .triton import Group, tiles
from .work import Work


@triton.jit
def _broadcast_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, root,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``dst[i] = src[i]`` of member ``root`` for ``i < n``, on every member but ``root``."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, flags, epochs, status, budget, GROUP, ME)
    pid = tl.program_id(0)
    t = pid  # persistent: tiles pid, pid + P, ... (the same program on every member)
    while t < tl.cdiv(n, BLOCK):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tiles.broadcast_pull(ctx, group, src, dst, offs, offs < n, root, pid)
        t += tl.num_programs(0)


def broadcast(
    tensor: torch.Tensor,
    src: int,
    *,
    group=None,
    async_op: bool = False,
    config: Config | None = None,
) -> Work | None:
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
    _host.check_tensor(tensor, "tensor")
    n = tensor.numel()
    comm, in_place, cfg = _host.setup(
        "broadcast", [tensor], group, config, n * tensor.element_size(), root=src
    )
    if n == 0 or comm.size == 1:
        return _host.finish(comm, async_op)
    data = _rooted.flat(tensor)
    per_launch = _host.max_elements(cfg, tensor.element_size(), not in_place, comm)
    for start, length in _host.chunks(n, per_launch):
        dst = data[start : start + length]
        if in_place:
            ksrc = dst
        elif comm.index == root:
            ksrc = comm.staged_copy("in", dst)
        else:
            ksrc = comm.staging_like("in", dst)
        grid = _host.persistent_grid(comm, cfg, length)
        _host.launch(_broadcast_kernel, grid, comm, cfg, ksrc, dst, length, root)
    _host.copy_back(tensor, data)
    return _host.finish(comm, async_op)
