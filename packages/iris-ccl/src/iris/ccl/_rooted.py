"""Host helpers of the rooted and point-to-point collectives: ranks named by the caller.

torch.distributed names roots and peers by *global* rank; the kernels index the group's
members. These helpers validate the caller's rank on every rank before any communication,
so a bad rank raises the same clear ``ValueError`` everywhere instead of hanging.
"""

from __future__ import annotations

import operator

import torch
import torch.distributed as dist

import iris.mem
from iris.mem.runtime import group_ranks


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


def default_device() -> torch.device:
    """The device of iris.ccl's own heap when no tensor names one (:func:`iris.mem.default_device`)."""
    return iris.mem.default_device()


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
