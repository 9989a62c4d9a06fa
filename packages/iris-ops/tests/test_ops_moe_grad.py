"""Gradients of ``iris.ops.moe_dispatch`` / ``moe_combine``: ``torch.autograd.gradcheck`` in
float64 at a world of one, and, at worlds 1-3, the gradients of a two-layer MoE model with
expert parallelism against the same model computed on one device with torch ops only (every
rank's tokens gathered with torch.distributed, every expert local), eager and under
``torch.compile(backend="aot_eager")``.

The model: a router (``softmax(x @ router)``, top-k, renormalised: the weights carry the
router's gradient) and experts ``row @ W[e]`` run on ``d.tokens`` through
``d.expert_offsets`` (no host synchronisation), two layers of the same shapes (so the second
reuses the first's buffers before either backward runs). Gradients of ``x``, the router and
every expert's weights are compared in float64 (kernels accumulate float64 rows in float64;
only the order of the sums differs from the reference).
"""

import pytest
import torch
from ops_testutils import assert_clean, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
WORLD_TIMEOUT = 240.0
F64 = torch.float64
#: Tokens per rank (one rank with none at a world of three), hidden size, top-k.
TOKENS = {1: (5,), 2: (4, 3), 3: (4, 0, 5)}
HIDDEN, TOPK = 6, 2


def route(x, router, k):
    """Top-k experts of each token and their renormalised softmax weights."""
    probs = torch.softmax(x @ router, dim=-1)
    weights, idx = torch.topk(probs, k, dim=-1)
    return idx, weights / weights.sum(-1, keepdim=True)


def experts_on_rows(tokens, offsets, weights):
    """``tokens[i] @ weights[expert of row i]`` with the expert of each row found from
    ``offsets`` on the device (rows past the last offset use the last expert: never read)."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    expert = torch.bucketize(rows, offsets[1:], right=True).clamp(max=weights.shape[0] - 1)
    return torch.einsum("rh,rhi->ri", tokens, weights[expert])


def moe_layer(x, router, local_weights, num_experts, k=TOPK):
    import iris.ops

    idx, w = route(x, router, k)
    d = iris.ops.moe_dispatch(x, idx, num_experts)
    return iris.ops.moe_combine(experts_on_rows(d.tokens, d.expert_offsets, local_weights), d, w)


def reference_layer(x, router, weights, k=TOPK):
    """The same layer on one device: every token, every expert, torch ops only."""
    idx, w = route(x, router, k)
    y = torch.zeros_like(x)
    for e in range(weights.shape[0]):
        rows, slots = (idx == e).nonzero(as_tuple=True)
        y = y.index_add(0, rows, w[rows, slots, None] * (x[rows] @ weights[e]))
    return y


def _params(world, dtype, dev):
    """(router, experts) of both layers, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(11)
    experts = 2 * world
    return [
        (
            torch.randn(HIDDEN, experts, generator=g).to(dtype),
            torch.randn(experts, HIDDEN, HIDDEN, generator=g).to(dtype),
        )
        for _ in range(2)
    ]


def _two_layers(x, params, layer):
    h = layer(x, *params[0])
    return layer(torch.tanh(h) + x, *params[1]) if len(params) > 1 else h


#: Error allowed relative to a result's largest element: float64 differs from the reference
#: only in the order of the sums; float32 rows also round each expert row and product.
TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def gradients_body(rank, world_size, compiled=False, dtype=F64):
    """Gradients of x, the routers and every expert's weights, against the one-device model
    (compiled: its first layer only, to keep the compile short)."""
    import torch.distributed as dist

    dev = setup_rank()
    bad = []
    tokens = TOKENS[world_size]
    experts, local = 2 * world_size, 2
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(tokens[rank], HIDDEN, generator=g).to(dtype).to(dev).requires_grad_()
    grad_y = torch.randn(tokens[rank], HIDDEN, generator=g).to(dtype).to(dev)
    full = [(r.to(dev), w.to(dev)) for r, w in _params(world_size, dtype, dev)][: 1 if compiled else 2]
    mine = [
        (r.clone().requires_grad_(), w[rank * local : (rank + 1) * local].clone().requires_grad_())
        for r, w in full
    ]

    def layer(h, router, weights):
        return moe_layer(h, router, weights, experts)

    run = torch.compile(_two_layers, backend="aot_eager", fullgraph=True) if compiled else _two_layers
    y = run(x, mine, layer)
    y.backward(grad_y)
    # The reference: every rank's tokens and output gradients, every expert.
    everyone = [None] * world_size
    dist.all_gather_object(everyone, (x.detach().cpu(), grad_y.cpu()))
    x_all = torch.cat([e[0] for e in everyone]).to(dev).requires_grad_()
    ref = [(r.clone().requires_grad_(), w.clone().requires_grad_()) for r, w in full]
    y_ref = _two_layers(x_all, ref, reference_layer)
    y_ref.backward(torch.cat([e[1] for e in everyone]).to(dev))
    start = sum(tokens[:rank])
    what = f"world {world_size} {dtype}{' compiled' if compiled else ''}"
    checks = [("y", y.detach(), y_ref.detach()[start : start + tokens[rank]])]
    checks.append(("grad x", x.grad, x_all.grad[start : start + tokens[rank]]))
    for i, ((router, weights), (ref_router, ref_weights)) in enumerate(zip(mine, ref)):
        router_grad = router.grad.clone()
        dist.all_reduce(router_grad)  # the router is replicated: each rank holds its tokens' share
        checks.append((f"layer {i} grad router", router_grad, ref_router.grad))
        checks.append(
            (f"layer {i} grad experts", weights.grad, ref_weights.grad[rank * local : (rank + 1) * local])
        )
    for name, got, want in checks:
        err = (got - want).abs().max().item() if got.numel() else 0.0
        if got.shape != want.shape or not err <= TOL[dtype] * max(
            want.abs().max().item() if want.numel() else 0.0, 1.0
        ):
            bad.append(f"{what}: {name} differs from the one-device model by {err}")
    return bad


def matrix_body(rank, world_size, compile_too, gradcheck_too=False, dtypes=(F64,)):

    import iris.ops

    bad = []
    for dtype in dtypes:
        bad += gradients_body(rank, world_size, dtype=dtype)
        if compile_too:
            torch._dynamo.reset()
            bad += gradients_body(rank, world_size, compiled=True, dtype=dtype)
    if gradcheck_too:
        bad += gradcheck_case(rank, world_size)
    iris.ops.release_workspaces()
    return {"bad": bad, "cases": len(dtypes) * (1 + compile_too) + 3 * gradcheck_too}


@pytest.mark.parametrize("world_size", [1, 3])
def test_gradients_match_one_device(world_size):
    """World 1: eager and compiled, and gradcheck in float64 (:func:`gradcheck_case`);
    world 3 (one rank without tokens): eager."""
    require_world(world_size)
    one = world_size == 1
    results = run_world(matrix_body, world_size, one, one, timeout=WORLD_TIMEOUT)
    assert_clean(results, 1 + 4 * one)


@pytest.mark.full
@pytest.mark.parametrize("world_size", [2, 3])
def test_gradients_match_one_device_full(world_size):
    """Worlds 2 and 3, float64 and float32, eager and compiled."""
    require_world(world_size)
    dtypes = (F64, torch.float32)
    assert_clean(run_world(matrix_body, world_size, True, False, dtypes, timeout=WORLD_TIMEOUT), 4)


def gradcheck_case(rank, world_size):
    """gradcheck of dispatch + experts + combine in float64 (masked slots, a token routed
    twice to one expert, an expert with no token), and the calls that must refuse to drop
    gradients."""
    import iris.ops

    dev = setup_rank()
    bad = []
    experts = 3
    idx = torch.tensor([[0, 2], [2, 2], [-1, 0], [0, -1]], device=dev)  # expert 1 gets no token
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 3, generator=g).to(F64).to(dev).requires_grad_()
    w = torch.rand(4, 2, generator=g).to(F64).to(dev).requires_grad_()
    weights = torch.randn(experts, 3, 3, generator=g).to(F64).to(dev).requires_grad_()

    def layer(x, w, weights):
        d = iris.ops.moe_dispatch(x, idx, experts)
        return iris.ops.moe_combine(experts_on_rows(d.tokens, d.expert_offsets, weights), d, w)

    try:
        torch.autograd.gradcheck(layer, (x, w, weights), fast_mode=True)
    except Exception as e:  # noqa: BLE001 - reported
        bad.append(f"gradcheck: {type(e).__name__}: {e}"[:2000])
    # Inputs whose gradient cannot flow raise instead of being dropped.
    x8 = torch.randn(2, 128, generator=g).to(torch.float8_e4m3fn).to(dev)
    idx8 = torch.zeros(2, 1, dtype=torch.int64, device=dev)
    scales = torch.ones(2, 1, device=dev, requires_grad=True)
    cases = {
        "quantize= with x requiring grad": lambda: iris.ops.moe_dispatch(
            torch.randn(2, 128, device=dev, requires_grad=True), idx8, experts, quantize=torch.float8_e4m3fn
        ),
        "x_scales requiring grad": lambda: iris.ops.moe_dispatch(x8, idx8, experts, x_scales=scales),
    }
    for what, call in cases.items():
        try:
            call()
            bad.append(f"{what}: nothing raised")
        except RuntimeError as e:
            if "grad" not in str(e):
                bad.append(f"{what}: unclear error {e}")
    return bad
