"""Gradients through iris.ccl's functional collectives (``iris.ccl.functional`` and the
functional ``torch.ops.iris`` ops, ``iris.ccl._autograd``).

:func:`gradient_cases` compares each collective's output and the gradient of a loss through
it with ``torch.distributed.nn.functional`` on gloo (the same data, the same loss), on odd
shapes, in fp32 and fp64; :func:`compiled_case` compiles a training step with
``torch.compile(backend="aot_eager", fullgraph=True)`` and compares its gradients with the
eager ones. The default run calls both in the world of ``test_ccl_torch_inputs.py`` (one
world of 3 ranks for everything torch users pass, to keep the default run short), every
collective in one of the two dtypes; the tests here (``full``) run every collective in both
dtypes, in worlds of 4 and 1.
"""

import os

import pytest
import torch
from ccl_testutils import device, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
WORLD = 3  # on GPUs too: ranks beyond the number of GPUs share them
WORLD_TIMEOUT = 300.0
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}
COLS = 5  # columns of every input: rows x 5 is a multiple of no block size


# --------------------------------------------------------------------------- cases (in ranks)


def _cases(rank: int, world: int):
    """``(name, rows of the input, iris form, torch.distributed.nn form, output defined here)``:
    each form maps the input to the collective's output."""
    import torch.distributed.nn.functional as tnn

    import iris.ccl.functional as F

    last = world - 1
    send_rows = [j + 1 for j in range(world)]  # rank r sends j + 1 rows to rank j ...
    recv_rows = [rank + 1] * world  # ... so it receives r + 1 rows from every rank

    def empty(rows, like):
        return like.new_empty(rows, *like.shape[1:])

    return [
        ("all_reduce SUM", 7, F.all_reduce, tnn.all_reduce, True),
        ("all_reduce AVG", 7, lambda x: F.all_reduce(x, "avg"), lambda x: tnn.all_reduce(x) / world, True),
        ("all_gather", 7, F.all_gather, lambda x: torch.cat(tnn.all_gather(x)), True),
        (
            "reduce_scatter SUM", 3 * world, F.reduce_scatter,
            lambda x: tnn.reduce_scatter(empty(3, x), list(x.chunk(world))), True,
        ),
        (
            "all_to_all", 2 * world, F.all_to_all,
            lambda x: tnn.all_to_all_single(torch.empty_like(x), x), True,
        ),
        (
            "all_to_all split sizes", sum(send_rows), lambda x: F.all_to_all(x, recv_rows, send_rows),
            lambda x: tnn.all_to_all_single(empty(sum(recv_rows), x), x, recv_rows, send_rows), True,
        ),
        ("broadcast", 7, lambda x: F.broadcast(x, last), lambda x: tnn.broadcast(x, last), True),
        ("reduce SUM", 7, lambda x: F.reduce(x, 0), lambda x: tnn.reduce(x, 0), rank == 0),
        ("gather", 7, lambda x: F.gather(x, last), lambda x: torch.cat(tnn.gather(x, last)), rank == last),
        (
            "scatter", 2 * world, lambda x: F.scatter(x, 0),
            lambda x: tnn.scatter(list(x.chunk(world)), 0), True,
        ),
    ]  # fmt: skip


def _close(got, want, dtype, what: str) -> str | None:
    atol, rtol = TOL[dtype]
    if got is None or want is None:
        return f"{what}: a gradient is missing (iris {got is not None}, torch {want is not None})"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: {list(got.shape)} {got.dtype} != {list(want.shape)} {want.dtype}"
    if not torch.allclose(got, want, atol=atol, rtol=rtol):
        worst = (got - want).abs().max().item()
        return f"{what}: differs from torch.distributed.nn (max abs difference {worst:g})"
    return None


def _grad(fn, x: torch.Tensor, w_seed: int):
    """``(output, d loss / d x)`` for ``loss = sum(fn(x) * w)``, ``w`` random per rank."""
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    g = torch.Generator().manual_seed(w_seed)
    w = torch.rand(y.shape, generator=g, dtype=torch.float64).to(y.dtype).to(y.device)
    (y * w).sum().backward()
    return y.detach(), x.grad


def gradient_cases(rank: int, world: int, dtypes: list, every: bool) -> list[str]:
    """Every functional collective against torch.distributed.nn (gloo): in each of
    ``dtypes`` (``every``), or in one of them in turn. Returns what differs."""
    import iris.ccl  # noqa: F401  (registers the ops' autograd)
    import iris.ccl.functional as F

    bad = []
    dev = device()
    cases = list(enumerate(_cases(rank, world)))
    if every:
        runs = [(dtype, case) for dtype in dtypes for case in cases]
    else:
        runs = [(dtypes[case[0] % len(dtypes)], case) for case in cases]
    for dtype, (i, (name, rows, ours, theirs, defined)) in runs:
        what = f"{name} {str(dtype).replace('torch.', '')}"
        g = torch.Generator().manual_seed(100 * rank + i)
        x = (torch.rand(rows, COLS, generator=g, dtype=torch.float64) * 4 - 2).to(dtype).to(dev)
        seed = 7 * rank + i
        y, gx = _grad(ours, x, seed)
        y_ref, gx_ref = _grad(theirs, x, seed)
        if defined and (err := _close(y, y_ref, dtype, what + " output")):
            bad.append(err)
        if err := _close(gx, gx_ref, dtype, what + " gradient"):
            bad.append(err)

    # MAX has no gradient: the backward says so
    x = torch.ones(3, device=dev, requires_grad=True)
    try:
        F.all_reduce(x, "max").sum().backward()
        bad.append("all_reduce MAX: backward did not raise")
    except RuntimeError as e:
        if "no gradient" not in str(e) or "SUM and AVG" not in str(e):
            bad.append(f"all_reduce MAX: unexpected error {e}")

    return bad


def _autograd_body(rank: int, world: int, dtypes: list, compiled: bool) -> list[str]:
    setup_rank()
    bad = gradient_cases(rank, world, dtypes, every=True)
    if compiled:
        bad += compiled_case(rank, world)
    return bad


def _step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A loss through three collectives (the functional module and an op directly)."""
    import iris.ccl.functional as F

    y = F.all_reduce(x * 2)
    g = torch.ops.iris.all_gather(torch.sin(y), "", "")
    s = F.reduce_scatter(g * 3, "avg")
    return (s * w).sum()


def compiled_case(rank: int, world: int) -> list[str]:
    """``_step`` compiled with aot_eager (fullgraph: one graph, no break) against eager."""
    dev = device()
    g = torch.Generator().manual_seed(rank)
    x0 = (torch.rand(world * 3, COLS, generator=g, dtype=torch.float64) - 0.5).to(dev)
    w = torch.rand(world * 3, COLS, generator=g, dtype=torch.float64).to(dev)
    grads = []
    for fn in (_step, torch.compile(_step, backend="aot_eager", fullgraph=True)):
        x = x0.clone().requires_grad_(True)
        loss = fn(x, w)
        loss.backward()
        grads.append((loss.detach(), x.grad))
    bad = []
    for what, a, b in (("loss", grads[0][0], grads[1][0]), ("gradient", grads[0][1], grads[1][1])):
        if not torch.allclose(a, b, atol=1e-12, rtol=1e-12):
            bad.append(
                f"compiled (aot_eager) {what} differs from eager: {a.flatten()[:4]} vs {b.flatten()[:4]}"
            )
    return bad


def _run(*args, world: int = WORLD):
    require_world(world)
    results = run_world(_autograd_body, world, *args, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res]
    assert not problems, "\n".join(problems[:40])


# --------------------------------------------------------------------------- tests


@pytest.mark.full
def test_gradients_match_torch_distributed_nn_every_dtype():
    """Every functional collective in fp32 and in fp64, and the compiled step (the default
    run: each collective in one of the two, in ``test_ccl_torch_inputs.py``)."""
    _run([torch.float32, torch.float64], True)


@pytest.mark.full
def test_gradients_match_torch_distributed_nn_world_of_4():
    """The same in a world of 4 (even: other chunk owners, other split sizes)."""
    _run([torch.float32, torch.float64], False, world=4)


@pytest.mark.full
def test_gradient_of_world_of_one():
    """A world of one: every collective is the identity (or a copy), and so is its gradient."""
    _run([torch.float64, torch.float32], False, world=1)


def test_negative_control_catches_a_wrong_gradient():
    """The comparison the world tests use fails for a gradient off by a relative 1e-9, and
    for a missing one."""
    x = torch.ones(3, dtype=torch.float64)
    assert _close(x, x.clone(), torch.float64, "same") is None
    assert _close(x, x * (1 + 1e-9), torch.float64, "scaled") is not None
    assert _close(None, x, torch.float64, "missing") is not None
