"""The ``ll`` variant (flag in every 8-byte word, no barrier) of all_reduce, all_gather,
reduce_scatter and all_to_all, against ``torch.distributed``.

What is particular to it and tested here: elements of 1, 2, 4 and 8 bytes packed into
32-bit words (counts whose bytes are not whole words, tails of a tile), tiles as small as
16 words and launches split by ``chunk_elements`` (many programs, many launches per call),
calls of different sizes one after another, interleaved with ``boxed`` on one communicator
(the boxes keep words of older launches: no old flag may pass for this launch's), both
banks many times over,
in-place all_reduce and all_gather, plain (non-heap) and non-contiguous tensors, and a wait that
gives up with ``DeviceWaitTimeout`` when a peer never sends. The same bodies run on GPUs
with ``IRIS_BACKEND=cuda``.
"""

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import (
    BACKEND,
    device,
    dtype_name,
    make_input,
    mismatch,
    reduced,
    require_world,
    setup_rank,
)

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

WORLD_TIMEOUT = 400.0
#: (block_size in words, chunk_elements, element counts): odd byte counts for the half and
#: 1-byte types, one tile per launch up to many tiles per program and several launches.
SHAPES = ((16, 0, (1, 3, 45)), (64, 300, (1000,)), (256, 0, (4099,)))
#: Worlds of 3 and 4 (slower in the interpreter): the packing widths once each.
SHAPES_LARGER_WORLDS = ((16, 0, (3, 45)), (64, 300, (1000,)))
FP8 = getattr(torch, "float8_e4m3fn", None)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """Bytes of ``x`` (flat, contiguous): moves are compared bit for bit (fp8 included)."""
    return x.detach().cpu().contiguous().view(torch.uint8)


def _gathered(x: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``x`` as bytes."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, _bits(x))
    return everyone


def ll_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    bad: list[str] = []
    cases = 0
    salt = 0
    size = world_size
    with iris.mem.init(1 << 22) as heap:
        small = size == 2
        for block, chunk, counts in SHAPES if small else SHAPES_LARGER_WORLDS:
            cfg = ccl.Config(variant="ll", block_size=block, chunk_elements=chunk)
            reductions = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)
            reductions = reductions if small else (torch.bfloat16, torch.int64)
            for dtype in reductions:
                for n in counts:
                    ops = ["SUM", "MAX"] + (["AVG"] if dtype.is_floating_point else ["MIN"])
                    for op in ops if n == 1000 else ops[:1]:
                        salt += 1
                        x = make_input((n,), dtype, rank, salt)
                        what = f"block={block} chunk={chunk} {dtype_name(dtype)} n={n} {op}"
                        want = reduced(x, op)
                        out = torch.full_like(x, 77)
                        ccl.all_reduce(out, x, op=getattr(ccl.ReduceOp, op), config=cfg)
                        if (m := mismatch(out, want, f"all_reduce {what}")) is not None:
                            bad.append(m)
                        inplace = x.clone()
                        ccl.all_reduce(inplace, inplace, op=getattr(ccl.ReduceOp, op), config=cfg)
                        if (m := mismatch(inplace, want, f"all_reduce in place {what}")) is not None:
                            bad.append(m)
                        # reduce_scatter of size * n elements: chunk ME of the reduction
                        y = make_input((size * n,), dtype, rank, salt + 1000)
                        rs = torch.full((n,), 77, dtype=dtype, device=x.device)
                        ccl.reduce_scatter(rs, y, op=getattr(ccl.ReduceOp, op), config=cfg)
                        want_rs = reduced(y, op)[rank * n : (rank + 1) * n]
                        if (m := mismatch(rs, want_rs, f"reduce_scatter {what}")) is not None:
                            bad.append(m)
                        cases += 3
            moves = [torch.float32, torch.bfloat16, torch.int64] + ([FP8] if FP8 is not None else [])
            moves = moves if small else moves[1:]
            for dtype in moves:
                for n in counts:
                    salt += 1
                    x = make_input((n,), torch.float32, rank, salt).to(dtype)
                    what = f"block={block} chunk={chunk} {dtype_name(dtype)} n={n}"
                    everyone = _gathered(x)
                    ag = torch.zeros((size * n,), dtype=dtype, device=x.device)
                    ccl.all_gather(ag, x, config=cfg)
                    if not torch.equal(_bits(ag), torch.cat(everyone)):
                        bad.append(f"all_gather {what}: differs")
                    # in place: the input is this rank's chunk of the output
                    ag2 = torch.zeros((size * n,), dtype=dtype, device=x.device)
                    ag2[rank * n : (rank + 1) * n] = x
                    ccl.all_gather(ag2, ag2[rank * n : (rank + 1) * n], config=cfg)
                    if not torch.equal(_bits(ag2), torch.cat(everyone)):
                        bad.append(f"all_gather in place {what}: differs")
                    # all_to_all: chunk j of rank i's input ends in chunk i of rank j's output
                    y = make_input((size * n,), torch.float32, rank, salt + 2000).to(dtype)
                    sent = _gathered(y)
                    a2a = torch.zeros_like(y)
                    ccl.all_to_all(a2a, y, config=cfg)
                    isz = y.element_size()
                    want = torch.cat([sent[i][rank * n * isz : (rank + 1) * n * isz] for i in range(size)])
                    if not torch.equal(_bits(a2a), want):
                        bad.append(f"all_to_all {what}: differs")
                    cases += 3
        # Sizes up and down on one communicator: a small call after a large one (the boxes
        # hold the large call's words), heap tensors, a non-contiguous input, 40 calls in a
        # row (both banks many times over), every third one boxed (its own boxes and counter).
        hx = heap.zeros(4099)
        calls = [4099, 5, 4099, 2000, 1, 4099] + [17 + 97 * k for k in range(40 if small else 6)]
        for i, n in enumerate(calls):
            salt += 1
            x = make_input((n,), torch.float32, rank, salt)
            hx[:n] = x
            cfg = ccl.Config(variant="ll" if i % 3 else "boxed", block_size=32)
            ccl.all_reduce(hx[:n], hx[:n], config=cfg)
            if (m := mismatch(hx[:n], reduced(x, "SUM"), f"sequence call {i} n={n}")) is not None:
                bad.append(m)
            cases += 1
        x = make_input((37, 8), torch.bfloat16, rank, salt + 1).t()  # non-contiguous
        out = torch.zeros_like(x)
        ccl.all_reduce(out, x, config=ccl.Config(variant="ll"))
        if (m := mismatch(out, reduced(x, "SUM"), "non-contiguous bf16")) is not None:
            bad.append(m)
        # a subgroup (worlds of 3 and 4): its own communicator and launch counter
        if size >= 3:
            sub = dist.new_group(list(range(size - 1)))
            if rank < size - 1:
                x = make_input((1001,), torch.bfloat16, rank, salt + 2)
                out = torch.zeros_like(x)
                for _ in range(3):
                    ccl.all_reduce(out, x, group=sub, config=ccl.Config(variant="ll", block_size=64))
                if (m := mismatch(out, reduced(x, "SUM", sub), "subgroup")) is not None:
                    bad.append(m)
            dist.barrier()
        if x.is_cuda:
            torch.cuda.synchronize()
        ccl.check_errors()
    return bad, cases


@pytest.mark.parametrize(
    "world_size", [pytest.param(2, marks=pytest.mark.full), 3, pytest.param(4, marks=pytest.mark.full)]
)
def test_ll_matches_torch_distributed(world_size):
    require_world(world_size)
    results = run_world(ll_body, world_size, timeout=WORLD_TIMEOUT)
    for bad, cases in results:
        assert cases > 50
        assert not bad, "\n".join(bad[:20])


def silent_peer_body(rank, world_size):
    """Rank 0 calls an ll all_reduce that rank 1 never joins: rank 0's wait gives up."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    x = torch.ones(100, device=device())
    ccl.all_reduce(x, x, config=ccl.Config(variant="ll"))  # both: the communicator exists
    outcome = "completed"
    if rank == 0:
        try:
            ccl.all_reduce(x, x, config=ccl.Config(variant="ll"))
            if x.is_cuda:
                torch.cuda.synchronize()
            ccl.check_errors()
        except iris.mem.DeviceWaitTimeout as e:
            outcome = f"timeout: {e}"
    dist.barrier()
    return outcome


def test_ll_gives_up_on_a_silent_peer():
    require_world(2)
    seconds = "0.5" if BACKEND == "cuda" else "2"
    results = run_world(silent_peer_body, 2, timeout=WORLD_TIMEOUT, env={"IRIS_WAIT_TIMEOUT": seconds})
    assert results[0].startswith("timeout: rank 0: a collective gave up waiting for rank 1"), results[0]
    assert results[1] == "completed"
