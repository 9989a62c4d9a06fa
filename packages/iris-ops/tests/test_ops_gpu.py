"""GPU-only tests of iris.ops (``IRIS_BACKEND=cuda``, ``pytest -m gpu``), on any number of
GPUs: ranks beyond it share GPUs.

* Real shapes: every op at prefill shapes (M = 1024 and 8192, N = 8192, K = 4096), decode
  shapes (M = 1 and 128) and odd ones (no dimension a multiple of any block), bf16, fp16 and
  fp32 (tf32), bias on and off, heap and plain outputs, against the float64 matmul and
  torch.distributed over gloo (the case functions of the CPU-tier tests, at GPU sizes).
* Back-to-back calls: 50 calls of each op on one workspace with no synchronisation between
  them (ranks drift apart; the flags' generations must keep calls apart), then a check; and
  24 calls with different data each while one rank's GPU is loaded by a second stream,
  every call's output checked.
* CUDA graphs: each op warmed up, captured once in ``torch.cuda.graph``, then replayed three
  times, each after refilling its inputs in place with fresh random data.
"""

import os

import pytest
import torch
import torch.distributed as dist
from ops_testutils import (
    assert_clean,
    device,
    gathered,
    mismatch,
    peak,
    rand,
    require_world,
    run_cases,
    seed,
    setup_rank,
    summed,
)
from test_ops_all_gather_matmul import agm_case
from test_ops_matmul_all_gather import mag_case
from test_ops_matmul_all_reduce import ar_case
from test_ops_matmul_reduce_scatter import rs_case

from iris.mem.testing import run_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(BACKEND != "cuda", reason="GPU-only test: run with IRIS_BACKEND=cuda"),
]
WORLD_TIMEOUT = 1200.0
HEAP = 3 << 30
BF, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# --------------------------------------------------------------------------- real shapes

AR_CASES = [
    dict(dtype=BF, shape=(8192, 8192, 4096), bias=True, out_kind="heap"),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=False, out_kind="heap", repeat=3),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=True, out_kind="plain", split="n"),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=True, out_kind="heap", tma=False),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=True, out_kind="heap", order="spread", repeat=2),
    dict(dtype=BF, shape=(8192, 8192, 4096), bias=False, out_kind="plain", order="spread"),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=True, out_kind="plain", stream=False),
    dict(dtype=BF, shape=(1, 8192, 4096), bias=True, out_kind="heap"),
    dict(dtype=BF, shape=(128, 8192, 4096), bias=False, out_kind="plain"),
    dict(dtype=FP16, shape=(1000, 3000, 1999), bias=True, out_kind="strided"),
    dict(dtype=FP32, shape=(777, 1536, 1000), bias=False, out_kind="heap"),
]
RS_CASES = [
    dict(dtype=BF, shape=(8192, 8192, 4096), bias=False, out_kind="heap", scatter_dim=0),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=True, out_kind="plain", scatter_dim=0, repeat=3),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=False, out_kind="plain", scatter_dim=1),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=True, out_kind="plain", scatter_dim=0, tma=False),
    dict(dtype=BF, shape=(1024, 8192, 4096), bias=False, out_kind="heap", scatter_dim=0, stream=False),
    dict(dtype=BF, shape=(8192, 8192, 4096), bias=True, out_kind="plain", scatter_dim=0, order="spread"),
    dict(dtype=FP16, shape=(1998, 3000, 1999), bias=True, out_kind="plain", scatter_dim=1, order="spread"),
    dict(dtype=BF, shape=(128, 8192, 4096), bias=True, out_kind="heap", scatter_dim=0),
    dict(dtype=FP16, shape=(1998, 3000, 1999), bias=True, out_kind="strided", scatter_dim=0),
    dict(dtype=FP32, shape=(777, 1538, 1000), bias=False, out_kind="plain", scatter_dim=1),
]
MAG_CASES = [
    dict(dtype=BF, shape=(4096, 8192, 4096), bias=True, out_kind="heap"),
    dict(dtype=BF, shape=(512, 8192, 4096), bias=False, out_kind="heap", repeat=3),
    dict(dtype=BF, shape=(64, 8192, 4096), bias=True, out_kind="plain"),
    dict(dtype=BF, shape=(512, 8192, 4096), bias=True, out_kind="heap", tma=False),
    dict(dtype=FP16, shape=(999, 3000, 1999), bias=False, out_kind="strided"),
    dict(dtype=FP32, shape=(389, 1536, 1000), bias=True, out_kind="heap"),
]
AGM_CASES = [
    dict(dtype=BF, shard=(4096, 4096), n=8192, bias=False, out_kind="heap", gather_dim=0),
    dict(dtype=BF, shard=(512, 4096), n=8192, bias=True, out_kind="plain", gather_dim=0, repeat=3),
    dict(dtype=BF, shard=(1024, 2048), n=8192, bias=True, out_kind="plain", gather_dim=1),
    dict(dtype=BF, shard=(512, 4096), n=8192, bias=False, out_kind="plain", gather_dim=0, tma=False),
    dict(dtype=BF, shard=(512, 2048), n=8192, bias=False, out_kind="heap", gather_dim=1, tma=False),
    dict(dtype=BF, shard=(64, 4096), n=8192, bias=False, out_kind="heap", gather_dim=0),
    dict(dtype=BF, shard=(8, 4096), n=8192, bias=True, out_kind="plain", gather_dim=0, repeat=3),
    dict(dtype=FP16, shard=(3, 1000), n=3000, bias=False, out_kind="heap", gather_dim=0),
    dict(dtype=BF, shard=(128, 2048), n=8192, bias=False, out_kind="plain", gather_dim=1),
    dict(dtype=FP16, shard=(999, 1999), n=3000, bias=True, out_kind="strided", gather_dim=0),
    dict(dtype=FP32, shard=(777, 500), n=1536, bias=False, out_kind="heap", gather_dim=1),
]
CASE_FNS = {"matmul_all_reduce": (ar_case, AR_CASES), "matmul_reduce_scatter": (rs_case, RS_CASES)}
CASE_FNS |= {"matmul_all_gather": (mag_case, MAG_CASES), "all_gather_matmul": (agm_case, AGM_CASES)}


def shapes_body(rank, world_size, op):
    case_fn, cases = CASE_FNS[op]
    return run_cases(case_fn, rank, world_size, cases, heap_bytes=HEAP)


@pytest.mark.parametrize("op", sorted(CASE_FNS))
def test_real_shapes_match_torch(op):
    require_world(2)
    assert_clean(run_world(shapes_body, 2, op, timeout=WORLD_TIMEOUT), len(CASE_FNS[op][1]))


# --------------------------------------------------------------------------- calls and graphs


class Problem:
    """Buffers of one op call at a fixed shape: ``fill(r)`` refills the inputs in place with
    the data of round ``r``, ``call()`` runs the op, ``expect()`` computes the reference of
    the current inputs (collective) and the scale of its terms."""

    def __init__(self, op: str, rank: int, world: int, alloc, shape=(1000, 3072, 2048), dtype=BF):
        import iris.ops

        self.op, self.rank, self.world = op, rank, world
        m, n, k = shape  # M not a multiple of any block
        ws = self.workspace = iris.ops.Workspace()
        fn = getattr(iris.ops, op)
        if op == "all_gather_matmul":
            self.a, self.b = alloc((m // world, k), dtype), alloc((k, n), dtype)
            self.out = alloc((m // world * world, n), dtype)
            self.call = lambda: fn(self.out, self.a, self.b, workspace=ws)
        elif op == "matmul_all_gather":
            self.a, self.b = alloc((m, k), dtype), alloc((k, n), dtype)
            self.out = alloc((world * m, n), dtype)
            self.call = lambda: fn(self.out, self.a, self.b, workspace=ws)
        elif op == "matmul_reduce_scatter":
            self.a, self.b = alloc((m // world * world, k), dtype), alloc((k, n), dtype)
            self.out = alloc((m // world, n), dtype)
            self.call = lambda: fn(self.out, self.a, self.b, workspace=ws)
        else:
            self.a, self.b = alloc((m, k), dtype), alloc((k, n), dtype)
            self.out = alloc((m, n), dtype)
            self.call = lambda: fn(self.out, self.a, self.b, workspace=ws)

    def fill(self, r: int) -> None:
        self.a.copy_(rand(tuple(self.a.shape), self.a.dtype, seed(self.rank, 900 + r, 0)))
        self.b.copy_(rand(tuple(self.b.shape), self.b.dtype, seed(self.rank, 900 + r, 1)))

    def expect(self):
        partial = self.a.double() @ self.b.double()
        if self.op == "all_gather_matmul":
            want = gathered(self.a, 0).double() @ self.b.double()
            return want, want.abs().max().item()
        if self.op == "matmul_all_gather":
            want = gathered(partial, 0)
            return want, want.abs().max().item()
        full = summed(partial)
        scale = self.world * peak(partial) + full.abs().max().item()
        if self.op == "matmul_reduce_scatter":
            return full.chunk(self.world, 0)[self.rank], scale
        return full, scale


def _allocator(heap, dev):
    if heap is not None:
        return lambda shape, dtype: heap.zeros(shape, dtype=dtype)
    return lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=dev)


def _synchronize() -> None:
    if torch.cuda.is_available() and BACKEND == "cuda":
        torch.cuda.synchronize()


def back_to_back_body(rank, world_size, calls=50, shape=(1000, 3072, 2048), heap_bytes=HEAP):
    """``calls`` calls per op on one workspace, no synchronisation in between; the last
    one checked (device-agnostic: also runs on the CPU backend at small sizes)."""
    import iris.mem
    import iris.ops

    dev = setup_rank()
    bad = []
    with iris.mem.init(heap_bytes) as heap:
        for op in sorted(CASE_FNS):
            p = Problem(op, rank, world_size, _allocator(heap, dev), shape)
            p.fill(0)
            for _ in range(calls):
                p.call()
            _synchronize()
            want, scale = p.expect()
            if (msg := mismatch(p.out, want, scale, f"{op} after {calls} calls")) is not None:
                bad.append(msg)
            dist.barrier()
        iris.ops.release_workspaces()
        _synchronize()
    return {"bad": bad, "cases": len(CASE_FNS)}


def test_back_to_back_calls():
    require_world(2)
    assert_clean(run_world(back_to_back_body, 2, timeout=WORLD_TIMEOUT), len(CASE_FNS))


def skewed_body(rank, world_size, calls=24):
    """Back-to-back calls with different data each (``a`` scaled by a power of two, so every
    call's exact result is known) while rank 1's GPU also runs large matmuls on a second
    stream, so its calls run slower and the other rank starts each call early: a push of
    call g + 1 that lands before its owner has read call g's shows in call g's output.
    Measured limit: with matmul_reduce_scatter's wait for the peers' exit flags removed this
    test still passed twice on 2 x H200 (the window between a program's push and its peer's
    read of the previous call is too short to hit this way); that wait rests on the order
    argument of ``_reduce.py``."""
    import iris.mem
    import iris.ops

    dev = setup_rank()
    scales = (1.0, -2.0, 4.0, -1.0, 2.0, -4.0)
    side = torch.cuda.Stream()
    load = [torch.randn(4096, 4096, device=dev, dtype=BF) for _ in range(2)]
    bad = []
    with iris.mem.init(HEAP) as heap:
        for op in sorted(CASE_FNS):
            p = Problem(op, rank, world_size, _allocator(heap, dev))
            p.fill(0)
            base = p.a.clone()
            want, scale = p.expect()
            outs = []
            for i in range(calls):
                if rank == 1 and i % 3 == 0:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for _ in range(4):
                            torch.matmul(load[0], load[1])
                p.a.copy_(base * scales[i % len(scales)])
                p.call()
                outs.append(p.out.clone())
            _synchronize()
            for i, got in enumerate(outs):
                s = scales[i % len(scales)]
                if (msg := mismatch(got, want * s, scale * abs(s), f"{op} call {i} of {calls}")) is not None:
                    bad.append(msg)
                    break
            dist.barrier()
        iris.ops.check_errors()
        iris.ops.release_workspaces()
        _synchronize()
    return {"bad": bad, "cases": len(CASE_FNS)}


def test_skewed_ranks_fresh_data_every_call():
    require_world(2)
    assert_clean(run_world(skewed_body, 2, timeout=WORLD_TIMEOUT), len(CASE_FNS))


def graph_body(rank, world_size, use_heap):
    """Warm-up, capture, three replays with fresh data in place, for every op."""
    import iris.mem
    import iris.ops

    dev = device()  # LOCAL_RANK modulo the GPUs present
    torch.cuda.set_device(dev)
    bad, cases = [], 0
    heap = iris.mem.init(HEAP) if use_heap else None
    try:
        for op in sorted(CASE_FNS):
            what = f"{op} {'heap' if use_heap else 'plain'}"
            p = Problem(op, rank, world_size, _allocator(heap, dev))
            p.fill(0)
            p.call()  # warm-up: prepares the workspace and compiles
            torch.cuda.synchronize()
            want, scale = p.expect()
            if (msg := mismatch(p.out, want, scale, f"{what} warm-up")) is not None:
                bad.append(msg)
            dist.barrier()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                p.call()
            torch.cuda.synchronize()
            dist.barrier()
            for r in range(1, 4):
                p.fill(r)
                torch.cuda.synchronize()
                want, scale = p.expect()
                graph.replay()
                torch.cuda.synchronize()
                if (msg := mismatch(p.out, want, scale, f"{what} replay {r}")) is not None:
                    bad.append(msg)
                dist.barrier()  # nobody refills inputs a peer may still read
            cases += 1
            del graph
        iris.ops.check_errors()
        iris.ops.release_workspaces()
    finally:
        torch.cuda.synchronize()
        if heap is not None:
            heap.close()
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("use_heap", [True, False], ids=["heap", "plain"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_cuda_graph_capture_and_replay(world_size, use_heap):
    require_world(world_size)
    assert_clean(run_world(graph_body, world_size, use_heap, timeout=WORLD_TIMEOUT), len(CASE_FNS))
