"""Collectives over a group spanning several nodes: Iris within each node, torch.distributed
between nodes.

A symmetric heap spans one node (see :mod:`iris.mem.nodes`), so a collective over a group
whose ranks sit on several nodes runs in stages. The stages within a node are iris.ccl's
own collectives over the group's ranks on that node (the **intra** group); the stages
between nodes are torch.distributed collectives over the group's ranks with the same place
on their nodes (the **inter** group of that local index: gloo for CPU tensors, NCCL for
CUDA tensors). Each group's subgroups are made once, at its first collective, and kept.

Where every node holds the same number ``s`` of the group's ranks (a *uniform* layout):

* ``all_reduce``: intra reduce-scatter into ``s`` shards, inter all-reduce of each shard
  (every rank of a node drives its own shard over the network), intra all-gather; large
  messages in pieces of :data:`PIECE_ELEMENTS` (bounding the temporary buffers; the stages
  of successive pieces run one after another, not yet overlapped);
* ``all_gather``: inter all-gather of the own piece, then intra all-gather of the ``N``
  pieces each rank now holds;
* ``reduce_scatter``: intra reduce-scatter of the chunks regrouped by local index, then
  inter reduce-scatter;
* ``all_to_all``: intra all-to-all of the chunks regrouped by destination local index, then
  inter all-to-all.

Every other collective, and every collective over a non-uniform layout, relays through one
rank per node (the root's local index where every node has it, else the first rank):
intra step to the relay, inter step among the relays, intra step from the relay.
``send``/``recv`` go through Iris within a node and torch.distributed between nodes.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

import iris.mem
from iris.mem.nodes import NodeLayout, subgroup

from . import _host
from .reduce_op import ReduceOp
from .work import Work

_TORCH_OP = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.MIN: dist.ReduceOp.MIN,
}
#: Elements per pipelined piece of a uniform all_reduce.
PIECE_ELEMENTS = 1 << 22

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Hier:
    """The node structure of one group spanning nodes, with its subgroups."""

    def __init__(self, group, layout: NodeLayout, device: torch.device):
        backend = iris.mem.capabilities(device).backend
        me = dist.get_rank()
        self.group, self.layout = group, layout
        self.size = len(layout.ranks)
        self.position = {g: i for i, g in enumerate(layout.ranks)}  # global rank -> group index
        self.nodes = [sorted(n) for n in layout.nodes]  # each node's ranks, in intra-group order
        self.local = self.nodes[layout.node]
        self.s = len(self.local)
        self.li = self.local.index(me)
        self.uniform = layout.uniform
        self.num_nodes = len(self.nodes)
        # inter group of this local index: the ranks with index li on their node, sorted
        self.peers = sorted(n[self.li] for n in self.nodes if len(n) > self.li)
        self.peer_node = [layout.node_of(g) for g in self.peers]
        self.intra = subgroup(group, self.local, "intra", backend) if self.s > 1 else None
        self.inter = subgroup(group, self.peers, f"inter{self.li}", backend) if len(self.peers) > 1 else None
        # every member: point to point between nodes
        self.cross = subgroup(group, layout.ranks, "cross", backend)
        if self.intra is not None:  # its iris.ccl heap now, while every member is here
            from . import _comm

            _comm.own(self.intra, device)
        if self.uniform:
            # chunk order of the regrouped all_gather / reduce_scatter / all_to_all buffers:
            # local index a, then inter-group position b (the rank R(a, b))
            inter_of = [sorted(n[a] for n in self.nodes) for a in range(self.s)]
            self.order = [self.position[inter_of[a][b]] for a in range(self.s) for b in range(self.num_nodes)]
            # sources of the all_to_all result: inter position b, then local index a
            self.a2a_sources = [
                self.position[self.nodes[self.peer_node[b]][a]]
                for b in range(self.num_nodes)
                for a in range(self.s)
            ]

    # ----------------------------------------------------------------- helpers
    def _intra_relay(self, root: int) -> tuple[int, int]:
        """``(relay local index, root's node)``: the root's local index where every node
        has one, else 0."""
        node = self.layout.node_of(root)
        index = self.nodes[node].index(root)
        relay = index if all(len(n) > index for n in self.nodes) else 0
        return relay, node

    def _padded_blocks(self, m: int) -> int:
        return max(len(n) for n in self.nodes) * m

    # ----------------------------------------------------------------- collectives
    def all_reduce(self, out, inp, op: ReduceOp, config) -> None:
        op = _op(op, inp.dtype)
        from .all_gather import all_gather
        from .all_reduce import all_reduce
        from .broadcast import broadcast
        from .reduce_scatter import reduce_scatter

        n = inp.numel()
        rop = ReduceOp.SUM if op is ReduceOp.AVG else op
        x = inp.reshape(-1)
        if self.uniform:
            result = torch.empty(n, dtype=inp.dtype, device=inp.device)
            for start in range(0, n, PIECE_ELEMENTS):
                piece = min(PIECE_ELEMENTS, n - start)
                if self.intra is None:
                    part = x[start : start + piece].clone()
                    if self.inter is not None:
                        dist.all_reduce(part, op=_TORCH_OP[rop], group=self.inter)
                    result[start : start + piece] = part
                    continue
                shard = -(-piece // self.s)
                buf = torch.zeros(self.s * shard, dtype=inp.dtype, device=inp.device)
                buf[:piece] = x[start : start + piece]
                part = torch.empty(shard, dtype=inp.dtype, device=inp.device)
                reduce_scatter(part, buf, op=rop, group=self.intra, config=config)
                if self.inter is not None:
                    dist.all_reduce(part, op=_TORCH_OP[rop], group=self.inter)
                all_gather(buf, part, group=self.intra, config=config)
                result[start : start + piece] = buf[:piece]
        else:
            result = x.clone()
            if self.intra is not None:
                all_reduce(result, x, op=rop, group=self.intra, config=config)
            if self.li == 0 and self.inter is not None:
                dist.all_reduce(result, op=_TORCH_OP[rop], group=self.inter)
            if self.intra is not None:
                broadcast(result, self.local[0], group=self.intra, config=config)
        if op is ReduceOp.AVG:
            result = result / self.size
        out.copy_(result.view(out.shape))

    def all_gather(self, out, inp, config) -> None:
        from .all_gather import all_gather

        m, dt, dev = inp.numel(), inp.dtype, inp.device
        x = inp.reshape(-1).contiguous()
        if self.uniform:
            g1 = torch.empty(self.num_nodes * m, dtype=dt, device=dev)
            _all_gather_single(g1, x, group=self.inter) if self.inter is not None else g1.copy_(x)
            if self.intra is not None:
                g2 = torch.empty(self.size * m, dtype=dt, device=dev)
                all_gather(g2, g1, group=self.intra, config=config)
            else:
                g2 = g1
            result = torch.empty(self.size, m, dtype=dt, device=dev)
            result[self.order] = g2.view(self.size, m)
        else:
            result = self._gather_everything(x, config)
        out.copy_(result.view(out.shape))

    def _gather_everything(self, x, config) -> torch.Tensor:
        """Every member's ``x`` (``m`` elements) on every member, ``[G, m]`` in group order,
        through the first rank of each node."""
        from .broadcast import broadcast
        from .gather import gather

        m, dt, dev = x.numel(), x.dtype, x.device
        block = self._padded_blocks(m)
        mine = torch.zeros(block, dtype=dt, device=dev)
        if self.intra is not None:
            gather(mine[: self.s * m], x, self.local[0], group=self.intra, config=config)
        else:
            mine[:m] = x
        result = torch.empty(self.size, m, dtype=dt, device=dev)
        if self.li == 0:
            blocks = torch.empty(len(self.peers) * block, dtype=dt, device=dev)
            _all_gather_single(blocks, mine, group=self.inter) if self.inter is not None else blocks.copy_(
                mine
            )
            blocks = blocks.view(len(self.peers), block)
            for b, node in enumerate(self.peer_node):
                for a, g in enumerate(self.nodes[node]):
                    result[self.position[g]] = blocks[b, a * m : (a + 1) * m]
        if self.intra is not None:
            broadcast(result, self.local[0], group=self.intra, config=config)
        return result

    def reduce_scatter(self, out, inp, op: ReduceOp, config) -> None:
        op = _op(op, inp.dtype)
        from .reduce_scatter import reduce_scatter

        m = out.numel()
        rop = ReduceOp.SUM if op is ReduceOp.AVG else op
        if self.uniform:
            y = inp.reshape(self.size, m)[self.order].reshape(-1)
            if self.intra is not None:
                z = torch.empty(self.num_nodes * m, dtype=inp.dtype, device=inp.device)
                reduce_scatter(z, y, op=rop, group=self.intra, config=config)
            else:
                z = y
            result = torch.empty(m, dtype=inp.dtype, device=inp.device)
            if self.inter is not None:
                _reduce_scatter_single(result, z, op=_TORCH_OP[rop], group=self.inter)
            else:
                result.copy_(z)
        else:
            whole = torch.empty(inp.numel(), dtype=inp.dtype, device=inp.device)
            self.all_reduce(whole, inp, rop, config)
            result = whole.view(self.size, m)[self.position[dist.get_rank()]]
        if op is ReduceOp.AVG:
            result = result / self.size
        out.copy_(result.view(out.shape))

    def all_to_all(self, out, inp, config) -> None:
        from .all_to_all import all_to_all

        m = inp.numel() // self.size
        dt, dev = inp.dtype, inp.device
        if self.uniform:
            y = inp.reshape(self.size, m)[self.order].reshape(-1)  # [a][b]: to R(a, b)
            if self.intra is not None:
                z = torch.empty_like(y)
                all_to_all(z, y, group=self.intra, config=config)  # z[a'][b]: from local a' to R(li, b)
            else:
                z = y
            w = z.view(self.s, self.num_nodes, m).transpose(0, 1).contiguous().view(-1)
            v = torch.empty_like(w)
            if self.inter is not None:
                dist.all_to_all_single(v, w, group=self.inter)  # v[b][a']: from node b's local a'
            else:
                v.copy_(w)
            result = torch.empty(self.size, m, dtype=dt, device=dev)
            result[self.a2a_sources] = v.view(self.size, m)
        else:
            everything = self._gather_everything(inp.reshape(-1).contiguous(), config)
            me = self.position[dist.get_rank()]
            result = everything.view(self.size, self.size, m)[:, me]
        out.copy_(result.reshape(out.shape))

    def all_to_all_uneven(self, out, inp, output_split_sizes, input_split_sizes, config) -> None:
        """Rows of dim 0 with split sizes: padded to the largest split of any rank, then the
        equal exchange."""
        row = 1
        for d in inp.shape[1:]:
            row *= d
        size = self.size
        ins = list(input_split_sizes) if input_split_sizes is not None else [inp.shape[0] // size] * size
        outs = list(output_split_sizes) if output_split_sizes is not None else [out.shape[0] // size] * size
        largest = torch.tensor([max(ins + outs + [0])], dtype=torch.int64, device=inp.device)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.cross)
        rows = int(largest.item())
        send = torch.zeros(size, rows * row, dtype=inp.dtype, device=inp.device)
        flat_in = inp.reshape(inp.shape[0], row)
        start = 0
        for j, k in enumerate(ins):
            send[j, : k * row] = flat_in[start : start + k].reshape(-1)
            start += k
        recv = torch.empty_like(send)
        self.all_to_all(recv, send, config)
        flat_out = (
            out.view(out.shape[0], row)
            if out.is_contiguous()
            else torch.empty(out.shape[0], row, dtype=out.dtype, device=out.device)
        )
        start = 0
        for j, k in enumerate(outs):
            flat_out[start : start + k] = recv[j, : k * row].view(k, row)
            start += k
        if flat_out.data_ptr() != out.data_ptr() or not out.is_contiguous():
            out.copy_(flat_out.view(out.shape))

    def broadcast(self, tensor, src: int, config) -> None:
        from .broadcast import broadcast

        relay, node = self._intra_relay(src)
        work = tensor.reshape(-1).contiguous().clone() if not tensor.is_contiguous() else tensor.view(-1)
        on_root_node = self.layout.node == node
        early = on_root_node and self.intra is not None and self.nodes[node][relay] != src
        if early:  # the relay of the root's node is not the root: hand it over first
            broadcast(work, src, group=self.intra, config=config)
        if self.li == relay and self.inter is not None:
            dist.broadcast(work, src=self.nodes[node][relay], group=self.inter)
        if self.intra is not None and not early:
            broadcast(work, self.local[relay], group=self.intra, config=config)
        if work.data_ptr() != tensor.data_ptr():
            tensor.copy_(work.view(tensor.shape))

    def reduce(self, out, inp, dst: int, op: ReduceOp, config) -> None:
        op = _op(op, inp.dtype)
        from .broadcast import broadcast
        from .reduce import reduce

        rop = ReduceOp.SUM if op is ReduceOp.AVG else op
        relay, node = self._intra_relay(dst)
        work = inp.reshape(-1).clone()
        if self.intra is not None:
            reduce(work, inp, self.local[relay], op=rop, group=self.intra, config=config)
        if self.li == relay and self.inter is not None:
            dist.reduce(work, dst=self.nodes[node][relay], op=_TORCH_OP[rop], group=self.inter)
        if self.layout.node == node and self.intra is not None and self.nodes[node][relay] != dst:
            broadcast(work, self.local[relay], group=self.intra, config=config)
        if dist.get_rank() == dst:
            out.copy_((work / self.size if op is ReduceOp.AVG else work).view(out.shape))

    def gather(self, out, inp, dst: int, config) -> None:
        from .broadcast import broadcast
        from .gather import gather

        m, dt, dev = inp.numel(), inp.dtype, inp.device
        relay, node = self._intra_relay(dst)
        block = self._padded_blocks(m)
        mine = torch.zeros(block, dtype=dt, device=dev)
        if self.intra is not None:
            gather(mine[: self.s * m], inp, self.local[relay], group=self.intra, config=config)
        else:
            mine[:m] = inp.reshape(-1)
        relay_rank = self.nodes[node][relay]
        result = torch.empty(self.size, m, dtype=dt, device=dev)
        if self.li == relay:
            root = dist.get_rank() == relay_rank
            blocks = [torch.empty(block, dtype=dt, device=dev) for _ in self.peers] if root else None
            if self.inter is not None:
                dist.gather(mine, blocks, dst=relay_rank, group=self.inter)
            elif root:
                blocks[0].copy_(mine)
            if root:
                for b, nd in enumerate(self.peer_node):
                    for a, g in enumerate(self.nodes[nd]):
                        result[self.position[g]] = blocks[b][a * m : (a + 1) * m]
        if self.layout.node == node and self.intra is not None and relay_rank != dst:
            broadcast(result, relay_rank, group=self.intra, config=config)
        if dist.get_rank() == dst:
            out.copy_(result.view(out.shape))

    def scatter(self, out, inp, src: int, config) -> None:
        from .broadcast import broadcast
        from .scatter import scatter

        m, dt, dev = out.numel(), out.dtype, out.device
        relay, node = self._intra_relay(src)
        relay_rank = self.nodes[node][relay]
        on_root_node = self.layout.node == node
        full = None
        if on_root_node:
            full = (
                inp.reshape(self.size, m).contiguous()
                if dist.get_rank() == src
                else torch.empty(self.size, m, dtype=dt, device=dev)
            )
            if self.intra is not None and relay_rank != src:
                broadcast(full, src, group=self.intra, config=config)
        block = self._padded_blocks(m)
        mine = torch.zeros(block, dtype=dt, device=dev)
        if self.li == relay:
            root = dist.get_rank() == relay_rank
            blocks = None
            if root:
                blocks = []
                for nd in self.peer_node:
                    b = torch.zeros(block, dtype=dt, device=dev)
                    for a, g in enumerate(self.nodes[nd]):
                        b[a * m : (a + 1) * m] = full[self.position[g]]
                    blocks.append(b)
            if self.inter is not None:
                dist.scatter(mine, blocks, src=relay_rank, group=self.inter)
            elif root:
                mine.copy_(blocks[0])
        if self.intra is not None:
            scatter(out, mine[: self.s * m], self.local[relay], group=self.intra, config=config)
        else:
            out.copy_(mine[:m].view(out.shape))

    def send(self, tensor, dst: int, config) -> None:
        from .p2p import send

        if dst in self.local:
            send(tensor, dst, group=self.intra, config=config)
        else:
            dist.send(tensor.contiguous(), dst=dst, group=self.cross)

    def recv(self, tensor, src: int, config) -> None:
        from .p2p import recv

        if src in self.local:
            recv(tensor, src, group=self.intra, config=config)
        else:
            buf = (
                tensor
                if tensor.is_contiguous()
                else torch.empty_like(tensor, memory_format=torch.contiguous_format)
            )
            dist.recv(buf, src=src, group=self.cross)
            if buf is not tensor:
                tensor.copy_(buf)

    def barrier(self, config) -> None:
        from .barrier import barrier

        if self.intra is not None:
            barrier(group=self.intra, config=config)
        if self.li == 0 and self.inter is not None:
            dist.barrier(group=self.inter)
        if self.intra is not None:
            barrier(group=self.intra, config=config)


#: The node structure of each group spanning nodes (keyed weakly by the group object).
_BY_GROUP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def spanning(group, device: torch.device | None = None) -> Hier | None:
    """The node structure of ``group`` when it spans several nodes (made at the first call,
    collectively), else None: the collective runs on one node as usual. Decided by
    :func:`iris.mem.node_layout`."""
    if not dist.is_initialized():
        return None
    layout = iris.mem.node_layout(group)
    if not layout.multi_node:
        return None
    key = dist.group.WORLD if group is None else group
    hier = _BY_GROUP.get(key)
    if hier is None:
        dev = device if device is not None else iris.mem.default_device()
        hier = _BY_GROUP[key] = Hier(group, layout, dev)
    return hier


def entry(group, device: torch.device, name: str, *args, async_op: bool) -> tuple[bool, Work | None]:
    """The public collectives' way in: ``(True, handle)`` after running ``name`` in stages
    when ``group`` spans nodes, ``(False, None)`` when it does not (the caller goes on)."""
    hier = spanning(group, device)
    if hier is None:
        return False, None
    getattr(hier, name)(*args)
    return True, Work(device) if async_op else None


def _op(op, dtype: torch.dtype) -> ReduceOp:
    rop = ReduceOp.parse(op)
    _host.check_op(rop, dtype)
    return rop
