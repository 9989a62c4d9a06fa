"""Nodes: which ranks of a job can share a symmetric heap.

A heap maps every rank's memory into every other rank's process, which only works between
processes of one machine (CUDA IPC, POSIX shared memory). Iris calls such a set of ranks a
**node**: ranks are on the same node when they run on the same host *and* were started by
the same launcher agent. torchrun's agent number (``GROUP_RANK``) tells the agents apart,
so two torchrun agents on one machine act as two nodes; ``IRIS_NODE_ID`` overrides it for
other launchers (or to split one machine into several nodes by hand).

:func:`node_layout` describes how a group's ranks fall onto nodes. In a job spanning
several nodes, :func:`iris.mem.init` builds the heap over this node's ranks of the group
(``heap.rank`` and ``heap.world_size`` are node-local, ``heap.global_ranks`` the global
ranks it holds), and iris.ccl / iris.ops run their collectives in stages: Iris within each
node, torch.distributed between nodes. Device kernels never see a rank of another node.
"""

from __future__ import annotations

import dataclasses
import socket
import weakref
from collections.abc import Sequence

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import settings
from .bootstrap import exchange, group_ranks, host_timeout
from .errors import IrisError


def node_key() -> str:
    """This process's node: ``host`` and the launcher agent (``IRIS_NODE_ID``, else
    torchrun's ``GROUP_RANK``, else nothing) as ``"host/agent"``."""
    agent = settings.node_id()
    if agent is None:
        agent = settings.text("GROUP_RANK") or ""
    return f"{socket.gethostname()}/{agent}"


@dataclasses.dataclass(frozen=True)
class NodeLayout:
    """How the ranks of a group fall onto nodes (see :func:`node_layout`).

    Attributes:
        ranks: the group's global ranks, in group-rank order.
        keys: each node's key (``"host/agent"``), nodes numbered in the order their first
            rank appears in ``ranks``.
        nodes: the global ranks of the group on each node, in group-rank order.
        node: the node of this process.
    """

    ranks: tuple[int, ...]
    keys: tuple[str, ...]
    nodes: tuple[tuple[int, ...], ...]
    node: int

    @property
    def num_nodes(self) -> int:
        """Number of nodes the group spans."""
        return len(self.nodes)

    @property
    def multi_node(self) -> bool:
        """Whether the group spans more than one node."""
        return len(self.nodes) > 1

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """The global ranks of the group on this process's node (a heap spans these)."""
        return self.nodes[self.node]

    @property
    def local_index(self) -> int:
        """This process's place among :attr:`local_ranks`."""
        return self.local_ranks.index(dist.get_rank())

    @property
    def uniform(self) -> bool:
        """Whether every node holds the same number of the group's ranks."""
        return len({len(n) for n in self.nodes}) == 1

    def node_of(self, rank: int) -> int:
        """The node of global rank ``rank`` (a member of the group)."""
        for i, members in enumerate(self.nodes):
            if rank in members:
                return i
        raise ValueError(f"rank {rank} is not a member of the group (ranks {list(self.ranks)})")

    def local_index_of(self, rank: int) -> int:
        """The place of global rank ``rank`` among its node's ranks of the group."""
        return self.nodes[self.node_of(rank)].index(rank)


def _layout_from(ranks: Sequence[int], keys: Sequence[str], me: int) -> NodeLayout:
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for rank, key in zip(ranks, keys):
        if key not in members:
            order.append(key)
            members[key] = []
        members[key].append(rank)
    nodes = tuple(tuple(members[k]) for k in order)
    node = next(i for i, n in enumerate(nodes) if me in n)
    return NodeLayout(tuple(ranks), tuple(order), nodes, node)


#: Layouts already exchanged, per group object (the world under its ProcessGroup object).
_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def node_layout(group: dist.ProcessGroup | None = None) -> NodeLayout:
    """How the ranks of ``group`` (None: the world) fall onto nodes.

    The first call for a group exchanges every member's node key over the group, so it is
    collective like :func:`iris.mem.init`: every member of the group must make it (iris.mem
    and iris.ccl make it in their first call over a group); later calls return the kept
    layout.
    """
    ranks = group_ranks(group)  # validates group and that torch.distributed is up
    key = dist.group.WORLD if group is None else group
    layout = _LAYOUTS.get(key)
    if layout is None:
        world = _LAYOUTS.get(dist.group.WORLD)
        if world is not None:  # known from the world's: no exchange
            keys = [world.keys[world.node_of(r)] for r in ranks]
        elif len(ranks) == 1:
            keys = [node_key()]
        else:
            keys = exchange(group, "iris.mem node layout", node_key())
        layout = _LAYOUTS[key] = _layout_from(ranks, keys, dist.get_rank())
    return layout


#: Groups made by :func:`subgroup`: per parent group object, ``{(purpose, ranks): group}``.
_SUBGROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def subgroup(
    parent: dist.ProcessGroup | None, ranks: Sequence[int], purpose: str, device_backend: str
) -> dist.ProcessGroup:
    """A torch.distributed group of the global ``ranks`` (members of ``parent``, this process
    among them), made by those ranks only and kept for the parent's lifetime.

    torch's ``new_group`` needs every rank of the job to enter it, which a collective over
    a subgroup cannot arrange. Iris names the group after its parent, ``purpose`` and
    members, which every member computes alike, and creates it through torch's own group
    machinery; only the members take part.

    :param device_backend: the heap backend (``"cpu"``: gloo; ``"cuda"``: NCCL for CUDA
        tensors, gloo for CPU tensors).
    """
    ranks = sorted(int(r) for r in ranks)
    if dist.get_rank() not in ranks:
        raise ValueError(f"internal: this process (rank {dist.get_rank()}) is not among {ranks}")
    key = dist.group.WORLD if parent is None else parent
    table = _SUBGROUPS.get(key)
    if table is None:
        table = _SUBGROUPS[key] = {}
    found = table.get((purpose, tuple(ranks)))
    if found is not None:
        return found
    backend = "gloo" if device_backend == "cpu" else "cuda:nccl,cpu:gloo"
    parent_name = key.group_name
    name = f"iris:{parent_name}:{purpose}:{'_'.join(map(str, ranks))}"
    group = _make_group(ranks, backend, name)
    table[(purpose, tuple(ranks))] = group
    return group


def _make_group(ranks: list[int], backend: str, name: str) -> dist.ProcessGroup:
    """A registered process group of ``ranks`` named ``name``, made by its members only."""
    default = c10d._get_default_group()
    try:
        helper = c10d._new_process_group_helper
        _, store = c10d._world.pg_map[default]
    except (AttributeError, KeyError):  # pragma: no cover - a torch without these internals
        helper = None
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
            device_id=default.bound_device_id,
            group_desc=name,
        )
        c10d._world.pg_group_ranks[group] = {g: i for i, g in enumerate(ranks)}
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        raise IrisError(f"internal: making the process group {name} failed")
    return group


def node_group(group: dist.ProcessGroup | None, backend: str) -> dist.ProcessGroup | None:
    """The group a heap for ``group`` spans: ``group`` itself when its ranks are on one node,
    else the ranks of ``group`` on this process's node (a subgroup made once, by them)."""
    layout = node_layout(group)
    if not layout.multi_node:
        return group
    return subgroup(group, layout.local_ranks, "node", backend)


__all__ = ["NodeLayout", "node_group", "node_key", "node_layout", "subgroup"]
