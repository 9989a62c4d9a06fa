"""The gloo group iris.ccl makes for each ``iris`` torch.distributed group (its host group),
by the group's members alone, through the group's store, under a name no other group takes
(``torch.distributed.new_group`` would be collective over the whole world, and the group is
being made inside one)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from iris.mem import settings as mem_settings


def subgroup(
    ranks: Sequence[int], name: str, timeout: datetime.timedelta, *, rank: int, store: dist.Store,
    world: bool = False, description: str = "gloo group of iris.ccl",
) -> dist.ProcessGroup:  # fmt: skip
    """A gloo group over the global ``ranks``, made by them alone.

    :param name: the group's name, unique in the job (also its store prefix and tag).
    :param timeout: the group's timeout.
    :param rank: this process's index in ``ranks``.
    :param store: the store its members meet through.
    :param world: ``ranks`` are the world's, whose default group is being made (torch then
        takes no rank list: it cannot look this process's rank up yet).
    """
    ranks = list(ranks)
    group_name = getattr(c10d, "GroupName", str)(name)
    group, _ = c10d._new_process_group_helper(
        len(ranks), rank, [] if world else ranks, "gloo", store, group_name, timeout=timeout, pg_tag=name,
        group_desc=description,
    )  # fmt: skip
    # torch.distributed looks a group's ranks up here (new_group records them itself)
    c10d._world.pg_group_ranks[group] = {g: i for i, g in enumerate(ranks)}
    return group


def host_timeout(limit: datetime.timedelta | None = None) -> datetime.timedelta:
    """The timeout of a group that carries Iris's own host exchanges: ``IRIS_HOST_TIMEOUT``,
    or ``limit`` when shorter."""
    bound = datetime.timedelta(seconds=mem_settings.host_timeout())
    return min(bound, limit) if limit is not None else bound
