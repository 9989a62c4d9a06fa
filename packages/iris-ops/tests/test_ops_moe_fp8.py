"""Float8 MoE dispatch: float8 tokens with their block scales (``x_scales``), and bf16 / fp32
tokens quantized in the dispatch kernel (``quantize=``), against references built from every
rank's inputs (gathered with ``torch.distributed.all_gather_object``).

Moved rows and scales must equal the reference byte for byte; quantized rows must equal
torch's quantization of the same formula (``scale = max(amax, 1e-12) / fp8_max`` per token
and 128 channels, ``(x / scale).clamp(-max, max).to(fp8)``: round to nearest even,
saturating), on data holding exact ties, subnormals, negative zeros and blocks of zeros; the
combine of the dequantized rows (bf16) must match the fp64 sum within bf16's rounding.
"""

import pytest
import torch
from ops_testutils import assert_clean, require_world, setup_rank
from test_ops_moe import _expect, reference, routing

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
WORLD_TIMEOUT = 240.0
E4M3, E5M2, BF, F32 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float32
BLOCK = 128

#: (fp8 format, mode, source dtype, hidden, top-k, experts, tokens per rank)
CASES = {
    1: [(E4M3, "quantize", BF, 384, 2, 4, (6,)), (E5M2, "scales", None, 256, 3, 4, (5,))],
    3: [(E4M3, "quantize", BF, 256, 2, 6, (4, 0, 5)), (E4M3, "scales", None, 384, 2, 6, (3, 5, 2))],
    "full 2": [
        (E5M2, "quantize", F32, 384, 3, 4, (5, 2)),
        (E4M3, "scales", None, 256, 2, 4, (2, 6)),
        (E5M2, "quantize", BF, 128, 4, 8, (7, 1)),
    ],
    "full 3": [(E5M2, "quantize", BF, 384, 3, 6, (2, 6, 1)), (E5M2, "scales", None, 256, 2, 9, (4, 4, 0))],
    "full 4": [
        (E4M3, "quantize", F32, 256, 3, 8, (3, 0, 5, 2)),
        (E5M2, "scales", None, 128, 2, 4, (1, 3, 2, 4)),
    ],
}


def quantize_reference(x: torch.Tensor, fmt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's quantization of ``x`` [T, H]: one fp32 scale per token and block of 128."""
    t, h = x.shape
    blocks = x.float().view(t, h // BLOCK, BLOCK)
    fmax = torch.finfo(fmt).max
    scales = blocks.abs().amax(-1).clamp(min=1e-12) / fmax
    q = (blocks / scales[..., None]).clamp(-fmax, fmax).to(fmt)
    return q.view(t, h), scales


def tokens_for(rank, case, call, fmt, src, hidden, count):
    """``count`` tokens with the hard cases: a block at the format's maximum whose other
    values sit exactly halfway between two float8 values (ties to even), subnormals and
    negative zeros; a block of zeros; the rest random."""
    g = torch.Generator().manual_seed(1000 * case + 10 * call + rank)
    x = torch.randn(count, hidden, generator=g) * 3
    if count:
        fmax = torch.finfo(fmt).max
        grid = torch.arange(256, dtype=torch.uint8).view(fmt).float()
        grid = grid[torch.isfinite(grid) & (grid > 0)].sort().values
        halfway = (grid[1:] + grid[:-1]) / 2  # amax = fmax: scale 1, so these stay halfway
        x[0, :BLOCK] = halfway[torch.randint(0, halfway.numel(), (BLOCK,), generator=g)]
        x[0, 0], x[0, 1], x[0, 2], x[0, 3] = fmax, -0.0, grid[0], -grid[1] / 2
    if count > 1:
        x[1, BLOCK : 2 * BLOCK] = 0.0
    return x.to(src) if src is not None else x


def fp8_case(rank, world, case, fmt, mode, src, hidden, k, experts, tokens, calls):
    import torch.distributed as dist

    import iris.ops

    dev = setup_rank()
    problems = []
    for call in range(calls):
        label = f"world={world} {fmt} {mode} {src} H={hidden} K={k} E={experts} T={tokens} call {call}"
        x = tokens_for(rank, case, call, fmt, src if mode == "quantize" else BF, hidden, tokens[rank])
        if mode == "quantize":
            want_x, want_s = quantize_reference(x, fmt)
        else:
            x, scales = quantize_reference(x, fmt)
            want_x, want_s = x, scales
        idx = routing(rank, world, tokens[rank], k, experts, 50 * case + call)
        w = torch.rand(tokens[rank], k, generator=torch.Generator().manual_seed(rank + 7 * call))
        everyone = [None] * world
        dist.all_gather_object(everyone, (want_x.view(torch.uint8), want_s, idx, w))
        xs, ss, idxs, ws = zip(*everyone)
        rows, counts, _ = reference(xs, idxs, ws, rank, world, experts)
        scale_rows, _, _ = reference(ss, idxs, ws, rank, world, experts)
        if mode == "quantize":
            d = iris.ops.moe_dispatch(x.to(dev), idx.to(dev), experts, quantize=fmt)
        else:
            d = iris.ops.moe_dispatch(x.to(dev), idx.to(dev), experts, x_scales=scales.to(dev))
        n = sum(counts)
        if d.tokens.dtype != fmt or d.scales is None or list(d.scales.shape) != [d.capacity, hidden // BLOCK]:
            problems.append(
                f"{label}: tokens {d.tokens.dtype}, scales {None if d.scales is None else d.scales.shape}"
            )
            continue
        got = d.tokens[:n].view(torch.uint8).cpu()
        if not torch.equal(got, rows):
            bad = (got != rows).nonzero()[:4].tolist()
            problems.append(f"{label}: float8 bytes differ from the reference at {bad}")
        if not torch.equal(d.scales[:n].cpu(), scale_rows):
            problems.append(f"{label}: scales differ from the reference")
        if d.expert_counts.tolist() != counts:
            problems.append(f"{label}: expert_counts {d.expert_counts.tolist()} != {counts}")
        # the experts: identity on the dequantized rows, combined in bf16
        blocks = hidden // BLOCK
        rows_bf = (d.tokens.float().view(d.capacity, blocks, BLOCK) * d.scales[:, :, None]).view(
            d.capacity, hidden
        )
        y = iris.ops.moe_combine(rows_bf.to(BF), d, w.to(dev)).double().cpu()
        deq = want_x.double().view(tokens[rank], blocks, BLOCK) * want_s.double()[..., None]
        deq = deq.view(tokens[rank], hidden)
        want_y = (deq[:, None, :] * (w.double() * (idx >= 0))[:, :, None]).sum(1)
        atol = 2.0**-7 * max(want_y.abs().max().item() if want_y.numel() else 0.0, 1.0)
        if y.shape != want_y.shape or not (y - want_y).abs().le(atol).all():
            problems.append(f"{label}: combine of the dequantized rows is off")
    return problems


def fp8_bad_inputs(rank, world_size) -> list[str]:
    """Float8 arguments that do not fit raise on every rank, naming the argument."""
    import iris.ops

    dev = setup_rank()
    bad, experts = [], 2 * world_size
    x = torch.randn(3, 256, device=dev)
    x8, scales = quantize_reference(x, E4M3)
    idx = torch.zeros(3, 1, dtype=torch.int64, device=dev)
    dispatch = iris.ops.moe_dispatch
    calls = {
        "scales of another shape": (
            ValueError, ["x_scales", "shape"], lambda: dispatch(x8, idx, experts, x_scales=scales[:, :1])
        ),
        "scales with bf16 x": (
            TypeError, ["x_scales"], lambda: dispatch(x.to(BF), idx, experts, x_scales=scales)
        ),
        "scales not fp32": (
            TypeError, ["float32"], lambda: dispatch(x8, idx, experts, x_scales=scales.double())
        ),
        "quantize float8 x": (TypeError, ["quantize"], lambda: dispatch(x8, idx, experts, quantize=E4M3)),
        "quantize to bf16": (ValueError, ["quantize"], lambda: dispatch(x, idx, experts, quantize=BF)),
        "hidden not a multiple of 128": (
            ValueError, ["128"], lambda: dispatch(x[:, :200], idx, experts, quantize=E4M3)
        ),
        "both": (ValueError, ["not both"], lambda: dispatch(x, idx, experts, x_scales=scales, quantize=E4M3)),
    }  # fmt: skip
    for what, (exc, words, call) in calls.items():
        _expect(bad, what, exc, words, call)
    d = iris.ops.moe_dispatch(x8, idx, experts, x_scales=scales)
    w = torch.ones(3, 1, device=dev)
    _expect(
        bad,
        "fp32 combine after float8",
        TypeError,
        ["bf16"],
        lambda: iris.ops.moe_combine(d.tokens.float(), d, w),
    )
    iris.ops.moe_combine(d.tokens.to(BF), d, w)
    return bad


def body(rank, world_size, cases, errors, calls=1):
    import torch.distributed as dist

    import iris.ops

    bad = []
    for i, case in enumerate(cases):
        bad += fp8_case(rank, world_size, i, *case, calls=calls)
    if errors:
        bad += fp8_bad_inputs(rank, world_size)
    dist.barrier()
    iris.ops.release_workspaces()
    return {"bad": bad, "cases": len(cases) + errors}


@pytest.mark.parametrize("world_size", [1, 3])
def test_fp8_dispatch_matches_reference(world_size):
    """Worlds 1 and 3: both modes (e4m3 quantized, scales moved; e5m2 at 1), one call each;
    bad input at 3. Worlds 2-4, both formats, two calls each in ``tests_full``."""
    require_world(world_size)
    cases = CASES[world_size]
    results = run_world(body, world_size, cases, world_size == 3, timeout=WORLD_TIMEOUT)
    assert_clean(results, len(cases) + (world_size == 3))


@pytest.mark.full
@pytest.mark.parametrize("world_size", ["full 2", "full 3", "full 4"])
def test_fp8_dispatch_matches_reference_full(world_size):
    ranks = int(world_size[-1])
    require_world(ranks)
    cases = CASES[world_size]
    assert_clean(run_world(body, ranks, cases, False, 2, timeout=WORLD_TIMEOUT), len(cases))


def test_quantize_reference_rounds_ties_to_even():
    """Negative control of the reference: halfway values go to the even neighbour, not up
    (Triton's interpreter rounds them away from zero; the kernel must not)."""
    x = torch.zeros(1, BLOCK)
    x[0, 0], x[0, 1], x[0, 2] = 448.0, 1.0625, 1.1875  # e4m3: 1.0 | 1.125 | 1.25 around them
    q, scales = quantize_reference(x, E4M3)
    assert scales.item() == 1.0
    assert q[0, 1].item() == 1.0 and q[0, 2].item() == 1.25
