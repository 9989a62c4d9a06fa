"""Helpers shared by the iris-mem tests (imported by name; the tests folder is on sys.path)."""

import os

import torch

# require_world(world_size, separate_gpus=None): skip unless this machine can run the world
# (ranks beyond the GPUs share them; a case that needs a GPU per rank says why it skips)
from iris.mem.testing import require_world  # noqa: F401 - the tests import it from here

#: Backend the tests run on: ``cpu`` (Triton interpreter) or ``cuda`` (``pytest -m gpu``).
BACKEND = os.environ.get("IRIS_BACKEND", "cpu")

#: The dtypes every RMA test covers.
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]
#: World sizes every multi-rank test covers (3 is deliberately odd).
WORLD_SIZES = [1, 2, 3, 4]
#: World size of tests that run one multi-rank world: 3 (odd), on any number of GPUs.
MULTI_WORLD = 3
#: Heap size of test worlds (small: CPU shared memory, many ranks at once).
HEAP = 1 << 22


def pattern(n: int, dtype: torch.dtype, rank: int, salt: int = 0) -> torch.Tensor:
    """Distinct, exactly representable values per (rank, salt, index) for any dtype."""
    base = torch.arange(n, dtype=torch.int64) % 97 + 1 + rank * 101 + salt * 7
    if dtype.is_floating_point:
        base = base % 120  # with the .5 below, at most 8 significant bits: exact in bf16
        return base.to(dtype) + 0.5 * (rank % 2)
    return base.to(dtype)
