"""GPU-only tests of iris.ccl (``IRIS_BACKEND=cuda``, ``pytest -m gpu``), on any number of
GPUs: ranks beyond it share GPUs (a world of 4 on one GPU is four processes taking turns).

* CUDA graphs: every collective iris.ccl has when the test runs (all_reduce in every
  variant; all_gather, reduce_scatter, all_to_all, broadcast, reduce, scatter, gather when
  present) is warmed up once, captured once in ``torch.cuda.graph``, then replayed three
  times, each time after filling its inputs in place (same storage) with fresh random data;
  with tensors on an iris heap (used in place) and with plain tensors (staged).
* Large messages: a 64 MiB bf16 all_reduce in every variant.
* Back to back: every collective and variant called 8 times in a row on separate buffers,
  the ranks drifting apart (a GPU sleep on one of them), every output checked.
* Large per-tile collectives: ``ring`` all_reduce, broadcast and reduce of 512 MiB and a
  64 MiB send/recv ring, three times each (the kernels that launched a program per tile,
  up to 1024 per launch each waiting on its twin on the peer; ``ring`` hung at 512 MiB).
* Mixed variants: all_reduce calls that change variant from one call to the next (what
  ``variant="auto"`` does when message sizes change) at 8 KiB, 1 MiB and 128 MiB, issued
  back to back with no host synchronisation, then as CUDA graphs (one per variant) replayed
  back to back: every output checked, no wait may run out.

References: every rank's inputs are gathered to the CPU with gloo (``all_gather_object``)
and reduced in float64 (int64 for integers), so they do not depend on the device.
"""

import os

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import device, make_input, mismatch, require_world

from iris.mem.testing import run_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(BACKEND != "cuda", reason="GPU-only test: run with IRIS_BACKEND=cuda"),
]

ROUNDS = 3
WORLD_TIMEOUT = 900.0
#: Elements per rank of the graph tests: not a multiple of any block size or world size.
N = 100_003


# --------------------------------------------------------------------------- references


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.dtype.is_floating_point else t.long()


def _sum(ts):
    return torch.stack([_wide(t) for t in ts]).sum(0)


def _gather_inputs(inputs) -> list[list[torch.Tensor]]:
    """Every rank's ``inputs`` (list of tensors), on the CPU, indexed by rank."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [t.detach().cpu().clone() for t in inputs])
    return everyone


class Case:
    """One collective call on fixed buffers: ``inputs`` are refilled before each replay,
    ``call`` runs the collective, ``expect(gathered)`` gives this rank's expected output
    (or None where the rank's output is unspecified), compared with ``output``."""

    def __init__(self, name, inputs, output, call, expect):
        self.name, self.inputs, self.output, self.call, self.expect = name, inputs, output, call, expect


def _cases(ccl, rank: int, ws: int, alloc, dtype) -> list[Case]:
    """A Case per collective (and variant) present in ``ccl``. ``alloc(shape, dtype)``
    makes the buffers (heap or plain). Roots are the last rank (not 0, on purpose)."""
    cases = []
    n = N
    root = ws - 1
    sl = slice(rank * n, (rank + 1) * n)
    variants = getattr(ccl, "VARIANTS", {})

    def cfg(variant):
        return ccl.Config(variant=variant)

    for variant in variants.get("all_reduce", ("auto",)):
        inp, out = alloc((n,), dtype), alloc((n,), dtype)
        cases.append(Case(
            f"all_reduce {variant}", [inp], out,
            lambda inp=inp, out=out, v=variant: ccl.all_reduce(out, inp, config=cfg(v)),
            lambda g: _sum([r[0] for r in g]),
        ))  # fmt: skip
    if hasattr(ccl, "all_gather"):
        for variant in variants.get("all_gather", ("auto",)):
            inp, out = alloc((n,), dtype), alloc((ws * n,), dtype)
            cases.append(Case(
                f"all_gather {variant}", [inp], out,
                lambda inp=inp, out=out, v=variant: ccl.all_gather(out, inp, config=cfg(v)),
                lambda g: torch.cat([r[0] for r in g]),
            ))  # fmt: skip
    if hasattr(ccl, "reduce_scatter"):
        for variant in variants.get("reduce_scatter", ("auto",)):
            inp, out = alloc((ws * n,), dtype), alloc((n,), dtype)
            cases.append(Case(
                f"reduce_scatter {variant}", [inp], out,
                lambda inp=inp, out=out, v=variant: ccl.reduce_scatter(out, inp, config=cfg(v)),
                lambda g: _sum([r[0] for r in g])[sl],
            ))  # fmt: skip
    if hasattr(ccl, "all_to_all"):
        for variant in variants.get("all_to_all", ("auto",)):
            inp, out = alloc((ws * n,), dtype), alloc((ws * n,), dtype)
            cases.append(Case(
                f"all_to_all {variant}", [inp], out,
                lambda inp=inp, out=out, v=variant: ccl.all_to_all(out, inp, config=cfg(v)),
                lambda g: torch.cat([r[0][sl] for r in g]),
            ))  # fmt: skip
    if hasattr(ccl, "broadcast"):
        t = alloc((n,), dtype)
        cases.append(Case(
            "broadcast", [t], t, lambda t=t: ccl.broadcast(t, root), lambda g: g[root][0],
        ))  # fmt: skip
    if hasattr(ccl, "reduce"):
        inp, out = alloc((n,), dtype), alloc((n,), dtype)
        cases.append(Case(
            "reduce", [inp], out, lambda inp=inp, out=out: ccl.reduce(out, inp, root),
            lambda g: _sum([r[0] for r in g]) if rank == root else None,
        ))  # fmt: skip
    if hasattr(ccl, "scatter"):
        inp, out = alloc((ws * n,), dtype), alloc((n,), dtype)
        cases.append(Case(
            "scatter", [inp], out, lambda inp=inp, out=out: ccl.scatter(out, inp, root),
            lambda g: g[root][0][sl],
        ))  # fmt: skip
    if hasattr(ccl, "gather"):
        inp, out = alloc((n,), dtype), alloc((ws * n,), dtype)
        cases.append(Case(
            "gather", [inp], out, lambda inp=inp, out=out: ccl.gather(out, inp, root),
            lambda g: torch.cat([r[0] for r in g]) if rank == root else None,
        ))  # fmt: skip
    return cases


def _fill(inputs, rank: int, salt: int) -> None:
    """Fresh random data into ``inputs``, in place (the graph keeps their storage)."""
    for i, t in enumerate(inputs):
        t.copy_(make_input(tuple(t.shape), t.dtype, rank, 7919 * salt + i).to(t.device))


def _check(case: Case, rank: int, gathered, what: str) -> str | None:
    want = case.expect(gathered)
    if want is None:
        return None
    return mismatch(case.output, want.to(case.output.dtype), what)


# --------------------------------------------------------------------------- CUDA graphs


def graph_body(rank, world_size, use_heap: bool):
    dev = device()  # LOCAL_RANK modulo the GPUs present
    torch.cuda.set_device(dev)
    import iris.ccl as ccl
    import iris.mem

    bad: list[str] = []
    names: list[str] = []
    heap = iris.mem.init(1 << 30) if use_heap else None
    try:
        if heap is not None:

            def alloc(shape, dtype):
                return heap.zeros(shape, dtype=dtype)

        else:

            def alloc(shape, dtype):
                return torch.zeros(shape, dtype=dtype, device=dev)

        cases = _cases(ccl, rank, world_size, alloc, torch.float32)
        cases += [
            c for c in _cases(ccl, rank, world_size, alloc, torch.bfloat16) if c.name.startswith("all_reduce")
        ]
        kind = "heap" if use_heap else "plain"
        for case in cases:
            dtype = case.output.dtype
            what = f"{case.name} {str(dtype).replace('torch.', '')} {kind} world={world_size}"
            names.append(what)
            # Warm-up: makes the communicator, staging buffers and compiled kernels.
            _fill(case.inputs, rank, 0)
            gathered = _gather_inputs(case.inputs)
            try:
                case.call()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - reported, next case
                bad.append(f"{what}: warm-up call raised {type(e).__name__}: {e}")
                dist.barrier()
                continue
            if (m := _check(case, rank, gathered, what + " warm-up")) is not None:
                bad.append(m)
            dist.barrier()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    case.call()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - reported, next case
                bad.append(f"{what}: capture raised {type(e).__name__}: {e}")
                torch.cuda.synchronize()
                dist.barrier()
                continue
            dist.barrier()
            for r in range(1, ROUNDS + 1):
                _fill(case.inputs, rank, r)
                torch.cuda.synchronize()
                gathered = _gather_inputs(case.inputs)
                graph.replay()
                torch.cuda.synchronize()
                if (m := _check(case, rank, gathered, f"{what} replay {r}")) is not None:
                    bad.append(m)
                dist.barrier()  # nobody refills inputs a peer may still read
            del graph
    finally:
        if heap is not None:
            torch.cuda.synchronize()
            heap.close()
    return {"bad": bad, "names": names}


@pytest.mark.parametrize("use_heap", [True, False], ids=["heap", "plain"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_cuda_graph_capture_and_replay(world_size, use_heap):
    require_world(world_size)
    results = run_world(graph_body, world_size, use_heap, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    names = results[0]["names"]
    assert sum(1 for n in names if n.startswith("all_reduce")) >= 2 * 6, names


# --------------------------------------------------------------------------- large messages


def large_body(rank, world_size):
    """64 MiB of bf16 per rank, every variant, plain (staged in chunks) and on a heap (in
    place, and out of place), against gloo's all_reduce of the fp32 upcast on the CPU."""
    dev = device()  # LOCAL_RANK modulo the GPUs present
    torch.cuda.set_device(dev)
    import iris.ccl as ccl
    import iris.mem

    n = (64 << 20) // 2
    bad: list[str] = []
    x = make_input((n,), torch.bfloat16, rank, 1)
    ref = x.cpu().float()
    dist.all_reduce(ref)
    want = ref.to(torch.bfloat16)
    with iris.mem.init(4 * (64 << 20)) as heap:
        h = heap.empty(n, dtype=torch.bfloat16)
        h2 = heap.empty(n, dtype=torch.bfloat16)
        for variant in ccl.VARIANTS["all_reduce"]:
            cfg = ccl.Config(variant=variant)
            out = torch.empty_like(x)
            for what, got, call in (
                ("plain", out, lambda out=out, cfg=cfg: ccl.all_reduce(out, x, config=cfg)),
                ("heap in-place", h, lambda cfg=cfg: ccl.all_reduce(h, h.copy_(x), config=cfg)),
                ("heap", h2, lambda cfg=cfg: ccl.all_reduce(h2, h.copy_(x), config=cfg)),
            ):
                call()
                try:  # a wait that ran out of budget is recorded on the device: surface it
                    ccl.check_errors()
                except Exception as e:  # noqa: BLE001 - reported with the case
                    bad.append(f"64 MiB bf16 {variant} {what}: {type(e).__name__}: {e}")
                if (m := mismatch(got, want, f"64 MiB bf16 {variant} {what}")) is not None:
                    bad.append(m)
            dist.barrier()
    return {"bad": bad}


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_64mib_bf16(world_size):
    require_world(world_size)
    results = run_world(large_body, world_size, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


# --------------------------------------------------------------------------- back to back

#: Calls of one collective issued back to back (no host synchronisation between them).
BACK_TO_BACK = 8


def back_to_back_body(rank, world_size, use_heap: bool, dtype_name: str):
    """Every case of :func:`_cases`, ``BACK_TO_BACK`` times in a row on separate buffers with
    distinct data, one rank delayed by a GPU sleep before every other call so the members
    drift apart; then every output is checked. Catches a barrier that publishes a flag before
    its data (no barrier fences per thread: a CTA barrier and a release order them) and a bank of ``boxed``
    reused while a peer still reads it."""
    dev = device()  # LOCAL_RANK modulo the GPUs present
    torch.cuda.set_device(dev)
    import iris.ccl as ccl
    import iris.mem

    dtype = getattr(torch, dtype_name)
    bad: list[str] = []
    heap = iris.mem.init(1 << 30) if use_heap else None
    try:

        def alloc(shape, dt):
            if heap is not None:
                return heap.zeros(shape, dtype=dt)
            return torch.zeros(shape, dtype=dt, device=dev)

        sets = [_cases(ccl, rank, world_size, alloc, dtype) for _ in range(BACK_TO_BACK)]
        kind = "heap" if use_heap else "plain"
        for c in range(len(sets[0])):
            what = f"{sets[0][c].name} {dtype_name} {kind} world={world_size}"
            calls = [s[c] for s in sets]
            for k, case in enumerate(calls):
                _fill(case.inputs, rank, 100 + k)
            torch.cuda.synchronize()
            gathered = [_gather_inputs(case.inputs) for case in calls]
            dist.barrier()
            for k, case in enumerate(calls):
                if rank == k % world_size:
                    torch.cuda._sleep(200_000)  # about 0.1 ms: this rank falls behind
                case.call()
            torch.cuda.synchronize()
            try:
                ccl.check_errors()
            except Exception as e:  # noqa: BLE001 - reported with the case
                bad.append(f"{what}: {type(e).__name__}: {e}")
            for k, case in enumerate(calls):
                if (m := _check(case, rank, gathered[k], f"{what} call {k}")) is not None:
                    bad.append(m)
            dist.barrier()
    finally:
        if heap is not None:
            torch.cuda.synchronize()
            heap.close()
    return {"bad": bad}


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("use_heap", [True, False], ids=["heap", "plain"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_back_to_back_calls(world_size, use_heap, dtype_name):
    require_world(world_size)
    results = run_world(back_to_back_body, world_size, use_heap, dtype_name, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


# --------------------------------------------------------------------------- mixed variants

#: The all_reduce variants the tuning table picks from, in the order the calls cycle through.
MIXED = ("ll", "boxed", "one_shot", "two_shot", "two_shot_push", "copy_engine")
#: Bytes per rank of the mixed-variant calls: latency-, middle- and bandwidth-bound sizes.
MIXED_BYTES = (8 << 10, 1 << 20, 128 << 20)


def mixed_body(rank, world_size, sizes):
    """Every variant of :data:`MIXED` at every size of ``sizes`` (bytes of bf16), each call
    on its own output on a heap, all inputs on the heap: first issued eagerly back to back
    (variant changing every call, one rank delayed by a GPU sleep before every other call),
    then each captured in a CUDA graph and the graphs replayed back to back twice. A device
    wait that runs out (``IRIS_WAIT_TIMEOUT``) is reported by ``check_errors``."""
    from ccl_testutils import device, reduced

    dev = device()
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    import iris.ccl as ccl
    import iris.mem

    bad: list[str] = []
    per_call = sum(sizes)
    staging = (2 << 30) if cuda else (64 << 20)  # the communicator's staging buffers live there too
    with iris.mem.init(len(MIXED) * per_call + per_call + staging) as heap:
        inputs = [heap.empty(nb // 2, dtype=torch.bfloat16) for nb in sizes]
        for i, x in enumerate(inputs):
            x.copy_(make_input(x.shape, torch.bfloat16, rank, salt=i))
        wants = [reduced(x, "SUM") for x in inputs]
        calls = []
        for i, x in enumerate(inputs):
            for v in MIXED:
                out = heap.zeros(x.numel(), dtype=torch.bfloat16)
                cfg = ccl.Config(variant=v)
                call = lambda out=out, x=x, cfg=cfg: ccl.all_reduce(out, x, config=cfg)  # noqa: E731
                calls.append((f"{sizes[i] >> 10} KiB {v}", call, out, wants[i]))

        def check(stage: str) -> None:
            if cuda:
                torch.cuda.synchronize()
            try:
                ccl.check_errors()
            except Exception as e:  # noqa: BLE001 - reported with the stage
                bad.append(f"{stage}: {type(e).__name__}: {e}")
            for what, _, out, want in calls:
                if (m := mismatch(out, want, f"{stage} {what} world={world_size}")) is not None:
                    bad.append(m)
                out.zero_()
            dist.barrier()

        dist.barrier()
        for k, (_, call, _, _) in enumerate(calls):
            if cuda and rank == k % world_size:
                torch.cuda._sleep(200_000)  # about 0.1 ms: this rank falls behind
            call()
        check("eager, back to back")
        if cuda:
            graphs = []
            for _, call, _, _ in calls:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    call()
                graphs.append(graph)
            torch.cuda.synchronize()
            dist.barrier()
            for r in range(2):
                for graph in graphs:
                    graph.replay()
                check(f"graphs replayed back to back, round {r}")
            del graphs
    return {"bad": bad}


@pytest.mark.parametrize("world_size", [2, 4])
def test_mixed_variants_back_to_back(world_size, monkeypatch):
    require_world(world_size)
    monkeypatch.setenv("IRIS_WAIT_TIMEOUT", "60")  # a wait that never ends fails in a minute
    results = run_world(mixed_body, world_size, MIXED_BYTES, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


# --------------------------------------------------------------------------- per-tile kernels

#: Per-rank bytes of the per-tile test: 64 launches of the old per-tile ring kernel.
PER_TILE_BYTES = 512 << 20


def per_tile_body(rank, world_size, nbytes: int):
    """``ring`` all_reduce, broadcast and reduce (in place, on a heap) of ``nbytes`` of bf16
    per rank, three calls each, then a ring of send/recv of up to 64 MiB: the collectives
    whose kernels used to launch one program per tile. Every rank makes every rank's input
    the same way on its own device, so the references need no communication."""
    cuda = BACKEND == "cuda"
    dev = device()
    if cuda:
        torch.cuda.set_device(dev)
    import iris.ccl as ccl
    import iris.mem

    n, root = nbytes // 2, world_size - 1
    bad: list[str] = []

    def data(r: int) -> torch.Tensor:
        g = torch.Generator(device=dev).manual_seed(7 + r)
        return (torch.rand(n, generator=g, device=dev) * 16 - 8).to(torch.bfloat16)

    def check(got, want, what: str, tol: float) -> None:
        try:  # a wait that ran out of budget is recorded on the device: surface it
            ccl.check_errors()
        except Exception as e:  # noqa: BLE001 - reported with the case
            bad.append(f"{what}: {type(e).__name__}: {e}")
            return
        if got is not None:
            err = (got.float() - want.float()).abs().max().item()
            if not err <= tol:
                bad.append(f"{what}: max error {err} (tolerance {tol})")

    x = data(rank)
    total = sum(data(r).float() for r in range(world_size))
    tol = 2.0**-7 * 8 * world_size  # a bf16 rounding of a sum of magnitude <= 8 G
    with iris.mem.init(nbytes + (64 << 20)) as heap:
        h = heap.empty(n, dtype=torch.bfloat16)
        out = torch.empty_like(x)
        for call in range(3):
            what = f"{nbytes >> 20} MiB bf16 world={world_size} call {call}"
            out.zero_()
            ccl.all_reduce(out, x, config=ccl.Config(variant="ring"))
            check(out, total, f"ring all_reduce {what}", tol)
            h.copy_(x)
            ccl.broadcast(h, root)
            check(h, data(root), f"broadcast {what}", 0.0)
            h.copy_(x)
            ccl.reduce(h, h, root)
            check(h if rank == root else None, total, f"reduce {what}", tol)
            dist.barrier()
        # A ring of messages: even ranks send first, odd ones receive first (no cycle of
        # sends waiting for receives queued behind other sends).
        m = min(n, (64 << 20) // 2)
        got = torch.zeros(m, dtype=torch.bfloat16, device=dev)
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        steps = [lambda: ccl.send(x[:m], right), lambda: ccl.recv(got, left)]
        for step in steps if rank % 2 == 0 else steps[::-1]:
            step()
        check(got, data(left)[:m], f"send/recv {m * 2 >> 20} MiB world={world_size}", 0.0)
    return {"bad": bad}


@pytest.mark.parametrize("world_size", [2, 4])
def test_per_tile_collectives_at_512mib(world_size, monkeypatch):
    require_world(world_size)
    monkeypatch.setenv("IRIS_WAIT_TIMEOUT", "60")  # a wait that never ends fails in a minute
    results = run_world(per_tile_body, world_size, PER_TILE_BYTES, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
