"""The ``iris`` torch.distributed backend (``iris.ccl.backend``) against gloo.

Every test starts one real multi-process world (``iris.mem.testing.run_world``, whose
default group is gloo) and loops over its cases inside the ranks. The ranks make a group
with ``dist.new_group(backend="iris")``, run each torch.distributed call on it and the same
call on a CPU copy of the data through gloo (floats upcast to fp64 for reductions), and
return their mismatch descriptions. Every iris.ccl function is wrapped in the ranks to count
its calls, so each case also proves that its torch.distributed call reached iris.ccl (the
expected function, at least once) rather than some other path.
"""

import functools
import os
import warnings
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import TOLERANCES, device, dtype_name, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
#: 3 ranks on both tiers (on GPUs, ranks beyond the number of GPUs share them).
WORLD = 3
WORLD_TIMEOUT = 300.0
#: The iris.ccl functions the backend may call (each wrapped to count its calls).
CCL_FUNCS = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
    "scatter", "send", "recv", "barrier",
)  # fmt: skip
MODES = ("sync", "wait", "future")
#: (dtype, atol, rtol) of reductions over a few ranks, beyond those of ccl_testutils.
TOL = {**TOLERANCES, torch.float64: (1e-12, 1e-12)}


# --------------------------------------------------------------------------- helpers (in ranks)


def _count_ccl_calls() -> Counter:
    """Wrap every iris.ccl collective of this process to count its calls (by name), and
    ``iris.ccl.p2p.exchange`` (the batches of sends and receives the backend starts) under
    "send/recv"."""
    import iris.ccl
    import iris.ccl.p2p

    counts: Counter = Counter()
    targets = [(iris.ccl, name, name) for name in CCL_FUNCS] + [(iris.ccl.p2p, "exchange", "send/recv")]
    for module, name, key in targets:
        fn = getattr(module, name)

        @functools.wraps(fn)
        def counted(*args, _fn=fn, _key=key, **kwargs):
            counts[_key] += 1
            return _fn(*args, **kwargs)

        setattr(module, name, counted)
    return counts


def _data(shape, dtype: torch.dtype, rank: int, salt: int) -> torch.Tensor:
    """Data distinct per rank and call: floats in [-8, 8), small ints, every byte value for
    1-byte types (so moves of int8/uint8 are checked bit for bit), 0/1 for bool."""
    g = torch.Generator().manual_seed(7919 * rank + 131 * salt + 3)
    if dtype == torch.bool:
        x = torch.randint(0, 2, shape, generator=g).bool()
    elif dtype in (torch.int8, torch.uint8):
        x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(dtype)
    elif dtype.is_floating_point:
        x = (torch.rand(shape, generator=g, dtype=torch.float64) * 16 - 8).to(dtype)
    else:
        x = torch.randint(-100, 100, shape, generator=g).to(dtype)
    return x.to(device())


def _cpu(x: torch.Tensor, upcast: bool = False) -> torch.Tensor:
    """A contiguous CPU copy for gloo; floats in fp64 when ``upcast`` (reductions)."""
    t = x.detach().cpu().contiguous().clone()
    return t.double() if upcast and t.dtype.is_floating_point else t


def _gloo_reduced(x: torch.Tensor, op: str) -> torch.Tensor:
    """gloo's all_reduce of ``x`` on the world (AVG as SUM over the size), in ``x``'s dtype."""
    t = _cpu(x, upcast=True)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "AVG" else getattr(dist.ReduceOp, op))
    if op == "AVG":
        t = t / dist.get_world_size()
    return t.to(x.dtype)


def _differs(got: torch.Tensor, want: torch.Tensor, what: str) -> str | None:
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: {list(got.shape)} {got.dtype} != {list(want.shape)} {want.dtype}"
    if got.dtype == torch.bool:  # gloo's SUM of bools may leave bytes > 1: compare truth values
        same = torch.equal(got.view(torch.uint8) != 0, want.view(torch.uint8) != 0)
    elif got.dtype in (torch.int8, torch.uint8):
        same = torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    else:
        atol, rtol = TOL.get(got.dtype, (0, 0))
        same = bool(torch.isclose(got.double(), want.double(), atol=atol, rtol=rtol).all())
    if same:
        return None
    return f"{what}: got {got.reshape(-1)[:6].tolist()} want {want.reshape(-1)[:6].tolist()}"


def _finish(work, mode: str, outputs: list[torch.Tensor], what: str) -> str | None:
    """Complete an ``async_op=mode != "sync"`` call as the mode says and check its Work."""
    if mode == "sync":  # None (dist.recv: the sender's rank)
        return (
            None if work is None or isinstance(work, int) else f"{what}: a synchronous call returned {work!r}"
        )
    if not isinstance(work, dist.Work):
        return f"{what}: async_op=True returned {type(work).__name__}, not a torch.distributed Work"
    if mode == "wait":
        if work.wait() is not True or not work.is_completed():
            return f"{what}: wait() did not complete the work"
        return None
    value = work.get_future().wait()
    ids = {id(v) for v in value}
    if any(id(o) not in ids for o in outputs):
        return f"{what}: the future's value {len(value)} tensors does not hold the outputs"
    return None


def _splits(world: int, seed: int) -> list[list[int]]:
    """``m[i][j]``: rows rank ``i`` sends to rank ``j`` (some zero; the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 4, (world, world), generator=g)
    m[0, world - 1] = 0
    return m.tolist()


class _Case:
    """One rank's record of the cases run: mismatches and the iris.ccl calls they made."""

    def __init__(self, counts: Counter):
        self.counts = counts
        self.bad: list[str] = []
        self.cases = 0

    def run(self, what: str, expect: str, mode: str, call, check) -> None:
        """``call(async_op)`` the torch.distributed call, ``check()`` its mismatches; the
        call must reach ``iris.ccl.<expect>``."""
        before = Counter(self.counts)
        outputs, work = call(mode != "sync")
        problem = _finish(work, mode, outputs, f"{what} [{mode}]")
        if problem:
            self.bad.append(problem)
        made = self.counts - before
        if made[expect] < 1:
            self.bad.append(f"{what} [{mode}]: did not call iris.ccl.{expect} (calls: {dict(made)})")
        for p in check():
            if p:
                self.bad.append(f"{p} [{mode}]")
        self.cases += 1


def _collectives(case: _Case, g, dtype: torch.dtype, shape: tuple, modes, salt: int) -> None:
    """Every torch.distributed collective on the iris group ``g`` (the world's ranks) for one
    dtype and shape, against gloo on the world; ``modes`` rotate over the calls."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mode = iter(modes * 64).__next__
    name = f"{dtype_name(dtype)} {list(shape)}"
    x = _data(shape, dtype, rank, salt)

    # all_reduce, every reduction that makes sense for the dtype
    ops = ["SUM", "MAX", "MIN"] + (["AVG"] if dtype.is_floating_point else [])
    for op in ops:
        t = x.clone()
        want = _gloo_reduced(x, op)
        case.run(
            f"all_reduce {op} {name}", "all_reduce", mode(),
            lambda a, t=t, op=op: (
                [t], dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=g, async_op=a)
            ),
            lambda t=t, want=want, op=op: [_differs(t, want, f"all_reduce {op} {name}")],
        )  # fmt: skip

    # all_gather (list) and all_gather_into_tensor
    outs = [torch.empty_like(x) for _ in range(world)]
    ref = [torch.empty_like(_cpu(x)) for _ in range(world)]
    dist.all_gather(ref, _cpu(x))
    case.run(
        f"all_gather {name}", "all_gather", mode(),
        lambda a: (outs, dist.all_gather(outs, x, group=g, async_op=a)),
        lambda: [_differs(o, r, f"all_gather {name} [{i}]") for i, (o, r) in enumerate(zip(outs, ref))],
    )  # fmt: skip
    out = torch.empty((world * shape[0], *shape[1:]), dtype=dtype, device=x.device)
    case.run(
        f"all_gather_into_tensor {name}", "all_gather", mode(),
        lambda a: ([out], dist.all_gather_into_tensor(out, x, group=g, async_op=a)),
        lambda: [_differs(out, torch.cat(ref), f"all_gather_into_tensor {name}")],
    )  # fmt: skip

    # reduce_scatter (list) and reduce_scatter_tensor
    op = ("SUM", "MAX", "MIN")[salt % 3]
    big = _data((world * shape[0], *shape[1:]), dtype, rank, salt + 1)
    want = _gloo_reduced(big, op).chunk(world)[rank]
    parts = list(big.chunk(world))
    r1 = torch.empty_like(x)
    case.run(
        f"reduce_scatter {op} {name}", "reduce_scatter", mode(),
        lambda a: ([r1], dist.reduce_scatter(r1, parts, op=getattr(dist.ReduceOp, op), group=g, async_op=a)),
        lambda: [_differs(r1, want, f"reduce_scatter {op} {name}")],
    )  # fmt: skip
    r2 = torch.empty_like(x)
    case.run(
        f"reduce_scatter_tensor {op} {name}", "reduce_scatter", mode(),
        lambda a: (
            [r2], dist.reduce_scatter_tensor(r2, big, op=getattr(dist.ReduceOp, op), group=g, async_op=a)
        ),
        lambda: [_differs(r2, want, f"reduce_scatter_tensor {op} {name}")],
    )  # fmt: skip

    # all_to_all_single: equal splits, then split sizes (zero rows included)
    a2a = torch.empty_like(big)
    want = torch.empty_like(_cpu(big))
    dist.all_to_all_single(want, _cpu(big))
    case.run(
        f"all_to_all_single {name}", "all_to_all", mode(),
        lambda a: ([a2a], dist.all_to_all_single(a2a, big, group=g, async_op=a)),
        lambda: [_differs(a2a, want, f"all_to_all_single {name}")],
    )  # fmt: skip
    m = _splits(world, salt)
    send_rows = m[rank]
    recv_rows = [m[j][rank] for j in range(world)]
    src = _data((sum(send_rows), *shape[1:]), dtype, rank, salt + 2)
    got = torch.empty((sum(recv_rows), *shape[1:]), dtype=dtype, device=x.device)
    want_u = torch.empty_like(_cpu(got))
    dist.all_to_all_single(want_u, _cpu(src), recv_rows, send_rows)
    case.run(
        f"all_to_all_single split sizes {m} {name}", "all_to_all", mode(),
        lambda a: ([got], dist.all_to_all_single(got, src, recv_rows, send_rows, group=g, async_op=a)),
        lambda: [_differs(got, want_u, f"all_to_all_single split sizes {name}")],
    )  # fmt: skip

    # all_to_all (lists of tensors of different sizes per peer); gloo reference through the
    # flat all_to_all_single of the same elements
    ins = [_data((send_rows[j] + 1, *shape[1:]), dtype, rank, salt + 3 + j) for j in range(world)]
    outs_l = [torch.empty((recv_rows[j] + 1, *shape[1:]), dtype=dtype, device=x.device) for j in range(world)]
    flat_want = torch.empty(sum(o.numel() for o in outs_l), dtype=dtype)
    dist.all_to_all_single(
        flat_want, torch.cat([_cpu(t).reshape(-1) for t in ins]), [o.numel() for o in outs_l],
        [t.numel() for t in ins],
    )  # fmt: skip
    want_l = [c.view(o.shape) for c, o in zip(flat_want.split([o.numel() for o in outs_l]), outs_l)]
    case.run(
        f"all_to_all {name}", "all_to_all", mode(),
        lambda a: (outs_l, dist.all_to_all(outs_l, ins, group=g, async_op=a)),
        lambda: [_differs(o, w, f"all_to_all {name} [{i}]") for i, (o, w) in enumerate(zip(outs_l, want_l))],
    )  # fmt: skip

    # rooted: broadcast, reduce, gather, scatter (roots 1, last, 0, 1)
    b = x.clone()
    want_b = _cpu(x)
    dist.broadcast(want_b, 1)
    case.run(
        f"broadcast {name}", "broadcast", mode(),
        lambda a: ([b], dist.broadcast(b, 1, group=g, async_op=a)),
        lambda: [_differs(b, want_b, f"broadcast {name}")],
    )  # fmt: skip
    op = ("SUM", "MAX", "MIN")[(salt + 1) % 3]
    r = x.clone()
    want_r = _gloo_reduced(x, op)
    case.run(
        f"reduce {op} {name}", "reduce", mode(),
        lambda a: ([r], dist.reduce(r, world - 1, op=getattr(dist.ReduceOp, op), group=g, async_op=a)),
        lambda: [_differs(r, want_r, f"reduce {op} {name}")] if rank == world - 1 else [],
    )  # fmt: skip
    gat = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
    case.run(
        f"gather {name}", "gather", mode(),
        lambda a: (gat or [], dist.gather(x, gat, dst=0, group=g, async_op=a)),
        lambda: [_differs(o, w, f"gather {name} [{i}]") for i, (o, w) in enumerate(zip(gat or [], ref))],
    )  # fmt: skip
    sc = torch.empty_like(x)
    sc_in = list(big.chunk(world)) if rank == 1 else None
    want_sc = torch.empty_like(_cpu(x))
    dist.scatter(want_sc, [_cpu(c) for c in sc_in] if sc_in else None, src=1)
    case.run(
        f"scatter {name}", "scatter", mode(),
        lambda a: ([sc], dist.scatter(sc, sc_in, src=1, group=g, async_op=a)),
        lambda: [_differs(sc, want_sc, f"scatter {name}")],
    )  # fmt: skip


def _point_to_point(case: _Case, g, dtype: torch.dtype, shape: tuple, salt: int) -> None:
    """A ring: every rank sends to the next (isend), receives from the previous (recv or
    irecv), and checks the data is the sender's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    mine = _data(shape, dtype, rank, salt)
    got = torch.empty_like(mine)
    want = _data(shape, dtype, prev, salt)
    sent = dist.isend(mine, nxt, group=g)
    case.run(
        f"send/recv {dtype_name(dtype)} {list(shape)}", "send/recv", ("wait", "sync")[salt % 2],
        lambda a: ([got], dist.irecv(got, prev, group=g) if a else dist.recv(got, prev, group=g)),
        lambda: [_differs(got, want, f"recv {dtype_name(dtype)}")],
    )  # fmt: skip
    sent.wait()


def _backend_body(rank: int, world: int, dtypes: list, shapes: list) -> dict:
    setup_rank()
    counts = _count_ccl_calls()
    case = _Case(counts)
    g = dist.new_group(backend="iris")
    dist.barrier(group=g)  # barrier: the group's first collective makes its heap
    if counts["barrier"] != 1:
        case.bad.append(f"dist.barrier called iris.ccl.barrier {counts['barrier']} times")
    salt = 0
    for dtype in dtypes:
        for shape in shapes:
            modes = MODES[salt % 3 :] + MODES[: salt % 3]  # each call's mode rotates
            with warnings.catch_warnings():  # torch 2.13 renamed *_into_tensor / *_tensor
                warnings.simplefilter("ignore", FutureWarning)
                _collectives(case, g, dtype, shape, modes, salt)
            _point_to_point(case, g, dtype, shape, salt)
            salt += 1
    work = dist.barrier(group=g, async_op=True)
    if not isinstance(work, dist.Work) or work.wait() is not True:
        case.bad.append("dist.barrier(async_op=True) did not return a Work whose wait() is True")
    # negative controls: a call on the gloo world is not counted as reaching iris.ccl, and a
    # wrong reference is caught
    probe = _Case(counts)
    t = _data((5,), torch.float32, rank, 0)
    probe.run("control", "all_reduce", "sync", lambda a: ([t], dist.all_reduce(t)), lambda: [])
    if not probe.bad or _differs(t, t + 1, "control") is None:
        case.bad.append("negative control: a gloo call or a wrong result was not caught")
    return {"bad": case.bad, "cases": case.cases, "calls": sum(counts.values())}


def _run(fn, *args, world: int = WORLD):
    require_world(world)
    return run_world(fn, world, *args, timeout=WORLD_TIMEOUT)


def _assert_clean(results, min_cases: int) -> None:
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    assert min(res["cases"] for res in results) >= min_cases, [res["cases"] for res in results]


# --------------------------------------------------------------------------- tests


def test_backend_collectives_match_gloo():
    """Every torch.distributed operation on an iris group, for reduced (fp32, bf16) and
    backend-reduced dtypes (fp64, int8, bool), on odd shapes, sync and async in turn."""
    dtypes = [torch.float32, torch.bfloat16, torch.float64, torch.int8, torch.bool]
    results = _run(_backend_body, dtypes, [(5, 3)])
    _assert_clean(results, 3 * 16 + 2 * 15)


@pytest.mark.full
def test_backend_collectives_match_gloo_full():
    """Every dtype torch.distributed moves with NCCL, on two more shapes (a 1-d one), every
    operation in every mode in turn."""
    dtypes = [
        torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int8,
        torch.uint8, torch.bool,
    ]  # fmt: skip
    results = _run(_backend_body, dtypes, [(7,), (37, 3)])
    _assert_clean(results, (4 * 16 + 5 * 15) * 2)


def _tensor_parallel_body(rank: int, world: int) -> dict:
    """Functional collectives (eager and compiled) and a tensor-parallel MLP on an iris group."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    setup_rank()
    counts = _count_ccl_calls()
    bad: list[str] = []
    g = dist.new_group(backend="iris")
    dev = device()

    def reached(name: str, before: Counter, what: str) -> None:
        if (counts - before)[name] < 1:
            bad.append(f"{what} did not call iris.ccl.{name} (calls: {dict(counts - before)})")

    # functional collectives, by the group object and by its name
    x = _data((7, 5), torch.float32, rank, 1)
    for op, grp in (("sum", g), ("avg", g.group_name), ("max", g)):
        before = Counter(counts)
        got = funcol.all_reduce(x, op, grp)
        want = _gloo_reduced(x, op.upper())
        bad += filter(None, [_differs(funcol.wait_tensor(got), want, f"funcol all_reduce {op}")])
        reached("all_reduce", before, f"funcol all_reduce {op}")
    before = Counter(counts)
    gathered = funcol.wait_tensor(funcol.all_gather_tensor(x, 0, g))
    ref = [torch.empty_like(_cpu(x)) for _ in range(world)]
    dist.all_gather(ref, _cpu(x))
    bad += filter(None, [_differs(gathered, torch.cat(ref), "funcol all_gather_tensor")])
    reached("all_gather", before, "funcol all_gather_tensor")
    big = _data((world * 3, 5), torch.float32, rank, 2)
    before = Counter(counts)
    scattered = funcol.wait_tensor(funcol.reduce_scatter_tensor(big, "sum", 0, g))
    bad += filter(
        None, [_differs(scattered, _gloo_reduced(big, "SUM").chunk(world)[rank], "funcol reduce_scatter")]
    )
    reached("reduce_scatter", before, "funcol reduce_scatter_tensor")

    before = Counter(counts)
    rows = _data((world * 2, 3), torch.float32, rank, 3)
    exchanged = funcol.wait_tensor(funcol.all_to_all_single(rows, None, None, g))
    want = torch.empty_like(_cpu(rows))
    dist.all_to_all_single(want, _cpu(rows))
    bad += filter(None, [_differs(exchanged, want, "funcol all_to_all_single")])
    reached("all_to_all", before, "funcol all_to_all_single")

    # torch.compile of a function calling a functional collective (no graph break)
    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(t):
        return funcol.all_reduce(t * 2, "sum", g) + 1

    before = Counter(counts)
    compiled = step(x)
    bad += filter(None, [_differs(compiled, _gloo_reduced(x * 2, "SUM") + 1, "compiled funcol all_reduce")])
    reached("all_reduce", before, "compiled funcol all_reduce")

    # ColwiseParallel + RowwiseParallel MLP on a DeviceMesh of the iris group, against the
    # unsharded model: outputs and gradients
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 16)).to(dev)
    ref_model = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 16)).to(dev)
    ref_model.load_state_dict(model.state_dict())
    mesh = DeviceMesh.from_group(g, dev.type)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    inp = torch.randn(5, 16, device=dev)  # the same on every rank (same seed)
    before = Counter(counts)
    out = model(inp)
    reached("all_reduce", before, "RowwiseParallel forward")
    out.square().sum().backward()
    want = ref_model(inp)
    want.square().sum().backward()
    bad += filter(None, [_differs(out, want, "tensor-parallel MLP output")])
    for i in (0, 2):
        for p, q in ((model[i].weight, ref_model[i].weight), (model[i].bias, ref_model[i].bias)):
            bad += filter(
                None, [_differs(p.grad.full_tensor(), q.grad, f"tensor-parallel MLP grad of layer {i}")]
            )

    # DDP on the iris group: rank 0's parameters broadcast, gradients averaged
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(rank)  # different on every rank: DDP must broadcast rank 0's
    local = torch.nn.Linear(6, 5).to(dev)
    torch.manual_seed(0)
    plain = torch.nn.Linear(6, 5).to(dev)
    before = Counter(counts)
    ddp = DistributedDataParallel(local, process_group=g)
    batch = _data((4, 6), torch.float32, rank, 4)
    ddp(batch).square().sum().backward()
    plain(batch).square().sum().backward()
    for p, q in ((local.weight, plain.weight), (local.bias, plain.bias)):
        bad += filter(None, [_differs(p.detach(), q.detach(), "DDP: the parameters broadcast from rank 0")])
        bad += filter(None, [_differs(p.grad, _gloo_reduced(q.grad, "AVG"), "DDP: the averaged gradient")])
    reached("broadcast", before, "DDP's parameter broadcast")
    reached("all_reduce", before, "DDP's gradient all_reduce")
    return {"bad": bad, "calls": dict(counts)}


# worlds 2, 3 and 4 on GPUs (on any number of them); the world of 3 on the CPU tier
@pytest.mark.parametrize("world", [2, 3, 4] if BACKEND == "cuda" else [WORLD])
def test_functional_collectives_and_tensor_parallel(world):
    """funcol all_reduce / all_gather_tensor / reduce_scatter_tensor / all_to_all_single
    (eager, and compiled with fullgraph=True), a ColwiseParallel/RowwiseParallel MLP on a mesh
    of an iris group matching the unsharded model, and DDP on the group, all through
    iris.ccl."""
    results = _run(_tensor_parallel_body, world=world)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, "\n".join(problems)


def _expect_error(bad: list, what: str, exc_type, words: tuple, call) -> None:
    try:
        call()
    except exc_type as exc:
        missing = [w for w in words if w not in str(exc)]
        if missing:
            bad.append(f"{what}: the error does not say {missing}: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - report the wrong kind of error
        bad.append(f"{what}: raised {type(exc).__name__} instead of {exc_type.__name__}: {exc}")
        return
    bad.append(f"{what}: no error")


def _errors_body(rank: int, world: int) -> dict:
    import iris.ccl  # noqa: F401 - registers the backend

    setup_rank()
    bad: list[str] = []
    g = dist.new_group(backend="iris")
    x = _data((6, 2), torch.float32, rank, 0)
    dist.barrier(group=g)
    _expect_error(
        bad, "BAND", ValueError, ("dist.reduce", "ReduceOp.BAND", "gloo group"),
        lambda: dist.reduce(x.int(), 0, op=dist.ReduceOp.BAND, group=g),
    )  # fmt: skip
    for dtype in (torch.int32, torch.float8_e4m3fn):
        _expect_error(
            bad, f"PREMUL_SUM of {dtype}", TypeError, ("ReduceOp.PREMUL_SUM", "float32"),
            lambda dtype=dtype: dist.all_reduce(x.to(dtype), op=dist._make_nccl_premul_sum(2.0), group=g),
        )  # fmt: skip
    for dtype in (torch.int32, torch.int8):
        _expect_error(
            bad, f"AVG {dtype}", ValueError, ("AVG", "floating-point", "SUM"),
            lambda dtype=dtype: dist.all_reduce(x.to(dtype), op=dist.ReduceOp.AVG, group=g),
        )  # fmt: skip
    _expect_error(  # torch's own check (gloo only), before the backend is asked
        bad, "monitored_barrier", ValueError, ("monitored_barrier", "GLOO"),
        lambda: dist.monitored_barrier(group=g),
    )  # fmt: skip
    _expect_error(
        bad, "recv from any rank", NotImplementedError, ("dist.recv", "NCCL", "pass src"),
        lambda: dist.recv(torch.empty_like(x), group=g),
    )  # fmt: skip
    sizes = [torch.empty(3 + i) for i in range(world)]
    _expect_error(
        bad, "all_gather of different sizes", ValueError, ("dist.all_gather", "pad them"),
        lambda: dist.all_gather(sizes, torch.ones(3), group=g),
    )  # fmt: skip
    _expect_error(
        bad, "uneven all_to_all_single without splits", ValueError, ("all_to_all_single", "split sizes"),
        lambda: dist.all_to_all_single(torch.empty(world + 1), torch.ones(world + 1), group=g),
    )  # fmt: skip
    # the group still works afterwards (no rank ran a collective the others skipped)
    y = torch.ones(5, device=device())
    dist.all_reduce(y, group=g)
    if not torch.equal(y.cpu(), torch.full((5,), float(world))):
        bad.append(f"all_reduce after the errors gave {y.tolist()}")
    return {"bad": bad}


def test_unsupported_operations_name_the_fix():
    """What the backend does not support raises on every rank, naming the operation and what
    to use instead; the group keeps working."""
    results = _run(_errors_body)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, "\n".join(problems)


def _groups_body(rank: int, world: int, folder: str) -> dict:
    """Subgroups (global roots and peers), two iris groups of the same ranks, and iris as the
    default group (alone, and as cuda's backend beside gloo)."""
    import iris.ccl

    setup_rank()
    counts = _count_ccl_calls()
    bad: list[str] = []
    dev = device()
    # a subgroup of the first and last ranks: roots and peers are global ranks
    ends = [0, world - 1]
    sub = dist.new_group(ends, backend="iris")
    if rank in ends:
        peer = ends[1] if rank == ends[0] else ends[0]
        t = torch.full((3,), float(rank), device=dev)
        if rank == ends[0]:  # send/recv as the group's first operation
            dist.send(t, peer, group=sub)
        else:
            dist.recv(t, peer, group=sub)
            if t.tolist() != [0.0] * 3:
                bad.append(f"subgroup recv got {t.tolist()}")
        b = torch.full((4,), float(rank), device=dev)
        dist.broadcast(b, world - 1, group=sub)
        if b.tolist() != [float(world - 1)] * 4:
            bad.append(f"subgroup broadcast from global rank {world - 1} gave {b.tolist()}")
        r = torch.full((4,), float(rank + 1), device=dev)
        dist.all_reduce(r, group=sub)
        if r.tolist() != [float(world + 1)] * 4:
            bad.append(f"subgroup all_reduce gave {r.tolist()}")
    # two groups of the same ranks are independent (their own iris.ccl communicators)
    g1, g2 = dist.new_group(backend="iris"), dist.new_group(backend="iris")
    if g1.host_group is g2.host_group:
        bad.append("two iris groups of the same ranks share a host group")
    for i in range(3):
        a, c = torch.full((5,), float(rank + i), device=dev), torch.full((5,), float(10 * rank), device=dev)
        dist.all_reduce(a, group=g1)
        dist.all_reduce(c, group=g2, op=dist.ReduceOp.MAX)
        if a.tolist() != [float(sum(range(world)) + world * i)] * 5 or c.tolist() != [10.0 * (world - 1)] * 5:
            bad.append(f"crossed groups, round {i}: {a.tolist()} {c.tolist()}")

    # calls of a coalescing block run one by one (torch's fast path for all_reduce)
    from torch.distributed.distributed_c10d import _coalescing_manager

    before = Counter(counts)
    p, q = torch.ones(3, device=dev), torch.full((4,), 2.0, device=dev)
    with _coalescing_manager(g1, dev, async_ops=True) as cm:
        dist.all_reduce(p, group=g1)
        dist.all_reduce(q, group=g1)
    cm.wait()
    if (
        p.tolist() != [float(world)] * 3
        or q.tolist() != [2.0 * world] * 4
        or (counts - before)["all_reduce"] != 2
    ):
        bad.append(f"coalesced all_reduces: {p.tolist()} {q.tolist()}, iris.ccl calls {counts - before}")

    # iris as the default group's backend
    if dev.type == "cpu":
        dist.destroy_process_group()
        dist.init_process_group(
            "cpu:gloo,cuda:iris", init_method=f"file://{folder}/a", rank=rank, world_size=world
        )
        before = Counter(counts)
        t = torch.ones(5)
        dist.all_reduce(t)  # a CPU tensor: gloo, as configured
        if t.tolist() != [float(world)] * 5 or counts != before:
            bad.append(
                f"cpu:gloo,cuda:iris: a CPU all_reduce gave {t.tolist()}, iris.ccl calls {counts - before}"
            )
        dist.destroy_process_group()
        dist.init_process_group("iris", init_method=f"file://{folder}/b", rank=rank, world_size=world)
        if not isinstance(dist.group.WORLD, iris.ccl.backend.IrisProcessGroup):
            bad.append(f"init_process_group('iris') made {type(dist.group.WORLD).__name__}")
        before = Counter(counts)
        t = torch.ones(5)
        dist.all_reduce(t)
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank})  # pickled bytes (uint8) through iris.ccl
        if t.tolist() != [float(world)] * 5 or objs != [{"rank": r} for r in range(world)]:
            bad.append(f"default iris group: all_reduce {t.tolist()}, all_gather_object {objs}")
        if (counts - before)["all_reduce"] < 1 or (counts - before)["all_gather"] < 1:
            bad.append(f"default iris group: iris.ccl calls {counts - before}")
        # iris.ccl itself on the default (iris) group: its heap's host exchanges go through
        # the backend, which runs them on the group's gloo group
        u = torch.full((6,), float(rank))
        iris.ccl.all_reduce(u, u)
        if u.tolist() != [float(sum(range(world)))] * 6:
            bad.append(f"iris.ccl.all_reduce on the default iris group gave {u.tolist()}")
    return {"bad": bad}


def test_subgroups_crossed_groups_and_default_group(tmp_path):
    """Global ranks in subgroups, two independent groups of the same ranks, and
    ``init_process_group`` with ``iris`` (alone, and ``cpu:gloo,cuda:iris``)."""
    results = _run(_groups_body, str(tmp_path))
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, "\n".join(problems)
