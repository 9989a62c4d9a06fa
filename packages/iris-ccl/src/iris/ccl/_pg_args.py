"""The arguments of a torch.distributed process group's methods, as the ``iris`` backend
takes them, and the options of an ``iris`` group (:class:`ProcessGroupOptions`).

torch.distributed calls a group's methods with lists of tensors and an options object
(``AllreduceOptions``, ...); pybind also gives ``ProcessGroup`` convenience forms that
Python code calls on the group directly (``pg.allreduce(tensor)``,
``pg.broadcast(tensor, root)``, ``pg.reduce(tensor, root, op)``, ...). A Python subclass's
method receives either, so each method first turns its arguments into the canonical form
with the functions here. :func:`reduction` reads a ``ReduceOp`` (with PREMUL_SUM's factor).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from . import _dtypes
from .config import Config
from .reduce_op import ReduceOp

_C = torch._C._distributed_c10d
_RED = dist.ReduceOp.RedOpType

_FP8 = tuple(d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d)
#: dtypes iris.ccl's kernels reduce (float8 in fp32, rounded once); it reduces the others it
#: accepts through its conversion path (:mod:`iris.ccl._dtypes`), exactly, in their own dtype.
REDUCED = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, *_FP8)


# --------------------------------------------------------------------------- reductions


@dataclasses.dataclass(frozen=True)
class Reduction:
    """A torch.distributed reduction as iris.ccl runs it: ``op`` (an iris.ccl
    :class:`~iris.ccl.ReduceOp`), after multiplying the input by ``factor`` (PREMUL_SUM's,
    a number or a one-element tensor; None: no scaling)."""

    op: ReduceOp
    factor: float | torch.Tensor | None = None

    def scaled(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` times the factor, a new tensor in ``t``'s dtype (``t`` itself without one)."""
        if self.factor is None:
            return t
        factor = self.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.to(device=t.device, dtype=t.dtype)
        return torch.mul(t, factor).to(t.dtype)


def reduction(op: Any, collective: str) -> Reduction:
    """The :class:`Reduction` of a torch.distributed ``ReduceOp`` (or its ``RedOpType``, or
    that type's number), or a ValueError naming the call and what to use."""
    kind = getattr(op, "op", op)
    if isinstance(kind, int) and not isinstance(kind, _RED):
        kind = _RED(kind)
    name = getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]
    if name == "PREMUL_SUM":
        factor = getattr(op, "factor", None)
        if factor is None:
            raise ValueError(
                f"dist.{collective} with ReduceOp.PREMUL_SUM reached the iris backend without its factor "
                "(through torch.ops.c10d, which does not carry it); call torch.distributed's function "
                "with dist._make_nccl_premul_sum(factor)"
            )
        return Reduction(ReduceOp.SUM, factor)
    try:
        return Reduction(ReduceOp[name])
    except KeyError:
        raise ValueError(
            f"dist.{collective} with ReduceOp.{name} is not supported by the iris backend (nor by NCCL); it "
            "reduces with SUM, AVG, MAX, MIN, PRODUCT and PREMUL_SUM: use a gloo group for bitwise reductions"
        ) from None


def check_reduction(t: torch.Tensor, red: Reduction, collective: str) -> None:
    """Raise, before anything is sent, for a reduction iris.ccl cannot make of ``t``'s
    dtype (AVG of integers or bools, PREMUL_SUM of integers or float8, dtypes it cannot move
    or reduce), naming the torch.distributed call."""
    wire(t)
    if red.factor is not None and (t.dtype in _FP8 or not (t.dtype.is_floating_point or t.dtype.is_complex)):
        raise TypeError(
            f"dist.{collective}: ReduceOp.PREMUL_SUM needs a float16, bfloat16, float32, float64 or "
            f"complex tensor, got {t.dtype}"
        )
    if red.op is ReduceOp.AVG and not (t.dtype.is_floating_point or t.dtype.is_complex):
        raise ValueError(
            f"dist.{collective}: ReduceOp.AVG needs a floating-point dtype, got {t.dtype}; use SUM and divide"
        )
    if t.dtype not in REDUCED and not t.dtype.is_complex:
        try:
            _dtypes.check_reduction(red.op, t.dtype, f"dist.{collective}")
        except TypeError as e:
            raise TypeError(f"{e}; or use a gloo group") from None


def wire(t: torch.Tensor) -> torch.Tensor:
    """``t`` when iris.ccl moves its dtype, else a view of it (same shape and strides) in
    the carrier dtype of its item size."""
    if t.layout != torch.strided:
        raise NotImplementedError(
            f"the iris backend moves dense tensors only, got a tensor of layout {t.layout}; use a gloo "
            "group for sparse tensors"
        )
    if t.dtype.itemsize not in (1, 2, 4, 8) or t.is_complex():
        raise TypeError(
            f"the iris backend cannot move tensors of dtype {t.dtype}; use a dtype of 1, 2, 4 or 8 bytes "
            "(complex tensors through torch.view_as_real)"
        )
    return _dtypes.wire(t)


def flat(t: torch.Tensor) -> torch.Tensor:
    """A flat view of ``t``, or a flat copy when it is not contiguous."""
    return t.reshape(-1) if t.is_contiguous() else t.contiguous().view(-1)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, flat (a view when ``t`` is contiguous, else a copy)."""
    t = t.resolve_conj()
    if t.is_complex():
        t = torch.view_as_real(t)
    return flat(t).view(torch.uint8)


# --------------------------------------------------------------------------- canonical forms


def tensor_list(x: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A list of tensors from a tensor or a sequence of them."""
    return [x] if isinstance(x, torch.Tensor) else list(x)


def nested(x: Any) -> list[list[torch.Tensor]]:
    """A list of lists of tensors from a list of tensors (one list) or a list of lists."""
    x = list(x)
    if x and isinstance(x[0], torch.Tensor):
        return [x]
    return [list(inner) for inner in x]


def _timeout(opts: Any, timeout: datetime.timedelta | None) -> Any:
    if timeout is not None:
        opts.timeout = timeout
    return opts


def allreduce(tensors, opts=None, timeout=None) -> tuple[list[torch.Tensor], Any]:
    """``allreduce(tensors, opts)``, ``allreduce(tensors, op, timeout)``, ``allreduce(tensor, op)``."""
    if isinstance(opts, (_C.AllreduceOptions, _C.AllreduceCoalescedOptions)):
        return tensor_list(tensors), opts
    options = _C.AllreduceOptions()
    options.reduceOp = opts if opts is not None else dist.ReduceOp.SUM
    return tensor_list(tensors), _timeout(options, timeout)


def broadcast(tensors, opts=None, timeout=None) -> tuple[list[torch.Tensor], Any]:
    """``broadcast(tensors, opts)``, ``broadcast(tensor, root, timeout)``."""
    if isinstance(opts, _C.BroadcastOptions):
        return tensor_list(tensors), opts
    options = _C.BroadcastOptions()
    options.rootRank = int(opts or 0)
    return tensor_list(tensors), _timeout(options, timeout)


def reduce(tensors, opts=None, op=None, timeout=None) -> tuple[list[torch.Tensor], Any]:
    """``reduce(tensors, opts)``, ``reduce(tensor, root, op, timeout)``."""
    if isinstance(opts, _C.ReduceOptions):
        return tensor_list(tensors), opts
    options = _C.ReduceOptions()
    options.rootRank = int(opts or 0)
    options.reduceOp = op if op is not None else dist.ReduceOp.SUM
    return tensor_list(tensors), _timeout(options, timeout)


def allgather(outputs, inputs, opts=None) -> tuple[list[list[torch.Tensor]], list[torch.Tensor], Any]:
    """``allgather(output_lists, inputs, opts)``, ``allgather(outputs, tensor, timeout)``."""
    if isinstance(opts, _C.AllgatherOptions):
        return nested(outputs), tensor_list(inputs), opts
    return nested(outputs), tensor_list(inputs), _timeout(_C.AllgatherOptions(), opts)


def gather(
    outputs, inputs, opts=None, timeout=None
) -> tuple[list[list[torch.Tensor]], list[torch.Tensor], Any]:
    """``gather(output_lists, inputs, opts)``, ``gather(outputs, tensor, root, timeout)``."""
    if isinstance(opts, _C.GatherOptions):
        return nested(outputs), tensor_list(inputs), opts
    options = _C.GatherOptions()
    options.rootRank = int(opts or 0)
    outs = nested(outputs) if list(outputs) else [[]]
    return outs, tensor_list(inputs), _timeout(options, timeout)


def scatter(
    outputs, inputs, opts=None, timeout=None
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], Any]:
    """``scatter(outputs, input_lists, opts)``, ``scatter(tensor, inputs, root, timeout)``."""
    if isinstance(opts, _C.ScatterOptions):
        return tensor_list(outputs), nested(inputs) if list(inputs) else [], opts
    options = _C.ScatterOptions()
    options.rootRank = int(opts or 0)
    ins = nested(inputs) if list(inputs) else []
    return tensor_list(outputs), ins, _timeout(options, timeout)


def reduce_scatter(outputs, inputs, opts=None, timeout=None) -> tuple[list[torch.Tensor], list[list], Any]:
    """``reduce_scatter(outputs, input_lists, opts)``, ``reduce_scatter(tensor, inputs, op, timeout)``."""
    if isinstance(opts, _C.ReduceScatterOptions):
        return tensor_list(outputs), nested(inputs), opts
    options = _C.ReduceScatterOptions()
    options.reduceOp = opts if opts is not None else dist.ReduceOp.SUM
    return tensor_list(outputs), nested(inputs), _timeout(options, timeout)


def barrier(opts=None) -> Any:
    """``barrier(opts)``, ``barrier(timeout)``."""
    if isinstance(opts, _C.BarrierOptions):
        return opts
    return _timeout(_C.BarrierOptions(), opts)


def options(opts: Any, cls: type) -> Any:
    """``opts`` when it is an options object, else a new ``cls`` (with ``opts`` as its
    timeout when it is one)."""
    if isinstance(opts, cls):
        return opts
    return _timeout(cls(), opts if isinstance(opts, datetime.timedelta) else None)


def with_timeout(opts: Any, timeout: datetime.timedelta) -> Any:
    """``opts`` with ``timeout`` when its own is unset (torch's default: negative)."""
    if getattr(opts, "timeout", None) is not None and opts.timeout.total_seconds() < 0:
        opts.timeout = timeout
    return opts


def check_list(size: int, tensors: Sequence[torch.Tensor], like: torch.Tensor, collective: str) -> None:
    """``tensors`` holds one tensor per rank of a group of ``size``, each with ``like``'s
    element count and dtype."""
    if len(tensors) != size:
        raise ValueError(
            f"dist.{collective}: pass a list of {size} tensors (one per rank of the group), got "
            f"{len(tensors)}"
        )
    for i, t in enumerate(tensors):
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise ValueError(
                f"dist.{collective}: tensor {i} of the list has {t.numel()} {t.dtype} elements, but the "
                f"iris backend needs {like.numel()} {like.dtype} elements in each (tensors of different "
                "sizes: pad them to one size)"
            )


def from_bytes(out: torch.Tensor, data: torch.Tensor) -> None:
    """Copy ``data`` (uint8, ``out``'s bytes: see :func:`as_bytes`) into ``out``."""
    if data.storage_offset() % out.element_size():  # a view in out's dtype must be aligned
        data = data.clone()
    if out.is_complex():
        out.copy_(torch.view_as_complex(data.view(out.real.dtype).view(*out.shape, 2)))
    else:
        out.copy_(data.view(out.dtype).view(out.shape))


def unpack(flat: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    """Copy consecutive chunks of ``flat`` into ``outs``."""
    start = 0
    for o in outs:
        o.copy_(flat[start : start + o.numel()].view(o.shape))
        start += o.numel()


# --------------------------------------------------------------------------- options


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessGroupOptions:
    """Options of an ``iris`` group: ``dist.new_group(backend="iris", pg_options=...)`` or
    ``dist.init_process_group(..., pg_options=...)``.

    Attributes:
        heap_size: bytes of the group's own symmetric heap (per rank), through which
            collectives on tensors that are not on a heap spanning the group are staged; its
            six staging buffers share what is left after 8 MiB. None: six buffers of
            ``IRIS_CCL_STAGING_BYTES`` (64 MiB each on GPUs, 4 MiB in the interpreter).
        config: the :class:`~iris.ccl.Config` of the group's collectives. None: picked by
            size for each call.
    """

    heap_size: int | None = None
    config: Config | None = None

    def __post_init__(self) -> None:
        if self.heap_size is not None and (
            isinstance(self.heap_size, bool) or not isinstance(self.heap_size, int) or self.heap_size <= 0
        ):
            raise ValueError(f"heap_size must be a positive number of bytes or None, got {self.heap_size!r}")
        if self.config is not None and not isinstance(self.config, Config):
            raise TypeError(f"config must be an iris.ccl.Config or None, got {type(self.config).__name__}")
