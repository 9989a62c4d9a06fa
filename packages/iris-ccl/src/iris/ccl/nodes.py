"""The node structure of a group whose ranks sit on several nodes, for the staged forms of
the collectives and fused ops.

A symmetric heap spans one node (see :mod:`iris.mem.nodes`), so a collective over a group
spanning nodes runs in stages: iris.ccl's own collectives over the group's ranks on this
node (the **intra** group), and torch.distributed collectives over the group's ranks that
have the same place on their nodes (the **inter** group of that local index: gloo for CPU
tensors, NCCL for CUDA tensors). :func:`spanning` returns a group's :class:`NodeGroups`,
made at the group's first call (collectively) and kept; :mod:`iris.ccl.entry` hands it to
the op's staged form.

This module is public so that packages built on iris.ccl (iris.ops) write staged forms of
their own ops with it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist

import iris.mem
from iris.mem.nodes import NodeLayout, subgroup

from . import _comm


class NodeGroups:
    """The node structure of one group spanning nodes, with its subgroups.

    Attributes:
        group: the group (None: the world).
        layout: its :class:`iris.mem.NodeLayout`.
        size: the group's size.
        position: group index of each global rank of the group.
        nodes: each node's global ranks, sorted (intra-group order).
        local: this node's ranks; ``per_node`` their number; ``local_index`` this rank's
            place among them.
        uniform: whether every node holds the same number of the group's ranks.
        num_nodes: the number of nodes.
        peers: the inter group's ranks (those with this rank's local index), sorted, and
            ``peer_node`` the node of each.
        intra: the subgroup of this node's ranks (None on a node of one rank).
        inter: the subgroup of ``peers`` (None when this local index exists on one node only).
        cross: a subgroup of every member, for point-to-point messages between nodes.
        order: (uniform layouts) the group index of rank ``R(a, b)`` at ``a * num_nodes + b``,
            ``a`` a local index and ``b`` an inter-group position: the chunk order of the
            regrouped all_gather / reduce_scatter / all_to_all buffers.
        a2a_sources: (uniform layouts) the group index each chunk of the regrouped
            all_to_all's result came from, inter position first, then local index.
    """

    def __init__(self, group, layout: NodeLayout, device: torch.device):
        backend = iris.mem.capabilities(device).backend
        me = dist.get_rank()
        self.group, self.layout = group, layout
        self.size = len(layout.ranks)
        self.position = {rank: i for i, rank in enumerate(layout.ranks)}
        self.nodes = [sorted(node) for node in layout.nodes]
        self.local = self.nodes[layout.node]
        self.per_node = len(self.local)
        self.local_index = self.local.index(me)
        self.uniform = layout.uniform
        self.num_nodes = len(self.nodes)
        self.peers = sorted(node[self.local_index] for node in self.nodes if len(node) > self.local_index)
        self.peer_node = [layout.node_of(rank) for rank in self.peers]
        self.intra = subgroup(group, self.local, "intra", backend) if self.per_node > 1 else None
        inter_name = f"inter{self.local_index}"
        self.inter = subgroup(group, self.peers, inter_name, backend) if len(self.peers) > 1 else None
        self.cross = subgroup(group, layout.ranks, "cross", backend)
        if self.intra is not None:  # its iris.ccl heap now, while every member is here
            _comm.own(self.intra, device)
        if self.uniform:
            inter_of = [sorted(node[a] for node in self.nodes) for a in range(self.per_node)]
            self.order = [
                self.position[inter_of[a][b]] for a in range(self.per_node) for b in range(self.num_nodes)
            ]
            self.a2a_sources = [
                self.position[self.nodes[self.peer_node[b]][a]]
                for b in range(self.num_nodes)
                for a in range(self.per_node)
            ]

    @property
    def me(self) -> int:
        """This rank's index in the group."""
        return self.position[dist.get_rank()]

    def relay(self, root: int) -> tuple[int, int]:
        """``(relay local index, root's node)`` of a rooted collective: the root's local
        index where every node has one, else 0."""
        node = self.layout.node_of(root)
        index = self.nodes[node].index(root)
        relay = index if all(len(n) > index for n in self.nodes) else 0
        return relay, node

    def padded_block(self, m: int) -> int:
        """Elements of one node's block of ``m`` elements per rank, padded to the largest node."""
        return max(len(n) for n in self.nodes) * m


#: The node structure of each group spanning nodes (keyed weakly by the group object).
_BY_GROUP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def spanning(group, device: torch.device | Callable[[], torch.device] | None = None) -> NodeGroups | None:
    """The :class:`NodeGroups` of ``group`` when it spans several nodes (made at the first
    call, collectively), else None. ``device`` (or a function returning it, asked only when
    the structure is made) is where its heaps live; None: the current device."""
    if not dist.is_initialized():
        return None
    layout = iris.mem.node_layout(group)
    if not layout.multi_node:
        return None
    key = dist.group.WORLD if group is None else group
    groups = _BY_GROUP.get(key)
    if groups is None:
        dev = device() if callable(device) else device
        groups = _BY_GROUP[key] = NodeGroups(
            group, layout, dev if dev is not None else iris.mem.default_device()
        )
    return groups
