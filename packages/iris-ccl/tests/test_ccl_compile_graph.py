"""iris.ccl under ``torch.compile``: the ``torch.ops.iris`` custom ops (``iris.ccl._torch_ops``).

(Triton compilation of the kernels for sm_90 is ``test_ccl_compile.py``.)

The public collectives call their custom op when ``torch.compiler.is_compiling()``, so a
function calling them compiles with ``fullgraph=True``: every test here compiles a few
functions inside one real world (``run_world``) and compares them with eager runs of the
same functions. One function calls every collective through the public API, one calls
every functional op directly; the graphs are counted (one frame, no break) and
searched for the ops. ``torch.library.opcheck`` checks the schemas, mutation declarations
and fake implementations in a world of one.
"""

import os
import shutil

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import device, mismatch, require_world, setup_rank

from iris.mem.testing import run_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
WORLD_TIMEOUT = 240.0
#: The functional ops (what the public functions call under torch.compile, with barrier,
#: send and recv).
FUNCTIONAL = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
)  # fmt: skip


# --------------------------------------------------------------------------- functions compiled (in ranks)


def _public(x: torch.Tensor, group, rank: int, world: int) -> list[torch.Tensor]:
    """Every collective through iris.ccl's public functions; returns the outputs."""
    import iris.ccl
    from iris.ccl import Config, ReduceOp

    outs = []
    y = x * 2
    iris.ccl.all_reduce(y, y, group=group)  # in place
    outs.append(y)
    z = torch.empty_like(x)
    iris.ccl.all_reduce(z, x, op=ReduceOp.MAX, group=group, config=Config(variant="one_shot"))
    outs.append(z)
    avg = torch.empty_like(x)
    iris.ccl.all_reduce(avg, x + 1, op="avg", group=group)
    outs.append(avg)
    g = x.new_empty(world * x.shape[0], *x.shape[1:])
    iris.ccl.all_gather(g, x, group=group)
    outs.append(g)
    rs = x.new_empty(x.shape[0] // world, *x.shape[1:])
    iris.ccl.reduce_scatter(rs, x, group=group)
    outs.append(rs)
    a2a = torch.empty_like(x)
    iris.ccl.all_to_all(a2a, x, group=group)
    outs.append(a2a)
    # uneven: rank r sends j + 1 rows to rank j, so it receives r + 1 rows from everyone
    send_rows = [j + 1 for j in range(world)]
    recv_rows = [rank + 1] * world
    rows = x.new_empty(sum(recv_rows), x.shape[1])
    iris.ccl.all_to_all(rows, x[: sum(send_rows)], recv_rows, send_rows, group=group)
    outs.append(rows)
    b = x + rank
    iris.ccl.broadcast(b, world - 1, group=group)
    outs.append(b)
    red = torch.zeros_like(x)
    iris.ccl.reduce(red, x, 0, group=group)
    outs.append(red)
    gat = torch.zeros(world * x.shape[0], *x.shape[1:], dtype=x.dtype, device=x.device)
    iris.ccl.gather(gat, x, 0, group=group)
    outs.append(gat)
    sc = torch.empty(x.shape[0] // world, *x.shape[1:], dtype=x.dtype, device=x.device)
    iris.ccl.scatter(sc, x, 0, group=group)
    outs.append(sc)
    iris.ccl.barrier(group=group)
    if world > 1:  # a ring: each rank sends to the next and receives from the previous
        msg = x[0] * (rank + 1)
        got = torch.empty_like(msg)
        iris.ccl.send(msg, (rank + 1) % world, group=group)
        iris.ccl.recv(got, (rank - 1) % world, group=group)
        outs.append(got)
    return outs


def _functional(x: torch.Tensor, group_name: str, rank: int, world: int) -> list[torch.Tensor]:
    """Every functional op of torch.ops.iris; returns their results."""
    ops = torch.ops.iris
    send_rows = [j + 1 for j in range(world)]
    recv_rows = [rank + 1] * world
    outs = [
        ops.all_reduce(x * 3, "sum", group_name),
        ops.all_gather(x, group_name),
        ops.reduce_scatter(x, "max", group_name),
        ops.all_to_all(x, None, None, group_name),
        ops.all_to_all(x[: sum(send_rows)], recv_rows, send_rows, group_name),
        ops.broadcast(x + rank, 0, group_name),
        ops.scatter(x, world - 1, group_name),
    ]
    rooted = [ops.reduce(x, 0, "sum", group_name), ops.gather(x, 0, group_name)]
    if rank == 0:  # written on the root only
        outs += rooted
    return outs


def _graph_ops(counter) -> set[str]:
    """Names of the torch.ops.iris ops in the graphs a CompileCounterWithBackend saw."""
    names = set()
    for gm in counter.graphs:
        for node in gm.graph.nodes:
            target = getattr(node.target, "_qualified_op_name", None) or str(node.target)
            if "iris" in target:
                names.add(target.split("::")[-1].split(".")[0])
    return names


def _compare(eager: list, compiled: list, what: str) -> list[str]:
    if len(eager) != len(compiled):
        return [f"{what}: {len(compiled)} outputs compiled, {len(eager)} eager"]
    bad = [mismatch(c, e, f"{what}[{i}]") for i, (c, e) in enumerate(zip(compiled, eager))]
    return [b for b in bad if b]


def _body_compile(rank: int, world_size: int, backend: str) -> list[str]:
    """Eager and compiled runs of :func:`_public` and :func:`_functional`; mismatches."""
    import torch._dynamo.testing

    import iris.ccl  # noqa: F401  (registers torch.ops.iris)

    setup_rank()
    torch._dynamo.reset()
    group = dist.new_group(list(range(world_size)))
    rows = 2 * world_size * (world_size + 1)  # divisible by the world, >= the uneven rows
    x = (torch.arange(rows * 5, dtype=torch.float32, device=device()).reshape(rows, 5) + 10 * rank) / 7
    problems = []

    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    fn = torch.compile(_public, fullgraph=True, backend=counter)
    for step in range(2):  # the second call runs the compiled graph again
        eager = _public(x + step, group, rank, world_size)
        problems += _compare(eager, fn(x + step, group, rank, world_size), f"public step {step}")
    if counter.frame_count != 1:
        problems.append(f"public: {counter.frame_count} frames compiled, expected 1")
    want = set(FUNCTIONAL) | ({"barrier", "send", "recv"} if world_size > 1 else {"barrier"})
    missing = want - _graph_ops(counter)
    if missing:
        problems.append(f"public: ops not in the graph: {sorted(missing)}")

    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    fn = torch.compile(_functional, fullgraph=True, backend=counter)
    eager = _functional(x, group.group_name, rank, world_size)
    problems += _compare(eager, fn(x, group.group_name, rank, world_size), "functional")
    missing = set(FUNCTIONAL) - _graph_ops(counter)
    if missing:
        problems.append(f"functional: ops not in the graph: {sorted(missing)}")

    # the functional ops against the public functions' results, eagerly
    want_sum = torch.empty_like(x)
    iris.ccl.all_reduce(want_sum, x * 3, group=group)
    problems += _compare([want_sum], [eager[0]], "functional all_reduce vs public")
    return problems


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("world_size", [1, 3] if BACKEND == "cpu" else [2])
def test_compile_aot_eager_matches_eager(world_size):
    """fullgraph compile (aot_eager) of every collective, public and functional, equals
    eager; one frame (no graph break); every op appears in the graph."""
    require_world(world_size)
    results = run_world(_body_compile, world_size, "aot_eager", timeout=WORLD_TIMEOUT)
    assert results == [[]] * world_size, results


def _has_compiler() -> bool:
    return shutil.which("g++") is not None or shutil.which("cc") is not None


@pytest.mark.full
@pytest.mark.skipif(not _has_compiler(), reason="inductor needs a C++ compiler (g++ or cc); none found")
def test_compile_inductor_matches_eager():
    """The same with inductor (C++ code generation on the CPU backend)."""
    results = run_world(_body_compile, 2, "inductor", timeout=2 * WORLD_TIMEOUT)
    assert results == [[]] * 2, results


def _body_async_refused(rank: int, world_size: int) -> str:
    import iris.ccl

    def fn(x):
        iris.ccl.all_reduce(x, x, async_op=True)
        return x

    try:
        torch.compile(fn, fullgraph=True, backend="aot_eager")(torch.ones(4))
    except Exception as e:  # dynamo wraps the error
        return str(e)
    return "no error"


def _body_opcheck(rank: int, world_size: int) -> tuple:
    """torch.library.opcheck of every op a world of one can run, fake-tensor tracing of
    each, and the config/group mappings."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from iris.ccl import Config, library

    ops = torch.ops.iris
    x = torch.randn(6, 4)
    cases = {
        "all_reduce_": (torch.empty(6, 4), x, "sum", "", ""),
        "all_gather_": (torch.empty(6, 4), x, "", ""),
        "reduce_scatter_": (torch.empty(6, 4), x, "max", "", ""),
        "all_to_all_": (torch.empty(6, 4), x, [6], [6], "", ""),
        "broadcast_": (x.clone(), 0, "", ""),
        "reduce_": (torch.empty(6, 4), x, 0, "sum", "", ""),
        "gather_": (torch.empty(6, 4), x, 0, "", ""),
        "scatter_": (torch.empty(6, 4), x, 0, "", ""),
        "all_reduce": (x, "avg", "", ""),
        "all_gather": (x, "", ""),
        "reduce_scatter": (x, "sum", "", ""),
        "all_to_all": (x, None, None, "", ""),
        "broadcast": (x, 0, "", ""),
        "reduce": (x, 0, "sum", "", ""),
        "gather": (x, 0, "", ""),
        "scatter": (x, 0, "", ""),
    }
    problems = []
    for name, args in cases.items():
        try:
            torch.library.opcheck(getattr(ops, name).default, args)
        except Exception as e:
            problems.append(f"opcheck {name}: {type(e).__name__}: {e}")
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.empty(6, 4))
        shapes = {
            "all_gather": ops.all_gather(fx, "").shape,
            "reduce_scatter": ops.reduce_scatter(fx, "sum", "").shape,
            "all_to_all": ops.all_to_all(fx, [2, 5], None, "").shape,
            "recv": ops.recv(fx, 0, "").shape,
        }
    expected = {"all_gather": (6, 4), "reduce_scatter": (6, 4), "all_to_all": (7, 4), "recv": (6, 4)}
    for name, shape in shapes.items():
        if tuple(shape) != expected[name]:
            problems.append(f"fake {name}: shape {tuple(shape)}, expected {expected[name]}")
    cfg = Config(variant="two_shot", block_size=256, programs=3)
    if library.decode_config(library.encode_config(cfg)) != cfg:
        problems.append(f"config round trip: {library.encode_config(cfg)!r}")
    group = dist.new_group([0])
    if library.resolve_group(library.group_name(group)) is not group:
        problems.append("group name does not resolve to the group")
    return problems, _body_async_refused(rank, world_size)


def test_opcheck_fake_tensors_and_async_refused():
    """opcheck and fake tensors of every op, the config and group mappings; async_op=True
    under compile raises an error that says so."""
    ((problems, text),) = run_world(_body_opcheck, 1, timeout=WORLD_TIMEOUT)
    assert problems == [], problems
    assert "all_reduce(async_op=True) is not supported inside torch.compile" in text, text


# --------------------------------------------------------------------------- GPU tier


def _body_cudagraphs(rank: int, world_size: int) -> list[str]:
    """Inductor with mode="reduce-overhead" (CUDA graphs) of a function of functional ops,
    replayed a few times on fresh inputs, equals eager."""
    import iris.ccl  # noqa: F401

    setup_rank()
    torch._dynamo.reset()
    group = dist.new_group(list(range(world_size)))

    def step(x, w):
        h = torch.ops.iris.all_reduce(x @ w, "sum", group.group_name)
        g = torch.ops.iris.all_gather(torch.relu(h), group.group_name)
        return torch.ops.iris.reduce_scatter(g * 2, "sum", group.group_name)

    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).to(device())
    # the first eager call makes iris.ccl's heap and staging before any capture
    problems = []
    fn = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(4):
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(10 * rank + i)).to(device())
        want = step(x, w)
        got = fn(x, w)
        torch.cuda.synchronize()
        problems += _compare([want], [got.clone()], f"reduce-overhead call {i}")
    return problems


@pytest.mark.gpu
@pytest.mark.skipif(BACKEND != "cuda", reason="CUDA graphs: needs IRIS_BACKEND=cuda")
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_inductor_reduce_overhead_gpu(world_size):
    require_world(world_size)
    results = run_world(_body_cudagraphs, world_size, timeout=2 * WORLD_TIMEOUT)
    assert results == [[]] * world_size, results
