"""What torch users pass to iris.ccl called directly: no ``init_process_group``, the dtypes
torch.distributed with NCCL accepts, and ``async_op=True`` handles that are
``torch.distributed.Work`` objects (``iris.ccl.entry``, ``iris.ccl._dtypes``,
``iris.ccl.work``).

The world test starts ranks the way torchrun leaves them (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` set, no process group: the body destroys the one
``run_world`` made), so iris.ccl's first call must set the world up itself. Reductions are
compared with gloo on the same data (exactly, in the dtype); moves are compared bit for bit
with the inputs every rank can rebuild (each rank's data is a function of its rank).
"""

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import device, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
WORLD = 3  # on GPUs too: ranks beyond the number of GPUs share them
WORLD_TIMEOUT = 300.0
SHAPE = (5, 3)  # 15 elements: a multiple of no block size and of no world size above 1


# --------------------------------------------------------------------------- helpers (in ranks)


def _data(shape, dtype: torch.dtype, rank: int, salt: int) -> torch.Tensor:
    """Rank ``rank``'s input (any rank can rebuild any other's): the whole range of the
    small integer types, so int8 and uint8 sums wrap; small integers (exact sums) for
    floats; both parts for complex."""
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype == torch.bool:
        x = torch.rand(shape, generator=g) < 0.5
    elif dtype.is_complex:
        x = torch.complex(*(torch.randint(-50, 50, shape, generator=g).double() for _ in range(2))).to(dtype)
    elif dtype.is_floating_point:
        x = (torch.randint(-400, 400, shape, generator=g).double() / 4).to(dtype)
    elif dtype in (torch.int8, torch.uint8):
        x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(dtype)
    elif dtype in (torch.int16, torch.uint16):
        x = (
            torch.randint(-(1 << 15), 1 << 15, shape, generator=g, dtype=torch.int32)
            .to(torch.int16)
            .view(dtype)
        )
    else:
        x = torch.randint(-1000, 1000, shape, generator=g).to(dtype)
    return x.to(device())


def _differs(got: torch.Tensor, want: torch.Tensor, what: str, exact: bool = True) -> str | None:
    """Exact comparison (bools by truth value: gloo's SUM of bools may leave bytes above 1);
    ``exact=False``: within 1e-6 (a division's rounding)."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: {list(got.shape)} {got.dtype} != {list(want.shape)} {want.dtype}"
    if got.dtype == torch.bool:
        got, want = got.view(torch.uint8) != 0, want.view(torch.uint8) != 0
    if not (torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-6, atol=1e-6)):
        return f"{what}: {got.flatten()[:6].tolist()} != {want.flatten()[:6].tolist()}"
    return None


def _gloo(x: torch.Tensor, op: str) -> torch.Tensor:
    """gloo's all_reduce of a CPU copy of ``x`` (AVG as SUM divided by the world size; int16,
    which gloo does not take, as int32 and wrapped back)."""
    t = x.detach().cpu().clone()
    if t.dtype == torch.int16:
        return _gloo(t.int(), op).to(torch.int16)
    if op == "AVG":
        dist.all_reduce(t)
        return t / dist.get_world_size()
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return t


def _ops(dtype: torch.dtype) -> list[str]:
    if dtype.is_complex:
        return ["SUM", "AVG"]
    return ["SUM", "MAX", "MIN"] + (["AVG"] if dtype.is_floating_point else [])


def _dtype_cases(rank: int, world: int, dtype: torch.dtype, salt: int, every: bool) -> list[str]:
    """The collectives of iris.ccl called directly with ``dtype``, against gloo / the inputs:
    every one (``every``), or all_reduce (each op) and one move (the others run the same
    path for another dtype)."""
    import iris.ccl

    bad = []
    name = str(dtype).replace("torch.", "")
    x = _data(SHAPE, dtype, rank, salt)
    every_input = [_data(SHAPE, dtype, r, salt) for r in range(world)]
    reducible = dtype in (torch.float64, torch.int8, torch.uint8, torch.int16, torch.bool) or dtype.is_complex

    if reducible:
        for op in _ops(dtype):
            out = torch.empty_like(x)
            iris.ccl.all_reduce(out, x, op=op)
            bad.append(_differs(out, _gloo(x, op), f"all_reduce {op} {name}", exact=op != "AVG"))

    if not every:  # one move: the dtype's carrier (complex: its real view, split sizes)
        if dtype.is_complex:
            return [b for b in bad + _all_to_all_case(rank, world, dtype, salt, name) if b]
        gathered = torch.empty(world * SHAPE[0], SHAPE[1], dtype=dtype, device=x.device)
        iris.ccl.all_gather(gathered, x)
        bad.append(_differs(gathered, torch.cat(every_input), f"all_gather {name}"))
        return [b for b in bad if b]

    if reducible:
        inplace, op = x.clone(), "SUM" if dtype.is_complex else "MAX"
        iris.ccl.all_reduce(inplace, inplace, op=op)
        bad.append(_differs(inplace, _gloo(x, op), f"all_reduce {op} in place {name}"))
        big = _data((world * SHAPE[0], SHAPE[1]), dtype, rank, salt + 1)
        mine = torch.empty_like(x)
        iris.ccl.reduce_scatter(mine, big)
        bad.append(_differs(mine, _gloo(big, "SUM").chunk(world)[rank], f"reduce_scatter {name}"))
        root = world - 1
        red = torch.zeros_like(x) if rank == root else None
        iris.ccl.reduce(red, x.t(), root, op="sum")  # a non-contiguous input
        want = _gloo(x.t().contiguous(), "SUM")
        if rank == root:
            bad.append(_differs(red, want.view(SHAPE), f"reduce {name}"))

    gathered = torch.empty(world * SHAPE[0], SHAPE[1], dtype=dtype, device=x.device)
    iris.ccl.all_gather(gathered, x)
    bad.append(_differs(gathered, torch.cat(every_input), f"all_gather {name}"))

    bad += _all_to_all_case(rank, world, dtype, salt, name)

    b = x.clone()
    iris.ccl.broadcast(b, 1 % world)
    bad.append(_differs(b, every_input[1 % world], f"broadcast {name}"))
    everything = torch.empty(world, *SHAPE, dtype=dtype, device=x.device) if rank == 0 else None
    iris.ccl.gather(everything, x, 0)
    if rank == 0:
        bad.append(_differs(everything, torch.stack(every_input), f"gather {name}"))
    part = torch.empty(SHAPE, dtype=dtype, device=x.device)
    iris.ccl.scatter(part, torch.stack(every_input) if rank == world - 1 else None, world - 1)
    bad.append(_differs(part, every_input[rank], f"scatter {name}"))
    if world > 1:  # a ring
        msg = torch.empty_like(x)
        if rank % 2 == 0:
            iris.ccl.send(x, (rank + 1) % world)
            iris.ccl.recv(msg, (rank - 1) % world)
        else:
            iris.ccl.recv(msg, (rank - 1) % world)
            iris.ccl.send(x, (rank + 1) % world)
        bad.append(_differs(msg, every_input[(rank - 1) % world], f"send/recv {name}"))
    return [b for b in bad if b]


def _all_to_all_case(rank: int, world: int, dtype: torch.dtype, salt: int, name: str) -> list[str]:
    import iris.ccl

    bad = []
    send_rows = [j + 1 for j in range(world)]  # rank r sends j + 1 rows to rank j
    rows = _data((sum(send_rows), SHAPE[1]), dtype, rank, salt + 2)
    got = torch.empty((rank + 1) * world, SHAPE[1], dtype=dtype, device=rows.device)
    iris.ccl.all_to_all(got, rows, [rank + 1] * world, send_rows)
    start = sum(send_rows[:rank])  # where every rank's rows for this one start
    want = torch.cat([_data(rows.shape, dtype, r, salt + 2)[start : start + rank + 1] for r in range(world)])
    bad.append(_differs(got, want, f"all_to_all split sizes {name}"))

    return bad


def _work_cases(rank: int, world: int) -> list[str]:
    """``async_op=True`` handles: torch.distributed.Work, completed with the outputs."""
    import iris.ccl

    bad = []
    x = _data(SHAPE, torch.float32, rank, 5)
    out = torch.empty_like(x)
    work = iris.ccl.all_reduce(out, x, async_op=True)
    if not isinstance(work, dist.Work) or not isinstance(work, iris.ccl.Work):
        bad.append(f"all_reduce returned {type(work).__mro__}, not a torch.distributed.Work")
    if work.wait() is not True:
        bad.append("Work.wait() did not return True")
    if x.is_cuda:
        torch.cuda.synchronize()
    if not work.is_completed() or not work.is_success() or work.exception() is not None:
        bad.append("Work: not completed or not successful after wait")
    future = work.get_future()
    value = future.wait()
    if len(value) != 1 or value[0] is not out or work.result()[0] is not out:
        bad.append(f"Work.get_future() value {value!r} is not [out]")
    doubled = future.then(lambda f: f.value()[0] * 2).wait()
    bad.append(_differs(doubled, _gloo(x, "SUM").to(x.device) * 2, "Work future then()"))
    # the conversion path completes the future with the caller's tensors, not its views
    y = _data(SHAPE, torch.int8, rank, 6)
    ys = torch.empty(world * SHAPE[0], SHAPE[1], dtype=torch.int8, device=y.device)
    value = iris.ccl.all_gather(ys, y, async_op=True).get_future().wait()
    if len(value) != 1 or value[0] is not ys:
        bad.append(f"all_gather int8 future value is not [out]: {[t.dtype for t in value]}")
    z = _data(SHAPE, torch.float64, rank, 7)
    value = iris.ccl.all_reduce(z, z, async_op=True).get_future().wait()
    if len(value) != 1 or value[0] is not z or value[0].dtype != torch.float64:
        bad.append("all_reduce float64 future value is not [the caller's tensor]")
    if iris.ccl.barrier(async_op=True).get_future().wait() != []:
        bad.append("barrier future value is not []")
    if rank != 0 and iris.ccl.reduce(None, x, 0, async_op=True).get_future().wait() != []:
        bad.append("reduce off the root with out=None: future value is not []")
    if rank == 0:
        r = torch.empty_like(x)
        iris.ccl.reduce(r, x, 0, async_op=True).wait()
    return [b for b in bad if b]


def _error_cases(rank: int) -> list[str]:
    """Dtypes and ops that make no sense raise the same error on every rank, before sending."""
    import iris.ccl

    bad = []
    world = dist.get_world_size()
    b = torch.ones(4, dtype=torch.bool, device=device())
    c64 = b.to(torch.complex64)
    u16, i8 = (
        torch.zeros(4, dtype=torch.uint16, device=b.device),
        torch.ones(world, dtype=torch.int8, device=b.device),
    )
    cases = [
        ("bool AVG", lambda: iris.ccl.all_reduce(b, b, op="avg"), ValueError, ["AVG", "torch.bool"]),
        ("uint16 SUM", lambda: iris.ccl.all_reduce(u16, u16), TypeError, ["uint16", "int32"]),
        ("complex MAX", lambda: iris.ccl.all_reduce(c64, c64, op="max"), ValueError, ["MAX", "complex"]),
        (
            "dtype mismatch", lambda: iris.ccl.all_gather(b.double().repeat(4), b.float()), TypeError,
            ["float64", "float32"],
        ),
        ("sparse", lambda: iris.ccl.broadcast(b.double().to_sparse(), 0), TypeError, ["to_dense"]),
        ("int8 AVG", lambda: iris.ccl.reduce_scatter(i8[:1], i8, op="avg"), ValueError, ["AVG", "int8"]),
    ]  # fmt: skip
    for what, call, kind, words in cases:
        try:
            call()
            bad.append(f"{what}: no error")
        except kind as e:
            missing = [w for w in words if w not in str(e)]
            if missing:
                bad.append(f"{what}: {missing} not in {e}")
        except Exception as e:  # noqa: BLE001
            bad.append(f"{what}: {type(e).__name__} instead of {kind.__name__}: {e}")
    return bad


def _no_init_body(rank: int, world: int, port: int, dtypes: list, every: bool) -> list[str]:
    setup_rank()
    dist.destroy_process_group()  # as torchrun leaves a rank: environment only
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import iris.ccl

    bad = []
    if dist.is_initialized():
        return ["the process group is still initialised"]
    x = torch.full(SHAPE, float(rank + 1), dtype=torch.float64, device=device())
    iris.ccl.all_reduce(x, x)  # the first call sets the world up
    if not dist.is_initialized() or dist.get_world_size() != world or dist.get_rank() != rank:
        return [f"no world of {world} after the first call: {dist.is_initialized()}"]
    if not torch.equal(x.cpu(), torch.full(SHAPE, world * (world + 1) / 2, dtype=torch.float64)):
        bad.append(f"first all_reduce: {x.flatten()[:3].tolist()}")
    for salt, dtype in enumerate(dtypes):
        # float64 through every collective; the others through every one in the full run
        bad += _dtype_cases(rank, world, dtype, 10 * salt, every or dtype == torch.float64)
    bad += _work_cases(rank, world)
    bad += _error_cases(rank)
    if not every:  # gradients, each collective in one dtype (test_ccl_autograd: full runs)
        from test_ccl_autograd import compiled_case, gradient_cases

        bad += gradient_cases(rank, world, [torch.float32, torch.float64], every=False)
        bad += compiled_case(rank, world)
    return bad


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(dtypes: list, every: bool, world: int = WORLD) -> None:
    require_world(world)
    results = run_world(_no_init_body, world, _free_port(), dtypes, every, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


# --------------------------------------------------------------------------- tests


def test_torchrun_world_without_init():
    """torchrun's environment and no process group, then in the same world: float64 in every
    collective, int8, bool and complex64 in all_reduce (each op) and one move; Work handles;
    the errors of dtypes and ops that make no sense; gradients against
    torch.distributed.nn (each functional collective in fp32 or fp64) and a compiled
    training step (aot_eager)."""
    _run([torch.float64, torch.int8, torch.bool, torch.complex64], every=False)


@pytest.mark.full
def test_without_init_every_dtype():
    """Every collective with int8, uint8, bool, int16, uint16 (moved only), complex64 and
    complex128."""
    _run(
        [torch.int8, torch.uint8, torch.bool, torch.int16, torch.uint16, torch.complex64, torch.complex128],
        every=True,
    )


WORLD_OF_ONE = """
import torch, torch.distributed as dist
import iris.ccl
x = torch.arange(7, dtype=torch.float64)
out = torch.empty_like(x)
work = iris.ccl.all_reduce(out, x, async_op=True)
assert dist.is_initialized() and dist.get_world_size() == 1
assert torch.equal(work.get_future().wait()[0], x) and isinstance(work, dist.Work)
b = torch.tensor([True, False, True])
o = torch.empty_like(b)
iris.ccl.all_reduce(o, b, op="min")
assert torch.equal(o, b)
print("ok")
"""


@pytest.mark.full
def test_world_of_one_without_launcher():
    """No launcher and no process group: the first call makes a world of one."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "script.py"
        script.write_text(WORLD_OF_ONE)
        done = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240
        )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
