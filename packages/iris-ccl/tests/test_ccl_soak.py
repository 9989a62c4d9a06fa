"""Soak test of iris.ccl: long random sequences of collectives checked against gloo.

The ranks of one world run a sequence of steps; each step is one randomly chosen call:
all_reduce (SUM, AVG, MAX, MIN), all_gather, reduce_scatter, all_to_all with equal chunks
or split sizes, broadcast, reduce, gather, scatter, send/recv between a random pair, and
barrier; in any variant the registry (:mod:`iris.ccl.variants`) lists for the collective
and that can run here; fp32, bf16, fp16 or int32; sizes from one element to tens of
thousands (odd ones mostly); in place or not; tensors on a symmetric heap or plain; with
``async_op`` or not. Every result is compared with the same computation on every rank's
inputs gathered with gloo (float64, int64 for integers), and inputs that are not outputs
must come back unchanged. The ranks agree on each step's outcome, so a failure stops
every rank at that step.

A step's parameters and data come from ``(seed, step)`` alone, so a failure is replayed
with its seed (from the first step, as the sequence ran, or that step alone):

* ``IRIS_SOAK_SEED``: the seed (default 1).
* ``IRIS_SOAK_STEPS``: the most steps to run; ``IRIS_SOAK_FIRST``: the first step.
* ``IRIS_SOAK_SECONDS``: the wall-clock budget: no step starts after it (0: none), but at
  least ``IRIS_SOAK_MIN_STEPS`` steps run.
* ``IRIS_SOAK_RESULT``: a path where rank 0 writes the run's summary as JSON.

Tiers: the default run is short (a budget of seconds at 3 ranks on the CPU backend, every
collective at least once); ``full`` runs thousands of steps; ``gpu`` runs 2 ranks on 2
GPUs for minutes.
"""

import json
import os
import random
import time
import traceback

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import TOLERANCES

from iris.mem.testing import run_world

#: A backstop only: each world's deadline (from the budget and step counts) bounds the run.
pytestmark = [pytest.mark.timeout(4 * 3600)]

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32)
#: What a step runs, with its weight in the draw (the first steps take each in turn).
KINDS = {
    "all_reduce": 6,
    "all_gather": 3,
    "reduce_scatter": 3,
    "all_to_all": 2,
    "all_to_all_uneven": 2,
    "broadcast": 2,
    "reduce": 2,
    "gather": 2,
    "scatter": 2,
    "send_recv": 2,
    "barrier": 1,
}
#: Element counts per rank (or per chunk): ``(weight, low, high)`` on the CPU backend; GPUs
#: multiply the bounds by ``GPU_SCALE``.
SIZES = ((25, 1, 8), (45, 9, 999), (25, 1000, 5000), (5, 5001, 20000))
GPU_SCALE = 64


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def settings(seconds: float, min_steps: int, max_steps: int) -> dict:
    """The run's settings: the tier's defaults, overridden by the IRIS_SOAK_* variables."""
    return {
        "seed": _env_int("IRIS_SOAK_SEED", 1),
        "first": _env_int("IRIS_SOAK_FIRST", 0),
        "steps": _env_int("IRIS_SOAK_STEPS", max_steps),
        "seconds": float(os.environ.get("IRIS_SOAK_SECONDS") or seconds),
        "min_steps": _env_int("IRIS_SOAK_MIN_STEPS", min_steps),
    }


# --------------------------------------------------------------------------- drawing a step
def _variants(collective: str, interpreted: bool) -> list[str]:
    """The variants of ``collective`` that can run here, from the registry ("auto" first)."""
    import iris.ccl
    from iris.ccl import variants

    names = iris.ccl.VARIANTS.get(collective, ("auto",))
    usable = []
    for name in names:
        variant = variants.get(collective, name)
        if variant is not None and interpreted and variant.compiled_only:
            continue
        usable.append(name)
    return usable


def _ops(collective: str, variant: str, dtype: torch.dtype) -> list[str]:
    """The reductions a call may take: the variant's (registry), no AVG of integers."""
    from iris.ccl import variants

    ops = ["SUM", "AVG", "MAX", "MIN"]
    declared = variants.get(collective, variant)
    if declared is not None and declared.ops is not None:
        ops = [o for o in ops if any(d.name == o for d in declared.ops)]
    if not dtype.is_floating_point:
        ops = [o for o in ops if o != "AVG"]
    return ops


def draw(seed: int, step: int, world: int, interpreted: bool) -> dict:
    """The parameters of step ``step`` (the same on every rank)."""
    rng = random.Random(f"iris-soak:{seed}:{step}")
    kinds = list(KINDS)
    kind = kinds[step] if step < len(kinds) else rng.choices(kinds, weights=list(KINDS.values()))[0]
    scale = 1 if interpreted else GPU_SCALE
    _, low, high = rng.choices(SIZES, weights=[w for w, _, _ in SIZES])[0]
    spec = {
        "kind": kind,
        "dtype": rng.choice(DTYPES),
        "n": rng.randint(low * (scale if low > 1 else 1), high * scale),
        "heap": rng.random() < 0.5,
        "async_op": rng.random() < 0.3,
        "in_place": rng.random() < 0.4,
        "root": rng.randrange(world),
    }
    collective = "all_to_all" if kind == "all_to_all_uneven" else kind
    spec["variant"] = (
        rng.choice(_variants(collective, interpreted)) if collective in _variant_kinds() else None
    )
    spec["op"] = rng.choice(_ops(collective, spec["variant"] or "auto", spec["dtype"]))
    if kind == "send_recv":
        src = rng.randrange(world)
        spec["pair"] = (src, (src + rng.randrange(1, world)) % world) if world > 1 else (0, 0)
    if kind == "all_to_all_uneven":
        cap = max(1, spec["n"] // world)
        spec["splits"] = [
            [rng.randint(0, cap) if rng.random() < 0.85 else 0 for _ in range(world)] for _ in range(world)
        ]
    return spec


def _variant_kinds() -> tuple[str, ...]:
    import iris.ccl

    return tuple(iris.ccl.VARIANTS)


def describe(spec: dict) -> str:
    dtype = str(spec["dtype"]).replace("torch.", "")
    parts = [spec["kind"] + (f"[{spec['variant']}]" if spec["variant"] else ""), dtype, f"n={spec['n']}"]
    if spec["kind"] in ("all_reduce", "reduce_scatter", "reduce"):
        parts.append(f"op={spec['op']}")
    if spec["kind"] in ("broadcast", "reduce", "gather", "scatter"):
        parts.append(f"root={spec['root']}")
    if "pair" in spec:
        parts.append(f"{spec['pair'][0]}->{spec['pair'][1]}")
    if "splits" in spec:
        parts.append(f"splits={spec['splits']}")
    parts += [k for k in ("heap", "in_place", "async_op") if spec[k]]
    return " ".join(parts)


# --------------------------------------------------------------------------- one step
def _data(seed: int, step: int, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input of a step: multiples of 1/16 in [-8, 8) (exact in every float
    dtype) or integers in [-100, 100), on the CPU."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 64 + rank)
    if dtype.is_floating_point:
        return (torch.randint(-128, 128, (numel,), generator=g) / 16).to(dtype)
    return torch.randint(-100, 100, (numel,), generator=g).to(dtype)


def _input_numel(spec: dict, rank: int, world: int) -> int:
    kind, n = spec["kind"], spec["n"]
    if kind in ("reduce_scatter", "all_to_all", "scatter"):
        return world * n
    if kind == "all_to_all_uneven":
        return sum(spec["splits"][rank])
    return n


def _gathered(x: torch.Tensor, numels: list[int]) -> list[torch.Tensor]:
    """Every rank's ``x`` (``numels[r]`` elements) as float64, gathered with gloo."""
    longest = max(max(numels), 1)
    padded = torch.zeros(longest, dtype=torch.float64)
    padded[: x.numel()] = x.double()
    parts = [torch.empty_like(padded) for _ in numels]
    dist.all_gather(parts, padded)
    return [p[:k] for p, k in zip(parts, numels)]


def _reduce(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    stacked = torch.stack(parts)
    if op == "SUM":
        return stacked.sum(0)
    if op == "AVG":
        return stacked.sum(0) / len(parts)
    return stacked.amax(0) if op == "MAX" else stacked.amin(0)


def _mismatch(got: torch.Tensor, want: torch.Tensor, what: str) -> str | None:
    """None when ``got`` is ``want`` (float64) within the dtype's tolerance."""
    got = got.detach().cpu().reshape(-1)
    if got.numel() != want.numel():
        return f"{what}: {got.numel()} elements, expected {want.numel()}"
    atol, rtol = TOLERANCES[got.dtype]
    # the reference rounded to the dtype like the result (AVG of floats, low precision)
    want = want.to(got.dtype).double()
    bad = ~torch.isclose(got.double(), want, atol=atol, rtol=rtol)
    if not bad.any():
        return None
    idx = bad.nonzero().reshape(-1)[:5].tolist()
    return (
        f"{what}: {int(bad.sum())} of {got.numel()} elements differ; first at {idx}: "
        f"got {got.double()[idx].tolist()} want {want[idx].tolist()}"
    )


def run_step(spec: dict, seed: int, step: int, rank: int, world: int, heap, dev) -> list[str]:
    """Run one step on this rank; the problems found (empty: right)."""
    import iris.ccl

    kind, n, dtype, root = spec["kind"], spec["n"], spec["dtype"], spec["root"]
    numels = [_input_numel(spec, r, world) for r in range(world)]
    mine = _data(seed, step, rank, numels[rank], dtype)
    everyone = _gathered(mine, numels)  # gloo, before the call, on every rank alike

    def alloc(numel: int) -> torch.Tensor:
        """A tensor filled with a marker: on the heap (the same size on every rank) or plain."""
        if spec["heap"]:
            return heap.full((numel,), 77, dtype=dtype)
        return torch.full((numel,), 77, dtype=dtype, device=dev)

    def filled(numel_alloc: int, values: torch.Tensor) -> torch.Tensor:
        t = alloc(numel_alloc)[: values.numel()]
        t.copy_(values.to(dev))
        return t

    kw = {"async_op": spec["async_op"]}
    if spec["variant"] is not None:
        kw["config"] = iris.ccl.Config(variant=spec["variant"])
    op = spec["op"]
    checks: list[tuple[torch.Tensor, torch.Tensor, str]] = []  # (got, want, what)
    keep: list[tuple[torch.Tensor, torch.Tensor]] = []  # inputs that must not change
    work = None
    if kind == "all_reduce":
        inp = filled(n, mine)
        out = inp if spec["in_place"] else alloc(n)
        work = iris.ccl.all_reduce(out, inp, op=op, **kw)
        checks.append((out, _reduce(everyone, op), "out"))
    elif kind == "all_gather":
        out = alloc(world * n)
        if spec["in_place"]:
            inp = out[rank * n : (rank + 1) * n]
            inp.copy_(mine.to(dev))
        else:
            inp = filled(n, mine)
        work = iris.ccl.all_gather(out, inp, **kw)
        checks.append((out, torch.cat(everyone), "out"))
    elif kind == "reduce_scatter":
        inp = filled(world * n, mine)
        out = inp[rank * n : (rank + 1) * n] if spec["in_place"] else alloc(n)
        work = iris.ccl.reduce_scatter(out, inp, op=op, **kw)
        checks.append((out, _reduce(everyone, op)[rank * n : (rank + 1) * n], "out"))
    elif kind == "all_to_all":
        inp = filled(world * n, mine)
        out = inp if spec["in_place"] else alloc(world * n)
        work = iris.ccl.all_to_all(out, inp, **kw)
        want = torch.cat([everyone[j][rank * n : (rank + 1) * n] for j in range(world)])
        checks.append((out, want, "out"))
    elif kind == "all_to_all_uneven":
        splits = spec["splits"]
        sends, receives = splits[rank], [splits[j][rank] for j in range(world)]
        longest = max(max(sum(s) for s in splits), max(sum(s[r] for s in splits) for r in range(world)))
        inp = filled(longest, mine)  # the same allocation on every rank: symmetric heaps
        out = alloc(longest)[: sum(receives)]
        work = iris.ccl.all_to_all(out, inp, receives, sends, **kw)
        want = torch.cat([everyone[j][sum(splits[j][:rank]) :][: splits[j][rank]] for j in range(world)])
        checks.append((out, want, "out"))
    elif kind == "broadcast":
        tensor = filled(n, mine)
        work = iris.ccl.broadcast(tensor, root, **kw)
        checks.append((tensor, everyone[root], "tensor"))
        inp = None
    elif kind == "reduce":
        inp = filled(n, mine)
        out = inp if spec["in_place"] else alloc(n)
        work = iris.ccl.reduce(out if rank == root else None, inp, root, op=op, **kw)
        if rank == root:
            checks.append((out, _reduce(everyone, op), "out on the root"))
    elif kind == "gather":
        inp, out = filled(n, mine), alloc(world * n)
        work = iris.ccl.gather(out if rank == root else None, inp, root, **kw)
        if rank == root:
            checks.append((out, torch.cat(everyone), "out on the root"))
    elif kind == "scatter":
        inp, out = filled(world * n, mine), alloc(n)
        work = iris.ccl.scatter(out, inp if rank == root else None, root, **kw)
        checks.append((out, everyone[root][rank * n : (rank + 1) * n], "out"))
    elif kind == "send_recv":
        src, dst = spec["pair"]
        inp, out = filled(n, mine), alloc(n)
        if rank == src and rank != dst:
            work = iris.ccl.send(inp, dst, **kw)
        elif rank == dst and rank != src:
            work = iris.ccl.recv(out, src, **kw)
            checks.append((out, everyone[src], f"received from {src}"))
    elif kind == "barrier":
        inp = None
        work = iris.ccl.barrier(**kw)
    else:
        raise AssertionError(f"unknown kind {kind}")
    if kind not in ("barrier", "broadcast") and not spec["in_place"]:
        keep.append((inp, mine))
    if spec["async_op"]:
        if work is None and (kind != "send_recv" or rank in spec["pair"]):
            return ["async_op=True returned no handle"]
        if work is not None:
            work.wait()
    elif work is not None:
        return [f"async_op=False returned {work!r}"]
    problems = [p for got, want, what in checks if (p := _mismatch(got, want, what))]
    problems += [
        f"the input changed: {p}" for got, was in keep if (p := _mismatch(got, was.double(), "input"))
    ]
    return problems


# --------------------------------------------------------------------------- the run
def soak_body(rank, world, config):
    """Run the sequence on this rank; returns the run's summary (the same on every rank)."""
    import iris.ccl
    import iris.mem

    if BACKEND == "cuda":
        torch.cuda.set_device(iris.mem.default_device())  # LOCAL_RANK modulo the GPUs present
    seed, first = config["seed"], config["first"]
    heap = iris.mem.init(config["heap_bytes"])
    dev = heap.device
    interpreted = heap.capabilities.interpreted
    started = time.monotonic()
    counts: dict[str, int] = {}
    failure = None
    step = first
    # negative control: the comparison catches a wrong element
    control = _mismatch(torch.ones(3), torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64), "control")
    assert control is not None, "the comparison did not catch a wrong element"
    go = config["steps"] > 0
    while go:
        spec = draw(seed, step, world, interpreted)
        what = describe(spec)
        try:
            with heap.scope():
                problems = run_step(spec, seed, step, rank, world, heap, dev)
        except Exception as e:  # noqa: BLE001 - reported with the step
            frames = traceback.extract_tb(e.__traceback__)[-3:]
            where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(frames))
            problems = [f"raised {type(e).__name__}: {e} (at {where})"]
        step += 1
        done, elapsed = step - first, time.monotonic() - started
        more = done < config["steps"] and (
            done < config["min_steps"] or not config["seconds"] or elapsed < config["seconds"]
        )
        outcomes = [None] * world
        dist.all_gather_object(outcomes, (problems, more))  # rank 0's clock decides for all
        key = what.split(" ")[0]
        counts[key] = counts.get(key, 0) + 1
        if any(p for p, _ in outcomes):
            failure = {
                "step": step - 1,
                "call": what,
                "problems": {r: p for r, (p, _) in enumerate(outcomes) if p},
            }
            break
        go = outcomes[0][1]
    summary = {
        "seed": seed,
        "first": first,
        "steps": step - first,
        "seconds": round(time.monotonic() - started, 1),
        "world": world,
        "backend": heap.backend,
        "counts": counts,
        "failure": failure,
    }
    iris.ccl._comm.close_all()
    heap.close()
    if rank == 0 and os.environ.get("IRIS_SOAK_RESULT"):
        with open(os.environ["IRIS_SOAK_RESULT"], "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
    return summary


def _check_run(results: list[dict], config: dict, test: str) -> None:
    summary = results[0]
    failure = summary["failure"]
    if failure is not None:
        step = failure["step"]
        problems = "\n".join(f"  rank {r}: {'; '.join(p)}" for r, p in failure["problems"].items())
        pytest.fail(
            f"soak seed {summary['seed']}, step {step}: {failure['call']}\n{problems}\n"
            f"replay the run up to it: IRIS_SOAK_SEED={summary['seed']} IRIS_SOAK_FIRST={summary['first']} "
            f"IRIS_SOAK_STEPS={step - summary['first'] + 1} IRIS_SOAK_SECONDS=0 pytest '{test}'\n"
            f"that step alone: IRIS_SOAK_SEED={summary['seed']} IRIS_SOAK_FIRST={step} IRIS_SOAK_STEPS=1 "
            f"pytest '{test}'",
            pytrace=False,
        )
    assert summary["steps"] >= min(config["min_steps"], config["steps"]), summary
    print(f"soak: {summary}")


def _config(seconds: float, min_steps: int, max_steps: int, heap_bytes: int) -> dict:
    config = settings(seconds, min_steps, max_steps)
    config["heap_bytes"] = heap_bytes
    return config


def _deadline(config: dict, per_step: float) -> float:
    """The world's deadline: start-up plus 3.5 times the longer of the budget and the steps
    it cannot stop (the minimum, or every step without a budget), at ``per_step`` seconds
    a step on an idle machine."""
    bounded = config["seconds"] if config["seconds"] else config["steps"] * per_step
    return 120 + 3.5 * max(bounded, min(config["min_steps"], config["steps"]) * per_step)


CPU_ENV = {"IRIS_WAIT_TIMEOUT": "60"}


@pytest.mark.skipif(BACKEND != "cpu", reason="the CPU soak runs on the cpu backend")
def test_soak_short():
    """A few seconds of random collectives at 3 ranks, every kind of call at least once."""
    config = _config(seconds=8, min_steps=len(KINDS), max_steps=100_000, heap_bytes=16 << 20)
    results = run_world(soak_body, 3, config, env=CPU_ENV, timeout=_deadline(config, 1.0))
    _check_run(results, config, "packages/iris-ccl/tests/test_ccl_soak.py::test_soak_short")


@pytest.mark.full
@pytest.mark.skipif(BACKEND != "cpu", reason="the CPU soak runs on the cpu backend")
def test_soak_full():
    """Thousands of random collectives at 3 ranks (at least 2,000; no new one after 4.5 min)."""
    config = _config(seconds=270, min_steps=2000, max_steps=5000, heap_bytes=16 << 20)
    results = run_world(soak_body, 3, config, env=CPU_ENV, timeout=_deadline(config, 0.3))
    _check_run(results, config, "packages/iris-ccl/tests/test_ccl_soak.py::test_soak_full")
    assert results[0]["steps"] >= 2000 or config["steps"] < 2000, results[0]


@pytest.mark.gpu
@pytest.mark.skipif(BACKEND != "cuda", reason="GPU-only test: run with IRIS_BACKEND=cuda")
def test_soak_gpu():
    """Minutes of random collectives at 2 ranks (IRIS_SOAK_SECONDS, default 180): on 2 GPUs,
    or sharing one."""
    config = _config(seconds=180, min_steps=200, max_steps=10_000_000, heap_bytes=1 << 30)
    results = run_world(soak_body, 2, config, timeout=_deadline(config, 2.0))
    _check_run(results, config, "packages/iris-ccl/tests/test_ccl_soak.py::test_soak_gpu")
