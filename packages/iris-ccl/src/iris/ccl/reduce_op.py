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
    PRODUCT = "product"

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
            names = ", ".join(o.name for o in cls)
            raise ValueError(f"unsupported reduce op {op!r}; use one of {names}") from None


#: dtypes every collective moves and reduces; reductions accumulate floating types in fp32.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)
#: The float8 formats, moved and reduced too (fp32 accumulation, one saturating rounding).
_FP8 = tuple(d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d)


def check_dtype(dtype: torch.dtype, what: str) -> None:
    """Raise TypeError for dtypes the collectives do not handle."""
    if dtype not in SUPPORTED_DTYPES + _FP8:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES + _FP8)
        raise TypeError(f"{what} has dtype {dtype}, which iris.ccl does not support; use one of {names}")


def check_op(op: ReduceOp, dtype: torch.dtype) -> None:
    """AVG is defined for floating types only."""
    if op is ReduceOp.AVG and not dtype.is_floating_point:
        raise ValueError(f"ReduceOp.AVG needs a floating-point dtype, got {dtype}; use SUM and divide")


def from_accumulator(acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The accumulator ``acc`` of a reduction (fp32, or for a group of one the input itself)
    in the element type ``dtype``, rounded as the kernels round
    (:mod:`iris.ccl.triton.accumulate`): float8 saturates to its finite range (infinities
    too; NaN stays NaN) and rounds to nearest even; other types convert as torch converts."""
    if dtype in _FP8:
        limit = torch.finfo(dtype).max
        acc = acc.float().clamp(-limit, limit)  # torch's own conversion would give NaN or inf
    return acc.to(dtype)
