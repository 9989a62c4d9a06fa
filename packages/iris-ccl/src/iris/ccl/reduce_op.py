"""``ReduceOp``: the reductions the collectives support, and the accumulation dtypes."""

from __future__ import annotations

import enum

import torch


class ReduceOp(enum.Enum):
    """Reduction of a collective, as in ``torch.distributed.ReduceOp``."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"

    @classmethod
    def parse(cls, op: object) -> ReduceOp:
        """Accept a ReduceOp, its name ("sum"), or torch.distributed's ReduceOp."""
        if isinstance(op, cls):
            return op
        name = getattr(op, "name", None) or (op if isinstance(op, str) else None)
        if name is None:
            name = str(op).rsplit(".", 1)[-1]
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unsupported reduce op {op!r}; use one of SUM, AVG, MAX, MIN") from None


#: dtypes every collective moves; reductions accumulate half types in fp32.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)
_FP8 = tuple(d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d)


def check_dtype(dtype: torch.dtype, what: str) -> None:
    """Raise TypeError for dtypes the collectives do not handle."""
    if dtype not in SUPPORTED_DTYPES + _FP8:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES + _FP8)
        raise TypeError(f"{what} has dtype {dtype}, which iris.ccl does not support; use one of {names}")


def check_op(op: ReduceOp, dtype: torch.dtype) -> None:
    """AVG is defined for floating types only, and float8 types are moved but not reduced
    (as in torch.distributed with NCCL)."""
    if dtype in _FP8:
        raise TypeError(
            f"iris.ccl reduces float32, float16, bfloat16, int32 and int64, not {dtype}; float8 tensors "
            "can be moved (all_gather, all_to_all, broadcast, scatter, gather, send/recv): upcast to "
            "bfloat16 or float16 to reduce them"
        )
    if op is ReduceOp.AVG and not dtype.is_floating_point:
        raise ValueError(f"ReduceOp.AVG needs a floating-point dtype, got {dtype}; use SUM and divide")
