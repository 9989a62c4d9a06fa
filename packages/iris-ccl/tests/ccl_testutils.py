"""Helpers shared by the iris-ccl tests (imported by name; the tests folder is on sys.path).

Tests run every collective in real multi-process worlds (iris.mem.testing.run_world) and
compare with torch.distributed on the same data: gloo on the CPU backend, the same calls on
GPUs (``IRIS_BACKEND=cuda``, tests marked ``gpu``).
"""

import os

import torch

import iris.mem

# require_world(world_size, separate_gpus=None): skip unless this machine can run the world
# (ranks beyond the GPUs share them; a case that needs a GPU per rank says why it skips)
from iris.mem.testing import require_world  # noqa: F401 - the tests import it from here

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]
#: (dtype, atol, rtol) for results reduced over up to 4 ranks of values in [-8, 8).
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (6e-2, 2e-2),
    torch.int32: (0, 0),
    torch.int64: (0, 0),
}
WORLD_SIZES = [1, 2, 3, 4]
#: Element counts: one element, odd, not a multiple of any block or of the world size.
SIZES = [1, 7, 1000, 4099]


def device() -> torch.device:
    """This rank's device inside a world: its GPU (``LOCAL_RANK``, which run_world sets,
    modulo the GPUs present), or the CPU."""
    if BACKEND == "cuda":
        return iris.mem.default_device()
    return torch.device("cpu")


def make_input(shape, dtype: torch.dtype, rank: int, salt: int = 0) -> torch.Tensor:
    """Random data distinct per rank (same on every run), on this rank's device: floats in
    [-8, 8), ints in [-100, 100)."""
    g = torch.Generator().manual_seed(1000 * rank + 17 * salt + 1)
    if dtype.is_floating_point:
        x = torch.rand(shape, generator=g, dtype=torch.float32) * 16 - 8
    else:
        x = torch.randint(-100, 100, shape, generator=g, dtype=torch.int64)
    return x.to(dtype).to(device())


def mismatch(got: torch.Tensor, want: torch.Tensor, what: str) -> str | None:
    """None when ``got`` matches ``want`` within the dtype's tolerance, else a description
    of the worst elements (a string, so bodies can return it to the test)."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: shape/dtype {list(got.shape)} {got.dtype} != {list(want.shape)} {want.dtype}"
    atol, rtol = TOLERANCES.get(got.dtype, (1e-2, 1e-2))
    g, w = got.double(), want.double()
    bad = ~torch.isclose(g, w, atol=atol, rtol=rtol)
    if not bad.any():
        return None
    idx = bad.nonzero()[:5].tolist()
    return (
        f"{what}: {int(bad.sum())} of {got.numel()} differ; first {idx}: "
        f"got {g[bad][:5].tolist()} want {w[bad][:5].tolist()}"
    )


def reduced(x: torch.Tensor, op: str, group=None) -> torch.Tensor:
    """``torch.distributed.all_reduce`` of ``x`` over ``group`` (None: the world) with
    ``op`` ("SUM", "AVG", "MAX", "MIN"), on a CPU copy (gloo on the CPU tier): floats reduced
    in fp32, AVG as SUM over the group size; returned in ``x``'s dtype and device."""
    import torch.distributed as dist

    t = x.detach().to("cpu", torch.float32 if x.dtype.is_floating_point else x.dtype, copy=True)
    if op == "AVG":
        dist.all_reduce(t, group=group)
        t = t / dist.get_world_size(group)
    else:
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
    return t.to(x.dtype).to(x.device)


def setup_rank() -> None:
    """Make this rank's GPU the current device (a no-op on the CPU backend)."""
    if device().type == "cuda":
        torch.cuda.set_device(device())


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16``, for case descriptions."""
    return str(dtype).replace("torch.", "")
