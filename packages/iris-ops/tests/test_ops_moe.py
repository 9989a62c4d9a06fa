"""``iris.ops.moe_dispatch`` / ``moe_combine`` against a reference built from every rank's
inputs (gathered with ``torch.distributed.all_gather_object``: gloo on the CPU backend).

Each world test starts one real world and loops over its cases inside the ranks. A case is
a dtype, a hidden size (odd), top-k, the number of experts, a token count per rank (uneven,
one rank with none), masked slots (-1), experts that get no token, tokens routed twice to
one rank, and a number of calls with fresh routing each (generations and buffers reused).
``d.tokens`` and ``d.expert_counts`` must equal the reference exactly; ``moe_combine``
(expert outputs: each row scaled by its local expert's number) must match the fp64 sum
within the output dtype's rounding. Bad input must raise on every rank.
"""

import pytest
import torch
from ops_testutils import BACKEND, assert_clean, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
WORLD_TIMEOUT = 240.0
BF, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
#: Error of the combined output relative to its largest element (rounded once to the dtype).
TOL = {FP32: 1e-5, FP16: 2.0**-10, BF: 2.0**-7}

# The default run: fp32 at a world of 1, bf16 at 3 (plus the bad-input checks in the same
# world); every size, dtype and call count in ``tests_full``.
CASES = {
    1: [dict(dtype=FP32, hidden=37, k=3, experts=4, tokens=(7,), calls=1)],
    2: [
        dict(dtype=BF, hidden=37, k=4, experts=6, tokens=(9, 2), calls=2),
        dict(dtype=FP16, hidden=70, k=2, experts=4, tokens=(3, 5), calls=1),
    ],
    3: [dict(dtype=BF, hidden=37, k=4, experts=6, tokens=(5, 0, 8), calls=2)],
    "3 full": [
        dict(dtype=FP32, hidden=19, k=3, experts=9, tokens=(4, 6, 3), calls=3),
        dict(dtype=BF, hidden=37, k=2, experts=3, tokens=(1, 2, 0), calls=1),
    ],
    4: [
        dict(dtype=BF, hidden=37, k=4, experts=8, tokens=(3, 7, 0, 5), calls=2),
        dict(dtype=FP32, hidden=70, k=8, experts=12, tokens=(6, 2, 4, 1), calls=1),
    ],
}


def routing(rank: int, world: int, tokens: int, k: int, experts: int, seed: int) -> torch.Tensor:
    """``[tokens, k]`` ids: random, about a quarter masked (-1), expert ``experts - 2`` never
    chosen (an expert with no token), token 0 routed to experts 0 and ``experts // world - 1``
    (twice to rank 0 when it has two local experts) and the last slot of token 1 a repeat of
    its first."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    idx = torch.randint(0, experts, (tokens, k), generator=g)
    idx[idx == experts - 2] = 0
    idx[torch.rand(tokens, k, generator=g) < 0.25] = -1
    if tokens > 0 and k >= 2:
        idx[0, 0], idx[0, 1] = 0, max(experts // world - 1, 0) if experts // world > 1 else 0
    if tokens > 1 and k >= 3:
        idx[1, k - 1] = idx[1, 0]
    return idx


def reference(xs, idxs, ws, rank: int, world: int, experts: int):
    """(rows this rank receives, counts per local expert, this rank's combine in fp64)."""
    local = experts // world
    rows, counts = [], []
    for e in range(rank * local, (rank + 1) * local):
        n = 0
        for q in range(world):
            for t in range(idxs[q].shape[0]):
                for s in range(idxs[q].shape[1]):
                    if int(idxs[q][t, s]) == e:
                        rows.append(xs[q][t])
                        n += 1
        counts.append(n)
    x, idx, w = xs[rank], idxs[rank], ws[rank]
    scale = torch.where(idx >= 0, idx % local + 1, 0).double()  # the test's expert: row x (local id + 1)
    y = (x.double()[:, None, :] * (w.double() * scale)[:, :, None]).sum(1)
    hidden = x.shape[1]
    return (torch.stack(rows) if rows else x.new_zeros(0, hidden)), counts, y


def moe_case(rank, world, case, dtype, hidden, k, experts, tokens, calls, config=None):
    import torch.distributed as dist

    import iris.ops

    dev = setup_rank()
    what = f"world={world} {dtype} H={hidden} k={k} E={experts} T={tokens}"
    problems = []
    local = experts // world
    for call in range(calls):
        seed = 1000 * case + call
        g = torch.Generator().manual_seed(seed * 7 + rank)
        x = torch.randn(tokens[rank], hidden, generator=g).to(dtype)
        idx = routing(rank, world, tokens[rank], k, experts, seed)
        w = torch.rand(tokens[rank], k, generator=g)
        everyone = [None] * world
        dist.all_gather_object(everyone, (x, idx, w))
        xs, idxs, ws = zip(*everyone)
        want_rows, want_counts, want_y = reference(xs, idxs, ws, rank, world, experts)
        d = iris.ops.moe_dispatch(x.to(dev), idx.to(dev), experts, config=config)
        label = f"{what} call {call}"
        counts = d.expert_counts.cpu()
        if counts.dtype != torch.int64 or counts.tolist() != want_counts:
            problems.append(f"{label}: expert_counts {counts.dtype} {counts.tolist()} != {want_counts}")
        offsets, want_offsets = d.expert_offsets.cpu(), [sum(want_counts[:j]) for j in range(local + 1)]
        if (
            offsets.dtype != torch.int64
            or offsets.tolist() != want_offsets
            or d.expert_offsets.device != d.tokens.device
        ):
            problems.append(f"{label}: expert_offsets {offsets.dtype} {offsets.tolist()} != {want_offsets}")
        got = d.tokens[: sum(want_counts)].cpu()
        if not torch.equal(got, want_rows):
            bad = (got != want_rows).any(1).nonzero().flatten()[:5].tolist()
            problems.append(f"{label}: d.tokens differs from the reference at rows {bad}")
        # the experts: row i times (its local expert + 1)
        expert_of = torch.repeat_interleave(torch.arange(local), torch.tensor(want_counts))
        expert_out = d.tokens.clone()
        n = sum(want_counts)
        expert_out[:n] = (d.tokens[:n].double() * (expert_of.to(dev)[:, None] + 1)).to(dtype)
        y = iris.ops.moe_combine(expert_out, d, w.to(dev))
        y = y.cpu().double()
        atol = TOL[dtype] * max(want_y.abs().max().item() if want_y.numel() else 0.0, 1.0)
        if y.shape != want_y.shape or not (y - want_y).abs().le(atol).all():
            err = (y - want_y).abs().max().item() if y.shape == want_y.shape else "shape"
            problems.append(f"{label}: moe_combine off by {err} (allowed {atol:.3g})")
    return problems


def compiled(rank, world_size) -> list[str]:
    """The public functions under ``torch.compile(fullgraph=True, backend="aot_eager")``: one
    frame, the two ops in the graph, the result of eager calls."""
    import torch._dynamo.testing

    import iris.ops

    dev = setup_rank()
    torch._dynamo.reset()
    experts, g = 2 * world_size, torch.Generator().manual_seed(rank)
    x = torch.randn(3 + rank, 21, generator=g).to(dev)
    idx = torch.randint(-1, experts, (3 + rank, 2), generator=g).to(dev)
    w = torch.rand(3 + rank, 2, generator=g).to(dev)

    def layer(x, idx, w):
        d = iris.ops.moe_dispatch(x, idx, experts)
        return iris.ops.moe_combine(d.tokens * 2, d, w), d.expert_counts

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    y, counts = torch.compile(layer, fullgraph=True, backend=counter)(x, idx, w)
    want_y, want_counts = layer(x, idx, w)
    bad = []
    if counter.frame_count != 1:
        bad.append(f"compile: {counter.frame_count} frames")
    names = {str(n.target) for gm in counter.graphs for n in gm.graph.nodes}
    if not any("moe_dispatch" in n for n in names) or not any("moe_combine" in n for n in names):
        bad.append(f"compile: the ops are not in the graph: {sorted(names)}")
    if not torch.equal(counts, want_counts) or not torch.allclose(y, want_y, atol=1e-5, rtol=1e-5):
        bad.append("compile: the compiled layer differs from the eager one")

    # float8: rows quantized by the dispatch (scales beside them), a capacity per call
    x8 = torch.randn(3 + rank, 256, generator=g).to(dev)

    def fp8_layer(x, idx, w):
        d = iris.ops.moe_dispatch(x, idx, experts, quantize=torch.float8_e5m2, max_recv_rows=64)
        rows = (d.tokens.float().view(d.tokens.shape[0], 2, 128) * d.scales[:, :, None]).view(-1, 256)
        return iris.ops.moe_combine(rows.to(torch.bfloat16), d, w), d.expert_offsets

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    y, offsets = torch.compile(fp8_layer, fullgraph=True, backend=counter)(x8, idx, w)
    want_y, want_offsets = fp8_layer(x8, idx, w)
    if counter.frame_count != 1 or not torch.equal(offsets, want_offsets) or not torch.equal(y, want_y):
        bad.append("compile: the compiled float8 layer differs from the eager one")
    return bad


def matrix_body(rank, world_size, cases, errors=False, compile_too=False):
    import torch.distributed as dist

    import iris.ops

    setup_rank()
    bad, n = [], 0
    for i, case in enumerate(cases):
        bad += moe_case(rank, world_size, i, **case)
        n += 1
    if errors:
        bad += (
            bad_inputs(rank, world_size) + capacity_growth(rank, world_size) + aborted_heap(rank, world_size)
        )
        n += 3
    if compile_too:
        bad += compiled(rank, world_size)
        n += 1
    dist.barrier()  # every rank is done with the others' buffers before any closes its own
    iris.ops.release_workspaces()
    return {"bad": bad, "cases": n}


@pytest.mark.parametrize("world_size", [1, 3])
def test_matches_reference(world_size):
    """Worlds 1 and 3; at 3 also every bad input (in the same world)."""
    require_world(world_size)
    cases, errors, compile_too = CASES[world_size], world_size == 3, False
    results = run_world(matrix_body, world_size, cases, errors, compile_too, timeout=WORLD_TIMEOUT)
    assert_clean(results, len(cases) + 3 * errors + compile_too)


@pytest.mark.full
@pytest.mark.parametrize("world_size", [2, "3 full", 4])
def test_matches_reference_full(world_size):
    """Worlds 2-4, more dtypes and calls; at 3 also the ops under torch.compile."""
    ranks = int(str(world_size)[0])
    require_world(ranks)
    cases, compile_too = CASES[world_size], ranks == 3
    results = run_world(matrix_body, ranks, cases, False, compile_too, timeout=WORLD_TIMEOUT)
    assert_clean(results, len(cases) + compile_too)


def _expect(problems, what, exc, words, fn):
    try:
        fn()
    except exc as e:
        if not all(w in str(e) for w in words):
            problems.append(f"{what}: message lacks {words}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - reported
        problems.append(f"{what}: raised {type(e).__name__}: {e}")
        return
    problems.append(f"{what}: nothing raised")


def bad_inputs(rank, world_size) -> list[str]:
    """Bad input raises a clear error on every rank; a call after each works."""
    import iris.ops

    dev = setup_rank()
    bad = []
    x = torch.randn(4 + rank, 24).to(dev)
    idx = torch.randint(0, 6, (4 + rank, 2)).to(dev)
    w = torch.rand(4 + rank, 2).to(dev)
    _expect(bad, "num_experts", ValueError, ["divisible"], lambda: iris.ops.moe_dispatch(x, idx, 7))
    _expect(bad, "rows", ValueError, ["rows"], lambda: iris.ops.moe_dispatch(x[1:], idx, 6))
    _expect(bad, "idx dtype", TypeError, ["int64"], lambda: iris.ops.moe_dispatch(x, idx.float(), 6))
    _expect(bad, "x dtype", TypeError, ["dtype"], lambda: iris.ops.moe_dispatch(x.int(), idx, 6))
    wrong = idx.clone()
    wrong[1, 1] = 6  # out of range on the last rank only: every rank is told
    _expect(
        bad, "expert id", ValueError, ["out of range", "6"],
        lambda: iris.ops.moe_dispatch(x, wrong if rank == world_size - 1 else idx, 6).check(),
    )  # fmt: skip
    d = iris.ops.moe_dispatch(x, idx, 6)
    _expect(bad, "weights shape", ValueError, ["shape"], lambda: iris.ops.moe_combine(d.tokens, d, w[:, :1]))
    _expect(bad, "weights dtype", TypeError, ["floating"], lambda: iris.ops.moe_combine(d.tokens, d, idx))
    _expect(bad, "out dtype", TypeError, ["dtype"], lambda: iris.ops.moe_combine(d.tokens.half(), d, w))
    y = iris.ops.moe_combine(d.tokens, d, w)
    want = (x[:, None, :] * w[:, :, None]).sum(1)
    if not torch.allclose(y.cpu(), want.cpu(), atol=1e-5, rtol=1e-5):
        bad.append("combine after the errors differs from sum_k w * x")
    _expect(bad, "combined twice", RuntimeError, ["once"], lambda: iris.ops.moe_combine(d.tokens, d, w))
    small = iris.ops.MoEConfig(max_recv_rows=3)
    _expect(
        bad, "capacity", RuntimeError, ["max_recv_rows", "rows"],
        lambda: iris.ops.moe_dispatch(x, idx, 6, config=small).check(),
    )  # fmt: skip
    _expect(bad, "config", TypeError, ["MoEConfig"], lambda: iris.ops.moe_dispatch(x, idx, 6, config=1))
    return bad


def capacity_growth(rank, world_size) -> list[str]:
    """The capacity is made for the first call's batch; a later, larger batch that does not
    fit raises on every rank and moves nothing; with ``max_recv_rows=`` the buffers grow
    (the rows then equal the reference), never shrink, and a dispatch made before the growth
    can no longer be combined."""
    import iris.ops

    dev = setup_rank()
    bad, experts, hidden = [], 2 * world_size, 40  # a signature of its own
    g = torch.Generator().manual_seed(rank)
    small, small_idx = (
        torch.randn(2, hidden, generator=g).to(dev),
        torch.tensor([[0, 1], [1, -1]], device=dev),
    )
    d = iris.ops.moe_dispatch(small, small_idx, experts)
    iris.ops.moe_combine(d.tokens, d, torch.ones(2, 2, device=dev))
    first = d.capacity
    if first != world_size * 2 * 2:
        bad.append(f"first capacity {first} != G * K * max T = {world_size * 4}")
    big = torch.randn(6, hidden, generator=g).to(dev)
    to_zero = torch.zeros(6, 2, dtype=torch.int64, device=dev)  # every slot of every rank to expert 0
    w = torch.rand(6, 2, generator=g).to(dev)
    _expect(
        bad,
        "larger batch",
        RuntimeError,
        ["max_recv_rows"],
        lambda: iris.ops.moe_dispatch(big, to_zero, experts).check(),
    )
    need = 12 * world_size
    d = iris.ops.moe_dispatch(big, to_zero, experts, max_recv_rows=need)
    if d.capacity != need:
        bad.append(f"capacity after max_recv_rows={need}: {d.capacity}")
    if rank == 0:
        if d.expert_offsets.tolist() != [0, need, need]:
            bad.append(f"offsets after growth {d.expert_offsets.tolist()} != {[0, need, need]}")
    y = iris.ops.moe_combine(d.tokens, d, w)
    if not torch.allclose(y.cpu(), (big * w.sum(1, keepdim=True)).cpu(), atol=1e-5, rtol=1e-5):
        bad.append("combine after growth differs from sum_k w * x")
    d = iris.ops.moe_dispatch(small, small_idx, experts, max_recv_rows=4)
    if d.capacity != need:
        bad.append(f"max_recv_rows below the capacity shrank it to {d.capacity}")
    d2 = iris.ops.moe_dispatch(small, small_idx, experts, max_recv_rows=need + 1)
    _expect(
        bad,
        "combine after growth",
        RuntimeError,
        ["released"],
        lambda: iris.ops.moe_combine(d.tokens, d, w[:2]),
    )
    iris.ops.moe_combine(d2.tokens, d2, w[:2])
    _expect(
        bad, "max_recv_rows", ValueError, ["max_recv_rows"],
        lambda: iris.ops.moe_dispatch(small, small_idx, experts, max_recv_rows=0),
    )  # fmt: skip
    return bad


def aborted_heap(rank, world_size) -> list[str]:
    """Tensors of an aborted heap are refused by moe_dispatch and moe_combine with
    AbortedError on every rank (the abort is each rank's own), as iris.ccl refuses them."""
    import iris.mem
    import iris.ops

    dev = setup_rank()
    bad, experts = [], 2 * world_size
    heap = iris.mem.init(1 << 20)
    x = heap.zeros((3, 16))
    idx = torch.zeros(3, 1, dtype=torch.int64, device=dev)
    d = iris.ops.moe_dispatch(torch.zeros(3, 16, device=dev), idx, experts)
    expert_out = heap.zeros((d.capacity, 16))
    heap.abort()
    _expect(
        bad,
        "aborted x",
        iris.mem.AbortedError,
        ["x", "aborted"],
        lambda: iris.ops.moe_dispatch(x, idx, experts),
    )
    weights = torch.ones(3, 1, device=dev)
    _expect(
        bad, "aborted expert_out", iris.mem.AbortedError, ["expert_out", "aborted"],
        lambda: iris.ops.moe_combine(expert_out, d, weights),
    )  # fmt: skip
    iris.ops.moe_combine(d.tokens, d, weights)
    heap.close()
    return bad


def test_config_checks():
    import iris.ops

    with pytest.raises(ValueError, match="max_recv_rows"):
        iris.ops.MoEConfig(max_recv_rows=-1)
    with pytest.raises(ValueError, match="block"):
        iris.ops.MoEConfig(block=100)
    with pytest.raises(TypeError, match="programs"):
        iris.ops.MoEConfig(programs=1.5)


def graph_body(rank, world_size):
    """CUDA graphs: dispatch, expert, combine captured once and replayed with fresh routing
    written into the captured inputs each replay."""
    import torch.distributed as dist

    import iris.ops

    dev = setup_rank()
    bad = []
    hidden, k, experts, tokens = 4096, 8, 24, 96 + 32 * rank  # 24 experts: 2, 3 and 4 ranks
    cfg = iris.ops.MoEConfig(max_recv_rows=world_size * k * 128)
    x = torch.empty(tokens, hidden, dtype=BF, device=dev)
    idx = torch.empty(tokens, k, dtype=torch.int64, device=dev)
    w = torch.empty(tokens, k, device=dev)

    def fill(seed):
        g = torch.Generator().manual_seed(seed * 31 + rank)
        x.copy_(torch.randn(tokens, hidden, generator=g))
        idx.copy_(torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]))
        idx[torch.rand(tokens, k, generator=g) < 0.2] = -1
        w.copy_(torch.rand(tokens, k, generator=g))

    def layer():
        d = iris.ops.moe_dispatch(x, idx, experts, config=cfg)
        return d, iris.ops.moe_combine(d.tokens * 2, d, w)

    fill(0)
    layer()  # makes the workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d, y = layer()
    for replay in range(1, 6):
        fill(replay)
        graph.replay()
        torch.cuda.synchronize()
        iris.ops.check_errors()
        want = (2 * x.double()[:, None, :] * (w.double() * (idx >= 0))[:, :, None]).sum(1)
        if not (y.double() - want).abs().le(2.0**-6 * want.abs().max()).all():
            bad.append(f"replay {replay}: combine differs")
        everyone = [None] * world_size
        dist.all_gather_object(everyone, idx.cpu())
        local = experts // world_size
        want_counts = [
            sum(int((i == e).sum()) for i in everyone) for e in range(rank * local, (rank + 1) * local)
        ]
        if d.expert_counts.tolist() != want_counts:
            bad.append(f"replay {replay}: expert_counts {d.expert_counts.tolist()} != {want_counts}")
    dist.barrier()
    iris.ops.release_workspaces()
    return {"bad": bad, "cases": 5}


@pytest.mark.skipif(BACKEND != "cuda" or not torch.cuda.is_available(), reason="CUDA graphs need GPUs")
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_cuda_graph_replay_fresh_routing(world_size):
    require_world(world_size)
    assert_clean(run_world(graph_body, world_size, timeout=WORLD_TIMEOUT), 5)
