"""``iris.ccl.broadcast``, ``reduce``, ``scatter`` and ``gather`` against ``torch.distributed``.

Every test starts one real multi-process world (``iris.mem.testing.run_world``) and loops
over its cases inside the ranks; each rank body returns a list of mismatch descriptions
(empty when everything matched). References come from ``torch.distributed`` (gloo, on
CPU) on the same data: floating types travel as an fp32 upcast (exact for data movement;
reductions accumulate in fp32 like iris.ccl) and are cast back, AVG is SUM divided by the
group size (gloo has no AVG). Roots are global ranks, as in torch.distributed.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import DTYPES, SIZES, device, dtype_name, make_input, mismatch, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

WORLD_TIMEOUT = 400.0
SMALL_DTYPES = (torch.float32, torch.bfloat16, torch.int32)
HEAP_BYTES = 24 << 20
ARENA_BYTES = 4 << 20


# --------------------------------------------------------------------------- helpers (in ranks)


def _wire(x: torch.Tensor) -> torch.Tensor:
    """``x`` as gloo gets it: a contiguous CPU copy, floats upcast to fp32."""
    t = x.detach().cpu().contiguous().clone()
    return t.float() if t.dtype.is_floating_point else t


def _back(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(like.dtype).to(like.device).view(like.shape)


def ref_broadcast(x, src, group):
    t = _wire(x)
    dist.broadcast(t, src, group=group)
    return _back(t, x)


def ref_reduce(x, dst, op, group):
    t = _wire(x)
    dist.reduce(t, dst, op=dist.ReduceOp.SUM if op == "AVG" else getattr(dist.ReduceOp, op), group=group)
    if op == "AVG":
        t = t / dist.get_world_size(group)
    return _back(t, x)


def ref_scatter(out, inp, src, group):
    """Chunk ``rank`` of ``inp`` (only read on ``src``)."""
    t = _wire(out)
    chunks = list(_wire(inp).view(-1).chunk(dist.get_world_size(group))) if dist.get_rank() == src else None
    dist.scatter(t.view(-1), chunks, src=src, group=group)
    return _back(t, out)


def ref_gather(inp, dst, group, out_like):
    t = _wire(inp).view(-1)
    size = dist.get_world_size(group)
    chunks = [torch.empty_like(t) for _ in range(size)] if dist.get_rank() == dst else None
    dist.gather(t, chunks, dst=dst, group=group)
    return _back(torch.cat(chunks), out_like) if chunks is not None else None


class Arena:
    """Heap tensors at the same offsets on every rank (bump allocation never frees, so a
    long test reuses two fixed regions of the heap instead)."""

    def __init__(self, heap):
        self.regions = [heap.empty(ARENA_BYTES, dtype=torch.uint8) for _ in range(2)]

    def tensor(self, x: torch.Tensor, region: int) -> torch.Tensor:
        nbytes = x.numel() * x.element_size()
        t = self.regions[region][:nbytes].view(x.dtype).view(x.shape)
        t.copy_(x)
        return t


def _layout(x: torch.Tensor, mode: str, arena: Arena | None, region: int) -> torch.Tensor:
    """``x``'s values as a plain tensor, a heap tensor, or a non-contiguous view."""
    if mode == "heap":
        return arena.tensor(x, region)
    if mode == "strided":
        view = torch.zeros((*x.shape, 2), dtype=x.dtype, device=x.device)[..., 1]
        view.copy_(x)
        assert not view.is_contiguous() or x.numel() <= 1
        return view
    return x.clone()


MODES = ("plain", "heap", "strided")
OPS = ("SUM", "AVG", "MAX", "MIN")


def _configs():
    import iris.ccl as ccl

    # None, and a config that splits 4099 elements over several launches of small tiles.
    return (None, ccl.Config(block_size=512, chunk_elements=1536))


# --------------------------------------------------------------------------- the matrix


def matrix_body(rank, world_size, members, dtypes, sizes):
    """Every root x ``sizes`` for the four rooted collectives, with dtypes (each of
    ``dtypes`` at least once), layouts, ops and configs cycling (interpreted kernels are
    slow: a product of everything would take minutes); ``members`` (global ranks) makes a
    subgroup, created on every rank."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    group = dist.new_group(members) if members is not None else None
    ranks = members if members is not None else list(range(world_size))
    bad: list[str] = []
    cases = 0
    if rank not in ranks:
        return {"bad": bad, "cases": cases}
    heap = iris.mem.init(HEAP_BYTES, group=group)
    arena = Arena(heap)
    size = len(ranks)
    salt = 0
    for root in ranks:
        for n in sizes:
            salt += 1
            dtype = dtypes[salt % len(dtypes)]
            mode = MODES[salt % len(MODES)]
            config = _configs()[salt % 2]
            ops = [op for op in OPS if op != "AVG" or dtype.is_floating_point]
            op = ops[salt % len(ops)]
            what = (
                f"world={world_size} group={ranks} root={root} {dtype_name(dtype)} n={n} {mode} cfg={config}"
            )

            # broadcast (in place)
            x = make_input((n,), dtype, rank, salt)
            want = ref_broadcast(x, root, group)
            t = _layout(x, mode, arena, 0)
            ccl.broadcast(t, root, group=group, config=config)
            if (m := mismatch(t, want, f"broadcast {what}")) is not None:
                bad.append(m)

            # reduce: out only on the root, others' out untouched
            x = make_input((n,), dtype, rank, salt + 1000)
            want = ref_reduce(x, root, op, group)
            inp = _layout(x, mode, arena, 0)
            out = _layout(torch.full_like(x, 77), "strided" if mode == "strided" else "plain", arena, 1)
            ccl.reduce(out, inp, root, op=op, group=group, config=config)
            expect = want if rank == root else torch.full_like(x, 77)
            if (m := mismatch(out, expect, f"reduce {op} {what}")) is not None:
                bad.append(m)
            if not torch.equal(inp.cpu(), x.cpu()):
                bad.append(f"reduce {what}: the input was modified")

            # scatter: inp (size * n elements) on the root only
            full = make_input((size, n), dtype, rank, salt + 2000)
            want = ref_scatter(torch.zeros(n, dtype=dtype, device=full.device), full, root, group)
            out = _layout(torch.full((n,), 77, dtype=dtype, device=full.device), mode, arena, 1)
            inp = (
                _layout(full, "strided" if mode == "strided" else "plain", arena, 0) if rank == root else None
            )
            ccl.scatter(out, inp, root, group=group, config=config)
            if (m := mismatch(out, want, f"scatter {what}")) is not None:
                bad.append(m)

            # gather: out (size * n elements) on the root only; None elsewhere or untouched
            x = make_input((n,), dtype, rank, salt + 3000)
            out_like = torch.full((size, n), 77, dtype=dtype, device=x.device)
            want = ref_gather(x, root, group, out_like)
            inp = _layout(x, mode, arena, 0)
            out = None
            if rank == root or salt % 2:
                out = _layout(out_like, "strided" if mode == "strided" else "plain", arena, 1)
            ccl.gather(out, inp, root, group=group, config=config)
            if rank == root and (m := mismatch(out, want, f"gather {what}")) is not None:
                bad.append(m)
            if rank != root and out is not None and not torch.equal(out.cpu(), out_like.cpu()):
                bad.append(f"gather {what}: a non-root output was written")
            cases += 4
    # Negative control: a reduce reference that lacks the last rank must be caught.
    x = make_input((1000,), torch.float32, rank, 999)
    out = torch.zeros_like(x)
    want = ref_reduce(x, ranks[0], "SUM", group)
    skewed = ref_reduce(x if rank != ranks[-1] else torch.zeros_like(x), ranks[0], "SUM", group)
    ccl.reduce(out, x, ranks[0], group=group)
    if rank == ranks[0]:
        if mismatch(out, want, "control") is not None:
            bad.append("negative control: the true reference did not match")
        if size > 1 and mismatch(out, skewed, "control") is None:
            bad.append("negative control: a reference missing a rank was not caught")
    heap.close()
    return {"bad": bad, "cases": cases}


def _run(world_size: int, fn, *args, env=None):
    require_world(world_size)
    return run_world(fn, world_size, *args, timeout=WORLD_TIMEOUT, env=env)


def _assert_clean(results, min_cases: int) -> None:
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    assert max(res["cases"] for res in results) >= min_cases


@pytest.mark.parametrize("world_size", [1, 2, 3, pytest.param(4, marks=pytest.mark.full)])
def test_rooted_match_torch(world_size):
    # World 1 is cheap (no kernels): every dtype at every size there.
    sizes = SIZES * len(DTYPES) if world_size == 1 else SIZES
    results = _run(world_size, matrix_body, None, DTYPES, sizes)
    _assert_clean(results, world_size * len(sizes) * 4)


def test_rooted_subgroup_of_uneven_ranks():
    """A group of global ranks [0, 2, 3] in a world of 4: roots are global ranks; rank 1
    takes no part."""
    results = _run(4, matrix_body, [0, 2, 3], (torch.float16, torch.int64, torch.float32), [1, 1003])
    _assert_clean(results, 3 * 2 * 4)


# --------------------------------------------------------------------------- shapes


def shapes_body(rank, world_size):
    """Multi-dimensional, 0-d and transposed tensors; out that is inp (reduce); chunks in
    flat element order (scatter/gather on a [size, *shape] tensor)."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    dev = device()
    for i, shape in enumerate([(5, 123, 7), (), (61, 17)]):
        dtype = (torch.float16, torch.int64)[i % 2]
        x = make_input(shape, dtype, rank, i)
        if len(shape) == 2 and shape[0] > 3:
            x = make_input(shape[::-1], dtype, rank, i).t()
        want = ref_broadcast(x, world_size - 1, None)
        ccl.broadcast(x, world_size - 1)
        if (m := mismatch(x, want, f"broadcast {shape} {dtype_name(dtype)}")) is not None:
            bad.append(m)
        x = make_input(shape, dtype, rank, i + 10)
        want = ref_reduce(x, 0, "MAX", None)
        x0 = x.clone()
        ccl.reduce(x, x, 0, op="max")  # torch's in-place form
        if (m := mismatch(x, want if rank == 0 else x0, f"reduce in place {shape}")) is not None:
            bad.append(m)
        full = make_input((world_size, *shape), dtype, rank, i + 20)
        out = torch.empty(shape, dtype=dtype, device=dev)
        want = ref_scatter(out, full, 0, None)
        ccl.scatter(out, full, 0)  # every rank passes inp; only rank 0's is read
        if (m := mismatch(out, want, f"scatter {shape}")) is not None:
            bad.append(m)
        x = make_input(shape, dtype, rank, i + 30)
        out = torch.empty((world_size, *shape), dtype=dtype, device=dev)
        want = ref_gather(x, world_size // 2, None, out)
        ccl.gather(out if rank == world_size // 2 else None, x, world_size // 2)
        if rank == world_size // 2 and (m := mismatch(out, want, f"gather {shape}")) is not None:
            bad.append(m)
    return {"bad": bad, "cases": 1}


@pytest.mark.parametrize("world_size", [1, 3])
def test_rooted_shapes(world_size):
    _assert_clean(_run(world_size, shapes_body), 1)


# --------------------------------------------------------------------------- repetition, async


def _inputs_of_all(shape, dtype, world_size, salt):
    """Every rank's make_input (the same values each rank generates for itself)."""
    return [make_input(shape, dtype, r, salt) for r in range(world_size)]


def repeat_body(rank, world_size, calls):
    """``calls`` small collectives in a row, rotating collective and root; references
    computed locally from every rank's (deterministic) inputs."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    dev = device()
    for i in range(calls):
        root = i % world_size
        kind = ("broadcast", "reduce", "scatter", "gather")[(i // world_size) % 4]
        xs = _inputs_of_all((5,), torch.int32, world_size, i)
        if kind == "broadcast":
            t = xs[rank].clone()
            ccl.broadcast(t, root)
            got, want = t, xs[root]
        elif kind == "reduce":
            out = torch.zeros(5, dtype=torch.int32, device=dev)
            ccl.reduce(out, xs[rank], root)
            got, want = out, (sum(xs) if rank == root else torch.zeros_like(out))
        elif kind == "scatter":
            out = torch.zeros(5, dtype=torch.int32, device=dev)
            ccl.scatter(out, torch.cat(xs) if rank == root else None, root)
            got, want = out, torch.cat(xs)[5 * rank : 5 * rank + 5]
        else:
            out = torch.zeros(5 * world_size, dtype=torch.int32, device=dev)
            ccl.gather(out, xs[rank], root)
            got, want = out, (torch.cat(xs) if rank == root else torch.zeros_like(out))
        if (m := mismatch(got, want, f"call {i} {kind} root={root}")) is not None:
            bad.append(m)
    return {"bad": bad, "cases": calls}


def test_rooted_100_calls():
    _assert_clean(_run(2, repeat_body, 100), 100)


def async_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    dev = device()
    x = make_input((1000,), torch.float32, rank, 1)
    want = ref_broadcast(x, 1, None)
    handles = [ccl.broadcast(x, 1, async_op=True)]
    y = make_input((77,), torch.bfloat16, rank, 2)
    want_r = ref_reduce(y, 0, "SUM", None)
    out_r = torch.zeros_like(y)
    handles.append(ccl.reduce(out_r, y, 0, async_op=True))
    out_s = torch.zeros(9, device=dev)
    full = torch.arange(9 * world_size, dtype=torch.float32, device=dev)
    handles.append(ccl.scatter(out_s, full if rank == 1 else None, 1, async_op=True))
    out_g = torch.zeros(9 * world_size, device=dev) if rank == 0 else None
    handles.append(ccl.gather(out_g, full[9 * rank : 9 * rank + 9], 0, async_op=True))
    for h in handles:
        if not isinstance(h, ccl.Work) or h.wait() is not True:
            bad.append(f"async_op=True returned {h!r}; wait() must return True")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # wait() orders streams only; is_completed() asks the device
    if not all(h.is_completed() for h in handles):
        bad.append("handles not completed after wait() and a synchronisation")
    checks = [(x, want, "broadcast"), (out_s, full[9 * rank : 9 * rank + 9], "scatter")]
    if rank == 0:
        checks += [(out_r, want_r, "reduce"), (out_g, full, "gather")]
    for got, expect, what in checks:
        if (m := mismatch(got, expect, f"async {what}")) is not None:
            bad.append(m)
    return {"bad": bad, "cases": 4}


def test_rooted_async_handles():
    _assert_clean(_run(2, async_body), 4)


# --------------------------------------------------------------------------- bad input


def _expect(bad: list, exc, words, fn, *args, **kwargs) -> None:
    """``fn(*args, **kwargs)`` must raise ``exc`` with every word of ``words`` in its message."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        missing = [w for w in words if w not in str(e)]
        if missing:
            bad.append(f"{fn.__name__}{args!r:.80}: message lacks {missing}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - reported
        bad.append(f"{fn.__name__}: raised {type(e).__name__} instead of {exc.__name__}: {e}")
        return
    bad.append(f"{fn.__name__}{args!r:.80}: did not raise {exc.__name__}")


def bad_input_body(rank, world_size):
    """Clear exceptions before any communication, then a valid collective still works."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    dev = device()
    sub = dist.new_group([0, 2, 3])
    t = torch.ones(10, device=dev)
    # Roots out of range, or not in the group; wrong types.
    _expect(bad, ValueError, ["src=4", "[0, 1, 2, 3]"], ccl.broadcast, t, 4)
    _expect(bad, ValueError, ["src=-1"], ccl.broadcast, t, -1)
    _expect(bad, ValueError, ["dst=9"], ccl.reduce, t.clone(), t, 9)
    _expect(bad, ValueError, ["src=4"], ccl.scatter, t, None, 4)
    _expect(bad, ValueError, ["dst=5"], ccl.gather, None, t, 5)
    _expect(bad, TypeError, ["src"], ccl.broadcast, t, "0")
    if rank in (0, 2, 3):
        _expect(bad, ValueError, ["src=1", "[0, 2, 3]"], ccl.broadcast, t, 1, group=sub)
        _expect(bad, ValueError, ["dst=1"], ccl.gather, None, t, 1, group=sub)
    else:
        _expect(bad, ValueError, ["not a member"], ccl.broadcast, t, 0, group=sub)
        _expect(bad, ValueError, ["not a member"], ccl.reduce, t.clone(), t, 0, group=sub)
    # Shapes and dtypes (every rank passes the same bad arguments).
    _expect(
        bad, ValueError, ["out has 9 elements", "expected 10"], ccl.reduce, torch.ones(9, device=dev), t, 0
    )
    _expect(bad, TypeError, ["dtype"], ccl.reduce, t.half(), t, 0)
    _expect(bad, ValueError, ["AVG"], ccl.reduce, t.int(), t.int(), 0, op="avg")
    _expect(bad, TypeError, ["to_dense"], ccl.broadcast, t.to_sparse(), 0)
    _expect(bad, TypeError, ["torch.Tensor"], ccl.broadcast, [1.0], 0)
    # Root-only checks: only the root calls (the others would wait for it).
    if rank == 0:
        _expect(
            bad,
            ValueError,
            ["41 elements", "expected 4 ranks x 10"],
            ccl.scatter,
            t,
            torch.ones(41, device=dev),
            0,
        )
        _expect(bad, ValueError, ["inp is None"], ccl.scatter, t, None, 0)
        _expect(bad, ValueError, ["out is None"], ccl.gather, None, t, 0)
        _expect(bad, ValueError, ["expected 40"], ccl.gather, torch.ones(39, device=dev), t, 0)
        _expect(bad, ValueError, ["out is None"], ccl.reduce, None, t, 0)
    # Nothing was communicated: a valid collective still matches.
    x = make_input((33,), torch.float32, rank, 5)
    want = ref_broadcast(x, 3, None)
    ccl.broadcast(x, 3)
    if (m := mismatch(x, want, "broadcast after bad input")) is not None:
        bad.append(m)
    return {"bad": bad, "cases": 1}


def test_rooted_bad_input():
    _assert_clean(_run(4, bad_input_body), 1)


# --------------------------------------------------------------------------- Hopper compile


def compile_child() -> list[str]:
    """Compile every rooted kernel for sm_90 (run with IRIS_BACKEND=cuda, no interpreter)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    lead = {"context": "*i64", "members": "*i32", "flags": "*i32", "epochs": "*i32", "status": "*i64"}
    lead["budget"], lead["SIG"] = "i64", "i32"
    fails = []
    fn = importlib.import_module("iris.ccl._rooted")._rooted_kernel
    for name in ("broadcast", "reduce", "scatter", "gather"):
        for ty in ("fp32", "fp16", "bf16", "i32", "i64"):
            sig = {**lead, "src": "*" + ty, "dst": "*" + ty, "n": "i32", "n_per_rank": "i32", "root": "i32"}
            consts = {"RANK": 2, "WORLD": 4, "GROUP": 3, "ME": 1, "BLOCK": 1024, "KIND": name}
            if name == "reduce":
                consts.update(OP="avg" if ty[0] != "i" else "max", ACC_FP32=ty[0] != "i")
            names = list(fn.arg_names)
            src = ASTSource(fn, {a: sig.get(a, "constexpr") for a in names}, constexprs=consts)
            try:
                k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
                if not k.asm.get("cubin"):
                    fails.append(f"{name} {ty}: no cubin")
            except Exception as e:  # noqa: BLE001 - reported
                fails.append(f"{name} {ty}: {type(e).__name__}: {e}"[:2000])
    return fails


def test_rooted_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(IRIS_BACKEND="cuda", TRITON_INTERPRET="0")
    here = os.path.dirname(os.path.abspath(__file__))
    code = "import sys, test_ccl_rooted as t; f = t.compile_child(); print('\\n'.join(f)); sys.exit(bool(f))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
