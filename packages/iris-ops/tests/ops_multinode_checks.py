"""Checks of iris.ops over nodes, run by every rank of a job that test_ops_multinode.py starts
as several torchrun agents on one machine (each agent a node).

Every fused op over the world and over a group spanning nodes that leaves ranks out, on odd
shapes and two dtypes (and float8 operands with scales, a float8 all_reduce_rmsnorm output),
against a float64 computation each rank makes from every rank's known operands. Exits
non-zero on the first mismatch and prints ``CHECKS OK`` at the end.
Usage: ``python ops_multinode_checks.py RANKS_PER_NODE``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import iris.mem
import iris.ops

M, K, N = 6, 3, 7  # odd and not block multiples (M even: reduce_scatter rows split in two)


def data(rank: int, salt: int, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-3, 4, shape, generator=g).to(torch.float64).to(dtype)


def same(got, want, what) -> None:
    got64, want64 = got.to(torch.float64), want.to(torch.float64)
    if got64.shape != want64.shape or not torch.allclose(got64, want64, rtol=2e-2, atol=2e-2):
        raise AssertionError(f"rank {dist.get_rank()}: {what}: got {got64.tolist()} want {want64.tolist()}")


def run(group, ranks: list[int], dtypes) -> None:
    me = dist.get_rank()
    size, pos = len(ranks), ranks.index(me)
    for k, dt in enumerate(dtypes):
        a = {r: data(r, 1 + k, (M, K), dt) for r in ranks}
        b = {r: data(r, 11 + k, (K, N), dt) for r in ranks}
        bias = data(0, 21 + k, (N,), dt)  # the same on every rank
        total = sum(a[r].double() @ b[r].double() for r in ranks)
        out = torch.empty(M, N, dtype=dt)
        iris.ops.matmul_all_reduce(out, a[me], b[me], bias, group=group)
        same(out, total + bias.double(), f"matmul_all_reduce {dt}")
        for dim in (0, 1):
            piece = (M // size if M % size == 0 else None, N) if dim == 0 else (M, None)
            if dim == 0 and M % size:
                continue
            if dim == 1 and N % size:
                continue
            out = torch.empty(M // size, N, dtype=dt) if dim == 0 else torch.empty(M, N // size, dtype=dt)
            iris.ops.matmul_reduce_scatter(out, a[me], b[me], None, scatter_dim=dim, group=group)
            same(out, total.chunk(size, dim=dim)[pos], f"matmul_reduce_scatter dim {dim} {dt}")
            del piece
        out = torch.empty(size * M, N, dtype=dt)
        iris.ops.matmul_all_gather(out, a[me], b[me], bias, group=group)
        same(
            out,
            torch.cat([a[r].double() @ b[r].double() + bias.double() for r in ranks]),
            f"matmul_all_gather {dt}",
        )
        out = torch.empty(size * M, N, dtype=dt)
        iris.ops.all_gather_matmul(out, a[me], b[me], bias, group=group)
        same(
            out,
            torch.cat([a[r].double() for r in ranks]) @ b[me].double() + bias.double(),
            f"all_gather_matmul {dt}",
        )
        inp = {r: data(r, 31 + k, (3, 5), dt) for r in ranks}
        weight = data(0, 41 + k, (5,), dt)
        residual = data(0, 51 + k, (3, 5), dt)
        out, rout = torch.empty(3, 5, dtype=dt), torch.empty(3, 5, dtype=dt)
        iris.ops.all_reduce_rmsnorm(
            out, inp[me], weight, 1e-6, residual=residual, residual_out=rout, group=group
        )
        s = sum(inp[r].double() for r in ranks) + residual.double()
        same(rout, s, f"all_reduce_rmsnorm residual_out {dt}")
        same(
            out,
            s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double(),
            f"all_reduce_rmsnorm {dt}",
        )


def run_fp8(group, ranks: list[int]) -> None:
    """Every fused op with float8 operands and scales (bf16 out), and all_reduce_rmsnorm with a
    float8 out and per-row scales, against the float64 dequantized computation."""
    me, e4m3 = dist.get_rank(), torch.float8_e4m3fn
    size, pos = len(ranks), ranks.index(me)
    a = {r: data(r, 61, (M, K), e4m3) for r in ranks}
    b = {r: data(r, 71, (K, N), e4m3) for r in ranks}
    sa = {r: torch.linspace(0.5, 1.5, M).view(M, 1) * (r + 1) for r in ranks}  # per row, per rank
    sb = {r: torch.full((1,), 0.25 * (r + 1)) for r in ranks}
    deq = {r: (a[r].double() * sa[r].double(), b[r].double() * sb[r].double()) for r in ranks}
    kw = {"scale_a": sa[me], "scale_b": sb[me], "group": group}
    total = sum(x @ y for x, y in deq.values())
    out = torch.empty(M, N, dtype=torch.bfloat16)
    iris.ops.matmul_all_reduce(out, a[me], b[me], **kw)
    same(out, total, "matmul_all_reduce float8")
    if M % size == 0:
        out = torch.empty(M // size, N, dtype=torch.bfloat16)
        iris.ops.matmul_reduce_scatter(out, a[me], b[me], **kw)
        same(out, total.chunk(size)[pos], "matmul_reduce_scatter float8")
    out = torch.empty(size * M, N, dtype=torch.bfloat16)
    iris.ops.matmul_all_gather(out, a[me], b[me], **kw)
    same(out, torch.cat([x @ y for x, y in deq.values()]), "matmul_all_gather float8")
    out = torch.empty(size * M, N, dtype=torch.bfloat16)
    iris.ops.all_gather_matmul(out, a[me], b[me], **kw)
    same(out, torch.cat([deq[r][0] for r in ranks]) @ deq[me][1], "all_gather_matmul float8")
    inp = {r: data(r, 81, (3, 5), torch.float32) for r in ranks}
    weight = data(0, 91, (5,), torch.float32)
    q, scales = torch.empty(3, 5, dtype=e4m3), torch.empty(3)
    iris.ops.all_reduce_rmsnorm(q, inp[me], weight, 1e-6, scales_out=scales, group=group)
    s = sum(inp[r].double() for r in ranks)
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    same(scales, y.abs().amax(-1).clamp_min(2.0**-40) / 448, "all_reduce_rmsnorm float8 scales")
    got = q.double() * scales.double()[:, None]
    if not torch.allclose(got, y, rtol=2.0**-3, atol=1e-3):  # e4m3: 3 mantissa bits
        raise AssertionError(f"rank {me}: all_reduce_rmsnorm float8: got {got.tolist()} want {y.tolist()}")


def _hier_comm_close() -> None:
    from iris.ccl import _comm

    _comm.close_all()


def main() -> None:
    per_node = int(sys.argv[1])
    full = "--full" in sys.argv
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    assert iris.mem.node_layout().num_nodes == world // per_node
    dtypes = (torch.float32, torch.bfloat16) if not full else (torch.float32, torch.bfloat16, torch.float16)
    run(None, list(range(world)), dtypes)
    run_fp8(None, list(range(world)))
    sub = sorted({0, world - 2, world - 1})
    group = dist.new_group(sub)
    if dist.get_rank() in sub:
        run(group, sub, dtypes[:1] if not full else dtypes)
        run_fp8(group, sub)
    from iris.ccl import nodes

    assert len(nodes._BY_GROUP) == (2 if dist.get_rank() in sub else 1), "the ops did not run in stages"
    dist.barrier()
    print(f"CHECKS OK rank {dist.get_rank()}", flush=True)
    iris.ops.release_workspaces()
    _hier_comm_close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
