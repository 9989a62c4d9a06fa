"""``iris.ops.moe_dispatch`` / ``moe_combine`` beside the usual PyTorch path, in one run.

    torchrun --nproc-per-node 2 benchmarks/ops/bench_moe.py --out benchmarks/ops/results-moe.json
    torchrun --nproc-per-node 2 benchmarks/ops/bench_moe.py --tokens 128 --reps 50
    IRIS_BACKEND=cpu torchrun --nproc-per-node 2 benchmarks/ops/bench_moe.py --smoke   # no GPU

DeepSeek-V3-like routing by default: hidden 7168, 256 experts split evenly over the ranks,
top-8 experts per token chosen at random (distinct), bf16 tokens, 4096 and 128 tokens per
rank. Contenders, per token count:

* ``iris``: ``moe_dispatch`` alone, and the layer ``moe_dispatch`` + ``moe_combine`` (the
  experts are the identity, so only the movement is timed); combine = layer - dispatch;
* ``torch``: the usual path on the process group's backend (NCCL on GPUs, gloo on the CPU):
  count the rows per destination rank, exchange the counts (``all_to_all_single``, read on
  the host: a synchronisation), sort the (token, slot) rows by destination, one
  ``all_to_all_single`` with split sizes for the rows and one for their expert ids, sort the
  received rows by local expert; combine: sort back, ``all_to_all_single`` with the reversed
  splits, undo the sort and sum with the weights in fp32;
* ``symm_mem``: torch symmetric memory's ``all_to_all_vdev`` (NVSHMEM) for the rows of the
  dispatch, where this torch and machine have it (reported as unavailable otherwise).

``--dtype float8_e4m3fn`` (or ``float8_e5m2``): the tokens are quantized first, one fp32 scale
per token and block of 128 channels (``amax / fp8 max``), and travel with their scales:
``moe_dispatch(x, idx, experts, x_scales=scales)``; the identity expert dequantizes the
received rows to bf16 for ``moe_combine`` (so the layer, and combine = layer - dispatch,
include that elementwise step on both sides); the PyTorch path moves each row's fp8 bytes and
its scales as one byte row. The same run also times the bf16 dispatch of the same tokens
(``iris_bf16_dispatch_us``), for the fp8 / bf16 ratio at one number of tokens, and the
dispatch that quantizes the bf16 tokens itself (``moe_dispatch(x, idx, experts,
quantize=fp8)``: ``iris_quantize_dispatch_us``; its layer is checked like the others).

On GPUs the copy engine moving dispatch's link bytes to the next rank (``peer_tensor(...).copy_``
on a symmetric heap, one contiguous block) is timed beside it: ``copy_engine_GBps``, the
rate dispatch is held against.

Every contender's combined output is checked against ``sum_k w[t, k] * x[t]`` before it is
timed. Times: median over ``--reps`` eager calls of device time (CUDA events; wall clock on
the CPU), the ranks started together by a barrier before each call, maximum over ranks.
Printed: times, ``torch / iris`` ratios, and dispatch's bytes over the link (rows each rank
sends to other ranks, once per destination rank, times the row's bytes) over its time in
GB/s. ``--out`` writes the results as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_timing import DTYPES, command_line, refuse_shared_gpu  # noqa: E402 - benchmarks/bench_timing.py

import iris.mem  # noqa: E402

#: Channels per fp8 scale (DeepSeek-V3's block size).
SCALE_BLOCK = 128


def _device() -> torch.device:
    if torch.cuda.is_available() and os.environ.get("IRIS_BACKEND", "cuda") != "cpu":
        return iris.mem.default_device()  # LOCAL_RANK modulo the GPUs present
    return torch.device("cpu")


def routing(tokens: int, experts: int, k: int, hidden: int, dtype, device, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype).to(device)
    idx = torch.rand(tokens, experts, generator=g).topk(k, dim=1).indices.to(device)
    w = torch.softmax(torch.rand(tokens, k, generator=g), -1).to(device)
    return x, idx, w


def torch_dispatch(x, idx, experts: int, group=None):
    """The usual path; returns (rows by local expert, what combine needs)."""
    size = dist.get_world_size(group)
    local = experts // size
    tokens, k = idx.shape
    flat = idx.flatten()
    order = torch.argsort(flat // local * experts + flat, stable=True)  # by destination, then expert
    send = torch.bincount(flat // local, minlength=size)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_l, recv_l = send.tolist(), recv.tolist()  # the host synchronisation
    rows = x[order // k]
    got = rows.new_empty(sum(recv_l), x.shape[1])
    dist.all_to_all_single(got, rows, recv_l, send_l, group=group)
    ids = flat[order]
    got_ids = ids.new_empty(sum(recv_l))
    dist.all_to_all_single(got_ids, ids, recv_l, send_l, group=group)
    by_expert = torch.argsort(got_ids, stable=True)
    return got[by_expert], (order, by_expert, send_l, recv_l, tokens, k)


def torch_combine(expert_out, state, w, group=None):
    order, by_expert, send_l, recv_l, tokens, k = state
    back = torch.empty_like(expert_out)
    back[by_expert] = expert_out
    rows = back.new_empty(sum(send_l), back.shape[1])
    dist.all_to_all_single(rows, back, send_l, recv_l, group=group)
    slots = torch.empty_like(rows)
    slots[order] = rows
    return (slots.view(tokens, k, -1).float() * w[:, :, None]).sum(1).to(expert_out.dtype)


def symm_mem_dispatch(device):
    """A function timing all_to_all_vdev of the dispatch's rows, or the reason it is unavailable."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if device.type != "cuda" or not hasattr(torch.ops.symm_mem, "all_to_all_vdev"):
            return None, "torch.ops.symm_mem.all_to_all_vdev is not available here"
        symm_mem.set_backend("NVSHMEM")
        group_name = dist.group.WORLD.group_name
        symm_mem.enable_symm_mem_for_group(group_name)

        def make(x, idx, experts):
            size = dist.get_world_size()
            flat = idx.flatten()
            order = torch.argsort(flat // (experts // size), stable=True)
            rows = x[order // idx.shape[1]]
            cap = rows.shape[0] * size
            inp = symm_mem.empty(rows.shape[0], x.shape[1], dtype=x.dtype, device=device)
            out = symm_mem.empty(cap, x.shape[1], dtype=x.dtype, device=device)
            splits = symm_mem.empty(3, size, dtype=torch.int64, device=device)
            splits[0].copy_(torch.bincount(flat // (experts // size), minlength=size))
            inp.copy_(rows)

            def run():
                torch.ops.symm_mem.all_to_all_vdev(inp, out, splits, group_name)

            return run

        return make, ""
    except Exception as e:  # noqa: BLE001 - reported as unavailable
        return None, f"unavailable: {type(e).__name__}: {e}"


def timed(fn, reps: int, device) -> float:
    """Median of ``reps`` calls in microseconds (device time on GPUs), maximum over ranks."""
    fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [T, H] as fp8 with one fp32 scale per token and block of 128 channels:
    ``(x8, scales)`` with ``x ~ x8 * scales`` blockwise, each block's largest at the format's max."""
    t, h = x.shape
    blocks = x.float().view(t, h // SCALE_BLOCK, SCALE_BLOCK)
    scales = blocks.abs().amax(-1).clamp(min=1e-12) / torch.finfo(dtype).max
    return (blocks / scales[..., None]).to(dtype).view(t, h), scales


def dequantize(x8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp8 rows and their block scales back to bf16 (what an expert reads)."""
    n, h = x8.shape
    blocks = x8.float().view(n, h // SCALE_BLOCK, SCALE_BLOCK) * scales[:, :, None]
    return blocks.view(n, h).to(torch.bfloat16)


def copy_engine_us(nbytes: int, reps: int, device) -> float | None:
    """Time of the copy engine moving ``nbytes`` to the next rank's symmetric heap (GPUs, at
    least two ranks): the rate dispatch is held against. None elsewhere."""
    import iris.mem

    rank, size = dist.get_rank(), dist.get_world_size()
    if device.type != "cuda" or size < 2 or nbytes == 0:
        return None
    with iris.mem.init(2 * nbytes + (64 << 20)) as heap:
        src, dst = heap.empty(nbytes, dtype=torch.uint8), heap.empty(nbytes, dtype=torch.uint8)
        src.fill_(rank)
        there = heap.peer_tensor(dst, (rank + 1) % size)
        us = timed(lambda: there.copy_(src), reps, device)
        heap.barrier()
    return us


def link_bytes(idx, experts: int, size: int, rank: int, row_bytes: int) -> int:
    """Bytes this rank's dispatch sends to other ranks: each token once per destination rank."""
    dest = idx // (experts // size)
    hit = torch.zeros(idx.shape[0], size, dtype=torch.bool, device=idx.device)
    hit.scatter_(1, dest, True)
    hit[:, rank] = False
    return int(hit.sum()) * row_bytes


def bench(tokens: int, args, device) -> dict:
    import iris.ops

    rank, size = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]
    fp8 = dtype.itemsize == 1
    # fp8: the tokens drawn in bf16, then quantized (the bf16 ones are dispatch's comparison)
    x, idx, w = routing(
        tokens, args.experts, args.topk, args.hidden, torch.bfloat16 if fp8 else dtype, device, 17 + rank
    )
    cfg = iris.ops.MoEConfig(max_recv_rows=args.max_recv_rows) if args.max_recv_rows else None
    row = {"tokens": tokens, "hidden": args.hidden, "experts": args.experts, "topk": args.topk, "world": size}
    if fp8:
        x16, (x, scales) = x, quantize(x, dtype)
        width = args.hidden // SCALE_BLOCK
        # the PyTorch path moves each token's fp8 bytes and its scales' bytes as one row
        packed = torch.cat([x.view(torch.uint8), scales.view(torch.uint8)], dim=1)
        want = (dequantize(x, scales).float()[:, None, :] * w[:, :, None]).sum(1)

        def iris_dispatch():
            return iris.ops.moe_dispatch(x, idx, args.experts, x_scales=scales, config=cfg)

        def iris_layer():
            d = iris_dispatch()
            return iris.ops.moe_combine(dequantize(d.tokens, d.scales), d, w)

        def iris_quantize_layer():
            d = iris.ops.moe_dispatch(x16, idx, args.experts, quantize=dtype, config=cfg)
            return iris.ops.moe_combine(dequantize(d.tokens, d.scales), d, w)

        def torch_rows():
            return torch_dispatch(packed, idx, args.experts)

        def torch_layer():
            got, state = torch_rows()
            rows = dequantize(got[:, : args.hidden].view(dtype), got[:, args.hidden :].view(torch.float32))
            return torch_combine(rows, state, w)

        row_bytes = args.hidden + 4 * width
    else:
        want = (x.float()[:, None, :] * w[:, :, None]).sum(1)

        def iris_dispatch():
            return iris.ops.moe_dispatch(x, idx, args.experts, config=cfg)

        def iris_layer():
            d = iris_dispatch()
            return iris.ops.moe_combine(d.tokens, d, w)

        def torch_rows():
            return torch_dispatch(x, idx, args.experts)

        def torch_layer():
            got, state = torch_rows()
            return torch_combine(got, state, w)

        row_bytes = args.hidden * x.element_size()
    tol = 0.02 * max(want.abs().max().item(), 1.0)

    problems = []
    layers = [("iris", iris_layer), ("torch", torch_layer)] + (
        [("iris quantize=", iris_quantize_layer)] if fp8 else []
    )
    for name, fn in layers:
        err = (fn().float() - want).abs().max().item()
        if not err <= tol:
            problems.append(f"{name}: combined output off by {err:.3g}")
    iris.ops.check_errors()
    row["problems"] = problems
    if problems:
        return row
    row["iris_dispatch_us"] = timed(iris_dispatch, args.reps, device)
    row["iris_layer_us"] = timed(iris_layer, args.reps, device)
    row["torch_dispatch_us"] = timed(torch_rows, args.reps, device)
    if fp8:  # the same tokens dispatched in bf16, and quantized by the dispatch, in this run
        row["iris_bf16_dispatch_us"] = timed(
            lambda: iris.ops.moe_dispatch(x16, idx, args.experts), args.reps, device
        )
        row["iris_quantize_dispatch_us"] = timed(
            lambda: iris.ops.moe_dispatch(x16, idx, args.experts, quantize=dtype, config=cfg),
            args.reps,
            device,
        )
    row["torch_layer_us"] = timed(torch_layer, args.reps, device)
    row["iris_combine_us"] = max(row["iris_layer_us"] - row["iris_dispatch_us"], 0.0)
    row["torch_combine_us"] = max(row["torch_layer_us"] - row["torch_dispatch_us"], 0.0)
    make, why = (
        symm_mem_dispatch(device) if not (args.smoke or fp8) else (None, "not tried in --smoke or fp8")
    )
    if make is not None:
        try:
            row["symm_mem_dispatch_us"] = timed(make(x, idx, args.experts), args.reps, device)
        except Exception as e:  # noqa: BLE001 - reported
            row["symm_mem"] = f"failed: {type(e).__name__}: {e}"[:300]
    else:
        row["symm_mem"] = why
    sent = torch.tensor([link_bytes(idx, args.experts, size, rank, row_bytes)], device=device)
    dist.all_reduce(sent, op=dist.ReduceOp.MAX)
    row["dispatch_link_bytes"] = int(sent.item())
    row["dispatch_link_GBps"] = row["dispatch_link_bytes"] / max(row["iris_dispatch_us"], 1e-3) / 1e3
    ce = copy_engine_us(row["dispatch_link_bytes"], args.reps, device)
    if ce is not None:
        row["copy_engine_us"] = ce
        row["copy_engine_GBps"] = row["dispatch_link_bytes"] / max(ce, 1e-3) / 1e3
    for part in ("dispatch", "combine", "layer"):
        row[f"torch_over_iris_{part}"] = row[f"torch_{part}_us"] / max(row[f"iris_{part}_us"], 1e-3)
    iris.ops.check_errors()
    return row


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="4096,128", help="comma-separated tokens per rank")
    parser.add_argument(
        "--hidden", type=int, default=7168, help="channels per token (fp8: a multiple of 128)"
    )
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--max-recv-rows", type=int, default=0, help="MoEConfig.max_recv_rows (0: default)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="", help="write the results to this JSON file")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU backend (no GPU)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.hidden, args.experts, args.topk, args.reps = "6,3", 40, 8, 2, 2
        if DTYPES[args.dtype].itemsize == 1:
            args.hidden = 2 * SCALE_BLOCK  # fp8 scales are per 128 channels
    return args


def main() -> int:
    args = parse_args()
    device = _device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    refuse_shared_gpu()  # before anything is timed: ranks sharing a GPU measure nothing
    import iris.ops

    rank = dist.get_rank()
    rows = [bench(int(t), args, device) for t in args.tokens.split(",")]
    failed = any(r["problems"] for r in rows)
    if rank == 0:
        print(
            f"MoE dispatch/combine, {dist.get_world_size()} ranks, {args.dtype}, "
            "device time in us (max over ranks)"
        )
        for r in rows:
            if r["problems"]:
                print(f"T={r['tokens']}: FAILED {r['problems']}")
                continue
            print(
                f"T={r['tokens']:>5}  dispatch iris {r['iris_dispatch_us']:9.1f}"
                f" torch {r['torch_dispatch_us']:9.1f}"
                f" (x{r['torch_over_iris_dispatch']:.2f})  combine iris {r['iris_combine_us']:9.1f}"
                f" torch {r['torch_combine_us']:9.1f} (x{r['torch_over_iris_combine']:.2f})"
                f"  dispatch link {r['dispatch_link_GBps']:.1f} GB/s"
                + (f" (copy engine {r['copy_engine_GBps']:.1f})" if "copy_engine_GBps" in r else "")
                + (
                    f"  bf16 dispatch {r['iris_bf16_dispatch_us']:.1f}"
                    f"  quantizing dispatch {r['iris_quantize_dispatch_us']:.1f}"
                    if "iris_bf16_dispatch_us" in r
                    else ""
                )
                + (f"  symm_mem {r['symm_mem_dispatch_us']:.1f}" if "symm_mem_dispatch_us" in r else "")
            )
            if "symm_mem" in r:
                print(f"         symm_mem: {r['symm_mem']}")
        if args.out:
            meta = {
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                if device.type == "cuda"
                else ["cpu"],
                "world_size": dist.get_world_size(),
                "dtype": args.dtype,
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
                "iris_ops": iris.ops.__version__,
                "command": command_line(),
            }
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "args": vars(args), "results": rows}, f, indent=1)
    iris.ops.release_workspaces()  # collective; synchronises the ranks itself
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
