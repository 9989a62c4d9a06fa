"""dtypes the kernels do not handle themselves, as torch.distributed with NCCL accepts them.

The kernels move and reduce float32, float16, bfloat16, int32, int64 and the float8 formats
(float8_e4m3fn, float8_e5m2; floating types below fp32 accumulate in fp32).
Every other dtype of 1, 2, 4 or 8 bytes (float64, int8, uint8, int16, bool, the unsigned
types) reaches them through :func:`run`, a conversion of :mod:`iris.ccl.entry` that every
public collective applies before anything else happens:

* **moved** (all_gather, all_to_all, broadcast, gather, scatter, send, recv): as a view of
  the same memory in a dtype the kernels move with the same item size (bits are copied,
  nothing is converted);
* **reduced** (all_reduce, reduce_scatter, reduce) for float64, int8, uint8, int16 and bool:
  an all_to_all (a gather for reduce) moves every rank's chunk of the data to the rank
  that reduces it, which reduces it locally in the tensor's own dtype (float64 stays
  float64, int8 wraps around as with NCCL, bools reduce as logic: SUM and MAX are OR, MIN
  and PRODUCT are AND), and an all_gather returns the result to every rank. The ``config``
  of such a call is checked but not used (the inner collectives pick theirs by size);
* **complex** tensors run as their real view (``torch.view_as_real``): moved, and reduced
  with SUM or AVG (MAX and MIN are not defined for them, as in torch.distributed).

Anything else raises a ``TypeError`` (or ``ValueError`` for an op the dtype has no meaning
for, like AVG of integers or bools) before anything is sent.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _host, _rooted, entry
from .all_gather import all_gather
from .all_to_all import all_to_all
from .gather import gather
from .reduce_op import _FP8, SUPPORTED_DTYPES, ReduceOp
from .work import Work

#: The collectives this conversion serves: every public one of iris.ccl.
COLLECTIVES = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
    "send", "recv",
)  # fmt: skip

#: dtypes the kernels handle themselves.
NATIVE = SUPPORTED_DTYPES + _FP8
#: dtypes reduced by the conversion path (all_to_all, local reduction, all_gather).
REDUCIBLE = (torch.float64, torch.int8, torch.uint8, torch.int16, torch.bool)
#: A dtype the kernels move, by item size: a tensor of another dtype travels as a view of
#: its bytes in the one of its item size.
_CARRIER = {1: _FP8[0] if _FP8 else None, 2: torch.float16, 4: torch.int32, 8: torch.int64}
_REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
_REDUCED_NAMES = (
    "float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float64, int8, uint8, int16, int32, int64, bool "
    "and complex"
)


def converts(t: torch.Tensor) -> bool:
    """Whether a call with ``t`` goes through :func:`run` (a dtype the kernels do not
    handle, or a layout other than strided, which :func:`run` refuses)."""
    return t.dtype not in NATIVE or t.layout != torch.strided


def wire(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a view in the dtype the kernels move for its item size."""
    carrier = _CARRIER.get(t.element_size())
    if carrier is None:
        raise TypeError(f"iris.ccl cannot move tensors of dtype {t.dtype}; use a dtype of 1, 2, 4 or 8 bytes")
    return t if t.dtype in NATIVE else t.view(carrier)


def check_reduction(op: ReduceOp, dtype: torch.dtype, collective: str) -> None:
    """Raise for a reduction the conversion path cannot make (see the module docstring)."""
    if dtype not in REDUCIBLE:
        raise TypeError(
            f"{collective}: iris.ccl reduces {_REDUCED_NAMES} tensors, not {dtype} (it can move them: "
            "all_gather, all_to_all, broadcast, gather, scatter, send/recv); convert to a wider signed "
            "type (int32, int64) to reduce them"
        )
    if op is ReduceOp.AVG and not dtype.is_floating_point:
        raise ValueError(
            f"{collective}: ReduceOp.AVG needs a floating-point dtype, got {dtype}; use SUM and divide"
        )


@entry.conversion(*COLLECTIVES)
def run(spec: entry.Spec, args: dict):
    """Run the public collective of ``spec`` on tensors of a dtype the kernels do not handle
    (module docstring); :data:`iris.ccl.entry.PASS` for calls whose tensors they handle."""
    given = [(n, args[n]) for n in spec.tensors if isinstance(args.get(n), torch.Tensor)]
    if not any(converts(t) for _, t in given):
        return entry.PASS
    name, call, outputs, bound = spec.name, spec.public, spec.outputs, dict(args)
    for n, t in given:
        if t.layout != torch.strided:
            raise TypeError(
                f"{name}: {n} is a tensor of layout {t.layout}; iris.ccl moves dense (strided) tensors: "
                f"pass {n}.to_dense()"
            )
    dtypes = {t.dtype for _, t in given}
    if len(dtypes) > 1:
        which = ", ".join(f"{n} has dtype {t.dtype}" for n, t in given)
        raise TypeError(f"{name}: {which}; they must match")
    dtype = given[0][1].dtype
    op = ReduceOp.parse(bound.get("op", ReduceOp.SUM)) if name in _REDUCTIONS else None
    if dtype.is_complex:
        return _complex(name, call, bound, given, op, outputs)
    if op is not None:
        check_reduction(op, dtype, name)
        return _REDUCE[name](bound, op)
    for n, t in given:
        bound[n] = wire(t)
    return _finish(call(**bound), bound, given, outputs)


def _finish(work: Work | None, bound: dict, given, outputs) -> Work | None:
    """``work`` completed with the caller's tensors (not the views the call ran on)."""
    if work is not None:
        originals = dict(given)
        work._set_outputs([originals.get(n) for n in outputs])
    return work


def _complex(name: str, call, bound: dict, given, op: ReduceOp | None, outputs) -> Work | None:
    if op is not None and op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise ValueError(
            f"{name}: ReduceOp.{op.name} is not defined for complex tensors ({given[0][1].dtype}); "
            "use SUM or AVG"
        )
    if (
        name == "all_to_all"
        and bound.get("output_split_sizes") is None
        and bound.get("input_split_sizes") is None
    ):
        size, _ = _host.group_position(bound.get("group"))
        inp = bound["inp"]
        if inp.numel() % size:
            raise ValueError(
                f"all_to_all: inp has {inp.numel()} elements (shape {list(inp.shape)}), which the group of "
                f"{size} ranks does not divide into equal chunks; pad inp (and out) to a multiple of {size}, "
                "or pass split sizes"
            )
    for n, t in given:
        # inputs only: a conjugated view is resolved (copied); an output must not be one
        bound[n] = torch.view_as_real(t.resolve_conj() if n == "inp" or name == "send" else t)
    return _finish(call(**bound), bound, given, outputs)


# --------------------------------------------------------------------------- reductions


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1) if t.is_contiguous() else t.contiguous().view(-1)


def _reduce_local(stack: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """Reduce ``stack`` (one row per rank, in rank order) over its rows in its own dtype."""
    if stack.dtype == torch.bool:
        return stack.all(0) if op in (ReduceOp.MIN, ReduceOp.PRODUCT) else stack.any(0)
    if op is ReduceOp.MAX:
        return stack.amax(0)
    if op is ReduceOp.MIN:
        return stack.amin(0)
    if op is ReduceOp.PRODUCT:
        return stack.prod(0, dtype=stack.dtype)
    if op is ReduceOp.AVG:
        return stack.sum(0) / stack.shape[0]
    return stack.sum(0, dtype=stack.dtype)


def _common(bound: dict, collective: str):
    out, inp = bound.get("out"), bound["inp"]
    _host.check_config(bound.get("config"))
    if out is not None and out.device != inp.device:
        raise ValueError(f"{collective}: out is on {out.device} but inp is on {inp.device}; they must match")
    return out, inp, bound.get("group"), bool(bound.get("async_op", False))


def _handle(out: torch.Tensor | None, inp: torch.Tensor, async_op: bool) -> Work | None:
    return Work(inp.device, [out]) if async_op else None


def _all_reduce(bound: dict, op: ReduceOp) -> Work | None:
    out, inp, group, async_op = _common(bound, "all_reduce")
    if out.shape != inp.shape:
        raise ValueError(f"all_reduce: out has shape {list(out.shape)} but inp has {list(inp.shape)}")
    size, _ = _host.group_position(group)
    n = inp.numel()
    if n and size == 1:
        out.copy_(inp)
    elif n:
        # each rank reduces one chunk of every rank's input (an all_to_all brings them), then
        # the reduced chunks go to every rank (an all_gather)
        chunk = -(-n // size)
        padded = torch.zeros(size * chunk, dtype=inp.dtype, device=inp.device)
        padded[:n] = inp.reshape(-1)
        mine = torch.empty_like(padded)
        all_to_all(wire(mine), wire(padded), group=group)
        reduced = _reduce_local(mine.view(size, chunk), op).contiguous()
        all_gather(wire(padded), wire(reduced), group=group)
        out.copy_(padded[:n].view(out.shape))
    return _handle(out, inp, async_op)


def _reduce_scatter(bound: dict, op: ReduceOp) -> Work | None:
    out, inp, group, async_op = _common(bound, "reduce_scatter")
    size, _ = _host.group_position(group)
    m = out.numel()
    if inp.numel() != size * m:
        raise ValueError(
            f"reduce_scatter: out has {m} elements (shape {list(out.shape)}), expected "
            f"{inp.numel() / size:g} for inp of shape {list(inp.shape)} (the group's {size} ranks each get "
            "an equal chunk)"
        )
    if m and size == 1:
        out.copy_(inp.reshape(out.shape))
    elif m:
        mine = torch.empty(size * m, dtype=inp.dtype, device=inp.device)
        all_to_all(wire(mine), wire(_flat(inp)), group=group)
        out.copy_(_reduce_local(mine.view(size, m), op).view(out.shape))
    return _handle(out, inp, async_op)


def _reduce(bound: dict, op: ReduceOp) -> Work | None:
    out, inp, group, async_op = _common(bound, "reduce")
    dst = bound["dst"]
    _rooted.member_index(dst, group, "dst", "reduce")
    size, _ = _host.group_position(group)
    is_root = dist.get_rank() == dst
    if is_root and out is None:
        raise ValueError(f"reduce: out is None on the destination rank {dst}; pass the tensor to reduce into")
    if out is not None and out.numel() != inp.numel():
        raise ValueError(
            f"reduce: out has {out.numel()} elements (shape {list(out.shape)}), expected {inp.numel()} "
            f"for inp of shape {list(inp.shape)}"
        )
    n = inp.numel()
    everyone = torch.empty((size, n), dtype=inp.dtype, device=inp.device) if is_root else None
    gather(wire(everyone) if is_root else None, wire(_flat(inp)), dst, group=group)
    if is_root and n:
        out.copy_(_reduce_local(everyone, op).view(out.shape))
    return _handle(out, inp, async_op)


_REDUCE = {"all_reduce": _all_reduce, "reduce_scatter": _reduce_scatter, "reduce": _reduce}
