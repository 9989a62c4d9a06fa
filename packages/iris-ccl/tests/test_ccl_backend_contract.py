"""torch.distributed's contract on the ``iris`` backend: what a process-group backend must do
beyond moving the right bytes.

Each test starts one real world (``iris.mem.testing.run_world``, default group gloo), makes a
group with ``dist.new_group(backend="iris")`` and checks one behaviour against gloo on the
same data: send/recv as a group's first call, tags, ``all_gather_coalesced``, PRODUCT and
PREMUL_SUM, the calls C++ makes through the dispatcher (``torch.ops.c10d``,
``torch.ops._c10d_functional``), pybind's convenience overloads, grouped point-to-point,
``Work``'s error contract, the group's timeouts and options, one communicator per group, the
carrier backend that only names the group, and the profiler's ranges. Tests that count calls
into iris.ccl run the same calls on a gloo group too, where the count must stay zero.
"""

import datetime
import functools
import os
import time
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import setup_rank

from iris.mem.testing import launch_world, run_world

pytestmark = pytest.mark.timeout(600)

#: The iris.ccl functions the backend calls (each wrapped to count its calls in the ranks).
CCL_FUNCS = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
    "scatter", "send", "recv", "barrier",
)  # fmt: skip


# --------------------------------------------------------------------------- helpers (in ranks)


def _count_ccl_calls() -> Counter:
    """Wrap every iris.ccl collective of this process to count its calls (by name)."""
    import iris.ccl

    counts: Counter = Counter()
    for name in CCL_FUNCS:
        fn = getattr(iris.ccl, name)

        @functools.wraps(fn)
        def counted(*args, _fn=fn, _name=name, **kwargs):
            counts[_name] += 1
            return _fn(*args, **kwargs)

        setattr(iris.ccl, name, counted)
    return counts


def _groups():
    """``(iris group, gloo group)`` over the whole world."""
    import iris.ccl  # noqa: F401  registers the backend

    return dist.new_group(backend="iris"), dist.new_group(backend="gloo")


def _data(shape, dtype: torch.dtype, rank: int, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * rank + 131 * salt + 3)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 16 - 8).to(dtype)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


def _near_one(shape, dtype: torch.dtype, rank: int, salt: int = 0) -> torch.Tensor:
    """Factors of a PRODUCT that neither overflow nor vanish: floats in [0.5, 1.5), ints in {-2..2}."""
    g = torch.Generator().manual_seed(104729 * rank + 7 * salt + 11)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    return torch.randint(-2, 3, shape, generator=g).to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-5) -> str | None:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: {list(got.shape)} {got.dtype} != {list(want.shape)} {want.dtype}"
    if got.dtype.is_floating_point:
        ok = torch.allclose(got.double(), want.double(), atol=tol, rtol=tol)
    else:
        ok = torch.equal(got, want)
    return None if ok else f"{what}: got {got.reshape(-1)[:5].tolist()} want {want.reshape(-1)[:5].tolist()}"


# --------------------------------------------------------------------------- send/recv first, tags


def _send_recv_first_body(rank: int, world: int) -> list[str]:
    setup_rank()
    iris_group, _ = _groups()
    bad = []
    msg = _data((1000,), torch.float32, 0, salt=5)
    # The group's very first call is a send from rank 0 to the last rank; the ranks between
    # take no part in it.
    if rank == 0:
        dist.send(msg, world - 1, group=iris_group)
    elif rank == world - 1:
        got = torch.empty_like(msg)
        dist.recv(got, 0, group=iris_group)
        bad.append(_same(got, msg, "first message"))
    # the group then works for everyone
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, group=iris_group)
    bad.append(_same(t, torch.full((5,), float(world * (world + 1) // 2)), "all_reduce after it"))
    return [b for b in bad if b]


def test_send_recv_as_first_call_of_a_group_of_three():
    """A send/recv is a group's first call and ranks outside the pair take no part (world 3)."""
    for bad in run_world(_send_recv_first_body, 3, timeout=120.0):
        assert not bad, bad


def _tags_body(rank: int, world: int) -> list[str]:
    setup_rank()
    iris_group, _ = _groups()
    a, b = _data((300,), torch.float32, 0, 1), _data((7,), torch.int64, 0, 2)
    bad = []
    if rank == 0:
        dist.send(a, 1, group=iris_group, tag=3)
        work = dist.isend(b, 1, group=iris_group, tag=7)
        work.wait()
    else:
        got_a, got_b = torch.empty_like(a), torch.empty_like(b)
        dist.recv(got_a, 0, group=iris_group, tag=3)
        dist.irecv(got_b, 0, group=iris_group, tag=7).wait()
        bad += [_same(got_a, a, "tag 3"), _same(got_b, b, "tag 7")]
    return [x for x in bad if x]


def test_tagged_send_recv():
    """Tags are accepted and messages matched in call order per pair, as NCCL does."""
    for bad in run_world(_tags_body, 2, timeout=120.0):
        assert not bad, bad


# --------------------------------------------------------------------------- all_gather_coalesced


def _all_gather_coalesced_body(rank: int, world: int) -> list[str]:
    setup_rank()
    iris_group, gloo_group = _groups()
    counts = _count_ccl_calls()
    bad = []
    # gloo's all_gather_coalesced takes one dtype per call
    for dtype in (torch.float32, torch.int64, torch.complex64):
        shapes = [(3, 5), (0,), (7,), (2, 1, 2)]
        inputs = [_data(s, torch.float64, rank, i).to(dtype) for i, s in enumerate(shapes)]
        results = {}
        for name, group in (("iris", iris_group), ("gloo", gloo_group)):
            outs = [[torch.empty_like(x) for x in inputs] for _ in range(world)]
            dist.all_gather_coalesced(outs, inputs, group=group)
            results[name] = outs
        for r in range(world):
            for j in range(len(inputs)):
                got, want = results["iris"][r][j], results["gloo"][r][j]
                bad.append(
                    None if torch.equal(got, want) else f"{dtype} rank {r}'s tensor {j}: {got} != {want}"
                )
    # several dtypes in one call of the group's method (torch.distributed's function and
    # gloo refuse that; each rank knows every rank's inputs)
    mixed = [((3,), torch.int8), ((2, 2), torch.complex64), ((5,), torch.bool), ((3,), torch.float64)]

    def inputs_of(r: int) -> list[torch.Tensor]:
        return [_data(shape, torch.float64, r, 50 + i).to(dtype) for i, (shape, dtype) in enumerate(mixed)]

    outs = [[torch.empty_like(x) for x in inputs_of(rank)] for _ in range(world)]
    iris_group.allgather_coalesced(outs, inputs_of(rank)).wait()
    for r in range(world):
        for j, (got, want) in enumerate(zip(outs[r], inputs_of(r))):
            if not torch.equal(got, want):
                bad.append(f"mixed dtypes: rank {r}'s tensor {j}: {got} != {want}")
    if counts["all_gather"] < 1:
        bad.append(f"all_gather_coalesced made no iris.ccl call: {dict(counts)}")
    return [b for b in bad if b]


def test_all_gather_coalesced_matches_gloo():
    """``dist.all_gather_coalesced`` (a list per rank of tensors of several shapes, one empty;
    float32, int64 and complex64) equals gloo's and runs on iris.ccl; the group's method
    given several dtypes at once (int8, complex64, bool, float64) gathers them too."""
    for bad in run_world(_all_gather_coalesced_body, 3, timeout=120.0):
        assert not bad, bad


# --------------------------------------------------------------------------- PRODUCT and PREMUL_SUM


def _product_premul_body(rank: int, world: int) -> list[str]:
    setup_rank()
    iris_group, gloo_group = _groups()
    counts = _count_ccl_calls()
    bad: list[str] = []
    prod = dist.ReduceOp.PRODUCT
    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.float64):
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
        x = _near_one((2 * world + 1,), dtype, rank)
        runs = {}
        for name, group in (("iris", iris_group), ("gloo", gloo_group)):
            base = x if name == "iris" or dtype != torch.bfloat16 else x.float()
            ar = base.clone()
            dist.all_reduce(ar, op=prod, group=group)
            red = base.clone()
            dist.reduce(red, world - 1, op=prod, group=group)
            rs_in = torch.cat([base, base[: world - 1]])  # 3 elements for each rank
            rs = torch.empty(3, dtype=base.dtype)
            dist.reduce_scatter_tensor(rs, rs_in, op=prod, group=group)
            rs_list = torch.empty(3, dtype=base.dtype)
            dist.reduce_scatter(rs_list, list(rs_in.chunk(world)), op=prod, group=group)
            runs[name] = [t.to(dtype) for t in (ar, red, rs, rs_list)]
        for what, got, want in zip(("all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter"),
                                   runs["iris"], runs["gloo"]):  # fmt: skip
            if what == "reduce" and rank != world - 1:
                continue
            bad.append(_same(got, want, f"{what} PRODUCT {dtype}", tol))
    # PREMUL_SUM: sum over ranks of factor * x, with a float factor and a one-element tensor
    for factor in (0.25, torch.tensor([1.5])):
        x = _data((2 * world + 1,), torch.float32, rank, 9)
        scaled = x * factor
        want = scaled.clone()
        dist.all_reduce(want, group=gloo_group)
        got = x.clone()
        dist.all_reduce(got, op=dist._make_nccl_premul_sum(factor), group=iris_group)
        bad.append(_same(got, want, f"all_reduce PREMUL_SUM({factor})"))
        inp = _data((world * 4,), torch.float32, rank, 10)
        want = torch.empty(4)
        dist.reduce_scatter_tensor(want, inp * factor, group=gloo_group)
        got = torch.empty(4)
        before = inp.clone()
        dist.reduce_scatter_tensor(got, inp, op=dist._make_nccl_premul_sum(factor), group=iris_group)
        bad.append(_same(got, want, f"reduce_scatter_tensor PREMUL_SUM({factor})"))
        bad.append(_same(inp, before, "reduce_scatter_tensor PREMUL_SUM left its input alone"))
        red = x.clone()
        dist.reduce(red, 0, op=dist._make_nccl_premul_sum(factor), group=iris_group)
        want = scaled.clone()
        dist.reduce(want, 0, group=gloo_group)
        if rank == 0:
            bad.append(_same(red, want, f"reduce PREMUL_SUM({factor})"))
    # float8: reduced in fp32 and rounded once (iris.ccl's contract), through the backend too
    from iris.ccl.reduce_op import from_accumulator

    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        every = [_data((2 * world + 1,), torch.float32, r, 11).to(dtype) for r in range(world)]
        got = every[rank].clone()
        dist.all_reduce(got, group=iris_group)
        want = from_accumulator(sum(t.float() for t in every), dtype)
        if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
            bad.append(f"all_reduce of {dtype}: {got.float().tolist()} != {want.float().tolist()}")
    if sum(counts.values()) == 0:
        bad.append("no call reached iris.ccl")
    return [b for b in bad if b]


def test_product_and_premul_sum_in_every_reduction():
    """ReduceOp.PRODUCT (floats, bfloat16, int32, float64) and PREMUL_SUM (float and tensor
    factor) in all_reduce, reduce, reduce_scatter_tensor and reduce_scatter equal gloo's;
    float8 all_reduce through the backend equals iris.ccl's contract (fp32, rounded once)."""
    for bad in run_world(_product_premul_body, 3, timeout=180.0):
        assert not bad, bad


# --------------------------------------------------------------------------- C++ callers


def _cpp_callers_body(rank: int, world: int) -> dict:
    setup_rank()
    iris_group, gloo_group = _groups()
    counts = _count_ccl_calls()
    found: dict = {"bad": [], "counts": {}}
    c10d = torch.ops.c10d
    fc = torch.ops._c10d_functional
    for name, group in (("iris", iris_group), ("gloo", gloo_group)):
        counts.clear()
        x = _data((6,), torch.float32, rank, 1)
        gathered = torch.empty(world * 6)
        # what inductor's FSDP and bucketing passes emit
        fc.all_gather_into_tensor_out(x, world, group.group_name, out=gathered)
        fc.wait_tensor(gathered)
        rs = torch.empty(6 // world if 6 % world == 0 else 2)
        rs_in = _data((world * rs.numel(),), torch.float32, rank, 2)
        fc.reduce_scatter_tensor_out(rs_in, "sum", world, group.group_name, out=rs)
        fc.wait_tensor(rs)
        # the c10d ops C++ ProcessGroup methods call for the group
        boxed = group.boxed()
        gathered2 = torch.empty(world * 6)
        _, work = c10d._allgather_base_(gathered2, x, boxed)
        work.wait()
        gathered_list = [[torch.empty(6) for _ in range(world)]] if rank == 0 else []
        c10d.gather_(gathered_list, [x], boxed, 0).wait()
        scattered = torch.empty(3)
        pieces = [[_data((3,), torch.float32, 0, 3 + j) for j in range(world)]] if rank == 0 else []
        c10d.scatter_([scattered], pieces, boxed, 0)[1].wait()
        a2a_out = [torch.empty(2) for _ in range(world)]
        a2a_in = [_data((2,), torch.float32, rank, 20 + j) for j in range(world)]
        c10d.alltoall_(a2a_out, a2a_in, boxed)[1].wait()
        agc = [[torch.empty(6)] for _ in range(world)]
        c10d.allgather_coalesced_(agc, [x], boxed).wait()
        red = x.clone()
        opts = dist.ReduceOptions()
        opts.rootRank, opts.reduceOp = 0, dist.ReduceOp.SUM
        dist.ProcessGroup.reduce(group, [red], opts).wait()
        found[name] = [gathered, rs, gathered2, scattered, torch.cat(a2a_out), agc[world - 1][0]]
        if rank == 0:
            found[name] += [torch.cat(gathered_list[0]), red]
        found["counts"][name] = sum(counts.values())
    for i, (got, want) in enumerate(zip(found["iris"], found["gloo"])):
        b = _same(got, want, f"result {i}")
        if b:
            found["bad"].append(b)
    del found["iris"], found["gloo"]
    return found


def test_cpp_callers_of_the_group_run_on_iris():
    """``torch.ops._c10d_functional.*_out`` and the ``torch.ops.c10d`` ops (what C++ callers
    and inductor reach) run on iris.ccl for an iris group, with gloo's results; on a gloo
    group the same calls make no iris.ccl call (the count can fail)."""
    for found in run_world(_cpp_callers_body, 2, timeout=180.0):
        assert not found["bad"], found["bad"]
        assert found["counts"]["gloo"] == 0, found["counts"]
        assert found["counts"]["iris"] >= 8, found["counts"]


def _carrier_body(rank: int, world: int) -> str:
    setup_rank()
    iris_group, _ = _groups()
    backend = iris_group._get_backend(torch.device("cpu"))
    if isinstance(backend, dist.ProcessGroupGloo):
        return f"the group's cpu backend is a gloo group ({backend!r}): a second mesh that carries data"
    try:
        backend.allreduce([torch.ones(3)], dist.AllreduceOptions()).wait()
    except RuntimeError:
        return ""
    return "a collective on the group's carrier backend moved data instead of raising"


def test_carrier_backend_carries_no_data():
    """The backend registered on an iris group for its name is not a gloo mesh and raises
    when a call reaches it."""
    for bad in run_world(_carrier_body, 2, timeout=120.0):
        assert not bad, bad


# --------------------------------------------------------------------------- convenience overloads


def _overloads_body(rank: int, world: int) -> dict:
    setup_rank()
    iris_group, gloo_group = _groups()
    counts = _count_ccl_calls()
    out: dict = {"bad": [], "calls": {}}
    results = {}
    for name, pg in (("iris", iris_group), ("gloo", gloo_group)):
        counts.clear()
        r = []
        t = _data((5,), torch.float32, rank, 1)
        pg.allreduce(t).wait()  # one tensor: one collective of 5 elements
        r.append(t)
        t = _data((5,), torch.float32, rank, 2)
        pg.allreduce([t], dist.ReduceOp.MAX).wait()
        r.append(t)
        t = _data((4,), torch.float32, rank, 3)
        pg.broadcast(t, world - 1).wait()
        r.append(t)
        t = _data((4,), torch.float32, rank, 4)
        pg.reduce(t, 0, dist.ReduceOp.SUM).wait()
        r.append(t if rank == 0 else torch.zeros(4))
        outs = [torch.empty(3) for _ in range(world)]
        pg.allgather(outs, _data((3,), torch.float32, rank, 5)).wait()
        r += outs
        outs = [torch.empty(3) for _ in range(world)] if rank == 0 else []
        pg.gather(outs, _data((3,), torch.float32, rank, 6), 0).wait()
        r += outs
        o = torch.empty(3)
        pg.scatter(
            o, [_data((3,), torch.float32, 0, 7 + j) for j in range(world)] if rank == 0 else [], 0
        ).wait()
        r.append(o)
        o = torch.empty(3)
        pg.reduce_scatter(
            o, [_data((3,), torch.float32, rank, 20 + j) for j in range(world)], dist.ReduceOp.SUM
        ).wait()
        r.append(o)
        pg.barrier().wait()
        results[name] = r
        out["calls"][name] = dict(counts)
    for i, (got, want) in enumerate(zip(results["iris"], results["gloo"])):
        b = _same(got, want, f"call {i}")
        if b:
            out["bad"].append(b)
    return out


def test_pybind_convenience_overloads_behave_as_on_gloo():
    """``pg.allreduce(tensor)``, ``pg.allreduce([t], op)``, ``pg.broadcast(tensor, root)``,
    ``pg.reduce(tensor, root, op)``, ``pg.allgather(list, tensor)``, ``pg.gather``,
    ``pg.scatter``, ``pg.reduce_scatter`` and ``pg.barrier()`` give gloo's results, each one
    collective (``allreduce`` of one tensor is not one collective per element)."""
    for found in run_world(_overloads_body, 2, timeout=180.0):
        assert not found["bad"], found["bad"]
        calls = found["calls"]["iris"]
        assert calls.get("all_reduce") == 2, calls
        assert found["calls"]["gloo"] == {}, found["calls"]


# --------------------------------------------------------------------------- grouped point-to-point


def _ring_body(rank: int, world: int, nbytes: int) -> list[str]:
    setup_rank()
    iris_group, _ = _groups()
    right, left = (rank + 1) % world, (rank - 1) % world
    send = _data((nbytes // 4,), torch.float32, rank, 30)
    recv = torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, right, iris_group), dist.P2POp(dist.irecv, recv, left, iris_group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    bad = [_same(recv, _data((nbytes // 4,), torch.float32, left, 30), "ring message")]
    # a second pattern in the same batch: every pair exchanges a message both ways
    sends = {p: _data((1000 + p,), torch.float32, rank, 40 + p) for p in range(world) if p != rank}
    recvs = {p: torch.empty(1000 + rank) for p in range(world) if p != rank}
    ops = [dist.P2POp(dist.isend, t, p, iris_group) for p, t in sends.items()]
    ops += [dist.P2POp(dist.irecv, t, p, iris_group) for p, t in recvs.items()]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for p, t in recvs.items():
        bad.append(_same(t, _data((1000 + rank,), torch.float32, p, 40 + rank), f"all-to-all from {p}"))
    return [b for b in bad if b]


@pytest.mark.parametrize("world", [3])
def test_ring_batch_isend_irecv(world):
    """A ring of 1 MiB messages (four times the mailbox) and an all-to-all exchange in one
    ``batch_isend_irecv`` each complete with the right data."""
    env = {"IRIS_WAIT_TIMEOUT": "60"}
    for bad in run_world(_ring_body, world, 1 << 20, timeout=240.0, env=env):
        assert not bad, bad


@pytest.mark.full
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_batch_isend_irecv_8mib(world):
    """A ring of 8 MiB messages in one ``batch_isend_irecv`` at worlds 2-4."""
    env = {"IRIS_WAIT_TIMEOUT": "120"}
    for bad in run_world(_ring_body, world, 8 << 20, timeout=500.0, env=env):
        assert not bad, bad


# --------------------------------------------------------------------------- Work's error contract


def _mismatch_body(rank: int, world: int) -> dict:
    setup_rank()
    import iris.mem

    iris_group, _ = _groups()
    dist.all_reduce(torch.ones(4), group=iris_group)  # the group's state, made by a good call
    t = torch.ones(100 if rank == 0 else 200)
    found = {}
    try:
        work = dist.all_reduce(t, group=iris_group, async_op=True)
    except iris.mem.IrisError as e:
        return {"raised_at_call": type(e).__name__}
    found["success_before_wait"] = work.is_success()
    found["exception"] = type(work.exception()).__name__
    try:
        work.get_future().wait()
        found["future"] = "completed"
    except Exception as e:  # noqa: BLE001 - the future's error is what the test reads
        found["future"] = type(e).__name__
    try:
        work.wait()
        found["wait"] = "returned"
    except iris.mem.IrisError as e:
        found["wait"] = type(e).__name__
    return found


def test_work_wait_raises_a_mismatch():
    """A collective whose ranks disagree (CPU: found by the kernels' call signatures) returns
    a Work whose ``wait()`` raises the mismatch, ``exception()`` holds it, ``is_success()`` is
    False and the future is completed with the error."""
    for found in run_world(_mismatch_body, 2, timeout=120.0):
        assert found.get("raised_at_call") is None, found
        assert found["wait"] == "CallMismatchError", found
        assert found["exception"] == "CallMismatchError", found
        assert found["success_before_wait"] is False, found
        assert found["future"] != "completed", found


def _dead_peer_body(rank: int, world: int) -> dict:
    setup_rank()
    import iris.mem

    iris_group, _ = _groups()
    dist.all_reduce(torch.ones(4), group=iris_group)
    if rank == 1:
        os._exit(3)  # a peer that dies without a word
    msg = torch.ones(1 << 18)
    start = time.monotonic()
    work = dist.isend(msg, 1, group=iris_group)
    try:
        work.wait()
        return {"wait": "returned"}
    except iris.mem.IrisError as e:
        return {"wait": type(e).__name__, "seconds": time.monotonic() - start, "exception": work.exception()}


def test_work_wait_raises_for_a_killed_peer():
    """An isend to a peer that was killed raises from ``wait()`` (the watchdog's abort), and
    ``exception()`` holds the error."""
    results = launch_world(_dead_peer_body, 2, timeout=120.0, env={"IRIS_WAIT_TIMEOUT": "60"})
    found = results[0].value
    assert found is not None, results[0].error
    assert found["wait"] in ("AbortedError", "DeviceWaitTimeout"), found
    assert found["exception"] is not None, found
    assert found["seconds"] < 30, found


def _wait_timeout_body(rank: int, world: int) -> dict:
    setup_rank()
    import iris.mem

    iris_group, _ = _groups()
    if rank == 1:
        time.sleep(8)  # never receives (while the sender waits its 2 s)
        return {}
    work = dist.isend(torch.ones(1 << 18), 1, group=iris_group)  # four mailboxes: waits for rank 1
    start = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=2))
        return {"wait": "returned", "seconds": time.monotonic() - start}
    except (iris.mem.IrisError, dist.DistBackendError) as e:
        return {"wait": type(e).__name__, "seconds": time.monotonic() - start}


def test_work_wait_honours_its_timeout():
    """``work.wait(timeout=2 s)`` of an isend whose receiver never comes gives up after about
    2 s (not the group's 60 s, nor IRIS_WAIT_TIMEOUT's 300 s)."""
    results = launch_world(_wait_timeout_body, 2, timeout=120.0, env={"IRIS_WATCHDOG": "0"})
    found = results[0].value
    assert found is not None, results[0].error
    assert found["wait"] != "returned" and found["seconds"] < 8, found


# --------------------------------------------------------------------------- timeouts and options


def _group_timeout_body(rank: int, world: int, late: float) -> dict:
    setup_rank()
    import iris.ccl  # noqa: F401
    import iris.mem

    group = dist.new_group(backend="iris", timeout=datetime.timedelta(seconds=2))
    dist.all_reduce(torch.ones(4), group=group)
    if rank == 1:
        time.sleep(late)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=group)
        outcome = "completed"
    except iris.mem.IrisError as e:
        outcome = type(e).__name__
    return {"outcome": outcome, "seconds": time.monotonic() - start}


def test_group_timeout_bounds_device_waits():
    """A group made with ``timeout=2 s`` gives up a device wait for a peer 8 s late after about
    2 s (IRIS_WAIT_TIMEOUT unset); with IRIS_WAIT_TIMEOUT=30 set, the same call waits for it."""
    env = {"IRIS_WAIT_TIMEOUT": "", "IRIS_WATCHDOG": "0"}
    results = launch_world(_group_timeout_body, 2, 8.0, timeout=120.0, env=env)
    first = results[0].value
    assert first is not None, results[0].error
    assert first["outcome"] == "DeviceWaitTimeout" and first["seconds"] < 6, first
    env = {"IRIS_WAIT_TIMEOUT": "30", "IRIS_WATCHDOG": "0"}
    for found in run_world(_group_timeout_body, 2, 4.0, timeout=120.0, env=env):
        assert found["outcome"] == "completed", found


def _host_timeout_body(rank: int, world: int) -> dict:
    setup_rank()
    import iris.ccl  # noqa: F401

    group = dist.new_group(backend="iris", timeout=datetime.timedelta(minutes=30))
    if rank == 1:
        time.sleep(10)  # makes no collective before rank 0 has given up (4 s)
        return {}
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=group)
        outcome = "completed"
    except Exception as e:  # noqa: BLE001 - the kind of error is what the test reads
        outcome = type(e).__name__
    return {"outcome": outcome, "seconds": time.monotonic() - start}


def test_iris_host_exchanges_bounded_on_a_group_with_a_long_timeout():
    """On a group whose timeout is 30 minutes, Iris's own host exchange (making the group's
    heap) gives up after IRIS_HOST_TIMEOUT when a peer never comes."""
    results = launch_world(_host_timeout_body, 2, timeout=120.0, env={"IRIS_HOST_TIMEOUT": "4"})
    found = results[0].value
    assert found is not None, results[0].error
    assert found["outcome"] != "completed" and found["seconds"] < 15, found


def _options_body(rank: int, world: int) -> dict:
    setup_rank()
    import iris.ccl
    import iris.mem
    from iris.ccl.backend import ProcessGroupOptions

    heaps = []
    init = iris.mem.init

    @functools.wraps(init)
    def counted_init(*args, **kwargs):
        heap = init(*args, **kwargs)
        heaps.append(heap.heap_size)
        return heap

    iris.mem.init = counted_init
    configs = []
    all_reduce = iris.ccl.all_reduce

    def seen(*args, **kwargs):
        configs.append(kwargs.get("config"))
        return all_reduce(*args, **kwargs)

    iris.ccl.all_reduce = seen
    config = iris.ccl.Config(variant="ring")
    options = ProcessGroupOptions(heap_size=96 << 20, config=config)
    group = dist.new_group(backend="iris", pg_options=options)
    t = torch.ones(1000)
    dist.all_reduce(t, group=group)
    return {"heaps": heaps, "configs": [repr(c) for c in configs], "want": repr(config), "ok": float(t[0])}


def test_pg_options_set_heap_size_and_config():
    """``pg_options=ProcessGroupOptions(heap_size=..., config=...)`` sizes the group's heap and
    is the default Config of its collectives."""
    for found in run_world(_options_body, 2, timeout=120.0):
        assert (96 << 20) in found["heaps"], found
        assert found["configs"] and all(c == found["want"] for c in found["configs"]), found
        assert found["ok"] == 2.0, found


def _one_communicator_body(rank: int, world: int) -> dict:
    setup_rank()
    import torch.distributed._functional_collectives as funcol

    import iris.ccl
    import iris.mem

    made = []
    init = iris.mem.init

    @functools.wraps(init)
    def counted_init(*args, **kwargs):
        made.append(kwargs.get("group"))
        return init(*args, **kwargs)

    iris.mem.init = counted_init
    group = dist.new_group(backend="iris")
    t = torch.ones(8)
    dist.all_reduce(t, group=group)
    first = len(made)
    torch.ops.iris.all_reduce(t, "sum", group.group_name, "")
    iris.ccl.all_reduce(torch.empty(8), t, group=group)
    funcol.all_reduce(t, "sum", group).wait()
    others = len(made) - first
    other = dist.new_group(backend="iris")  # the negative control: another group, new heaps
    before = len(made)
    dist.all_reduce(t, group=other)
    return {"other_paths": others, "another_group": len(made) - before}


def test_one_communicator_and_heap_per_group():
    """After ``dist.all_reduce`` on an iris group, torch.ops.iris.*, iris.ccl.* with the group
    and funcol make no heap of their own; a new group's first collective makes one (the
    count can fail)."""
    for found in run_world(_one_communicator_body, 2, timeout=120.0):
        assert found == {"other_paths": 0, "another_group": 1}, found


def _two_streams_body(rank: int, world: int) -> list[str]:
    setup_rank()
    from ccl_testutils import device

    iris_group, _ = _groups()
    dev = device()
    streams = [torch.cuda.Stream(dev), torch.cuda.Stream(dev)]
    xs = [torch.full((1 << 20,), float(rank + i), device=dev) for i in range(8)]
    torch.cuda.synchronize(dev)
    for i, x in enumerate(xs):  # no ordering between the streams but the group's own
        with torch.cuda.stream(streams[i % 2]):
            dist.all_reduce(x, group=iris_group)
    torch.cuda.synchronize(dev)
    want = [float(sum(r + i for r in range(world))) for i in range(len(xs))]
    return [
        f"call {i}: {x[0].item()} != {w}"
        for i, (x, w) in enumerate(zip(xs, want))
        if x.min() != x.max() or x[0] != w
    ]


@pytest.mark.gpu
def test_calls_of_a_group_from_two_streams_run_in_order():
    """All-reduces of one iris group alternating between two CUDA streams, with no ordering
    between the streams, all give the right sums (the group orders them, as NCCL does)."""
    if os.environ.get("IRIS_BACKEND", "cpu") != "cuda":
        pytest.skip("needs the cuda backend (CUDA streams); 2 ranks, on one GPU or two")
    for bad in run_world(_two_streams_body, 2, timeout=300.0):
        assert not bad, bad


# --------------------------------------------------------------------------- profiler


def _profiler_body(rank: int, world: int) -> list[str]:
    setup_rank()
    iris_group, _ = _groups()
    t = torch.ones(1000)
    out = torch.empty(world * 1000)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t, group=iris_group)
        dist.all_gather_into_tensor(out, t, group=iris_group)
    names = [e.name for e in prof.events()]
    want = (
        f"iris.ccl.all_reduce(out=float32[1000], inp=float32[1000], group={world})",
        f"iris.ccl.all_gather(out=float32[{world * 1000}], inp=float32[1000], group={world})",
    )
    return [f"no profiler range {w!r} in {sorted(set(names))[:20]}" for w in want if w not in names]


def test_profiler_trace_shows_iris_ranges():
    """A torch.profiler trace of collectives on an iris group holds a range per collective,
    named after it with its tensors' dtypes and shapes and its group's size."""
    for bad in run_world(_profiler_body, 2, timeout=120.0):
        assert not bad, bad
