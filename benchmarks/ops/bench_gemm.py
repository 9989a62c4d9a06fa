"""The GEMM core of iris.ops on one GPU, beside a plain persistent TMA GEMM and torch.matmul.

    torchrun --nproc-per-node 1 benchmarks/ops/bench_gemm.py --out benchmarks/ops/results

Separates what the fused ops pay for their GEMM from what they pay for communication: each
fused kernel runs on a group of one rank (no peer: its GEMM, its start-of-call
synchronisation and bookkeeping), beside

* ``plain``: a persistent Triton GEMM with nothing else in it (TMA loads, TMA stores,
  grouped tile order), with the tile shapes the config table uses (128 x 256 x 64 with
  8 warps and 3 or 4 stages, 128 x 128 x 64 with 8 warps and 4 stages; at decode shapes,
  M <= 128: 16 x 64 x 256, 16 x 128 x 256 and 64 x 128 x 128 with 4 warps), and ``... ptr``:
  the same storing its tiles through pointers, as the fused kernels do (a configuration
  that does not fit the GPU, such as a TMA-store epilogue at 4 stages, is reported and
  left out);
* ``plain ws``: the same with Triton's automatic warp specialisation on the K loop
  (``tl.range(..., warp_specialize=True)``), at the only tile shape Triton 3.6 splits for
  sm_90 (64 x 128, 4 warps);
* ``torch.matmul`` (cuBLAS).

bf16, every result checked against torch.matmul first; device times from CUDA-graph
replays in interleaved rounds (``benchmarks/bench_timing.py``). Writes ``gemm.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from iris.ops._gemm import grouped_tile  # the tile order of iris.ops (GROUP_M rows at a time)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_timing import interleaved_us, refuse_shared_gpu, use_rank_gpu  # noqa: E402 - benchmarks/bench_timing.py

#: (block_m, block_n, block_k, num_warps, num_stages, warp_specialize) of the plain GEMM,
#: for prefill shapes and for decode shapes (M <= 128).
PLAIN = [
    (128, 256, 64, 8, 3, False),
    (128, 256, 64, 8, 4, False),
    (128, 128, 64, 8, 4, False),
    (64, 128, 64, 4, 4, True),
]
PLAIN_DECODE = [(16, 64, 256, 4, 4, False), (16, 128, 256, 4, 3, False), (64, 128, 128, 4, 4, False)]
SHAPES = [(1024, 8192, 4096), (8192, 8192, 4096)]


@triton.jit
def plain_gemm_kernel(
    a_desc, b_desc, c_desc, c, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr, WS: tl.constexpr, PTR_STORE: tl.constexpr = False,
):  # fmt: skip
    """``C = A @ B`` (bf16, fp32 accumulation), ``PROGRAMS`` persistent programs walking the
    tiles in grouped order; A, B and C through tensor descriptors (``PTR_STORE``: C through
    pointers, masked, as the fused kernels store their tiles)."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS):
        pid_m, pid_n = grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(k_tiles, warp_specialize=WS):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        if PTR_STORE:
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (rows < M)[:, None] & (cols < N)[None, :]
            tl.store(c + rows.to(tl.int64)[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=mask)
        else:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


def plain(a, b, c, bm: int, bn: int, bk: int, warps: int, stages: int, ws: bool, ptr_store: bool = False):
    """A call of the plain GEMM writing ``c`` (contiguous)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    (m, k), n = a.shape, b.shape[1]
    descs = (
        TensorDescriptor.from_tensor(a, [bm, bk]),
        TensorDescriptor.from_tensor(b, [bk, bn]),
        TensorDescriptor.from_tensor(c, [bm, bn]),
    )
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    programs = min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn))
    return lambda: plain_gemm_kernel[(programs,)](
        *descs, c, m, n, k, bm, bn, bk, 8, programs, ws, ptr_store, num_warps=warps, num_stages=stages
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/ops/results")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--shapes", default="", help="comma-separated MxNxK, e.g. 1024x8192x4096")
    args = parser.parse_args()
    use_rank_gpu()
    dist.init_process_group("nccl")
    refuse_shared_gpu()  # before anything is timed: ranks sharing a GPU measure nothing
    if dist.get_world_size() != 1:
        raise SystemExit("bench_gemm.py runs on one GPU: torchrun --nproc-per-node 1")
    import iris.mem
    import iris.ops

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    heap = iris.mem.init(max(m * n for m, n, _ in shapes) * 2 * 3 + (256 << 20))
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a @ b
        outs, fns = {}, {"torch.matmul": lambda a=a, b=b: torch.matmul(a, b)}
        for bm, bn, bk, warps, stages, ws in PLAIN_DECODE if m <= 128 else PLAIN:
            name = f"plain{' ws' if ws else ''} {bm}x{bn}x{bk} w{warps} s{stages}"
            outs[name] = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            fns[name] = plain(a, b, outs[name], bm, bn, bk, warps, stages, ws)
            if not ws:  # the same with the tiles stored through pointers
                outs[name + " ptr"] = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                fns[name + " ptr"] = plain(a, b, outs[name + " ptr"], bm, bn, bk, warps, stages, ws, True)
        for op in ("matmul_all_reduce", "matmul_reduce_scatter", "matmul_all_gather"):
            name = f"iris.ops.{op} (group of one)"
            outs[name] = heap.empty((m, n), dtype=torch.bfloat16)
            fused = getattr(iris.ops, op)
            fns[name] = lambda f=fused, out=outs[name], a=a, b=b: f(out, a, b)
        for name, fn in list(fns.items()):
            if name in outs:
                try:
                    fn()
                except triton.runtime.errors.OutOfResources as e:  # e.g. a TMA-store epilogue at 4 stages
                    print(f"{name} at {m}x{n}x{k}: {e}: not timed", flush=True)
                    del fns[name]
                    continue
                torch.cuda.synchronize()
                err = (outs[name].float() - ref.float()).abs().max().item()
                if err > 1e-2 * ref.abs().max().item():
                    print(f"{name} at {m}x{n}x{k}: max error {err}: not timed", flush=True)
                    del fns[name]
        times = interleaved_us(fns, args.reps)
        for name, us in sorted(times.items(), key=lambda kv: kv[1]):
            row = {"M": m, "N": n, "K": k, "name": name, "us": us, "tflops": 2 * m * n * k / us / 1e6}
            row["over_torch"] = us / times["torch.matmul"]
            rows.append(row)
            speed = f"{row['tflops']:.0f} TFLOP/s, {row['over_torch']:.2f}x torch.matmul's time"
            print(f"{m}x{n}x{k} {name}: {us:.1f} us, {speed}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    with open(os.path.join(args.out, "gemm.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    heap.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
