"""Helpers shared by the iris-ops tests (imported by name; the tests folder is on sys.path).

Every op runs in real multi-process worlds (``iris.mem.testing.run_world``) and is compared
with a torch reference computed another way: the matmul in float64 on the gathered inputs,
then the torch.distributed collective on the world's gloo group (the same bodies run on
GPUs with ``IRIS_BACKEND=cuda``, where gloo moves the GPU tensors through host memory: it
works however many ranks share a GPU, which NCCL refuses).
"""

import os

import torch

import iris.mem

# require_world(world_size, separate_gpus=None): skip unless this machine can run the world
# (ranks beyond the GPUs share them; a case that needs a GPU per rank says why it skips)
from iris.mem.testing import require_world  # noqa: F401 - the tests import it from here

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Relative tolerance per dtype: outputs and exchanged partials are rounded to the dtype
#: (half a unit in the last place each); fp32 runs on tf32 tensor cores on GPUs.
EPS = {torch.float32: 2.0**-9, torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7}
#: Shapes ``(M, N, K)``: odd ones (no dimension a multiple of any block), one of block
#: multiples, and one with M smaller than a block.
SHAPES = ((37, 29, 43), (32, 48, 32), (5, 70, 20))


def device() -> torch.device:
    """This rank's device inside a world: its GPU (``LOCAL_RANK``, which run_world sets,
    modulo the GPUs present), or the CPU."""
    if BACKEND == "cuda":
        return iris.mem.default_device()
    return torch.device("cpu")


def setup_rank() -> torch.device:
    """Make this rank's GPU the current device (a no-op on the CPU backend); its device."""
    dev = device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def rand(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Uniform values in [-1, 1) made on the CPU from ``seed`` (the same on every backend),
    on this rank's device."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 2 - 1).to(dtype).to(device())


def seed(rank: int, case: int, which: int = 0) -> int:
    """A seed distinct per rank, case and operand."""
    return 100_003 * rank + 101 * case + which


def mismatch(got: torch.Tensor, want: torch.Tensor, scale: float, what: str) -> str | None:
    """None when ``|got - want| <= EPS[got.dtype] * scale`` everywhere (``want`` exact, in
    float64; ``scale`` the magnitude of the terms summed into an element), else a
    description of the worst elements."""
    atol = EPS[got.dtype] * max(scale, 1.0)
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    if got.shape != want.shape:
        return f"{what}: shape {list(got.shape)} != {list(want.shape)}"
    err = (got - want).abs()
    bad = ~(err <= atol)  # also catches NaN
    if not bad.any():
        return None
    idx = bad.nonzero()[:4].tolist()
    worst = f"got {got[bad][:4].tolist()} want {want[bad][:4].tolist()}"
    return (
        f"{what}: {int(bad.sum())} of {got.numel()} elements differ by more than {atol:.3g} "
        f"(max {err.max().item():.3g}); first {idx}: {worst}"
    )


def scale_of(*terms: torch.Tensor) -> float:
    """Sum of the largest magnitudes of ``terms`` (the size of what a result adds up)."""
    return float(sum(t.detach().abs().max().item() if t.numel() else 0.0 for t in terms))


def assert_clean(results, min_cases: int) -> None:
    """Every rank's body returned no problems and checked at least ``min_cases`` cases."""
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:30])
    for r, res in enumerate(results):
        assert res["cases"] >= min_cases, f"rank {r} checked only {res['cases']} cases (< {min_cases})"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------- references (in ranks)


def summed(x: torch.Tensor, group=None) -> torch.Tensor:
    """``torch.distributed.all_reduce`` (SUM) of a float64 copy of ``x``."""
    import torch.distributed as dist

    t = x.detach().double().clone()
    dist.all_reduce(t, group=group)
    return t


def peak(x: torch.Tensor, group=None) -> float:
    """The largest ``|x|`` over every rank of ``group``."""
    import torch.distributed as dist

    largest = x.detach().abs().max().item() if x.numel() else 0.0
    t = torch.tensor([largest], dtype=torch.float64, device=x.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def gathered(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """``torch.distributed.all_gather`` of ``x`` concatenated along ``dim`` (group-rank order)."""
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.detach().contiguous(), group=group)
    return torch.cat(parts, dim)


def make_out(kind: str, shape, dtype: torch.dtype, heap=None) -> torch.Tensor:
    """An output tensor filled with NaN: ``plain`` (contiguous), ``strided`` (a transposed
    view) or ``heap`` (on ``heap``, a symmetric heap spanning the world)."""
    rows, cols = shape
    if kind == "heap":
        return heap.full((rows, cols), float("nan"), dtype=dtype)
    if kind == "strided":
        return torch.full((cols, rows), float("nan"), dtype=dtype, device=device()).t()
    return torch.full((rows, cols), float("nan"), dtype=dtype, device=device())


def run_cases(body_case, rank: int, world_size: int, cases, heap_bytes: int = 1 << 23) -> dict:
    """Run ``body_case(rank, world_size, index, heap, **case)`` (returning a list of
    problems) for every case, with a heap spanning the world for ``out_kind="heap"``."""
    setup_rank()
    import iris.mem
    import iris.ops

    bad: list[str] = []
    with iris.mem.init(heap_bytes) as heap:
        for i, case in enumerate(cases):
            bad += body_case(rank, world_size, i, heap, **case)
        iris.ops.release_workspaces()
        heap.barrier()
    return {"bad": bad, "cases": len(cases)}


def check_calls(one_call, repeat: int, what: str) -> list[str]:
    """Problems of ``repeat`` calls of one op on one workspace: ``one_call(i)`` draws fresh
    inputs, calls the op (``async_op=False``) and returns ``(returned, out, want, scale)``."""
    problems = []
    for i in range(repeat):
        returned, out, want, scale = one_call(i)
        label = f"{what} call {i}"
        if returned is not None:
            problems.append(f"{label}: returned {returned!r} with async_op=False")
        if (msg := mismatch(out, want, scale, label)) is not None:
            problems.append(msg)
    return problems
