"""Bring-up of torch.distributed and the host collectives Iris runs over it.

The heap needs three host collectives: exchange small Python objects, barrier, and
broadcast. They run over ``torch.distributed`` on the group the heap was created for
(:class:`Communicator`), always on the CPU: on the group itself when it has a CPU backend
(gloo), else on a gloo group of the same ranks (:func:`host_group`), so that no host
exchange of Iris needs NCCL (which refuses ranks that share a GPU). :func:`exchange` is the
checked form that every rank-comparing check of Iris uses, and :func:`group_ranks` the
validation of a ``group`` argument; :mod:`iris.mem.runtime` re-exports both.

Which torch.distributed backend a group Iris makes gets is one decision,
:func:`group_backend`: gloo for the CPU backend; for CUDA, NCCL for CUDA tensors and gloo for
CPU tensors, except where ranks share GPUs (the world that :func:`iris.mem.init` brings up
for a launcher that started more ranks than there are GPUs, and the groups made under a
parent group that moves CUDA tensors with gloo): gloo for both.
"""

from __future__ import annotations

import atexit
import datetime
import os
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from . import machine, settings
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
    pg_backend = group_backend(backend)
    present = [name for name in _LAUNCHER_VARS if name in os.environ]
    if present and len(present) < len(_LAUNCHER_VARS):
        missing = sorted(set(_LAUNCHER_VARS) - set(present))
        raise RuntimeError(
            f"torch.distributed environment is incomplete: {', '.join(missing)} not set. "
            "Launch with torchrun, or call torch.distributed.init_process_group() before iris.mem.init()."
        )
    if present:
        if backend == "cuda":
            torch.cuda.set_device(machine.rank_gpu())
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


#: The backend of groups whose CUDA tensors go through NCCL, their CPU tensors through gloo.
NCCL_AND_GLOO = "cuda:nccl,cpu:gloo"


def backend_for(device_backend: str, parent: str | None, ranks_share_gpus: bool) -> str:
    """The torch.distributed backend of a group Iris makes (the rule of :func:`group_backend`):

    :param device_backend: the heap backend, ``"cpu"`` or ``"cuda"``.
    :param parent: the backend configuration (``dist.get_backend_config``, e.g.
        ``"cpu:gloo,cuda:nccl"``) of the group it is made under, or None for the world itself.
    :param ranks_share_gpus: (the world only) whether ranks of the job share a GPU.
    :returns: ``"gloo"`` on the CPU backend, where ranks share GPUs (NCCL refuses a group
        with two ranks on one GPU) and under a parent that moves CUDA tensors with gloo (it
        was made so for a reason, and every member reads the same parent: they all decide
        alike); else :data:`NCCL_AND_GLOO`.
    """
    if device_backend == "cpu":
        return "gloo"
    if parent is None:
        return "gloo" if ranks_share_gpus else NCCL_AND_GLOO
    for entry in parent.split(","):
        device, _, name = entry.strip().partition(":")
        if device == "cuda" and name.strip() == "gloo":
            return "gloo"
    if parent.strip() == "gloo":
        return "gloo"
    return NCCL_AND_GLOO


def group_backend(device_backend: str, parent: dist.ProcessGroup | None = None) -> str:
    """The torch.distributed backend of a group Iris makes for the heap backend
    ``device_backend``: the default group when torch.distributed is not initialised yet
    (ranks share GPUs when the launcher started more ranks on this node, ``LOCAL_WORLD_SIZE``,
    than there are visible GPUs), else a group under ``parent`` (None: the world). See
    :func:`backend_for`. The one place this is decided: the world that
    :func:`ensure_initialized` brings up, :func:`iris.mem.nodes.subgroup`, and the
    commands of upper layers that set up a process group (the tuners) ask it."""
    if not dist.is_initialized():
        gpus = torch.cuda.device_count() if device_backend == "cuda" and torch.cuda.is_available() else 0
        shared = machine.launcher_shares_gpus(settings.local_world_size(), gpus)
        return backend_for(device_backend, None, shared)
    try:
        config = str(dist.get_backend_config(parent))
    except Exception:  # noqa: BLE001 - a group that cannot say: as if it used NCCL
        config = "cuda:nccl"
    return backend_for(device_backend, config, False)


def make_group(ranks: list[int], backend: str, name: str) -> dist.ProcessGroup:
    """A registered process group of the global ``ranks`` (this process among them) named
    ``name``, made by its members only (torch's ``new_group`` needs every rank of the job)."""
    default = distributed_c10d._get_default_group()
    try:
        helper = distributed_c10d._new_process_group_helper
        _, store = distributed_c10d._world.pg_map[default]
    except (AttributeError, KeyError):  # pragma: no cover - a torch without these internals
        helper = None
    device_id = default.bound_device_id if "nccl" in backend else None
    if helper is None:  # pragma: no cover
        group = dist.new_group(ranks, backend=backend, use_local_synchronization=True)
    else:
        group, _ = helper(
            len(ranks),
            ranks.index(dist.get_rank()),
            ranks,
            dist.Backend(backend),
            store,
            name,
            timeout=host_timeout(),
            device_id=device_id,
            group_desc=name,
        )
        distributed_c10d._world.pg_group_ranks[group] = {g: i for i, g in enumerate(ranks)}
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        raise IrisError(f"internal: making the process group {name} failed")
    return group


def runs_on_cpu(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` (None: the world) runs object collectives and barriers on the CPU:
    it has a CPU backend and is bound to no device (a group bound to a GPU barriers there)."""
    pg = group if group is not None else distributed_c10d._get_default_group()
    if getattr(pg, "bound_device_id", None) is not None:
        return False
    try:
        return distributed_c10d._get_object_coll_device(pg) == "cpu"
    except Exception:  # noqa: BLE001 - a torch without the helper: ask the device types
        return torch.device("cpu") in getattr(pg, "_device_types", [torch.device("cpu")])


#: The gloo group of each group whose collectives would not run on the CPU (weakly keyed).
_HOST_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def host_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The group Iris's host collectives over ``group`` (None: the world) run on: ``group``
    itself when it runs them on the CPU (:func:`runs_on_cpu`: gloo, or ``"cpu:gloo,..."``),
    else a gloo group of the same ranks, made at the first call (collectively: every member
    makes it there, as every member makes the host collective that asks) and kept for the
    group's lifetime. So a group of NCCL alone (``init_process_group("nccl")``) serves Iris
    too, where its ranks share a GPU (which NCCL refuses) as elsewhere."""
    if runs_on_cpu(group):
        return group
    key = dist.group.WORLD if group is None else group
    twin = _HOST_GROUPS.get(key)
    if twin is None:
        # in the group's rank order, so that the twin numbers the ranks as the group does
        ranks = list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)
        twin = _HOST_GROUPS[key] = make_group(list(ranks), "gloo", f"iris:{key.group_name}:host")
    return twin


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
        #: Where the collectives run: the group, or its gloo twin (:func:`host_group`).
        self.host = host_group(group)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Gather one picklable object from every rank, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.host)
        return out

    def gather_object(self, obj: Any, dst: int) -> list[Any] | None:
        """Gather one picklable object from every rank on group rank ``dst`` (rank order
        there; None elsewhere)."""
        out: list[Any] | None = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, out, dst=self.global_ranks[dst], group=self.host)
        return out

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Broadcast a picklable object from group rank ``src``."""
        box = [obj]
        dist.broadcast_object_list(box, src=self.global_ranks[src], group=self.host)
        return box[0]

    def barrier(self) -> None:
        """Host barrier over the group."""
        dist.barrier(group=self.host)

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
        dist.all_gather_object(gathered, (_EXCHANGE_TAG, what, payload), group=host_group(group))
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
