"""The Gluon all-gather (``Config(variant="gluon")``).

Gluon kernels do not run in Triton's interpreter. The CPU tier checks the clear error the
``cpu`` backend gives; test_ccl_compile compiles the kernel for sm_90 and checks its PTX
(16-byte vector stores, release/acquire flags at system scope). test_ccl_all_gather's whole
matrix runs the variant on GPUs (``IRIS_BACKEND=cuda``), and test_ccl_gpu captures and
replays it in CUDA graphs. The GPU tests here add what those do not reach: sizes whose
tiles are stored as 16-byte vectors, compared with NCCL's ``all_gather_into_tensor`` (gloo's
where ranks share a GPU: NCCL refuses two ranks on one GPU); graph replay on that path; the
variant interleaved with the Triton ones on one communicator; and a wait that times out
being reported.
"""

import os

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import BACKEND, device, dtype_name, make_input, mismatch, require_world, setup_rank

from iris.mem.testing import launch_world, run_world, shares_gpus

pytestmark = [pytest.mark.timeout(600)]
gpu_only = pytest.mark.skipif(BACKEND != "cuda", reason="Gluon kernels need GPUs: run with IRIS_BACKEND=cuda")

WORLD_TIMEOUT = 400.0
#: Elements per rank: whole 1024- and 4096-element tiles with 16-byte-aligned chunks (16-byte
#: vector stores), a partial last tile, and an odd count (unaligned chunks: no vectors).
SIZES = [4096 * 6, 1024 * 5 + 8, (1 << 20) + 64, 100_003]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]


def _cfg(variant: str = "gluon"):
    import iris.ccl as ccl

    return ccl.Config(variant=variant)


# --------------------------------------------------------------------------- CPU tier


def cpu_error_body(rank, world_size):
    import iris.ccl as ccl

    x = torch.ones(10)
    try:
        ccl.all_gather(torch.empty(world_size * 10), x, config=_cfg())
        message = None
    except RuntimeError as e:
        message = str(e)
    out = torch.empty(world_size * 10)
    ccl.all_gather(out, x, config=_cfg("push"))  # nobody was left inside a collective
    return message, bool((out == 1).all())


@pytest.mark.skipif(BACKEND == "cuda", reason="the cpu backend's error")
def test_gluon_variant_on_the_cpu_backend_says_it_needs_cuda():
    for message, ok in run_world(cpu_error_body, 2, timeout=WORLD_TIMEOUT):
        assert message is not None, "Config(variant='gluon') ran on the cpu backend"
        for needle in ("variant='gluon'", "cuda backend", "interpreter"):
            assert needle in message, message
        assert ok


# --------------------------------------------------------------------------- GPU tier


def reference_group(world_size: int):
    """The group the references come from: NCCL with a GPU per rank, else gloo (which moves
    the GPU tensors through host memory)."""
    return dist.new_group(backend="gloo" if shares_gpus(world_size) else "nccl")


def nccl_all_gather(x: torch.Tensor, group) -> torch.Tensor:
    """torch.distributed's ``all_gather_into_tensor`` of ``x`` (flat) over ``group``."""
    want = torch.empty(x.numel() * dist.get_world_size(group), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(want, x.reshape(-1), group=group)
    return want


def sizes_body(rank, world_size):
    """Every size and dtype, plain tensors (staged) and heap tensors (in place, and in-place
    all-gather where the input is this rank's chunk of the output), against NCCL."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    nccl = reference_group(world_size)
    bad: list[str] = []
    cases = 0
    with iris.mem.init(len(DTYPES) * (world_size + 1) * max(SIZES) * 8 + (1 << 24)) as heap:
        for dtype in DTYPES:
            hin = heap.empty(max(SIZES), dtype=dtype)
            hout = heap.empty(world_size * max(SIZES), dtype=dtype)
            for i, n in enumerate(SIZES):
                x = make_input((n,), dtype, rank, i)
                want = nccl_all_gather(x, nccl)
                what = f"gluon {dtype_name(dtype)} n={n} world={world_size}"
                out = torch.full((world_size * n,), 77, dtype=dtype, device=device())
                ccl.all_gather(out, x, config=_cfg())
                bad += [m for m in [mismatch(out, want, what + " plain")] if m]
                hin[:n].copy_(x)
                hout[: world_size * n].fill_(77)
                ccl.all_gather(hout[: world_size * n], hin[:n], config=_cfg())
                bad += [m for m in [mismatch(hout[: world_size * n], want, what + " heap")] if m]
                hout[rank * n : (rank + 1) * n].copy_(x)
                ccl.all_gather(hout[: world_size * n], hout[rank * n : (rank + 1) * n], config=_cfg())
                bad += [m for m in [mismatch(hout[: world_size * n], want, what + " heap in-place")] if m]
                cases += 3
            heap.barrier()
    return {"bad": bad, "cases": cases}


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_gluon_all_gather_matches_nccl(world_size):
    require_world(world_size)
    results = run_world(sizes_body, world_size, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    assert all(res["cases"] == 3 * len(SIZES) * len(DTYPES) for res in results)


def graph_body(rank, world_size):
    """Warm up, capture one call in a CUDA graph, replay it 3 times with fresh inputs
    (same storage), plain and heap tensors, an aligned and an odd size."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    nccl = reference_group(world_size)
    bad: list[str] = []
    with iris.mem.init(1 << 28) as heap:
        for n in (4096 * 6, 100_003):
            for kind in ("plain", "heap"):
                if kind == "heap":
                    inp, out = heap.zeros(n), heap.zeros(world_size * n)
                else:
                    inp, out = torch.zeros(n, device=device()), torch.zeros(world_size * n, device=device())
                inp.copy_(make_input((n,), torch.float32, rank, 0))
                ccl.all_gather(out, inp, config=_cfg())
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    ccl.all_gather(out, inp, config=_cfg())
                torch.cuda.synchronize()
                for r in range(1, 4):
                    inp.copy_(make_input((n,), torch.float32, rank, r))
                    want = nccl_all_gather(inp, nccl)
                    torch.cuda.synchronize()
                    dist.barrier()
                    graph.replay()
                    torch.cuda.synchronize()
                    if (m := mismatch(out, want, f"graph {kind} n={n} replay {r}")) is not None:
                        bad.append(m)
                    dist.barrier()  # nobody refills an input a peer may still read
                del graph
        ccl.check_errors()
    return {"bad": bad}


@gpu_only
@pytest.mark.gpu
def test_gluon_all_gather_cuda_graph_replay():
    require_world(2)
    results = run_world(graph_body, 2, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, "\n".join(problems[:40])


def interleaved_body(rank, world_size, calls):
    """gluon, push and pull in turn on the same communicator (in place on one heap): the
    variants share the flags and generation counters, so none may fall out of step."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    nccl = reference_group(world_size)
    bad: list[str] = []
    n = 1024 * 3 + 16
    with iris.mem.init(1 << 24) as heap:
        out = heap.zeros(world_size * n, dtype=torch.bfloat16)
        mine = out[rank * n : (rank + 1) * n]
        for i in range(calls):
            variant = ("gluon", "push", "pull")[i % 3]
            mine.copy_(make_input((n,), torch.bfloat16, rank, i))
            want = nccl_all_gather(mine.clone(), nccl)
            ccl.all_gather(out, mine, config=_cfg(variant))
            if (m := mismatch(out, want, f"call {i} ({variant})")) is not None:
                bad.append(m)
        ccl.check_errors()
    return {"bad": bad}


@gpu_only
@pytest.mark.gpu
def test_gluon_interleaved_with_triton_variants():
    require_world(2)
    results = run_world(interleaved_body, 2, 60, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, "\n".join(problems[:40])


def absent_body(rank, world_size):
    """Both ranks make the communicator; then only rank 0 calls the Gluon all-gather: its
    bounded waits give up and ``check_errors`` raises, naming the absent rank."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    x = torch.ones(4096, device=device())
    out = torch.empty(world_size * 4096, device=device())
    ccl.all_gather(out, x, config=_cfg())  # the default budget: ranks may compile at different speeds
    ccl.check_errors()
    dist.barrier()
    message = None
    if rank == 0:
        os.environ["IRIS_WAIT_TIMEOUT"] = "0.5"  # read at every launch: a short wait from here on
        ccl.all_gather(out, x, config=_cfg())
        try:
            ccl.check_errors()
        except iris.mem.DeviceWaitTimeout as e:
            message = str(e)
    dist.barrier()
    return message


@gpu_only
@pytest.mark.gpu
def test_gluon_wait_for_an_absent_rank_times_out():
    require_world(2)
    results = launch_world(absent_body, 2, timeout=WORLD_TIMEOUT)
    assert all(r.ok for r in results), [r.error for r in results]
    message = results[0].value
    assert message is not None and "rank 0: a collective gave up waiting for rank 1" in message, message
    assert results[1].value is None
