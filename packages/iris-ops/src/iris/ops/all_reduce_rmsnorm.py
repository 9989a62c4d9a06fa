"""``all_reduce_rmsnorm``: the all-reduce that ends a tensor-parallel layer, fused with the
residual add and the RMSNorm that follow it.

With ``s = sum over the group of inp (+ residual)``, row by row: ``residual_out = s`` and
``out = y = s * rsqrt(mean(s**2) + eps) * weight``, in fp32 from the inputs to the final
rounding (a float8 ``out`` receives ``y / scale`` rounded once, with a static scale or one
computed per row in the same kernel), in one kernel per call of one of two forms (how each works:
:mod:`iris.ops._rmsnorm_kernels`): ``"ll"`` for decode sizes (a one-shot flag-in-data
exchange: one link latency, twice the input's bytes on the link) and ``"rs_ag"`` for large
token counts (a reduce-scatter of rows, the norm by each row's owner, an all-gather).
``"auto"`` picks ``"ll"`` while what a rank sends is at most :data:`LL_MAX_BYTES`.

A call is validate (:func:`_check`) -> plan (:func:`_plan`: the config resolved and the
launch sizes, for the shape and the device) -> run (:func:`_run`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import triton

import iris.mem
from iris.ccl import Work, entry
from iris.mem import runtime

from . import _host
from ._rmsnorm_kernels import _ll_rmsnorm_kernel, _rs_rmsnorm_kernel
from .config import AllReduceRMSNormConfig, check_config
from .workspace import Workspace

_OP = "all_reduce_rmsnorm"
#: ``"auto"`` picks ``"ll"`` while what a rank sends ((G - 1) x the input's bytes) is at
#: most this; above it the ll form's doubled bytes cost more than the reduce-scatter form's
#: second flag round trip. An estimate from iris.ccl's measured all_reduce thresholds on
#: 2 x H200 (ll up to 128 KiB, one-barrier forms up to a few MiB), to be confirmed with
#: ``benchmarks/ops/bench_rmsnorm.py``, which times both forms.
LL_MAX_BYTES = 256 << 10
#: Bytes of one bank of ll boxes at most (compiled, interpreted); longer inputs are
#: processed in several launches of as many rows as fit.
_LL_BANK_BYTES = (8 << 20, 1 << 20)
#: Elements of a row a program holds in registers at once at most (compiled, interpreted);
#: longer rows are processed in several pieces (two passes over them).
_MAX_BLOCK = (8192, 4096)


# --------------------------------------------------------------------------- plan


def choose_form(tokens: int, hidden: int, itemsize: int, size: int) -> str:
    """The form ``"auto"`` runs for ``tokens x hidden`` elements of ``itemsize`` bytes over
    ``size`` ranks."""
    return "ll" if (size - 1) * tokens * hidden * itemsize <= LL_MAX_BYTES else "rs_ag"


def resolve(
    config: AllReduceRMSNormConfig | None,
    tokens: int,
    hidden: int,
    itemsize: int,
    size: int,
    interpreted: bool,
) -> AllReduceRMSNormConfig:
    """``config`` with every field left to choose filled in (``programs`` stays 0 unless
    set: it depends on the rows of each launch)."""
    check_config(config, AllReduceRMSNormConfig, _OP)
    config = config or AllReduceRMSNormConfig()
    form = config.form if config.form != "auto" else choose_form(tokens, hidden, itemsize, size)
    block = config.block or max(64, min(triton.next_power_of_2(max(hidden, 1)), _MAX_BLOCK[interpreted]))
    # Interpreted programs gain nothing from more warps; compiled, one warp per 512 elements.
    warps = config.num_warps or (4 if interpreted else max(4, min(16, block // 512)))
    spread = config.spread if config.spread is not None else not interpreted
    return dataclasses.replace(config, form=form, block=block, num_warps=warps, spread=spread)


def piece_elements(cfg: AllReduceRMSNormConfig, itemsize: int) -> int:
    """Elements of one piece of a row the ll form pushes: two lines (16 bytes) per thread."""
    return min(cfg.block, 256 * cfg.num_warps // itemsize)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a call runs: its resolved config and launch sizes."""

    cfg: AllReduceRMSNormConfig
    piece: int  # "ll": elements of the piece of a row one program pushes
    row_lines: int  # "ll": 8-byte lines of a row in a box
    launch_rows: int  # "ll": rows per launch, as many as one bank of boxes holds
    max_programs: int  # programs of a launch at most: the device's resident programs


def _plan(config: AllReduceRMSNormConfig | None, inp: torch.Tensor, size: int, caps) -> _Plan:
    """The plan of a call on ``inp`` over ``size`` ranks, on a device of capabilities
    ``caps`` (where kernels are interpreted: smaller blocks and banks, no spread pushes)."""
    tokens, hidden = inp.shape
    itemsize = inp.element_size()
    cfg = resolve(config, tokens, hidden, itemsize, size, caps.interpreted)
    # A line carries 4 bytes of the row; a box row is whole groups of 16 lines, so each
    # thread's lines leave as 16-byte stores (see _rmsnorm_kernels._push_piece).
    row_lines = _host.cdiv(_host.cdiv(hidden * itemsize, 4), 16) * 16
    peers = size - 1
    launch_rows = max(1, min(tokens, _LL_BANK_BYTES[caps.interpreted] // max(1, peers * row_lines * 8)))
    return _Plan(cfg, piece_elements(cfg, itemsize), row_lines, launch_rows, caps.resident_programs)


# --------------------------------------------------------------------------- validate


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _check_quantized(out, inp, scale, scales_out) -> None:
    """A float8 ``out`` comes with exactly one of ``scale`` (static) and ``scales_out``
    (dynamic, ``[tokens]``); any other ``out`` with neither."""
    if out.dtype not in _host.FP8:
        for name, t in (("scale", scale), ("scales_out", scales_out)):
            if t is not None:
                raise ValueError(
                    f"{_OP}: {name} is for a float8 out ({_host.names(_host.FP8)}); out has dtype {out.dtype}"
                )
        return
    if (scale is None) == (scales_out is None):
        raise ValueError(
            f"{_OP}: a float8 out needs exactly one of scale= (a one-element float32 tensor: out = fp8(y / "
            "scale)) and scales_out= (a float32 [tokens] tensor receiving each row's scale); got "
            f"{'both' if scale is not None else 'neither'}"
        )
    if scale is not None:
        _host.check_scale(scale, "scale", _OP, inp.device, ())
    else:
        _host._tensor(scales_out, "scales_out", _OP, 1)
        if scales_out.dtype != torch.float32 or scales_out.shape[0] != inp.shape[0]:
            raise ValueError(
                f"{_OP}: scales_out is {scales_out.dtype} {list(scales_out.shape)}; expected torch.float32 "
                f"[{inp.shape[0]}] (one scale per row of inp)"
            )
        if scales_out.device != inp.device:
            raise ValueError(
                f"{_OP}: scales_out is on {scales_out.device} but inp is on {inp.device}; they must match"
            )


def _check(out, inp, weight, eps, residual, residual_out, scale=None, scales_out=None) -> None:
    """Types, shapes, dtypes, devices and overlaps of a call's arguments."""
    _host._tensor(out, "out", _OP, 2)
    _host._tensor(inp, "inp", _OP, 2)
    _host._tensor(weight, "weight", _OP, 1)
    named = [("out", out)]
    for name, t in (("residual", residual), ("residual_out", residual_out)):
        if t is not None:
            named.append((name, _host._tensor(t, name, _OP, 2)))
    if inp.dtype not in _host.DTYPES:
        raise TypeError(
            f"{_OP}: dtype {inp.dtype} is not supported; use one of {', '.join(map(str, _host.DTYPES))}"
        )
    if weight.dtype not in _host.DTYPES:
        raise TypeError(
            f"{_OP}: weight has dtype {weight.dtype}; use one of {', '.join(map(str, _host.DTYPES))}"
        )
    for name, t in named + [("weight", weight)]:
        if t.device != inp.device:
            raise ValueError(f"{_OP}: {name} is on {t.device} but inp is on {inp.device}; they must match")
    for name, t in named:
        if t.dtype != inp.dtype and not (name == "out" and t.dtype in _host.FP8):
            raise TypeError(
                f"{_OP}: {name} has dtype {t.dtype} but inp has {inp.dtype}; they must match (out may "
                f"also be float8: {_host.names(_host.FP8)}, with scale= or scales_out=)"
            )
        if t.shape != inp.shape:
            raise ValueError(
                f"{_OP}: {name} has shape {list(t.shape)} but inp has {list(inp.shape)} ([tokens, hidden]); "
                "they must match"
            )
    if weight.shape[0] != inp.shape[1]:
        raise ValueError(
            f"{_OP}: weight has {weight.shape[0]} elements, expected {inp.shape[1]} (inp's hidden size)"
        )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{_OP}: eps must be a finite number >= 0, got {eps!r}")
    # Outputs may be their input's own view (in place), never overlap anything else.
    inputs = [("inp", inp), ("weight", weight)] + ([("residual", residual)] if residual is not None else [])
    outputs = named[:1] + ([("residual_out", residual_out)] if residual_out is not None else [])
    partner = {"out": "inp", "residual_out": "residual"}
    for oname, o in outputs:
        for iname, t in inputs:
            if partner[oname] == iname and _same_view(o, t):
                continue
            if _host.overlaps(o, t):
                allowed = f" (it may be {partner[oname]} itself, for an in-place call)"
                raise ValueError(
                    f"{_OP}: {oname} overlaps {iname}; outputs must not share memory with inputs{allowed}"
                )
    if residual_out is not None and _host.overlaps(out, residual_out):
        raise ValueError(f"{_OP}: out overlaps residual_out; the two outputs must not share memory")
    _check_quantized(out, inp, scale, scales_out)
    if scales_out is not None:
        for name, t in named + inputs:
            if _host.overlaps(scales_out, t):
                raise ValueError(
                    f"{_OP}: scales_out overlaps {name}; it must not share memory with another tensor"
                )


def _validate(out, inp, weight, eps, *, residual, residual_out, scale, scales_out, config, **_) -> None:
    _check(out, inp, weight, eps, residual, residual_out, scale, scales_out)
    check_config(config, AllReduceRMSNormConfig, _OP)


@entry.op(
    _OP, tensors=("out", "inp", "weight", "residual", "residual_out", "scale", "scales_out"),
    outputs=("out", "residual_out", "scales_out"), device="inp", validate=_validate,
)  # fmt: skip
def all_reduce_rmsnorm(
    out: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
    residual: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
    scale: torch.Tensor | None = None, scales_out: torch.Tensor | None = None, group=None,
    async_op: bool = False, config: AllReduceRMSNormConfig | None = None, workspace: Workspace | None = None,
) -> Work | None:  # fmt: skip
    """``out = rmsnorm(all_reduce(inp) + residual) * weight`` over the ranks of ``group``,
    in one kernel per call.

    With ``s = sum over the group of inp, + residual`` (when given): writes
    ``residual_out = s`` (when given) and ``out = s * rsqrt(mean(s**2, last dim) + eps) *
    weight``, computed in fp32 from the inputs and rounded once to the output's dtype.

    Shapes: ``inp``, ``out``, ``residual`` and ``residual_out`` are ``[tokens, hidden]``,
    the same on every rank; ``weight`` is ``[hidden]``. bf16, fp16 or fp32 (``weight`` any
    of them; the others all ``inp``'s, except a float8 ``out``). ``residual`` must be the
    same on every rank, as in tensor parallelism. ``out`` may be ``inp`` and
    ``residual_out`` may be ``residual`` (in place); no other output may overlap an input.
    Any tensors work, on a heap or not.

    A float8 ``out`` (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``) receives
    ``y / scale`` (``y`` the normed row in fp32; an IEEE division) rounded to nearest even,
    saturating to the format's finite range (448 or 57344; NaN stays NaN), so that
    ``out * scale`` is ``y`` as :func:`torch._scaled_mm` reads it; ``residual_out`` keeps
    ``inp``'s dtype. Exactly one of:

    :param scale: a one-element float32 tensor, the same on every rank: the static scale.
    :param scales_out: a float32 ``[tokens]`` tensor: each row's scale computed in the
        kernel, ``s_t = max(amax(|y_t|), 2**-40) / fp8_max`` (an IEEE division), the row
        then quantized with it (its largest element to ``+-fp8_max``).
    :param eps: added to the mean of squares (a finite number >= 0).
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`~iris.ccl.Work` handle instead of None.
    :param config: an :class:`AllReduceRMSNormConfig` (``form`` forces ``"ll"`` or
        ``"rs_ag"``); None chooses by size.
    :param workspace: a :class:`~iris.ops.Workspace` to reuse across calls; None keeps one
        per signature internally. The first call of a signature prepares it (collectively,
        not inside a CUDA graph capture); later calls allocate nothing.
    """
    ranks, index = _host.group_position(group)
    plan = _plan(config, inp, len(ranks), iris.mem.capabilities(inp.device))
    if out.numel() == 0:
        return _host.finish(inp.device, async_op)
    _run(plan, out, inp, weight, float(eps), residual, residual_out, scale, scales_out, ranks, index, group,
         workspace)  # fmt: skip
    return _host.finish(inp.device, async_op)


# --------------------------------------------------------------------------- run


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit stride along the hidden dimension (a copy when it has another)."""
    return t if t.stride(1) == 1 or t.shape[1] <= 1 else t.contiguous()


#: ``QUANT`` of the kernels (:mod:`iris.ops._rmsnorm_kernels`): out in inp's dtype, float8
#: with the static scale, float8 with per-row scales.
_PLAIN, _STATIC, _DYNAMIC = 0, 1, 2


def _run(plan: _Plan, out, inp, weight, eps: float, residual, residual_out, scale, scales_out, ranks, index,
         group, workspace):  # fmt: skip
    """Launch ``plan``'s form on views of the arguments with unit stride along the hidden
    dimension (copies of those with another, copied back into the outputs after)."""
    hidden = inp.shape[1]
    k_inp, k_res, k_w = _rows(inp), _rows(residual) if residual is not None else None, weight.contiguous()
    k_out = out if out.stride(1) == 1 else torch.empty_like(out, memory_format=torch.contiguous_format)
    k_rout = None
    if residual_out is not None:
        rout_ok = residual_out.stride(1) == 1
        k_rout = (
            residual_out if rout_ok else torch.empty_like(residual_out, memory_format=torch.contiguous_format)
        )
    k_scales = scales_out
    if scales_out is not None and scales_out.stride(0) != 1:
        k_scales = torch.empty_like(scales_out, memory_format=torch.contiguous_format)
    flags: dict[str, Any] = {
        "HAS_RES": residual is not None,
        "HAS_RES_OUT": residual_out is not None,
        "SINGLE": hidden <= plan.cfg.block,
        "BLOCK": plan.cfg.block,
        "QUANT": _STATIC if scale is not None else _DYNAMIC if scales_out is not None else _PLAIN,
    }
    # Unused pointers: any tensor (of the right dtype where one is read or written).
    args = (
        k_inp, k_res if k_res is not None else k_inp, k_w, k_out, k_rout if k_rout is not None else k_out,
        scale if scale is not None else k_scales if k_scales is not None else k_w,
    )  # fmt: skip
    run = _run_ll if plan.cfg.form == "ll" else _run_rs
    run(args, out, residual_out, ranks, index, plan, flags, eps, group, workspace)
    if k_out is not out:
        out.copy_(k_out)
    if k_rout is not None and k_rout is not residual_out:
        residual_out.copy_(k_rout)
    if k_scales is not scales_out:
        scales_out.copy_(k_scales)


def _shapes(inp, weight, out, flags, *more) -> tuple:
    """What besides the op, group, dtype, config and heap binds a workspace."""
    kinds = (str(weight.dtype), str(out.dtype), flags["HAS_RES"], flags["HAS_RES_OUT"], flags["QUANT"])
    return (tuple(inp.shape), *kinds, *more)


def _run_ll(args, out, residual_out, ranks, index, plan: _Plan, flags, eps, group, workspace) -> None:
    inp, res, weight, k_out, k_rout, scales = args
    tokens, hidden = inp.shape
    size, cfg, rows = len(ranks), plan.cfg, plan.launch_rows
    box_stride = rows * plan.row_lines
    specs = [("launches", 1, torch.int64), ("boxes", 2 * (size - 1) * box_stride, torch.int64)]
    # A program must read its rows of inp before it overwrites them in out; alone, nothing to push.
    spread = cfg.spread and size > 1 and not _host.overlaps(k_out, inp)
    shapes = _shapes(inp, weight, out, flags, spread)
    ws = _host.workspace_for(_OP, ranks, index, shapes, inp, cfg, rows, out, False, specs, workspace, group)
    for start in range(0, tokens, rows):
        count = min(rows, tokens - start)
        # one program per pushed piece (spread) or per row, at most the resident ones
        want = count * _host.cdiv(hidden, plan.piece) if spread else count
        grid = max(1, min(cfg.programs or want, plan.max_programs))
        dynamic = flags["QUANT"] == _DYNAMIC
        runtime.launch(
            _ll_rmsnorm_kernel, grid, ws.sync, ws.buffers["launches"],
            inp[start:], res[start:], weight, k_out[start:], k_rout[start:],
            scales[start:] if dynamic else scales, ws.buffers["boxes"],
            count, hidden, eps, inp.stride(0), res.stride(0), k_out.stride(0), k_rout.stride(0),
            plan.row_lines, box_stride, PIECE=plan.piece, SPREAD=spread, num_warps=cfg.num_warps, **flags,
        )  # fmt: skip


def _aligned_row(hidden: int, dtype: torch.dtype) -> int:
    """Elements of a workspace row of ``hidden`` elements of ``dtype``, rounded up to 16 bytes."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return _host.cdiv(hidden * itemsize, 16) * 16 // itemsize


def _run_rs(args, out, residual_out, ranks, index, plan: _Plan, flags, eps, group, workspace) -> None:
    inp, res, weight, k_out, k_rout, scales = args
    tokens, hidden = inp.shape
    size, cfg = len(ranks), plan.cfg
    share = _host.cdiv(tokens, size)
    stride, out_stride = _aligned_row(hidden, inp.dtype), _aligned_row(hidden, out.dtype)
    heap = _host.heap_of(out, ranks)
    # Owners store their rows straight into the peers' outputs where those are on a heap
    # spanning the group; else into the peers' workspaces, copied out after.
    out_in_place = size == 1 or (k_out is out and _host.writable_in_place(out, heap))
    res_in_place = not flags["HAS_RES_OUT"] or size == 1
    if not res_in_place and k_rout is residual_out and heap is not None:
        res_in_place = _host.heap_of(residual_out, ranks) is heap and residual_out.is_contiguous()
    specs = [
        ("launches", 1, torch.int64),
        ("partials", size * share * stride, inp.dtype),
        ("rs_flags", size * share, torch.int32),
        ("ag_flags", tokens, torch.int32),
        ("gout", 0 if out_in_place else tokens * out_stride, out.dtype),
        ("gres", 0 if res_in_place else tokens * stride, inp.dtype),
        # the peers' rows' scales (_DYNAMIC), always here: copied into scales_out after
        ("gscales", tokens if flags["QUANT"] == _DYNAMIC and size > 1 else 0, torch.float32),
    ]
    shapes = _shapes(inp, weight, out, flags, res_in_place)
    ws = _host.workspace_for(
        _OP, ranks, index, shapes, inp, cfg, None, out, out_in_place, specs, workspace, group
    )
    gout = k_out if out_in_place else ws.buffers["gout"].view(tokens, out_stride)
    gres = k_rout if res_in_place else ws.buffers["gres"].view(tokens, stride)
    hint = 16 if _host.aligned(gout, cfg.block) and _host.aligned(gres, cfg.block) else None
    grid = max(1, min(cfg.programs or share, plan.max_programs))  # one program per row of a share
    runtime.launch(
        _rs_rmsnorm_kernel, grid, ws.sync, ws.buffers["launches"],
        inp, res, weight, k_out, k_rout, scales, gout, gres, ws.buffers["gscales"], ws.buffers["partials"],
        ws.buffers["rs_flags"], ws.buffers["ag_flags"], tokens, hidden, eps, share, stride, inp.stride(0),
        res.stride(0),
        k_out.stride(0), k_rout.stride(0), gout.stride(0), gres.stride(0),
        OUT_IN_PLACE=out_in_place, RES_IN_PLACE=res_in_place, HINT=hint, num_warps=cfg.num_warps, **flags,
    )  # fmt: skip


__all__ = ["LL_MAX_BYTES", "all_reduce_rmsnorm", "choose_form", "resolve"]
