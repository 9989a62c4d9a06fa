"""What storing GEMM tiles to a peer GPU costs a persistent GEMM, and whether async stores help.

    torchrun --nproc-per-node 2 benchmarks/ops/bench_remote_tiles.py --out benchmarks/ops/results

A persistent Triton GEMM (128 x 256 x 64 tiles, 8 warps, 3 stages, TMA loads; bf16,
N = 8192, K = 4096, M = 1024 and 8192) writes its output tiles

* ``local``: into this GPU's memory, with a TMA store (``tma``) or pointer stores (``ptr``);
* ``peer``: into the peer GPU's memory through the symmetric heap's peer mapping, with
  pointer stores, or with TMA stores through a descriptor over the peer mapping (bulk
  asynchronous copies: in a ``for`` loop over tiles Triton waits for a tile's store only
  before the next tile's, so the SM computes while the copy drains; ``while``: a ``while``
  loop over tiles, as the iris.ops kernels have, where Triton waits right after the store);
* ``half peer``: only the tiles of the last M/2 rows go (to the peer), as much as
  matmul_reduce_scatter sends on two ranks.

Both ranks run the same kernel at the same time, so both directions of the link are busy,
as in a fused op. Every output is checked (the peer's tiles against the peer's product);
device times from CUDA-graph replays in interleaved rounds (``benchmarks/bench_timing.py``).
Writes ``remote_tiles.json``.
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
from bench_timing import any_rank, interleaved_us, refuse_shared_gpu, use_rank_gpu  # noqa: E402 - benchmarks/bench_timing.py

BLOCK_M, BLOCK_N, BLOCK_K = 128, 256, 64
SHAPES = [(1024, 8192, 4096), (8192, 8192, 4096)]


@triton.jit
def _tile(
    a_desc, b_desc, c_desc, c_ptr, M, N, K, HALF, tile, num_m, num_n, k_tiles,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, PTR_STORE: tl.constexpr,
):  # fmt: skip
    """One output tile (grouped order); stored only if its rows start at or past ``HALF``."""
    pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for ki in range(k_tiles):
        a = a_desc.load([pid_m * BM, ki * BK])
        b = b_desc.load([ki * BK, pid_n * BN])
        acc = tl.dot(a, b, acc)
    if pid_m * BM >= HALF:
        if PTR_STORE:
            origin = tl.cast(pid_m * BM, tl.int64) * N + pid_n * BN
            offs = tl.arange(0, BM)[:, None] * N + tl.arange(0, BN)[None, :]
            tl.store(c_ptr + origin + offs, acc.to(tl.bfloat16))
        else:
            c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


@triton.jit
def remote_tiles_kernel(
    a_desc, b_desc, c_desc, c_ptr, M, N, K, HALF,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, PTR_STORE: tl.constexpr, WHILE_LOOP: tl.constexpr,
):  # fmt: skip
    """``C = A @ B`` by ``NUM_SMS`` persistent programs; C through ``c_desc`` (TMA stores) or
    ``c_ptr`` (pointer stores, ``PTR_STORE``); the tile loop a ``while`` loop with
    ``WHILE_LOOP``, else a ``for`` loop."""
    start = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_m * num_n
    if WHILE_LOOP:
        tile = start
        while tile < num_tiles:
            _tile(
                a_desc, b_desc, c_desc, c_ptr, M, N, K, HALF, tile, num_m, num_n, k_tiles,
                BM, BN, BK, GROUP_M, PTR_STORE,
            )  # fmt: skip
            tile += NUM_SMS
    else:
        for tile in range(start, num_tiles, NUM_SMS):
            _tile(
                a_desc, b_desc, c_desc, c_ptr, M, N, K, HALF, tile, num_m, num_n, k_tiles,
                BM, BN, BK, GROUP_M, PTR_STORE,
            )  # fmt: skip


#: (name, destination "local"/"peer", pointer stores, while loop, only the last half of the rows)
VARIANTS = [
    ("local tma", "local", False, False, False),
    ("local ptr", "local", True, False, False),
    ("local tma while", "local", False, True, False),
    ("peer ptr", "peer", True, False, False),
    ("peer tma", "peer", False, False, False),
    ("peer tma while", "peer", False, True, False),
    ("half peer ptr", "peer", True, False, True),
    ("half peer tma", "peer", False, False, True),
    ("half peer tma while", "peer", False, True, True),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/ops/results")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    use_rank_gpu()
    dist.init_process_group("nccl")
    refuse_shared_gpu()  # before anything is timed: ranks sharing a GPU measure nothing
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("bench_remote_tiles.py runs on two GPUs: torchrun --nproc-per-node 2")
    from triton.tools.tensor_descriptor import TensorDescriptor

    import iris.mem

    heap = iris.mem.init(max(m * n for m, n, _ in SHAPES) * 2 + (256 << 20))
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    results, failures = {}, []
    for m, n, k in SHAPES:
        torch.manual_seed(rank)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a @ b
        refs = [torch.empty_like(ref) for _ in range(world)]
        dist.all_gather(refs, ref)
        local = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        mine = heap.empty((m, n), dtype=torch.bfloat16)
        peer = heap.peer_tensor(mine, 1 - rank)
        a_desc = TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K])
        b_desc = TensorDescriptor.from_tensor(b, [BLOCK_K, BLOCK_N])
        programs = min(sms, triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N))
        fns = {"torch.matmul": lambda a=a, b=b: torch.matmul(a, b)}
        for name, where, ptr, while_loop, half in VARIANTS:
            dst = local if where == "local" else peer
            c_desc = TensorDescriptor.from_tensor(dst, [BLOCK_M, BLOCK_N])
            first = m // 2 if half else 0
            args_ = (a_desc, b_desc, c_desc, dst, m, n, k, first, BLOCK_M, BLOCK_N, BLOCK_K, 8, programs)

            def fn(args_=args_, ptr=ptr, while_loop=while_loop, grid=(programs,)):
                remote_tiles_kernel[grid](*args_, ptr, while_loop, num_warps=8, num_stages=3)

            mine.zero_()
            torch.cuda.synchronize()
            dist.barrier()
            fn()
            torch.cuda.synchronize()
            dist.barrier()
            got = (local if where == "local" else mine)[first:]
            want = (ref if where == "local" else refs[1 - rank])[first:]
            err = (got.float() - want.float()).abs().max().item()
            problem = err > 1e-2 * want.float().abs().max().item()
            if any_rank([problem])[0]:
                failures.append(f"{name} at {m}x{n}x{k}: max error {err} (on this rank or the other)")
                continue
            fns[name] = fn
        results[f"{m}x{n}x{k}"] = interleaved_us(fns, args.reps)
        if rank == 0:
            for name, us in sorted(results[f"{m}x{n}x{k}"].items(), key=lambda kv: kv[1]):
                print(f"{m}x{n}x{k} {name}: {us:.1f} us", flush=True)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "remote_tiles.json"), "w") as f:
            json.dump({"times_us": results, "failures": failures}, f, indent=1)
        for failure in failures:
            print("FAILED:", failure)
    heap.close()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
