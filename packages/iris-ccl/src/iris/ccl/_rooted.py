"""The rooted collectives' shared parts: their kernel, their launch loop, and the check of
ranks named by the caller.

torch.distributed names roots and peers by *global* rank; the kernels index the group's
members. :func:`member_index` validates the caller's rank on every rank before any
communication, so a bad rank raises the same clear ``ValueError`` everywhere instead of
hanging. broadcast, reduce, scatter and gather run one persistent kernel,
:func:`_rooted_kernel`, specialised by the tile collective it calls.
"""

from __future__ import annotations

import operator

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from iris.mem.runtime import group_ranks
from iris.mem.triton.group import enter_group

from . import _host
from .config import Config
from .reduce_op import from_accumulator
from .triton import tiles


@triton.jit
def _rooted_kernel(
    context, members, flags, epochs, status, budget, src, dst, n, n_per_rank, root,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    KIND: tl.constexpr, OP: tl.constexpr = "sum", ACC_FP32: tl.constexpr = True,
    SIG=0,
):  # fmt: skip
    """Persistent: program ``p`` moves tiles ``p, p + P, ...`` of ``n`` elements (the same
    program on every member) with the tile collective ``KIND``, member ``root`` (a group
    index) at its centre:

    * ``"broadcast"``: ``dst[i] = src[i]`` of ``root`` on every other member;
    * ``"reduce"``: on ``root``, ``dst[i] = OP`` over the members' ``src[i]``;
    * ``"scatter"``: from ``root``, ``dst_m[i] = src[m * n_per_rank + i]`` on every member ``m``;
    * ``"gather"``: on ``root``, ``dst[m * n_per_rank + i] = src_m[i]`` for every member ``m``.
    """
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, False, SIG
    )
    t = pid
    while t < tl.cdiv(n, BLOCK):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if KIND == "broadcast":
            tiles.broadcast_pull(ctx, group, src, dst, offs, mask, root, pid)
        elif KIND == "reduce":
            tiles.reduce_pull(ctx, group, src, dst, offs, mask, root, pid, OP, ACC_FP32)
        elif KIND == "scatter":
            tiles.scatter_push(ctx, group, src, dst, offs, mask, n_per_rank, root, pid)
        else:
            tiles.gather_pull(ctx, group, src, dst, offs, mask, n_per_rank, root, pid)
        t += tl.num_programs(0)


def run(
    kind: str, comm, cfg: Config, n: int, itemsize: int, in_place: bool, buffers, root: int, **meta
) -> None:
    """Launch :func:`_rooted_kernel` over ``n`` elements in as many launches as the staging
    buffer and the config allow. ``buffers(start, length)`` returns the launch's
    ``(src, dst, n_per_rank, done)``: kernel pointers (on the heap where peers reach them) and
    what to do after the launch (a copy out of staging), or None."""
    per_launch = _host.max_elements(cfg, itemsize, not in_place, comm)
    fields = {"count": n, "itemsize": itemsize, "root": root, "op": meta.get("OP"), "variant": cfg.variant}
    with comm.signed(kind, **fields):
        for start, length in _host.chunks(n, per_launch):
            src, dst, n_per_rank, done = buffers(start, length)
            grid = _host.persistent_grid(comm, cfg, length)
            args = (src, dst, length, n_per_rank, root)
            _host.launch(_rooted_kernel, grid, comm, cfg, *args, KIND=kind, **meta)
            if done is not None:
                done()


def execute(
    kind: str, comm, cfg: Config, in_place: bool, count: int, itemsize: int, root: int, src_all, dst_all,
    out, buffers, async_op: bool, **meta,
):  # fmt: skip
    """The part of a rooted collective after its setup: nothing to move (``count == 0``), a
    group of one (a local copy), or :func:`run`; then the result into a non-contiguous
    ``out`` (where this rank has a result: ``dst_all`` not None) and the
    :class:`~iris.ccl.work.Work` handle when ``async_op``."""
    if count and comm.size == 1:  # a reduction over one member rounds as any does (float8: saturates)
        dst_all.copy_(from_accumulator(src_all, dst_all.dtype) if kind == "reduce" else src_all)
    elif count:
        run(kind, comm, cfg, count, itemsize, in_place, buffers, root, **meta)
    if dst_all is not None:
        _host.copy_back(out, dst_all)
    return _host.finish(comm, async_op)


def setup_chunked(kind: str, chunk: torch.Tensor, root_rank: int, group, config: Config | None):
    """The setup of ``gather`` / ``scatter``, whose every member holds one ``chunk`` of the
    root's tensor: ``(root's group index, whether this rank is the root, elements per chunk,
    communicator, in place, resolved config)``."""
    root = member_index(root_rank, group, "dst" if kind == "gather" else "src", kind)
    count = chunk.numel()
    nbytes = len(group_ranks(group)) * count * chunk.element_size()
    comm, in_place, cfg = _host.setup(kind, [chunk], group, config, nbytes, root=root_rank)
    return root, dist.get_rank() == root_rank, count, comm, in_place, cfg


def member_index(rank: object, group, name: str, collective: str) -> int:
    """Index in ``group`` of global rank ``rank`` (argument ``name`` of ``collective``)."""
    ranks = group_ranks(group)
    if isinstance(rank, bool):
        raise TypeError(f"{collective}: {name} must be an int global rank, got {rank!r}")
    try:
        rank = operator.index(rank)
    except TypeError:
        raise TypeError(f"{collective}: {name} must be an int global rank, got {rank!r}") from None
    if rank not in ranks:
        where = "the world" if group is None else "the group"
        raise ValueError(
            f"{collective}: {name}={rank} is not a rank of {where}, whose global ranks are {ranks}; "
            f"pass the global rank (as torch.distributed does) of a member"
        )
    if dist.get_rank() not in ranks:
        raise ValueError(f"{collective}: this process (rank {dist.get_rank()}) is not a member of the group")
    return ranks.index(rank)


def flat(t: torch.Tensor) -> torch.Tensor:
    """A flat contiguous version of ``t``: a view when ``t`` is contiguous, else a copy (write
    results back with ``copy_back(t, flat)``)."""
    return _flat_view(t) if t.is_contiguous() else t.contiguous().view(-1)


def flat_out(t: torch.Tensor) -> torch.Tensor:
    """A flat contiguous tensor to write ``t``'s result into: a view when ``t`` is
    contiguous, else scratch (write it back with ``copy_back(t, flat)``)."""
    return _flat_view(t) if t.is_contiguous() else torch.empty(t.numel(), dtype=t.dtype, device=t.device)


def _flat_view(t: torch.Tensor) -> torch.Tensor:
    # Not view(-1): a contiguous tensor of one element may keep any stride, and kernels (and
    # views as bytes) need stride 1.
    return t.as_strided((t.numel(),), (1,))
