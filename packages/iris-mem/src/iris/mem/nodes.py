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

The same exchange tells which ranks share a GPU (:attr:`NodeLayout.gpus`): with the cuda
backend each rank names the GPU it uses (:func:`gpu_key`), and this rank's count becomes
:attr:`iris.mem.Capabilities.ranks_on_device`.
"""

from __future__ import annotations

import dataclasses
import socket
import weakref
from collections.abc import Sequence

import torch
import torch.distributed as dist

from . import machine, settings
from .bootstrap import exchange, group_backend, group_ranks, make_group


def node_key() -> str:
    """This process's node: ``host`` and the launcher agent (``IRIS_NODE_ID``, else
    torchrun's ``GROUP_RANK``, else nothing) as ``"host/agent"``."""
    agent = settings.node_id()
    if agent is None:
        agent = settings.text("GROUP_RANK") or ""
    return f"{socket.gethostname()}/{agent}"


def _gpu_index() -> int | None:
    """The index of the GPU this process uses with the cuda backend
    (:func:`iris.mem.machine.rank_gpu`), None where kernels do not run on a GPU (the cpu
    backend, the interpreter)."""
    if settings.default_backend() != "cuda" or settings.interpreted() or not torch.cuda.is_available():
        return None
    return machine.rank_gpu(dist.get_rank() if dist.is_initialized() else None)


def gpu_key() -> str | None:
    """The GPU this process uses with the cuda backend as its UUID (``"GPU-..."``), which
    tells GPUs apart across processes whatever ``CUDA_VISIBLE_DEVICES`` each sees; None where
    kernels do not run on a GPU."""
    index = _gpu_index()
    return None if index is None else f"GPU-{torch.cuda.get_device_properties(index).uuid}"


@dataclasses.dataclass(frozen=True)
class NodeLayout:
    """How the ranks of a group fall onto nodes (see :func:`node_layout`).

    Attributes:
        ranks: the group's global ranks, in group-rank order.
        keys: each node's key (``"host/agent"``), nodes numbered in the order their first
            rank appears in ``ranks``.
        nodes: the global ranks of the group on each node, in group-rank order.
        node: the node of this process.
        gpus: the GPU each rank of ``ranks`` uses, by UUID (:func:`gpu_key`), None for a
            rank whose kernels do not run on a GPU; empty when not known.
    """

    ranks: tuple[int, ...]
    keys: tuple[str, ...]
    nodes: tuple[tuple[int, ...], ...]
    node: int
    gpus: tuple[str | None, ...] = ()

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

    def gpu_of(self, rank: int) -> str | None:
        """The GPU of global rank ``rank`` (a member), as in :attr:`gpus`."""
        return self.gpus[self.ranks.index(rank)] if self.gpus else None

    def ranks_on_gpu(self, rank: int) -> int:
        """How many ranks of the group use the GPU of global rank ``rank``, itself included
        (1 for a rank without a GPU): the ranks that share it, on any node of the host."""
        return machine.ranks_sharing(list(self.gpus), self.ranks.index(rank)) if self.gpus else 1


def _layout_from(
    ranks: Sequence[int], keys: Sequence[str], me: int, gpus: Sequence[str | None] = ()
) -> NodeLayout:
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for rank, key in zip(ranks, keys):
        if key not in members:
            order.append(key)
            members[key] = []
        members[key].append(rank)
    nodes = tuple(tuple(members[k]) for k in order)
    node = next(i for i, n in enumerate(nodes) if me in n)
    return NodeLayout(tuple(ranks), tuple(order), nodes, node, tuple(gpus))


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
            gpus = [world.gpu_of(r) for r in ranks]
        elif len(ranks) == 1:
            keys, gpus = [node_key()], [gpu_key()]
        else:
            pairs = exchange(group, "iris.mem node layout", (node_key(), gpu_key()))
            keys, gpus = [p[0] for p in pairs], [p[1] for p in pairs]
        layout = _LAYOUTS[key] = _layout_from(ranks, keys, dist.get_rank(), gpus)
        index = _gpu_index() if layout.gpu_of(dist.get_rank()) is not None else None
        if index is not None:  # this rank's count is what capabilities() reports
            machine.note_ranks_on_device(index, layout.ranks_on_gpu(dist.get_rank()))
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
        tensors, gloo for CPU tensors, unless the parent moves CUDA tensors with gloo: see
        :func:`iris.mem.bootstrap.group_backend`).
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
    backend = group_backend(device_backend, parent)
    parent_name = key.group_name
    name = f"iris:{parent_name}:{purpose}:{'_'.join(map(str, ranks))}"
    group = make_group(ranks, backend, name)
    table[(purpose, tuple(ranks))] = group
    return group


def node_group(group: dist.ProcessGroup | None, backend: str) -> dist.ProcessGroup | None:
    """The group a heap for ``group`` spans: ``group`` itself when its ranks are on one node,
    else the ranks of ``group`` on this process's node (a subgroup made once, by them)."""
    layout = node_layout(group)
    if not layout.multi_node:
        return group
    return subgroup(group, layout.local_ranks, "node", backend)


__all__ = ["NodeLayout", "node_group", "node_key", "node_layout", "subgroup"]
