"""The staged forms of the collectives, over a group spanning several nodes: Iris within
each node, torch.distributed between nodes (registered with :mod:`iris.ccl.entry`).

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

float8 tensors cross nodes as their bytes (gloo moves no float8), and are reduced in fp32:
every stage of a reduction runs on an fp32 copy of the input and the result is rounded to
float8 once, at the end, as on one node.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from . import _host, entry
from .all_gather import all_gather
from .all_reduce import all_reduce
from .all_to_all import all_to_all
from .barrier import barrier
from .broadcast import broadcast
from .gather import gather
from .nodes import NodeGroups
from .p2p import recv, send
from .reduce import reduce
from .reduce_op import _FP8, ReduceOp, from_accumulator
from .reduce_scatter import reduce_scatter
from .scatter import scatter

_TORCH_OP = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}
#: Elements per pipelined piece of a uniform all_reduce.
PIECE_ELEMENTS = 1 << 22

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _write_reduced(out: torch.Tensor, result: torch.Tensor, op: ReduceOp, size: int) -> None:
    """``result`` (summed for AVG) into ``out``, divided by the group's ``size`` for AVG."""
    out.copy_((result / size if op is ReduceOp.AVG else result).view(out.shape))


def _float8_as_bytes(*names: str):
    """A staged form that runs on the bytes (uint8 views) of float8 tensors ``names``:
    gloo moves no float8 (the steps within a node move the bytes as they move float8)."""

    def wrap(form):
        @functools.wraps(form)
        def run(groups: NodeGroups, args: dict) -> None:
            given = {n: args[n] for n in names if isinstance(args.get(n), torch.Tensor)}
            form(groups, {**args, **{n: t.view(torch.uint8) for n, t in given.items() if t.dtype in _FP8}})

        return run

    return wrap


def _float8_in_fp32(form):
    """A staged reduction that reduces float8 tensors in fp32 and rounds once at the end, as
    the kernels do on one node (torch.distributed reduces no float8, and rounding the result
    of each stage would round more than once)."""

    @functools.wraps(form)
    def run(groups: NodeGroups, args: dict) -> None:
        inp, out = args["inp"], args["out"]
        if inp.dtype not in _FP8:
            return form(groups, args)
        # reduce writes out on its destination only
        writes = out is not None and args.get("dst", dist.get_rank()) == dist.get_rank()
        wide = torch.empty(out.shape, dtype=torch.float32, device=out.device) if writes else None
        form(groups, {**args, "inp": inp.float(), "out": wide})
        if writes:
            out.copy_(from_accumulator(wide, out.dtype))

    return run


def _op(op, dtype: torch.dtype) -> ReduceOp:
    """The reduction ``op`` parsed and checked for ``dtype``."""
    parsed = ReduceOp.parse(op)
    _host.check_op(parsed, dtype)
    return parsed


@entry.staged_form("all_reduce")
@_float8_in_fp32
def _all_reduce(groups: NodeGroups, args: dict) -> None:
    _all_reduce_tensors(groups, args["out"], args["inp"], args["op"], args["config"])


def _all_reduce_tensors(groups: NodeGroups, out, inp, op, config) -> None:
    op = _op(op, inp.dtype)

    n = inp.numel()
    stage_op = ReduceOp.SUM if op is ReduceOp.AVG else op  # AVG: summed in stages, divided once at the end
    x = inp.reshape(-1)
    if groups.uniform:
        result = torch.empty(n, dtype=inp.dtype, device=inp.device)
        for start in range(0, n, PIECE_ELEMENTS):
            piece = min(PIECE_ELEMENTS, n - start)
            if groups.intra is None:
                part = x[start : start + piece].clone()
                if groups.inter is not None:
                    dist.all_reduce(part, op=_TORCH_OP[stage_op], group=groups.inter)
                result[start : start + piece] = part
                continue
            shard = -(-piece // groups.per_node)
            buf = torch.zeros(groups.per_node * shard, dtype=inp.dtype, device=inp.device)
            buf[:piece] = x[start : start + piece]
            part = torch.empty(shard, dtype=inp.dtype, device=inp.device)
            reduce_scatter(part, buf, op=stage_op, group=groups.intra, config=config)
            if groups.inter is not None:
                dist.all_reduce(part, op=_TORCH_OP[stage_op], group=groups.inter)
            all_gather(buf, part, group=groups.intra, config=config)
            result[start : start + piece] = buf[:piece]
    else:
        result = x.clone()
        if groups.intra is not None:
            all_reduce(result, x, op=stage_op, group=groups.intra, config=config)
        if groups.local_index == 0 and groups.inter is not None:
            dist.all_reduce(result, op=_TORCH_OP[stage_op], group=groups.inter)
        if groups.intra is not None:
            broadcast(result, groups.local[0], group=groups.intra, config=config)
    _write_reduced(out, result, op, groups.size)


@entry.staged_form("all_gather")
@_float8_as_bytes("out", "inp")
def _all_gather(groups: NodeGroups, args: dict) -> None:
    out, inp, config = args["out"], args["inp"], args["config"]
    m, dtype, device = inp.numel(), inp.dtype, inp.device
    x = inp.reshape(-1).contiguous()
    if groups.uniform:
        g1 = torch.empty(groups.num_nodes * m, dtype=dtype, device=device)
        _all_gather_single(g1, x, group=groups.inter) if groups.inter is not None else g1.copy_(x)
        if groups.intra is not None:
            g2 = torch.empty(groups.size * m, dtype=dtype, device=device)
            all_gather(g2, g1, group=groups.intra, config=config)
        else:
            g2 = g1
        result = torch.empty(groups.size, m, dtype=dtype, device=device)
        result[groups.order] = g2.view(groups.size, m)
    else:
        result = _gather_everything(groups, x, config)
    out.copy_(result.view(out.shape))


def _gather_everything(groups: NodeGroups, x, config) -> torch.Tensor:
    """Every member's ``x`` (``m`` elements) on every member, ``[G, m]`` in group order,
    through the first rank of each node."""

    m, dtype, device = x.numel(), x.dtype, x.device
    block = groups.padded_block(m)
    mine = torch.zeros(block, dtype=dtype, device=device)
    if groups.intra is not None:
        gather(mine[: groups.per_node * m], x, groups.local[0], group=groups.intra, config=config)
    else:
        mine[:m] = x
    result = torch.empty(groups.size, m, dtype=dtype, device=device)
    if groups.local_index == 0:
        blocks = torch.empty(len(groups.peers) * block, dtype=dtype, device=device)
        _all_gather_single(blocks, mine, group=groups.inter) if groups.inter is not None else blocks.copy_(
            mine
        )
        blocks = blocks.view(len(groups.peers), block)
        for b, node in enumerate(groups.peer_node):
            for a, g in enumerate(groups.nodes[node]):
                result[groups.position[g]] = blocks[b, a * m : (a + 1) * m]
    if groups.intra is not None:
        broadcast(result, groups.local[0], group=groups.intra, config=config)
    return result


@entry.staged_form("reduce_scatter")
@_float8_in_fp32
def _reduce_scatter(groups: NodeGroups, args: dict) -> None:
    out, inp, op, config = args["out"], args["inp"], args["op"], args["config"]
    op = _op(op, inp.dtype)

    m = out.numel()
    stage_op = ReduceOp.SUM if op is ReduceOp.AVG else op  # AVG: summed in stages, divided once at the end
    if groups.uniform:
        y = inp.reshape(groups.size, m)[groups.order].reshape(-1)
        if groups.intra is not None:
            z = torch.empty(groups.num_nodes * m, dtype=inp.dtype, device=inp.device)
            reduce_scatter(z, y, op=stage_op, group=groups.intra, config=config)
        else:
            z = y
        result = torch.empty(m, dtype=inp.dtype, device=inp.device)
        if groups.inter is not None:
            _reduce_scatter_single(result, z, op=_TORCH_OP[stage_op], group=groups.inter)
        else:
            result.copy_(z)
    else:
        whole = torch.empty(inp.numel(), dtype=inp.dtype, device=inp.device)
        _all_reduce_tensors(groups, whole, inp, stage_op, config)
        result = whole.view(groups.size, m)[groups.position[dist.get_rank()]]
    _write_reduced(out, result, op, groups.size)


@entry.staged_form("all_to_all")
@_float8_as_bytes("out", "inp")
def _all_to_all(groups: NodeGroups, args: dict) -> None:
    out, inp, config = args["out"], args["inp"], args["config"]
    if args["output_split_sizes"] is not None or args["input_split_sizes"] is not None:
        _all_to_all_uneven(groups, out, inp, args["output_split_sizes"], args["input_split_sizes"], config)
    else:
        _all_to_all_tensors(groups, out, inp, config)


def _all_to_all_tensors(groups: NodeGroups, out, inp, config) -> None:

    m = inp.numel() // groups.size
    dtype, device = inp.dtype, inp.device
    if groups.uniform:
        y = inp.reshape(groups.size, m)[groups.order].reshape(-1)  # [a][b]: to R(a, b)
        if groups.intra is not None:
            z = torch.empty_like(y)
            all_to_all(z, y, group=groups.intra, config=config)  # z[a'][b]: from local a' to R(li, b)
        else:
            z = y
        w = z.view(groups.per_node, groups.num_nodes, m).transpose(0, 1).contiguous().view(-1)
        v = torch.empty_like(w)
        if groups.inter is not None:
            dist.all_to_all_single(v, w, group=groups.inter)  # v[b][a']: from node b's local a'
        else:
            v.copy_(w)
        result = torch.empty(groups.size, m, dtype=dtype, device=device)
        result[groups.a2a_sources] = v.view(groups.size, m)
    else:
        everything = _gather_everything(groups, inp.reshape(-1).contiguous(), config)
        me = groups.position[dist.get_rank()]
        result = everything.view(groups.size, groups.size, m)[:, me]
    out.copy_(result.reshape(out.shape))


def _all_to_all_uneven(groups: NodeGroups, out, inp, output_split_sizes, input_split_sizes, config) -> None:
    """Rows of dim 0 with split sizes: padded to the largest split of any rank, then the
    equal exchange."""
    row = 1
    for d in inp.shape[1:]:
        row *= d
    size = groups.size
    ins = list(input_split_sizes) if input_split_sizes is not None else [inp.shape[0] // size] * size
    outs = list(output_split_sizes) if output_split_sizes is not None else [out.shape[0] // size] * size
    largest = torch.tensor([max(ins + outs + [0])], dtype=torch.int64, device=inp.device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=groups.cross)
    rows = int(largest.item())
    outgoing = torch.zeros(size, rows * row, dtype=inp.dtype, device=inp.device)
    flat_in = inp.reshape(inp.shape[0], row)
    start = 0
    for j, k in enumerate(ins):
        outgoing[j, : k * row] = flat_in[start : start + k].reshape(-1)
        start += k
    incoming = torch.empty_like(outgoing)
    _all_to_all_tensors(groups, incoming, outgoing, config)
    flat_out = (
        out.view(out.shape[0], row)
        if out.is_contiguous()
        else torch.empty(out.shape[0], row, dtype=out.dtype, device=out.device)
    )
    start = 0
    for j, k in enumerate(outs):
        flat_out[start : start + k] = incoming[j, : k * row].view(k, row)
        start += k
    if flat_out.data_ptr() != out.data_ptr() or not out.is_contiguous():
        out.copy_(flat_out.view(out.shape))


@entry.staged_form("broadcast")
@_float8_as_bytes("tensor")
def _broadcast(groups: NodeGroups, args: dict) -> None:
    tensor, src, config = args["tensor"], args["src"], args["config"]
    relay, node = groups.relay(src)
    work = tensor.reshape(-1).contiguous().clone() if not tensor.is_contiguous() else tensor.view(-1)
    on_root_node = groups.layout.node == node
    early = on_root_node and groups.intra is not None and groups.nodes[node][relay] != src
    if early:  # the relay of the root's node is not the root: hand it over first
        broadcast(work, src, group=groups.intra, config=config)
    if groups.local_index == relay and groups.inter is not None:
        dist.broadcast(work, src=groups.nodes[node][relay], group=groups.inter)
    if groups.intra is not None and not early:
        broadcast(work, groups.local[relay], group=groups.intra, config=config)
    if work.data_ptr() != tensor.data_ptr():
        tensor.copy_(work.view(tensor.shape))


@entry.staged_form("reduce")
@_float8_in_fp32
def _reduce(groups: NodeGroups, args: dict) -> None:
    out, inp, dst, op, config = args["out"], args["inp"], args["dst"], args["op"], args["config"]
    op = _op(op, inp.dtype)

    stage_op = ReduceOp.SUM if op is ReduceOp.AVG else op  # AVG: summed in stages, divided once at the end
    relay, node = groups.relay(dst)
    work = inp.reshape(-1).clone()
    if groups.intra is not None:
        reduce(work, inp, groups.local[relay], op=stage_op, group=groups.intra, config=config)
    if groups.local_index == relay and groups.inter is not None:
        dist.reduce(work, dst=groups.nodes[node][relay], op=_TORCH_OP[stage_op], group=groups.inter)
    if groups.layout.node == node and groups.intra is not None and groups.nodes[node][relay] != dst:
        broadcast(work, groups.local[relay], group=groups.intra, config=config)
    if dist.get_rank() == dst:
        out.copy_((work / groups.size if op is ReduceOp.AVG else work).view(out.shape))


def _chunked_root(groups: NodeGroups, chunk: torch.Tensor, root: int) -> tuple:
    """What gather and scatter over nodes start from: the elements per member, dtype and
    device of this rank's ``chunk``, and the relay of ``root`` (its local index, its global
    rank and the root's node)."""
    relay, node = groups.relay(root)
    return chunk.numel(), chunk.dtype, chunk.device, relay, groups.nodes[node][relay], node


@entry.staged_form("gather")
@_float8_as_bytes("out", "inp")
def _gather(groups: NodeGroups, args: dict) -> None:
    out, inp, dst, config = args["out"], args["inp"], args["dst"], args["config"]
    m, dtype, device, relay, relay_rank, node = _chunked_root(groups, inp, dst)
    block = groups.padded_block(m)
    mine = torch.zeros(block, dtype=dtype, device=device)
    if groups.intra is not None:
        gather(mine[: groups.per_node * m], inp, groups.local[relay], group=groups.intra, config=config)
    else:
        mine[:m] = inp.reshape(-1)
    result = torch.empty(groups.size, m, dtype=dtype, device=device)
    if groups.local_index == relay:
        root = dist.get_rank() == relay_rank
        blocks = [torch.empty(block, dtype=dtype, device=device) for _ in groups.peers] if root else None
        if groups.inter is not None:
            dist.gather(mine, blocks, dst=relay_rank, group=groups.inter)
        elif root:
            blocks[0].copy_(mine)
        if root:
            for b, nd in enumerate(groups.peer_node):
                for a, g in enumerate(groups.nodes[nd]):
                    result[groups.position[g]] = blocks[b][a * m : (a + 1) * m]
    if groups.layout.node == node and groups.intra is not None and relay_rank != dst:
        broadcast(result, relay_rank, group=groups.intra, config=config)
    if dist.get_rank() == dst:
        out.copy_(result.view(out.shape))


@entry.staged_form("scatter")
@_float8_as_bytes("out", "inp")
def _scatter(groups: NodeGroups, args: dict) -> None:
    out, inp, src, config = args["out"], args["inp"], args["src"], args["config"]
    m, dtype, device, relay, relay_rank, node = _chunked_root(groups, out, src)
    full = None
    if groups.layout.node == node:  # the root's node: every rank there holds the whole input
        full = (
            inp.reshape(groups.size, m).contiguous()
            if dist.get_rank() == src
            else torch.empty(groups.size, m, dtype=dtype, device=device)
        )
        if groups.intra is not None and relay_rank != src:
            broadcast(full, src, group=groups.intra, config=config)
    block = groups.padded_block(m)
    mine = torch.zeros(block, dtype=dtype, device=device)
    if groups.local_index == relay:
        root = dist.get_rank() == relay_rank
        blocks = None
        if root:
            blocks = []
            for nd in groups.peer_node:
                b = torch.zeros(block, dtype=dtype, device=device)
                for a, g in enumerate(groups.nodes[nd]):
                    b[a * m : (a + 1) * m] = full[groups.position[g]]
                blocks.append(b)
        if groups.inter is not None:
            dist.scatter(mine, blocks, src=relay_rank, group=groups.inter)
        elif root:
            mine.copy_(blocks[0])
    if groups.intra is not None:
        scatter(out, mine[: groups.per_node * m], groups.local[relay], group=groups.intra, config=config)
    else:
        out.copy_(mine[:m].view(out.shape))


def _point_to_point(groups: NodeGroups, args: dict, sending: bool) -> None:
    """send (``sending``) or recv: through Iris to a rank of this node, through
    torch.distributed to a rank of another node."""
    tensor, config = args["tensor"], args["config"]
    peer = args["dst"] if sending else args["src"]
    if peer in groups.local:
        (send if sending else recv)(tensor, peer, group=groups.intra, config=config)
    elif sending:
        dist.send(tensor.contiguous(), dst=peer, group=groups.cross)
    else:
        contiguous = tensor.is_contiguous()
        buf = tensor if contiguous else torch.empty_like(tensor, memory_format=torch.contiguous_format)
        dist.recv(buf, src=peer, group=groups.cross)
        if not contiguous:
            tensor.copy_(buf)


entry.staged_form("send")(_float8_as_bytes("tensor")(functools.partial(_point_to_point, sending=True)))
entry.staged_form("recv")(_float8_as_bytes("tensor")(functools.partial(_point_to_point, sending=False)))


@entry.staged_form("barrier")
def _barrier(groups: NodeGroups, args: dict) -> None:
    config = args["config"]
    if groups.intra is not None:
        barrier(group=groups.intra, config=config)
    if groups.local_index == 0 and groups.inter is not None:
        dist.barrier(group=groups.inter)
    if groups.intra is not None:
        barrier(group=groups.intra, config=config)
