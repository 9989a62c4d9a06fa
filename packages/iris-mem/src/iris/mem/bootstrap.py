"""Bring-up of torch.distributed and the host collectives Iris runs over it.

The heap needs three host collectives: exchange small Python objects, barrier, and
broadcast. They run over ``torch.distributed`` (gloo for the CPU backend, NCCL or gloo for
CUDA) on the group the heap was created for (:class:`Communicator`). :func:`exchange` is the
checked form that every rank-comparing check of Iris uses, and :func:`group_ranks` the
validation of a ``group`` argument; :mod:`iris.mem.runtime` re-exports both.
"""

from __future__ import annotations

import atexit
import datetime
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from . import settings
from .errors import IrisError

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def host_timeout() -> datetime.timedelta:
    """Timeout of host-side rendezvous and collectives (``IRIS_HOST_TIMEOUT`` seconds)."""
    return datetime.timedelta(seconds=settings.host_timeout())


def job_store():
    """The key-value store of the default process group (the job's rendezvous store), or
    None when torch.distributed is not initialised or has none. For small records peers
    read on rare occasions (how a process ended, what a call signature stands for)."""
    try:
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


def group_ranks(group: dist.ProcessGroup | None) -> list[int]:
    """Global ranks of ``group`` (None: the world), in group-rank order; a clear error when
    torch.distributed is not initialised, this process is not a member, or ``group`` is not
    a process group."""
    if not dist.is_initialized():
        raise RuntimeError(
            "Iris collectives and fused ops need torch.distributed: launch with torchrun, or call "
            "torch.distributed.init_process_group() (or iris.mem.init()) first"
        )
    if group is None:
        return list(range(dist.get_world_size()))
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this process is not a member of the group passed to the call")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {group!r}")
    return list(dist.get_process_group_ranks(group))


def group_index(group: dist.ProcessGroup | None) -> tuple[list[int], int]:
    """``(global ranks of group, this process's index among them)``."""
    ranks = group_ranks(group)
    return ranks, ranks.index(dist.get_rank())


#: Marks the payloads of :func:`exchange`, so a peer in another host collective is told apart.
_EXCHANGE_TAG = "iris exchange"


def exchange(
    group: dist.ProcessGroup | None,
    what: str,
    payload: Any,
    error: type[Exception] = IrisError,
    names: Sequence[int] | None = None,
) -> list[Any]:
    """Every rank's ``payload`` for the host exchange ``what`` ("heap allocation", "iris.ccl
    collective", ...) over ``group`` (None: the world), in group-rank order.

    For checks that compare the ranks (debug mode, the making of shared state): a peer that
    is at another exchange, or at another host collective of the group, is exactly what they
    look for, so it is reported as such: ``error`` naming what each rank was doing, instead of
    a comparison of unrelated values. A failure of the exchange itself (a peer exited, or a
    collective of another kind garbled it) is re-raised as ``error`` with that explanation.

    :param names: how to call the ranks in messages (default: their group ranks).
    """
    size = dist.get_world_size(group)
    names = list(range(size)) if names is None else list(names)
    gathered: list[Any] = [None] * size
    try:
        dist.all_gather_object(gathered, (_EXCHANGE_TAG, what, payload), group=group)
    except Exception as e:  # noqa: BLE001 - whatever the transport or unpickling raised
        raise error(
            f"{what}: exchanging it with the other ranks failed ({type(e).__name__}: {e}); a rank has "
            "exited, or is in another host collective of the group: every rank must make the same calls "
            "in the same order"
        ) from e
    whats = [
        g[1] if isinstance(g, tuple) and len(g) == 3 and g[0] == _EXCHANGE_TAG else None for g in gathered
    ]
    if any(w != what for w in whats):
        table = ", ".join(f"rank {n}: {w or 'another host collective'}" for n, w in zip(names, whats))
        raise error(
            f"{what}: ranks are at different calls ({table}); every rank must make the same calls in the "
            "same order"
        )
    return [g[2] for g in gathered]
