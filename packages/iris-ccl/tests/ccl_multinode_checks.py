"""Checks of iris.ccl (and iris.ops when asked) over nodes, run by every rank of a job that
test_ccl_multinode.py starts as several torchrun agents on one machine (each agent a node).

Every collective over the world and over a group spanning nodes, on an odd shape and two
dtypes (and e5m2 over the world), against a float64 computation each rank makes from every
rank's known input (float8: rounded once to the format, as the contract says). Exits
non-zero on the first mismatch (the traceback names it) and prints ``CHECKS OK`` at the end.
Usage: ``python ccl_multinode_checks.py RANKS_PER_NODE [--ops] [--full]``.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import iris.ccl
import iris.mem

SHAPE = (5, 7)  # 35 elements: odd, no block multiple
#: The cuda backend (IRIS_BACKEND=cuda): each rank on its GPU (LOCAL_RANK), NCCL between
#: nodes for CUDA tensors; otherwise the CPU with gloo.
CUDA = os.environ.get("IRIS_BACKEND") == "cuda"


def data(rank: int, salt: int, dtype: torch.dtype, numel: int = 35) -> torch.Tensor:
    """Small integers (exact in every dtype and sum) that differ per rank and salt."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    values = torch.randint(-4, 5, (numel,), generator=g, device="cpu").to(torch.float64).to(dtype)
    return values.to(torch.get_default_device())


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """``got`` is ``want`` (float8: exactly ``want`` rounded once to the format, saturating)."""
    if got.dtype in FP8:
        big = torch.finfo(got.dtype).max
        want = want.cpu().to(torch.float32).clamp(-big, big).to(got.dtype)
    got64, want64 = got.cpu().to(torch.float64).reshape(-1), want.cpu().to(torch.float64).reshape(-1)
    if got64.shape != want64.shape:
        ok = False
    elif got.dtype in FP8:
        ok = torch.equal(got64, want64)
    else:
        ok = torch.allclose(got64, want64, rtol=1e-2, atol=1e-2)
    if not ok:
        raise AssertionError(f"rank {dist.get_rank()}: {what}: got {got64.tolist()} want {want64.tolist()}")


def check_heap(per_node: int) -> None:
    world, me = dist.get_world_size(), dist.get_rank()
    layout = iris.mem.node_layout()
    node = me // per_node
    assert layout.num_nodes == world // per_node, layout
    assert layout.local_ranks == tuple(range(node * per_node, (node + 1) * per_node)), layout
    assert layout.node_of(me) == node and layout.local_index == me % per_node, layout
    heap = iris.mem.init(1 << 20)
    assert heap.world_size == per_node and heap.rank == me % per_node, (heap.rank, heap.world_size)
    assert heap.global_ranks == list(layout.local_ranks), heap.global_ranks
    heap.close()


def check_collectives(group, ranks: list[int], dtypes, salt: int) -> None:
    me = dist.get_rank()
    size = len(ranks)
    pos = ranks.index(me)
    n = 35
    for k, dt in enumerate(dtypes):
        s = salt + 10 * k
        ins = {r: data(r, s, dt) for r in ranks}
        inp = ins[me].view(SHAPE)
        total = sum(x.to(torch.float64) for x in ins.values())
        for op in ("sum", "max", "avg"):
            if op == "avg" and not dt.is_floating_point:
                continue
            out = torch.empty(SHAPE, dtype=dt)
            iris.ccl.all_reduce(out, inp, op=op, group=group)
            want = {
                "sum": total,
                "max": torch.stack([x.to(torch.float64) for x in ins.values()]).amax(0),
                "avg": total / size,
            }[op]
            same(out, want, f"all_reduce {op} {dt}")
        # in place
        buf = inp.clone()
        iris.ccl.all_reduce(buf, buf, group=group)
        same(buf, total, f"all_reduce in place {dt}")
        # all_gather
        out = torch.empty(size * n, dtype=dt)
        iris.ccl.all_gather(out, inp, group=group)
        same(out, torch.cat([ins[r] for r in ranks]), f"all_gather {dt}")
        # reduce_scatter: G chunks of 35
        big = {r: data(r, s + 1, dt, size * n) for r in ranks}
        out = torch.empty(n, dtype=dt)
        iris.ccl.reduce_scatter(out, big[me], group=group)
        same(
            out,
            sum(b.to(torch.float64) for b in big.values())[pos * n : (pos + 1) * n],
            f"reduce_scatter {dt}",
        )
        # all_to_all, equal chunks
        out = torch.empty(size * n, dtype=dt)
        iris.ccl.all_to_all(out, big[me], group=group)
        same(out, torch.cat([big[r][pos * n : (pos + 1) * n] for r in ranks]), f"all_to_all {dt}")
        # all_to_all with split sizes (rows of 3 elements): rank i sends (i + j) % 3 rows to j
        rows = {r: [(ranks.index(r) + j) % 3 for j in range(size)] for r in ranks}
        src = {r: data(r, s + 2, dt, sum(rows[r]) * 3).view(-1, 3) for r in ranks}
        out_rows = [rows[r][pos] for r in ranks]
        out = torch.empty(sum(out_rows), 3, dtype=dt)
        iris.ccl.all_to_all(out, src[me], out_rows, rows[me], group=group)
        pieces = []
        for r in ranks:
            start = sum(rows[r][:pos])
            pieces.append(src[r][start : start + rows[r][pos]])
        same(out, torch.cat(pieces), f"all_to_all uneven {dt}")
        # rooted: the last member (not the first rank of its node) as the root
        root = ranks[-1]
        t = inp.clone() if me == root else torch.zeros(SHAPE, dtype=dt)
        iris.ccl.broadcast(t, root, group=group)
        same(t, ins[root], f"broadcast {dt}")
        out = torch.zeros(SHAPE, dtype=dt)
        iris.ccl.reduce(out, inp, root, group=group)
        if me == root:
            same(out, total, f"reduce {dt}")
        out = torch.zeros(size, n, dtype=dt) if me == root else None
        iris.ccl.gather(out, inp, root, group=group)
        if me == root:
            same(out, torch.stack([ins[r] for r in ranks]), f"gather {dt}")
        out = torch.zeros(n, dtype=dt)
        iris.ccl.scatter(out, big[me] if me == ranks[0] else None, ranks[0], group=group)
        same(out, big[ranks[0]][pos * n : (pos + 1) * n], f"scatter {dt}")
        # send / recv around the group's ring (crosses nodes and stays within them)
        nxt, prv = ranks[(pos + 1) % size], ranks[(pos - 1) % size]
        got = torch.zeros(n, dtype=dt)
        if pos % 2 == 0:
            iris.ccl.send(ins[me], nxt, group=group)
            iris.ccl.recv(got, prv, group=group)
        else:
            iris.ccl.recv(got, prv, group=group)
            iris.ccl.send(ins[me], nxt, group=group)
        same(got, ins[prv], f"send/recv {dt}")
        work = iris.ccl.barrier(group=group, async_op=True)
        assert work is not None and work.wait()


def check_errors(group) -> None:
    try:
        iris.ccl.all_reduce(torch.zeros(3), torch.zeros(4), group=group)
    except ValueError as e:
        assert "shape" in str(e), e
    else:
        raise AssertionError("all_reduce with mismatched shapes did not raise")
    try:
        iris.ccl.all_reduce(
            torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), op="avg", group=group
        )
    except (ValueError, TypeError):
        pass
    else:
        raise AssertionError("all_reduce avg of int32 did not raise")


def main() -> None:
    per_node = int(sys.argv[1])
    want_ops = "--ops" in sys.argv
    full = "--full" in sys.argv
    if CUDA:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        torch.set_default_device(f"cuda:{local}")  # every tensor of the checks on this rank's GPU
    dist.init_process_group("cpu:gloo,cuda:nccl" if CUDA else "gloo")
    world = dist.get_world_size()
    check_heap(per_node)
    dtypes = (
        (torch.float32, torch.bfloat16, torch.float8_e5m2)
        if not full
        else (torch.float32, torch.bfloat16, torch.float16, torch.int32, *FP8)
    )
    check_collectives(None, list(range(world)), dtypes, salt=1)
    # a group spanning nodes that leaves ranks out: the first rank and the last two
    sub = sorted({0, world - 2, world - 1})
    group = dist.new_group(sub)
    if dist.get_rank() in sub:
        check_collectives(group, sub, dtypes[:1] if not full else dtypes, salt=2)
        check_errors(group)
    if want_ops:
        import ops_multinode_checks

        ops_multinode_checks.run(None, list(range(world)))
        if dist.get_rank() in sub:
            ops_multinode_checks.run(group, sub)
    dist.barrier()
    from iris.ccl import nodes

    assert len(nodes._BY_GROUP) == (2 if dist.get_rank() in sub else 1), "the calls did not run in stages"
    print(f"CHECKS OK rank {dist.get_rank()}", flush=True)
    iris.ccl._comm.close_all()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
