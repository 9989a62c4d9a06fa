"""The iris.ops API contract: bad input gets a clear exception naming the argument, empty
and K = 0 problems work, a rank that never arrives is reported instead of hanging, and
``Config`` validates its fields."""

import json
import os
import socket

import pytest
import torch
from ops_testutils import assert_clean, device, rand, setup_rank, summed

from iris.mem.testing import run_world

pytestmark = pytest.mark.timeout(300)

OPS = ("matmul_all_reduce", "all_gather_matmul", "matmul_all_gather", "matmul_reduce_scatter")


def test_config_validates_fields():
    import iris.ops

    assert iris.ops.Config() == iris.ops.Config(block_m=0, split="auto")
    for kwargs, text in [
        (dict(block_m=48), "block_m must be a power of two"),
        (dict(block_n=512), "block_n must be a power of two"),
        (dict(block_k=8), "block_k must be a power of two"),
        (dict(num_warps=3), "num_warps"),
        (dict(num_stages=9), "num_stages"),
        (dict(num_sms=5000), "num_sms"),
        (dict(comm_sms=-1), "comm_sms must be >= 0"),
        (dict(split="k"), "split"),
        (dict(order="backwards"), "order"),
    ]:
        with pytest.raises(ValueError, match=text):
            iris.ops.Config(**kwargs)
    with pytest.raises(TypeError, match="group_m must be an int"):
        iris.ops.Config(group_m=2.0)
    for name in ("tma", "stream"):
        with pytest.raises(TypeError, match=f"Config.{name} must be True, False or None"):
            iris.ops.Config(**{name: 1})
    with pytest.raises(TypeError):
        iris.ops.Config(128)  # keyword-only


def _first_call_body(rank: int, world: int, ports: list[int]) -> list[str]:
    """Each op called as the first thing of a rank whose launcher set only the environment
    (as torchrun does): the call must set the process group up, as iris.ccl's calls do."""
    import torch.distributed as dist

    import iris.ops

    setup_rank()
    dev = device()
    bad = []
    x = torch.full((5, 7), float(rank + 1), device=dev)
    w = torch.eye(7, device=dev)
    experts = torch.tensor([[rank % (2 * world)]], device=dev)
    calls = {
        "matmul_all_reduce": lambda: iris.ops.matmul_all_reduce(torch.empty(5, 7, device=dev), x, w),
        "all_reduce_rmsnorm": lambda: iris.ops.all_reduce_rmsnorm(
            torch.empty(5, 7, device=dev), x, torch.ones(7, device=dev)
        ),
        "moe_dispatch": lambda: iris.ops.moe_dispatch(x[:1], experts, 2 * world).check(),
    }
    for port, (name, call) in zip(ports, calls.items()):
        if dist.is_initialized():
            dist.destroy_process_group()  # what a torchrun rank starts with: the environment only
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        try:
            call()
        except Exception as e:  # noqa: BLE001 - reported per op
            bad.append(f"{name} as the first call: {type(e).__name__}: {e}")
            continue
        if not dist.is_initialized() or dist.get_world_size() != world or dist.get_rank() != rank:
            bad.append(f"{name} as the first call left no world of {world}")
    return bad


def test_ops_set_up_the_world_on_their_first_call():
    """Every iris.ops entry point sets the process group up from the launcher's environment
    on its first call (issue: 'launch with torchrun' under torchrun)."""
    ports = []
    for _ in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    results = run_world(_first_call_body, 3, ports, timeout=240)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res]
    assert not problems, "\n".join(problems)


def _expect(errors, exc, text, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        if text not in str(e):
            errors.append(f"{fn.__name__}: {exc.__name__} without {text!r}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - reported
        errors.append(f"{fn.__name__}: expected {exc.__name__} ({text!r}), got {type(e).__name__}: {e}")
        return
    errors.append(f"{fn.__name__}: expected {exc.__name__} ({text!r}), nothing raised")


def errors_body(rank, world_size):
    """Every rejected input of every op, in a world of ``world_size``."""
    import iris.ops

    bad: list[str] = []
    g = world_size
    a, b = rand((8, 6), torch.float32, 1), rand((6, 5), torch.float32, 2)
    ar, ag, mag, rs = (getattr(iris.ops, op) for op in OPS)
    _expect(bad, TypeError, "out must be a torch.Tensor", ar, None, a, b)
    _expect(bad, ValueError, "a must be 2-D", ar, torch.empty(8, 5), a.view(-1), b)
    _expect(bad, TypeError, "not supported", ar, torch.empty(8, 5, dtype=torch.int32), a.int(), b.int())
    _expect(bad, TypeError, "b has dtype torch.float16", ar, torch.empty(8, 5), a, b.half())
    _expect(bad, ValueError, "a's columns must equal b's rows", ar, torch.empty(8, 5), a, b[:5])
    _expect(bad, ValueError, "out has shape [8, 4], expected [8, 5]", ar, torch.empty(8, 4), a, b)
    _expect(bad, ValueError, "bias has 4 elements, expected 5", ar, torch.empty(8, 5), a, b, torch.zeros(4))
    _expect(bad, ValueError, "out overlaps a", ar, a[:, :5], a, b)
    _expect(bad, TypeError, "config must be an iris.ops.Config", ar, torch.empty(8, 5), a, b, config={})
    _expect(
        bad, TypeError, "workspace must be an iris.ops.Workspace", ar, torch.empty(8, 5), a, b, workspace=1
    )
    _expect(bad, TypeError, "group must be", ar, torch.empty(8, 5), a, b, group="world")
    # float8 operands: both float8, a bf16/fp32 out and a bias of out's dtype, the scales
    a8, b8, bf = a.to(torch.float8_e4m3fn), b.to(torch.float8_e5m2), torch.empty(8, 5, dtype=torch.bfloat16)
    one = torch.ones(1)
    _expect(bad, TypeError, "scale_a scales float8 inputs only", ar, torch.empty(8, 5), a, b, scale_a=one)
    _expect(bad, TypeError, "b must be float8 too", ar, bf, a8, b.bfloat16())
    _expect(bad, TypeError, "out has dtype torch.float16; the product of float8", ar, bf.half(), a8, b8)
    bias32 = torch.zeros(5)
    _expect(bad, TypeError, "bias has dtype torch.float32 but out has torch.bfloat16", ar, bf, a8, b8, bias32)
    wrong_rows, wrong_cols = torch.ones(1, 8), torch.ones(5, 1)
    rows_text, cols_text = (
        "scale_a has shape [1, 8]; expected one element or [8, 1]",
        "expected one element or [1, 5]",
    )
    _expect(bad, ValueError, rows_text, ar, bf, a8, b8, scale_a=wrong_rows)
    _expect(bad, ValueError, "scale_b has shape [5, 1]; " + cols_text, ar, bf, a8, b8, scale_b=wrong_cols)
    _expect(bad, TypeError, "scale_b has dtype torch.float64", ar, bf, a8, b8, scale_b=one.double())
    shard_rows = torch.ones(9, 1)  # all_gather_matmul: one per row of a_shard
    _expect(bad, ValueError, "scale_a has shape [9, 1]", ag, bf.repeat(g, 1), a8, b8, scale_a=shard_rows)
    _expect(bad, ValueError, "gather_dim must be 0", ag, torch.empty(8 * g, 5), a, b, gather_dim=2)
    _expect(bad, ValueError, "b's rows must equal", ag, torch.empty(8, 5), a, b[:5], gather_dim=1)
    _expect(bad, ValueError, f"expected [{8 * g}, 5]", mag, torch.empty(8 * g + 1, 5), a, b)
    _expect(bad, ValueError, "scatter_dim must be 0", rs, torch.empty(8, 5), a, b, scatter_dim=-1)
    if g > 1:
        _expect(
            bad,
            ValueError,
            "N (b's columns) (5) must be divisible",
            rs,
            torch.empty(8, 2),
            a,
            b,
            scatter_dim=1,
        )
        m3 = rand((9, 6), torch.float32, 3)
        _expect(bad, ValueError, "M (a's rows) (9) must be divisible", rs, torch.empty(4, 5), m3, b)
    return {"bad": bad, "cases": 1}


@pytest.mark.parametrize("world_size", [1, 2])
def test_bad_input_raises_clear_errors(world_size):
    assert_clean(run_world(errors_body, world_size, timeout=120), 1)


def degenerate_body(rank, world_size):
    """M = 0 does nothing; K = 0 gives the bias (or zeros) everywhere."""
    import iris.ops

    bad: list[str] = []
    bias = torch.arange(5, dtype=torch.float32)
    out = torch.full((3, 5), float("nan"))
    iris.ops.matmul_all_reduce(out, torch.empty(3, 0), torch.empty(0, 5), bias)
    if not torch.equal(out, bias.expand(3, 5)):
        bad.append(f"K=0 all_reduce: {out}")
    out = torch.full((3 * world_size, 5), float("nan"))
    iris.ops.matmul_all_gather(out, torch.empty(3, 0), torch.empty(0, 5))
    if not torch.equal(out, torch.zeros(3 * world_size, 5)):
        bad.append(f"K=0 all_gather: {out}")
    iris.ops.matmul_all_reduce(torch.empty(0, 5), torch.empty(0, 4), torch.ones(4, 5))
    iris.ops.all_gather_matmul(torch.empty(0, 5), torch.empty(0, 4), torch.ones(4, 5))
    iris.ops.release_workspaces()
    return {"bad": bad, "cases": 1}


def test_empty_and_k0_problems():
    assert_clean(run_world(degenerate_body, 2, timeout=120), 1)


def aborted_body(rank, world_size):
    """Every rank aborts its heap; then each op given one tensor of that heap (in each
    argument position) must refuse it with AbortedError naming the argument and the heap's
    reason, before anything runs, and leave the heap's tensors unwritten. Plain outputs of
    the fused GEMM ops and of the ll form stage nothing on the caller's heap, so without the
    check they ran on the aborted heap's inputs."""
    import iris.mem
    import iris.ops

    g = world_size
    heap = iris.mem.init(1 << 22)
    on_heap = {
        "a": heap.full((8, 6), 1.0), "b": heap.full((6, 5), 1.0), "bias": heap.zeros(5),
        "out": heap.full((8, 5), 7.0), "inp": heap.ones(3, 5), "weight": heap.ones(5),
        "residual": heap.ones(3, 5), "residual_out": heap.full((3, 5), 7.0),
        "normed": heap.full((3, 5), 7.0), "scale": heap.ones(1), "scales_out": heap.full((3,), 7.0),
    }  # fmt: skip
    before = {name: t.clone() for name, t in on_heap.items()}
    heap.abort("the trainer gave up")
    plain = {
        "a": torch.ones(8, 6), "b": torch.ones(6, 5), "bias": None, "out": torch.empty(8, 5),
        "inp": torch.ones(3, 5), "weight": torch.ones(5), "residual": torch.ones(3, 5),
        "residual_out": torch.empty(3, 5), "normed": torch.empty(3, 5),
    }  # fmt: skip
    rows = {"matmul_all_reduce": 8, "all_gather_matmul": 8 * g, "matmul_all_gather": 8 * g}
    calls = {}
    for op in (*rows, "matmul_reduce_scatter"):
        out_rows = rows.get(op, 8 // g)
        for name in ("a", "b", "bias") + (("out",) if out_rows == 8 else ()):  # out: the heap's is 8 x 5
            args = {**plain, "out": torch.empty(out_rows, 5), name: on_heap[name]}
            a_name = "a_shard" if op == "all_gather_matmul" else "a"
            call = {"out": args["out"], a_name: args["a"], "b": args["b"], "bias": args["bias"]}
            label = a_name if name == "a" else name
            calls[f"{op}({label} on the heap)"] = (getattr(iris.ops, op), call, label)
    for name in ("inp", "weight", "residual", "residual_out", "normed"):
        args = {**plain, name: on_heap[name]}
        call = {
            "out": args["normed"], "inp": args["inp"], "weight": args["weight"], "residual": args["residual"],
            "residual_out": args["residual_out"], "config": iris.ops.AllReduceRMSNormConfig(form="ll"),
        }  # fmt: skip
        label = "out" if name == "normed" else name
        calls[f"all_reduce_rmsnorm({label} on the heap)"] = (iris.ops.all_reduce_rmsnorm, call, label)
    # float8: a GEMM's scale, all_reduce_rmsnorm's per-row scales
    a8, b8 = torch.ones(8, 6, dtype=torch.float8_e4m3fn), torch.ones(6, 5, dtype=torch.float8_e4m3fn)
    call = {"out": torch.empty(8, 5), "a": a8, "b": b8, "scale_a": on_heap["scale"]}
    calls["matmul_all_reduce(scale_a on the heap)"] = (iris.ops.matmul_all_reduce, call, "scale_a")
    q = torch.empty(3, 5, dtype=torch.float8_e4m3fn)
    call = {"out": q, "inp": plain["inp"], "weight": plain["weight"], "scales_out": on_heap["scales_out"]}
    calls["all_reduce_rmsnorm(scales_out on the heap)"] = (iris.ops.all_reduce_rmsnorm, call, "scales_out")
    bad = []
    for what, (fn, kwargs, name) in calls.items():
        try:
            fn(**kwargs)
        except iris.mem.AbortedError as e:
            if "the trainer gave up" not in str(e) or f": {name} (" not in str(e):
                bad.append(f"{what}: AbortedError without the argument or the reason: {e}")
        except Exception as e:  # noqa: BLE001 - reported
            bad.append(f"{what}: {type(e).__name__}: {e}")
        else:
            bad.append(f"{what}: no error")
    for name, t in on_heap.items():
        if not torch.equal(t, before[name]):
            bad.append(f"a refused call wrote the aborted heap's {name}")
    heap.close()
    iris.ops.release_workspaces()
    return {"bad": bad, "cases": len(calls)}


def test_aborted_heap_tensors_are_refused():
    """heap.abort() is enforced by every fused op and all_reduce_rmsnorm (issue: they ran on
    an aborted heap's tensors where they stage nothing on it)."""
    assert_clean(run_world(aborted_body, 2, timeout=120), 4 + 3 * 3 + 5 + 2)


def absent_body(rank, world_size):
    """After one call together (which prepares the workspace), rank 1 skips the next call:
    rank 0's kernel gives up after IRIS_WAIT_TIMEOUT and raises DeviceWaitTimeout naming the
    ranks, instead of hanging."""
    import torch.distributed as dist

    import iris.mem
    import iris.ops

    def call():
        iris.ops.matmul_all_reduce(torch.empty(8, 5), torch.ones(8, 6), torch.ones(6, 5))

    call()
    outcome = "no error"
    if rank == 0:
        try:
            call()
        except iris.mem.DeviceWaitTimeout as e:
            outcome = str(e)
    dist.barrier()
    iris.ops.release_workspaces()
    return outcome


def test_absent_rank_is_reported_not_a_hang():
    results = run_world(absent_body, 2, timeout=200, env={"IRIS_WAIT_TIMEOUT": "2", "IRIS_WATCHDOG": "0"})
    assert "rank 0: iris.ops.matmul_all_reduce gave up waiting for rank 1" in results[0], results[0]
    # the first barrier's flag: its slot, this rank's generation, and rank 1 behind it
    assert "sync slot 0, generation " in results[0], results[0]
    generation = int(results[0].split("generation ")[1].split(" ")[0])
    published = json.loads(results[0].split("members published ")[1].split(")")[0])
    assert published[0] == generation and published[1] < generation, results[0]


def flags_body(rank, world_size):
    """The constexprs each op launches with: vector stores to peers (ALIGNED, WS_ALIGNED)
    for row-aligned shapes and not for odd ones, TMA only when asked and possible. The real
    launch runs; a wrapper records its keywords."""
    import iris.mem
    import iris.ops
    from iris.ops import _host

    seen = []
    real = _host.launch

    def spy(kernel, grid, ws, cfg, *args, **meta):
        seen.append(meta)
        return real(kernel, grid, ws, cfg, *args, **meta)

    _host.launch = spy
    bad = []
    tma = iris.ops.Config(tma=True)
    with iris.mem.init(1 << 23) as heap:
        for (m, n, k), vector in (((32, 64, 48), True), ((37, 29, 43), False)):
            a, b = rand((m, k), torch.bfloat16, rank), rand((k, n), torch.bfloat16, rank + 7)
            calls = [
                ("matmul_all_reduce", heap.empty((m, n), dtype=a.dtype), None),
                ("matmul_all_gather", heap.empty((world_size * m, n), dtype=a.dtype), tma),
                ("all_gather_matmul", torch.empty(world_size * m, n, dtype=a.dtype), tma),
            ]
            for op, out, config in calls:
                seen.clear()
                getattr(iris.ops, op)(out, a, b, config=config)
                meta = seen[-1]
                for flag in ("ALIGNED", "WS_ALIGNED"):
                    if flag in meta and meta[flag] != vector:
                        bad.append(f"{op} {m}x{n}x{k}: {flag}={meta[flag]}, expected {vector}")
                for flag in ("TMA_A", "TMA_B"):
                    want = vector and op != "matmul_all_reduce"
                    if op == "all_gather_matmul" and flag == "TMA_A":  # gathered A: only with TMA hardware
                        want = want and iris.mem.capabilities(a.device).tma
                    if flag in meta and meta[flag] != want:
                        bad.append(f"{op} {m}x{n}x{k}: {flag}={meta[flag]}, expected {want}")
        # Column chunks of B read through TMA only when each starts on 16 bytes (12 columns
        # of bf16 do not, 16 do); A's rows are aligned either way.
        for n, want_b in ((2 * 12, False), (2 * 16, True)):
            a, b = rand((32, 48), torch.bfloat16, rank), rand((48, n), torch.bfloat16, rank + 7)
            seen.clear()
            out = torch.empty(32, n // 2, dtype=a.dtype)
            iris.ops.matmul_reduce_scatter(out, a, b, scatter_dim=1, config=tma)
            got = (seen[-1]["TMA_A"], seen[-1]["TMA_B"])
            if got != (True, want_b):
                bad.append(
                    f"matmul_reduce_scatter 32x{n}x48 dim=1: (TMA_A, TMA_B) = {got}, want (True, {want_b})"
                )
        iris.ops.release_workspaces()
        heap.barrier()
    _host.launch = real
    return {"bad": bad, "cases": 1}


def test_launch_flags_follow_the_layout():
    assert_clean(run_world(flags_body, 2, timeout=120), 1)


def workspace_memory_body(rank, world_size):
    """A workspace on the output's heap survives the caller's heap.scope() and gives its
    memory back when released; a freed operand is refused in debug mode."""
    import iris.mem
    import iris.ops

    bad: list[str] = []
    with iris.mem.init(1 << 22) as heap:
        before = heap.memory_stats().in_use_bytes
        a, b = rand((5, 6), torch.float32, seed=rank), rand((6, 7), torch.float32, seed=10)
        with heap.scope():
            out = heap.empty((5, 7))
            iris.ops.matmul_all_reduce(out, a, b)
            prepared = heap.memory_stats().in_use_bytes
        if heap.memory_stats().in_use_bytes != prepared - 256:  # only out went back
            bad.append(f"the scope took the workspace: {before} -> {prepared} -> {heap.memory_stats()}")
        out = heap.empty((5, 7))
        iris.ops.matmul_all_reduce(out, a, b)  # the same workspace again, on a fresh out
        want = summed(a @ b).float()
        if not torch.allclose(out, want, atol=1e-4, rtol=1e-4):
            bad.append("wrong result with the workspace kept across the scope")
        heap.free(out)
        try:
            iris.ops.matmul_all_reduce(out, a, b)
            bad.append("a freed output was accepted")
        except iris.mem.UseAfterFreeError:
            pass
        iris.ops.release_workspaces()
        after = heap.memory_stats()
        if after.in_use_bytes != before or after.free_ranges != 1:
            bad.append(f"release_workspaces kept memory: {before} -> {after}")
    return {"bad": bad, "cases": 1}


def test_workspaces_give_memory_back():
    assert_clean(run_world(workspace_memory_body, 2, env={"IRIS_DEBUG": "1"}, timeout=240), 1)
