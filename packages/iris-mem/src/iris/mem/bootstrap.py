"""Bring-up of torch.distributed and the communicator the heap uses on the host.

The heap needs three host collectives: exchange small Python objects, barrier, and
broadcast. They run over ``torch.distributed`` (gloo for the CPU backend, NCCL or gloo for
CUDA) on the group the heap was created for.
"""

from __future__ import annotations

import atexit
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from . import settings

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def host_timeout() -> datetime.timedelta:
    """Timeout of host-side rendezvous and collectives (``IRIS_HOST_TIMEOUT`` seconds)."""
    return datetime.timedelta(seconds=settings.host_timeout())


def job_store():
    """The key-value store of the default process group (the job's rendezvous store), or
    None when torch.distributed is not initialised or has none. For small records peers
    read on rare occasions (how a process ended, what a call signature stands for)."""
    try:
        from torch.distributed import distributed_c10d

        if not dist.is_initialized():
            return None
        return distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store: the records are best effort
        return None


def ensure_initialized(backend: str) -> bool:
    """Initialise the default process group if the caller has not.

    Uses the launcher's environment (``torchrun`` sets ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT``); with none of it set, creates a world of one
    through a private file store, so a single process needs no launcher.

    :param backend: the heap backend (``cpu`` or ``cuda``), which picks gloo or NCCL.
    :returns: True when this call created a private world of one, which the heap then
        owns and destroys on close; a group made from the launcher's environment stays.
    """
    if dist.is_initialized():
        return False
    pg_backend = "gloo" if backend == "cpu" else "cuda:nccl,cpu:gloo"
    present = [name for name in _LAUNCHER_VARS if name in os.environ]
    if present and len(present) < len(_LAUNCHER_VARS):
        missing = sorted(set(_LAUNCHER_VARS) - set(present))
        raise RuntimeError(
            f"torch.distributed environment is incomplete: {', '.join(missing)} not set. "
            "Launch with torchrun, or call torch.distributed.init_process_group() before iris.mem.init()."
        )
    if present:
        if backend == "cuda":
            torch.cuda.set_device(
                int(os.environ.get("LOCAL_RANK", os.environ["RANK"])) % torch.cuda.device_count()
            )
        dist.init_process_group(backend=pg_backend, init_method="env://", timeout=host_timeout())
        # The caller may keep using torch.distributed after closing the heap, so the group
        # stays up until exit; a process that exits with a live gloo group can abort
        # ("terminate called without an active exception"), so tear it down then.
        atexit.register(_destroy_at_exit)
        return False
    # World of one: an in-process store; nothing on disk, nothing to clean up.
    dist.init_process_group(
        backend=pg_backend, store=dist.HashStore(), rank=0, world_size=1, timeout=host_timeout()
    )
    return True


def _destroy_at_exit() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class Communicator:
    """Host collectives over one torch.distributed group.

    :param group: the process group, or None for the default (world) group.
    """

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.global_ranks: list[int] = (
            list(range(self.world_size)) if group is None else list(dist.get_process_group_ranks(group))
        )

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Gather one picklable object from every rank, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def gather_object(self, obj: Any, dst: int) -> list[Any] | None:
        """Gather one picklable object from every rank on group rank ``dst`` (rank order
        there; None elsewhere)."""
        out: list[Any] | None = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, out, dst=self.global_ranks[dst], group=self.group)
        return out

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Broadcast a picklable object from group rank ``src``."""
        box = [obj]
        dist.broadcast_object_list(box, src=self.global_ranks[src], group=self.group)
        return box[0]

    def barrier(self) -> None:
        """Host barrier over the group."""
        dist.barrier(group=self.group)

    def global_rank(self, rank: int) -> int:
        """Global rank of group rank ``rank``."""
        return self.global_ranks[rank]


def node_group(group: dist.ProcessGroup | None, backend: str) -> dist.ProcessGroup | None:
    """The group a heap for ``group`` spans: ``group`` itself when its ranks are on one node,
    else the ranks of ``group`` on this process's node (a subgroup made once, by them)."""
    from .nodes import node_layout, subgroup

    layout = node_layout(group)
    if not layout.multi_node:
        return group
    return subgroup(group, layout.local_ranks, "node", backend)


def resolve_group(group: Any) -> dist.ProcessGroup | None:
    """Validate ``group``: a torch.distributed ProcessGroup this rank belongs to, or None."""
    if group is None:
        return None
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this process is not a member of the group passed to iris.mem.init()")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"group must be a torch.distributed ProcessGroup (from dist.new_group) or None, got {group!r}"
        )
    if dist.get_rank(group) < 0:
        raise ValueError("this process is not a member of the group passed to iris.mem.init()")
    return group
