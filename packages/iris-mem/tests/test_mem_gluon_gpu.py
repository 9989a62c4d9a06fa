"""GPU tier of the Gluon device API (``IRIS_BACKEND=cuda``, ``-m gpu``): the kernels of
test_mem_gluon (compiled for sm_90 in the CPU tier) run between the GPUs, with the checks
of the Triton tests (test_mem_rma, test_mem_atomics, test_mem_gpu), whose reference
helpers they import: values from every rank to every rank, masks and ``other``, every
dtype, 2-D tiles, the vectorised path, atomics' returned and final values, atomics under
contention from every SM, message passing with release/acquire flags at system scope,
and (test_mem_tracing's check) the events ``tracing=True`` records.
"""

import os

import pytest
import torch
from mem_testutils import DTYPES, HEAP, pattern, require_world
from test_mem_atomics import BLOCK as ATOMIC_BLOCK
from test_mem_atomics import N as ATOMIC_N
from test_mem_atomics import _apply, _data, _mask
from test_mem_gluon import (
    ATOMIC_ROWS,
    BLOCK,
    NAMES,
    _atomics_kernel,
    _contention_kernel,
    _copy_kernel,
    _identity_kernel,
    _message_passing_kernel,
    _rma_kernel,
    _tile_kernel,
    _traced_kernel,
    _vector_kernel,
    rows_mask,
    supported_rows,
)
from test_mem_rma import (
    COLS,
    M2,
    N2,
    NP,
    OTHER,
    ROWS,
    SENTINEL,
    TILE_M,
    TILE_N,
    N,
    _compare,
    _mask2d,
    _masked,
    _pattern2d,
    other_for,
)
from test_mem_tracing import BLOCK as TRACE_BLOCK
from test_mem_tracing import (
    EVENTS_PER_PROGRAM,
    PROGRAMS,
    _events,
    _expected,
    _load,
    _observed,
    traced_buffers,
    traced_data_ok,
)
from test_mem_tracing import N as TRACE_N

import iris.mem
from iris.mem.testing import run_world, shares_gpus

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(BACKEND != "cuda", reason="Gluon kernels need GPUs: run with IRIS_BACKEND=cuda"),
]


def _run(world_size: int, body, *args, timeout: float = 240):
    require_world(world_size)
    return [f for rank_failures in run_world(body, world_size, *args, timeout=timeout) for f in rank_failures]


def identity_body(rank: int, world: int) -> list[str]:
    """Rank and world size come from the context tensor; translate matches the host's
    arithmetic on the heap bases."""
    with iris.mem.init(HEAP) as heap:
        buf = heap.zeros(100)
        out = torch.full((2 + world,), -1, dtype=torch.int64, device=heap.device)
        _identity_kernel[(1,)](heap.get_device_context(), buf, out, num_warps=1)
        bases = heap.get_heap_bases().cpu().tolist()
        want = [rank, world] + [bases[p] + buf.data_ptr() - bases[rank] for p in range(world)]
        got = out.cpu().tolist()
        heap.barrier()
        return [] if got == want else [f"rank {rank}: rank/world/translate {got}, want {want}"]


@pytest.mark.parametrize("world_size", [1, 2])
def test_gluon_rank_world_size_and_translate(world_size):
    failures = _run(world_size, identity_body)
    assert failures == [], "\n".join(failures)


def rma_body(rank: int, world: int, dtypes: list, hint) -> list[str]:
    """test_mem_rma's checks through the Gluon Context: every op from every rank to every
    rank (itself included), every dtype, masks and ``other``, sentinel-filled targets."""
    failures: list[str] = []
    ranks = range(world)
    grid = (NP // BLOCK,)
    with iris.mem.init(HEAP) as heap:
        ctx_t = heap.get_device_context()
        bufs = {}
        for dt in dtypes:  # same allocation sequence on every rank
            b = bufs[dt] = {"src": heap.as_symmetric(pattern(NP, dt, rank))}
            b["put_src"] = [heap.as_symmetric(pattern(NP, dt, rank, salt=10 + p)) for p in ranks]
            b["copy_src"] = [heap.as_symmetric(pattern(NP, dt, rank, salt=30 + t)) for t in ranks]
            b["store_vals"] = [pattern(NP, dt, rank, salt=20 + p).to(heap.device) for p in ranks]
            for name in ("store_dst", "put_dst", "get_dst"):  # [writer] or [source]
                b[name] = [heap.full((NP,), SENTINEL, dtype=dt) for _ in ranks]
            b["copy_dst"] = [
                [heap.full((NP,), SENTINEL, dtype=dt) for _ in ranks] for _ in ranks
            ]  # [caller][src]
            b["load_out"] = [torch.full((NP,), SENTINEL, dtype=dt, device=heap.device) for _ in ranks]
        heap.barrier()
        for dt in dtypes:
            b = bufs[dt]
            meta = dict(BLOCK=BLOCK, OTHER=other_for(dt), HINT=hint, num_warps=1)
            for p in ranks:
                args = (b["src"], b["put_src"][p], b["store_vals"][p], b["load_out"][p], b["store_dst"][rank])
                _rma_kernel[grid](ctx_t, *args, b["get_dst"][p], b["put_dst"][rank], N, p, **meta)
                for t in ranks:  # remote->local, local->remote, remote->remote, local->local
                    _copy_kernel[grid](ctx_t, b["copy_src"][t], b["copy_dst"][rank][p], N, p, t, **meta)
        heap.barrier()
        for dt in dtypes:
            b = bufs[dt]
            for p in ranks:
                tag = f"gluon {dt} hint={hint} rank {rank}"
                _compare(
                    failures, f"{tag}: load from {p}", b["load_out"][p], _masked(pattern(NP, dt, p), OTHER)
                )
                want = _masked(pattern(NP, dt, p, salt=20 + rank), SENTINEL)
                _compare(failures, f"{tag}: store from {p}", b["store_dst"][p], want)
                _compare(
                    failures, f"{tag}: get from {p}", b["get_dst"][p], _masked(pattern(NP, dt, p), SENTINEL)
                )
                want = _masked(pattern(NP, dt, p, salt=10 + rank), SENTINEL)
                _compare(failures, f"{tag}: put from {p}", b["put_dst"][p], want)
                for f in ranks:
                    want = _masked(pattern(NP, dt, f, salt=30 + rank), SENTINEL)
                    _compare(failures, f"{tag}: copy by {p} from {f}", b["copy_dst"][p][f], want)
        heap.barrier()
    return failures


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("hint", [None, 16])
def test_gluon_rma_all_pairs_all_dtypes(world_size, hint):
    failures = _run(world_size, rma_body, DTYPES, hint)
    assert failures == [], "\n".join(failures[:40])


def tile_body(rank: int, world: int) -> list[str]:
    """2-D [16, 32] tiles in a 2-D Gluon layout with ``hint=(1, 32)``: a 37 x 50 region of
    a 48 x 64 buffer, loaded from and stored into every rank."""
    failures: list[str] = []
    ranks = range(world)
    grid = (ROWS // TILE_M, COLS // TILE_N)
    with iris.mem.init(HEAP) as heap:
        ctx_t = heap.get_device_context()
        dtypes = [torch.float32, torch.bfloat16, torch.int32]
        bufs = {}
        for dt in dtypes:
            bufs[dt] = {
                "src": heap.as_symmetric(_pattern2d(dt, rank)),
                "dst": [heap.full((ROWS, COLS), SENTINEL, dtype=dt) for _ in ranks],
                "out": [torch.full((ROWS, COLS), SENTINEL, dtype=dt, device=heap.device) for _ in ranks],
            }
        heap.barrier()
        for dt in dtypes:
            b = bufs[dt]
            for p in ranks:
                _tile_kernel[grid](ctx_t, b["src"], b["dst"][rank], b["out"][p], COLS, M2, N2, p,
                                   TILE_M=TILE_M, TILE_N=TILE_N, num_warps=2)  # fmt: skip
        heap.barrier()
        m = _mask2d()
        for dt in dtypes:
            for p in ranks:
                want = torch.where(m, _pattern2d(dt, p), torch.full((ROWS, COLS), OTHER, dtype=dt))
                _compare(failures, f"gluon 2-D {dt}: rank {rank} load from {p}", bufs[dt]["out"][p], want)
                want = torch.where(m, _pattern2d(dt, p), torch.full((ROWS, COLS), SENTINEL, dtype=dt))
                _compare(failures, f"gluon 2-D {dt}: rank {rank} store from {p}", bufs[dt]["dst"][p], want)
        heap.barrier()
    return failures


@pytest.mark.parametrize("world_size", [1, 2])
def test_gluon_rma_2d_tiles(world_size):
    failures = _run(world_size, tile_body)
    assert failures == [], "\n".join(failures[:40])


def vector_body(rank: int, world: int) -> list[str]:
    """The vectorised path (unmasked, hint=16) moves the right values: every rank copies
    each peer's ``src`` into that peer's ``dst[rank]`` with remote loads and stores."""
    failures: list[str] = []
    with iris.mem.init(HEAP) as heap:
        ctx_t = heap.get_device_context()
        bufs = {}
        for dt in DTYPES:
            block = 16 // dt.itemsize * 32 * 4
            dst = [heap.full((3 * block,), SENTINEL, dtype=dt) for _ in range(world)]
            bufs[dt] = (heap.as_symmetric(pattern(3 * block, dt, rank)), dst, block)
        heap.barrier()
        for src, dst, block in bufs.values():
            for p in range(world):
                _vector_kernel[(3,)](ctx_t, src, dst[rank], p, BLOCK=block, HINT=16, num_warps=4)
        heap.barrier()
        for dt, (src, dst, _) in bufs.items():
            for w in range(world):
                _compare(failures, f"gluon vector {dt}: rank {w} copied rank {rank}'s src", dst[w], src)
        heap.barrier()
    return failures


@pytest.mark.parametrize("world_size", [1, 2])
def test_gluon_vectorised_remote_copy(world_size):
    failures = _run(world_size, vector_body)
    assert failures == [], "\n".join(failures[:40])


#: dtypes of the GPU atomics check (each with the rows it supports).
ATOMIC_DTYPES = [torch.int32, torch.int64, torch.float32, torch.float16, torch.bfloat16]


def _rows(dt: torch.dtype, kind: str, rank: int, salt: int) -> torch.Tensor:
    """test_mem_atomics's operands for every row, [9, BLOCK]."""
    return torch.stack([_data(dt, kind, rank, op, salt) for op in ATOMIC_ROWS])


def atomics_body(rank: int, world: int) -> list[str]:
    """test_mem_atomics's semantics check through the Gluon Context: each rank applies every
    supported atomic to every rank (itself included) on rows only it writes; returned old
    values and final values are compared with torch."""
    failures: list[str] = []
    ranks = range(world)
    m = _mask()
    even = torch.arange(BLOCK) % 2 == 0
    with iris.mem.init(HEAP) as heap:
        ctx_t = heap.get_device_context()
        targets = {dt: [heap.as_symmetric(_rows(dt, "init", rank, w)) for w in ranks] for dt in ATOMIC_DTYPES}
        heap.barrier()
        olds = {}
        for dt in ATOMIC_DTYPES:
            for p in ranks:
                init = _data(dt, "init", p, "cas", rank)  # the cas row of p's target for this rank
                cmps = torch.where(even, init, init + 1).to(heap.device)  # even lanes swap, odd keep
                vals = _rows(dt, "val", rank, p).to(heap.device)
                old = torch.zeros(len(ATOMIC_ROWS), BLOCK, dtype=dt, device=heap.device)
                _atomics_kernel[(1,)](ctx_t, targets[dt][rank], vals, cmps, old, ATOMIC_N, p, BLOCK=BLOCK,
                                      ROWS=rows_mask(NAMES[dt]), num_warps=1)  # fmt: skip
                olds[dt, p] = old
        heap.barrier()
        for dt in ATOMIC_DTYPES:
            for i, op in enumerate(ATOMIC_ROWS):
                if op not in supported_rows(NAMES[dt]):
                    continue
                lanes = torch.ones(BLOCK, dtype=torch.bool) if op == "cas" else m
                for p in ranks:
                    got, want = olds[dt, p][i].cpu(), _data(dt, "init", p, op, rank)
                    if not torch.equal(got[lanes], want[lanes]):
                        failures.append(f"gluon {op} {dt}: rank {rank} -> {p}: returned old values differ")
                for w in ranks:
                    init, vals = _data(dt, "init", rank, op, w), _data(dt, "val", w, op, rank)
                    want = torch.where(even, vals, init) if op == "cas" else _apply(op, init, vals)
                    want = torch.where(m, want, init) if op != "cas" else want
                    got = targets[dt][w][i].cpu()
                    if not torch.equal(got, want):
                        bad = (got != want).nonzero().flatten().tolist()
                        failures.append(
                            f"gluon {op} {dt}: {w} -> {rank}: {len(bad)} wrong lanes, first {bad[0]}: "
                            f"got {got[bad[0]].item()}, want {want[bad[0]].item()}"
                        )
        heap.barrier()
    return failures


@pytest.mark.parametrize("world_size", [1, 2])
def test_gluon_atomic_semantics(world_size):
    assert ATOMIC_BLOCK == BLOCK, "the operands of test_mem_atomics must fill one Gluon block"
    failures = _run(world_size, atomics_body)
    assert failures == [], "\n".join(failures[:40])


CONTENTION_ITERS = 64


def contention_body(rank: int, world: int):
    with iris.mem.init(HEAP) as heap:
        programs = 2 * torch.cuda.get_device_properties(heap.device).multi_processor_count
        c32 = heap.zeros(1, dtype=torch.int32)
        c64 = heap.zeros(1, dtype=torch.int64)
        cf32 = heap.zeros(1, dtype=torch.float32)
        log = torch.full((world, programs, CONTENTION_ITERS), -1, dtype=torch.int32, device=heap.device)
        heap.barrier()
        _contention_kernel[(programs,)](heap.get_device_context(), c32, c64, cf32, log,
                                        ITERS=CONTENTION_ITERS, num_warps=4)  # fmt: skip
        heap.barrier()
        counts = (int(c32.item()), int(c64.item()), float(cf32.item()))
        heap.barrier()
        return programs, counts, log.cpu()


@pytest.mark.parametrize("world_size", [1, 2])
def test_gluon_atomics_under_contention_from_every_sm(world_size):
    require_world(world_size)
    results = run_world(contention_body, world_size, timeout=240)
    programs = results[0][0]
    total = world_size * programs * CONTENTION_ITERS
    weighted = programs * CONTENTION_ITERS * sum(r + 1 for r in range(world_size))
    for rank, (_, counts, _) in enumerate(results):
        want = (total, weighted, float(weighted))  # fp32 exact: below 2**24
        assert counts == want, f"rank {rank}: counters (int32, int64, fp32) {counts}, want {want}"
    for target in range(world_size):  # every add saw a distinct old value: none lost or repeated
        olds = torch.cat([log[target].flatten() for _, _, log in results])
        assert sorted(olds.tolist()) == list(range(total)), f"old values returned by rank {target}'s counter"


MP_ROUNDS = 50_000
#: Rounds where the ranks share a GPU: each hand-off waits for the GPU to switch processes.
MP_SHARED_ROUNDS = 500
MP_SPINS = 1 << 24


def message_passing_body(rank: int, world: int, rounds: int):
    with iris.mem.init(HEAP) as heap:
        data = heap.zeros(BLOCK, dtype=torch.int32)
        flag, ack, errors = (heap.zeros(1, dtype=torch.int32) for _ in range(3))
        args = (heap.get_device_context(), data, flag, ack, errors)
        # Compile first (0 rounds: same specialisation), so no rank waits out another's JIT.
        _message_passing_kernel[(1,)](*args, 0, MP_SPINS, BLOCK=BLOCK, num_warps=1)
        heap.barrier()
        _message_passing_kernel[(1,)](*args, rounds, MP_SPINS, BLOCK=BLOCK, num_warps=1)
        heap.barrier()
        return int(errors.item()), int(flag.item()), int(ack.item())


@pytest.mark.parametrize("world_size", [1, 2])
def test_gluon_message_passing_never_reads_stale_data(world_size):
    require_world(world_size)
    rounds = MP_SHARED_ROUNDS if shares_gpus(world_size) else MP_ROUNDS
    results = run_world(message_passing_body, world_size, rounds, timeout=240)
    for rank, (errors, flag, ack) in enumerate(results):
        assert errors == 0, f"rank {rank}: {errors} stale/torn elements (or 1e6 per timed-out wait)"
        assert flag == ack == rounds, f"rank {rank}: last flag {flag}, ack {ack}"


def traced_body(rank: int, world: int, folder: str):
    """test_mem_tracing's traced kernel, in Gluon: the same events land in the same buffer,
    and the host export reads them unchanged."""
    with iris.mem.init(HEAP) as heap:
        exchange, mark = heap.tracing.register("exchange"), heap.tracing.register("mark")
        src, dst, out, ids, ids_out, counter = traced_buffers(heap, rank)
        heap.tracing.enable(max_events=1000)
        heap.barrier()
        _traced_kernel[(PROGRAMS,)](
            heap.get_device_context(), src, dst, out, ids, ids_out, counter, TRACE_N,
            EXCHANGE=exchange, MARK=mark, TRACE=True, BLOCK=TRACE_BLOCK, num_warps=1,
        )  # fmt: skip
        heap.barrier()
        data_ok = traced_data_ok(rank, world, dst, out, ids_out, counter)
        base = heap.get_heap_bases()[rank].item()
        offsets = {name: t.data_ptr() - base for name, t in (("src", src), ("dst", dst), ("ids", ids))}
        events = _events(_load(heap.tracing.export(os.path.join(folder, "gluon.json"))))
        return data_ok, heap.tracing.stats(), _observed(events), _expected(rank, world, offsets)


@pytest.mark.parametrize("world_size", [1, 2])
def test_gluon_tracing_records_the_triton_event_layout(world_size, tmp_path):
    require_world(world_size)
    for rank, (data_ok, stats, observed, expected) in enumerate(
        run_world(traced_body, world_size, str(tmp_path), timeout=240)
    ):
        assert data_ok, f"rank {rank}: the traced Gluon kernel moved wrong data"
        assert stats["recorded"] == EVENTS_PER_PROGRAM * PROGRAMS and stats["dropped"] == 0, stats
        assert stats["guard_intact"], stats
        assert observed == expected, f"rank {rank}: events {observed} != {expected}"
