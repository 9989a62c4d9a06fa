"""Remote memory access between every pair of ranks: load, store, get, put and copy.

Each world runs every op from every calling rank to every peer (itself included), on
every dtype of ``mem_testutils.DTYPES``, through both the :class:`Context` methods and the
functional forms, on ``N = 203`` elements (not a multiple of the block) with a mask that
also drops some lanes inside ``N``. Destinations are pre-filled with a sentinel so a write
to a masked-off lane shows; masked loads must return ``other``. Data depends on the
source rank and on the target rank, so a pointer translated to the wrong heap shows too.

All checks of one world are batched into one launch of the world: a rank returns the
list of what it found wrong and the test asserts that every list is empty.
"""

import pytest
import torch
import triton
import triton.language as tl
from mem_testutils import DTYPES, HEAP, WORLD_SIZES, pattern, require_world

import iris.mem
import iris.mem.triton as imt
from iris.mem.testing import run_world
from iris.mem.triton import Context

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

N = 203  # elements per buffer that the mask may reach
BLOCK = 64
NP = 256  # allocated elements: the grid covers them all, lanes >= N are masked off
GRID = (NP // BLOCK,)
SENTINEL = -3  # destination fill: exact in every dtype, distinct from every pattern value
OTHER = -5  # `other` of masked loads


def other_for(dtype: torch.dtype):
    """``OTHER`` typed like the data: Triton 3.6's interpreter turns an int ``other``
    into NaN for bf16 loads (a Triton quirk, not iris), so floats get a float."""
    return float(OTHER) if dtype.is_floating_point else OTHER


CTX, FUN = 0, 1
MODES = {CTX: "Context", FUN: "functional"}

# 2-D tiles
M2, N2 = 37, 50  # valid region
ROWS, COLS = 48, 64  # allocated; the grid of [16, 32] tiles covers it exactly
TILE_M, TILE_N = 16, 32


@triton.jit
def _lane_mask(offs, n):
    # Drops every lane >= n and, inside n, every 5th lane starting at 2.
    return (offs < n) & (offs % 5 != 2)


@triton.jit
def _load_kernel(
    context, heap_bases, src, out, n, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr, HINT: tl.constexpr,
    OTHER: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = _lane_mask(offs, n)
    if MODE == 0:
        ctx = Context.initialize(context, RANK, WORLD)
        v = ctx.load(src + offs, peer, mask=mask, other=OTHER, hint=HINT)
    else:
        v = imt.load(src + offs, RANK, peer, heap_bases, mask=mask, other=OTHER, hint=HINT)
    tl.store(out + offs, v)  # every lane: masked lanes must hold `other`


@triton.jit
def _store_kernel(
    context, heap_bases, vals, dst, n, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr, HINT: tl.constexpr,
    OTHER: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = _lane_mask(offs, n)
    v = tl.load(vals + offs)
    if MODE == 0:
        ctx = Context.initialize(context, RANK, WORLD)
        ctx.store(dst + offs, v, peer, mask=mask, hint=HINT)
    else:
        imt.store(dst + offs, v, RANK, peer, heap_bases, mask=mask, hint=HINT)


@triton.jit
def _get_kernel(
    context, heap_bases, src, dst, n, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr, HINT: tl.constexpr,
    OTHER: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = _lane_mask(offs, n)
    if MODE == 0:
        ctx = Context.initialize(context, RANK, WORLD)
        ctx.get(src + offs, dst + offs, peer, mask=mask, other=OTHER, hint=HINT)
    else:
        imt.get(src + offs, dst + offs, peer, RANK, heap_bases, mask=mask, other=OTHER, hint=HINT)


@triton.jit
def _put_kernel(
    context, heap_bases, src, dst, n, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr, HINT: tl.constexpr,
    OTHER: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = _lane_mask(offs, n)
    if MODE == 0:
        ctx = Context.initialize(context, RANK, WORLD)
        ctx.put(src + offs, dst + offs, peer, mask=mask, other=OTHER, hint=HINT)
    else:
        imt.put(src + offs, dst + offs, RANK, peer, heap_bases, mask=mask, other=OTHER, hint=HINT)


@triton.jit
def _copy_kernel(
    context, heap_bases, src, dst, n, from_rank, to_rank,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr, HINT: tl.constexpr,
    OTHER: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = _lane_mask(offs, n)
    if MODE == 0:
        ctx = Context.initialize(context, RANK, WORLD)
        ctx.copy(src + offs, dst + offs, from_rank, to_rank, mask=mask, other=OTHER, hint=HINT)
    else:
        imt.copy(
            src + offs, dst + offs, from_rank, to_rank, RANK, heap_bases, mask=mask, other=OTHER, hint=HINT
        )


def lane_mask(n_alloc: int, n: int) -> torch.Tensor:
    """Host twin of ``_lane_mask``."""
    offs = torch.arange(n_alloc)
    return (offs < n) & (offs % 5 != 2)


def _compare(failures: list, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu(), want.cpu()  # device buffers against host-built references
    if not torch.equal(got, want):
        got, want = got.flatten(), want.flatten()
        bad = (got != want).nonzero().flatten().tolist()
        i = bad[0]
        failures.append(
            f"{what}: {len(bad)} wrong elements, first at {i}: got {got[i].item()}, want {want[i].item()}"
        )


def _masked(values: torch.Tensor, fill: float) -> torch.Tensor:
    """``values`` where the kernels' mask is on, ``fill`` elsewhere."""
    m = lane_mask(values.numel(), N)
    return torch.where(m, values, torch.full_like(values, fill))


def rma_body(rank: int, world: int, dtypes: list, hint) -> list[str]:
    """Every op, every (caller, peer) pair, every dtype; returns this rank's failures."""
    heap = iris.mem.init(HEAP)
    failures: list[str] = []
    try:
        ranks = range(world)
        ctx_t, bases = heap.get_device_context(), heap.get_heap_bases()
        common = dict(RANK=rank, WORLD=world, BLOCK=BLOCK, HINT=hint)
        bufs = {}
        # Phase 1: allocate (same sequence on every rank) and fill.
        for dt in dtypes:
            b = bufs[dt] = {}
            b["src"] = heap.as_symmetric(pattern(NP, dt, rank))
            # Data this rank sends to peer p depends on p (a misrouted write shows).
            b["put_src"] = [heap.as_symmetric(pattern(NP, dt, rank, salt=10 + p)) for p in ranks]
            b["copy_src"] = [heap.as_symmetric(pattern(NP, dt, rank, salt=30 + t)) for t in ranks]
            # ordinary (non-heap) device memory
            b["store_vals"] = [pattern(NP, dt, rank, salt=20 + p).to(heap.device) for p in ranks]
            # Destinations: [mode][writer] (store, put), [mode][source] (get),
            # [mode][caller][source] (copy); all start as the sentinel.
            for name in ("store_dst", "put_dst", "get_dst"):
                b[name] = [[heap.full((NP,), SENTINEL, dtype=dt) for _ in ranks] for _ in MODES]
            b["copy_dst"] = [
                [[heap.full((NP,), SENTINEL, dtype=dt) for _ in ranks] for _ in ranks] for _ in MODES
            ]
            b["load_out"] = [
                [torch.full((NP,), SENTINEL, dtype=dt, device=heap.device) for _ in ranks] for _ in MODES
            ]
        heap.barrier()

        # Phase 2: every op from this rank to every peer (itself included), both modes.
        for dt in dtypes:
            b = bufs[dt]
            common["OTHER"] = other_for(dt)
            for mode in MODES:
                for p in ranks:
                    _load_kernel[GRID](
                        ctx_t, bases, b["src"], b["load_out"][mode][p], N, p, MODE=mode, **common
                    )
                    _store_kernel[GRID](
                        ctx_t,
                        bases,
                        b["store_vals"][p],
                        b["store_dst"][mode][rank],
                        N,
                        p,
                        MODE=mode,
                        **common,
                    )
                    _get_kernel[GRID](
                        ctx_t, bases, b["src"], b["get_dst"][mode][p], N, p, MODE=mode, **common
                    )
                    _put_kernel[GRID](
                        ctx_t, bases, b["put_src"][p], b["put_dst"][mode][rank], N, p, MODE=mode, **common
                    )
                    # Copy from every source f to every target t (remote->local,
                    # local->remote, remote->remote, local->local).
                    for t in ranks:
                        _copy_kernel[GRID](
                            ctx_t, bases, b["copy_src"][t], b["copy_dst"][mode][rank][p], N, p, t,
                            MODE=mode, **common,
                        )  # fmt: skip
        heap.barrier()

        # Phase 3: check what landed here.
        for dt in dtypes:
            b = bufs[dt]
            for mode, mname in MODES.items():
                for p in ranks:
                    tag = f"{dt} {mname} rank {rank}"
                    _compare(
                        failures,
                        f"{tag}: load from {p}",
                        b["load_out"][mode][p],
                        _masked(pattern(NP, dt, p), OTHER),
                    )
                    _compare(
                        failures,
                        f"{tag}: store from {p}",
                        b["store_dst"][mode][p],
                        _masked(pattern(NP, dt, p, salt=20 + rank), SENTINEL),
                    )
                    _compare(
                        failures,
                        f"{tag}: get from {p}",
                        b["get_dst"][mode][p],
                        _masked(pattern(NP, dt, p), SENTINEL),
                    )
                    _compare(
                        failures,
                        f"{tag}: put from {p}",
                        b["put_dst"][mode][p],
                        _masked(pattern(NP, dt, p, salt=10 + rank), SENTINEL),
                    )
                    for f in ranks:
                        kind = {
                            (True, True): "local->local",
                            (False, True): "remote->local",
                            (True, False): "local->remote",
                            (False, False): "remote->remote",
                        }[(f == p, rank == p)]
                        # Caller p copied from f to this rank: `kind` as seen from p.
                        _compare(
                            failures,
                            f"{tag}: copy by {p} from {f} ({kind} for the caller)",
                            b["copy_dst"][mode][p][f],
                            _masked(pattern(NP, dt, f, salt=30 + rank), SENTINEL),
                        )
            # Context methods and functional forms agree exactly.
            for name in ("store_dst", "put_dst", "get_dst", "load_out"):
                for p in ranks:
                    if not torch.equal(b[name][CTX][p], b[name][FUN][p]):
                        failures.append(
                            f"{dt} rank {rank}: {name}[{p}] differs between Context and functional"
                        )
            # Negative control: the sentinel check can see an unwritten lane. Masked lanes
            # inside N exist, hold the sentinel, and a buffer nobody wrote fails the check.
            m = lane_mask(NP, N)
            assert (~m[:N]).sum() > 0
            dst = b["put_dst"][CTX][(rank + 1) % world].cpu()
            if not bool((dst[~m] == SENTINEL).all()):
                failures.append(f"{dt} rank {rank}: masked-off lanes of put_dst lost the sentinel")
            untouched = torch.full((NP,), SENTINEL, dtype=dt)
            probe: list[str] = []
            _compare(probe, "probe", untouched, _masked(pattern(NP, dt, 0), SENTINEL))
            if not probe:
                failures.append(f"{dt}: negative control: an unwritten buffer passed the check")
        heap.barrier()
    finally:
        heap.close()
    return failures


def _flatten(results: list[list[str]]) -> list[str]:
    return [f for rank_failures in results for f in rank_failures]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rma_all_pairs_all_dtypes(world_size):
    require_world(world_size)
    failures = _flatten(run_world(rma_body, world_size, DTYPES, None, timeout=120))
    assert failures == [], "\n".join(failures[:40])


@pytest.mark.parametrize("world_size", [2, 3])
def test_rma_hint16(world_size):
    """The same checks with ``hint=16`` on the 1-D blocks (64 contiguous, 16-aligned)."""
    require_world(world_size)
    failures = _flatten(
        run_world(rma_body, world_size, [torch.float32, torch.bfloat16, torch.int64], 16, timeout=120)
    )
    assert failures == [], "\n".join(failures[:40])


# --------------------------------------------------------------------------- 2-D tiles


@triton.jit
def _tile_offsets(stride, m, n, TILE_M: tl.constexpr, TILE_N: tl.constexpr):
    rm = tl.program_id(0) * TILE_M + tl.arange(0, TILE_M)
    rn = tl.program_id(1) * TILE_N + tl.arange(0, TILE_N)
    offs = rm[:, None] * stride + rn[None, :]
    mask = (rm[:, None] < m) & (rn[None, :] < n)
    return offs, mask


@triton.jit
def _load2d_kernel(
    context, heap_bases, src, out, stride, m, n, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr, MODE: tl.constexpr,
    OTHER: tl.constexpr,
):  # fmt: skip
    offs, mask = _tile_offsets(stride, m, n, TILE_M, TILE_N)
    if MODE == 0:
        ctx = Context.initialize(context, RANK, WORLD)
        v = ctx.load(src + offs, peer, mask=mask, other=OTHER, hint=(1, TILE_N))
    else:
        v = imt.load(src + offs, RANK, peer, heap_bases, mask=mask, other=OTHER, hint=(1, TILE_N))
    tl.store(out + offs, v)


@triton.jit
def _store2d_kernel(
    context, heap_bases, vals, dst, stride, m, n, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr, MODE: tl.constexpr,
    OTHER: tl.constexpr,
):  # fmt: skip
    offs, mask = _tile_offsets(stride, m, n, TILE_M, TILE_N)
    v = tl.load(vals + offs)
    if MODE == 0:
        ctx = Context.initialize(context, RANK, WORLD)
        ctx.store(dst + offs, v, peer, mask=mask, hint=(1, TILE_N))
    else:
        imt.store(dst + offs, v, RANK, peer, heap_bases, mask=mask, hint=(1, TILE_N))


def _pattern2d(dt, rank, salt=0):
    return pattern(ROWS * COLS, dt, rank, salt).view(ROWS, COLS)


def _mask2d():
    return (torch.arange(ROWS)[:, None] < M2) & (torch.arange(COLS)[None, :] < N2)


def tile_body(rank: int, world: int) -> list[str]:
    heap = iris.mem.init(HEAP)
    failures: list[str] = []
    try:
        ranks = range(world)
        ctx_t, bases = heap.get_device_context(), heap.get_heap_bases()
        grid = (ROWS // TILE_M, COLS // TILE_N)
        common = dict(RANK=rank, WORLD=world, TILE_M=TILE_M, TILE_N=TILE_N)
        dtypes = [torch.float32, torch.bfloat16, torch.int32]
        bufs = {}
        for dt in dtypes:
            bufs[dt] = {
                "src": heap.as_symmetric(_pattern2d(dt, rank)),
                "dst": [[heap.full((ROWS, COLS), SENTINEL, dtype=dt) for _ in ranks] for _ in MODES],
                "out": [
                    [torch.full((ROWS, COLS), SENTINEL, dtype=dt, device=heap.device) for _ in ranks]
                    for _ in MODES
                ],
                "vals": [_pattern2d(dt, rank, salt=40 + p).to(heap.device) for p in ranks],
            }
        heap.barrier()
        for dt in dtypes:
            b = bufs[dt]
            common["OTHER"] = other_for(dt)
            for mode in MODES:
                for p in ranks:
                    _load2d_kernel[grid](
                        ctx_t, bases, b["src"], b["out"][mode][p], COLS, M2, N2, p, MODE=mode, **common
                    )
                    _store2d_kernel[grid](
                        ctx_t, bases, b["vals"][p], b["dst"][mode][rank], COLS, M2, N2, p, MODE=mode, **common
                    )
        heap.barrier()
        m = _mask2d()
        for dt in dtypes:
            b = bufs[dt]
            for mode, mname in MODES.items():
                for p in ranks:
                    want = torch.where(m, _pattern2d(dt, p), torch.full((ROWS, COLS), OTHER, dtype=dt))
                    _compare(
                        failures, f"2-D {dt} {mname}: rank {rank} load from {p}", b["out"][mode][p], want
                    )
                    want = torch.where(
                        m, _pattern2d(dt, p, salt=40 + rank), torch.full((ROWS, COLS), SENTINEL, dtype=dt)
                    )
                    _compare(
                        failures, f"2-D {dt} {mname}: rank {rank} store from {p}", b["dst"][mode][p], want
                    )
        heap.barrier()
    finally:
        heap.close()
    return failures


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rma_2d_tiles(world_size):
    """[16, 32] pointer blocks with ``hint=(1, 32)``; a 37 x 50 region of a 48 x 64 buffer."""
    require_world(world_size)
    failures = _flatten(run_world(tile_body, world_size, timeout=120))
    assert failures == [], "\n".join(failures[:40])
