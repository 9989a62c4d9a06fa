"""Host side of the MoE ops (:mod:`iris.ops.moe`): argument checks, the workspaces and their
capacity, the kernel launches, and the errors the kernels record.

A MoE workspace serves one signature (group, hidden size, top-k, number of experts, dtypes,
float8 mode, config) and holds the receive buffer of ``capacity`` rows, the same on every
rank. It grows, collectively, when a call asks for more rows (``max_recv_rows=``); the
workspace it replaces is released first (its dispatch can no longer be combined).
"""

from __future__ import annotations

import dataclasses
import weakref

import torch
import torch.distributed as dist
import triton

import iris.mem
from iris.mem import AbortedError, runtime

from . import _host
from . import workspace as _workspace
from ._moe_kernels import _moe_combine_kernel, _moe_dispatch_kernel
from ._moe_parts import (
    BOX_HEAD,
    ERR_CAPACITY,
    ERR_EXPERT_ID,
    QUANTIZE,
    ROWS_ONLY,
    SCALE_BLOCK,
    WITH_SCALES,
)
from .config import MAX_PROGRAMS, MoEConfig, check_config

#: Largest number of experts (the histograms live in registers).
MAX_EXPERTS = 4096
#: Row dtypes the ops move and combine (float64 too: accumulated in float64, for gradcheck).
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
#: Float8 row formats: moved as bytes, with their block scales (``x_scales``), or produced
#: by the dispatch kernel (``quantize=``).
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
#: Triton's name of each float8 format (the kernel's ``QDTYPE``).
_TL_FP8 = {torch.float8_e4m3fn: "float8e4nv", torch.float8_e5m2: "float8e5"}


@dataclasses.dataclass
class Info:
    """What the host keeps beside a MoE workspace."""

    capacity: int
    calls: int = 0  # dispatches made with it
    combined: int = 0  # the dispatch the last combine consumed


#: The current MoE workspace by process-group object (weakly), then signature; host info
#: by workspace.
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# --------------------------------------------------------------------------- checks


def checked(t, name: str, op: str, ndim: int) -> torch.Tensor:
    """``t`` once it is a tensor of ``ndim`` dimensions on no closed or aborted heap."""
    _host._tensor(t, name, op, ndim)
    heap = iris.mem.heap_of(t)
    if heap is not None and heap.aborted:
        try:
            heap.get_device_context()  # raises the heap's own AbortedError: who failed, and why
        except AbortedError as e:
            raise AbortedError(
                f"{op}: {name} ({list(t.shape)}, {t.dtype}) lies on a symmetric heap that was aborted: {e}",
                e.rank,
                e.reason,
            ) from None
    return t


def _check_fp8(op: str, x, x_scales, quantize, hidden: int) -> None:
    """The float8 arguments of a dispatch (``x_scales`` for float8 ``x``, or ``quantize``)."""
    if quantize is not None:
        if quantize not in FP8:
            raise ValueError(
                f"{op}: quantize must be None, torch.float8_e4m3fn or torch.float8_e5m2, got {quantize}"
            )
        if x.dtype not in DTYPES[:3]:
            raise TypeError(f"{op}: quantize= takes bf16, fp16 or fp32 tokens, got x of dtype {x.dtype}")
        if x_scales is not None:
            raise ValueError(f"{op}: pass x_scales (float8 x) or quantize= (x to quantize), not both")
    if (quantize is not None or x_scales is not None) and hidden % SCALE_BLOCK:
        raise ValueError(
            f"{op}: float8 rows carry one scale per {SCALE_BLOCK} channels: x's {hidden} columns must be a "
            f"multiple of {SCALE_BLOCK}"
        )
    if x_scales is None:
        return
    checked(x_scales, "x_scales", op, 2)
    if x.dtype not in FP8:
        raise TypeError(
            f"{op}: x_scales goes with float8 x (float8_e4m3fn or float8_e5m2), got x of {x.dtype}"
        )
    if x_scales.dtype != torch.float32:
        raise TypeError(f"{op}: x_scales must be float32, got {x_scales.dtype}")
    want = [x.shape[0], hidden // SCALE_BLOCK]
    if list(x_scales.shape) != want:
        raise ValueError(
            f"{op}: x_scales has shape {list(x_scales.shape)}, expected {want} (one scale per token and "
            f"block of {SCALE_BLOCK} channels)"
        )
    if x_scales.device != x.device:
        raise ValueError(f"{op}: x_scales is on {x_scales.device} but x is on {x.device}")


def validate_dispatch(x, topk_idx, num_experts, size: int, x_scales=None, quantize=None, max_recv_rows=None):
    """A clear error for bad dispatch arguments (every rank raises the same)."""
    op = "moe_dispatch"
    checked(x, "x", op, 2)
    checked(topk_idx, "topk_idx", op, 2)
    if x.dtype not in DTYPES + FP8:
        raise TypeError(f"{op}: x has dtype {x.dtype}; use one of {', '.join(map(str, DTYPES + FP8))}")
    if topk_idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: topk_idx must hold int64 (or int32) expert ids, got {topk_idx.dtype}")
    if topk_idx.device != x.device:
        raise ValueError(f"{op}: topk_idx is on {topk_idx.device} but x is on {x.device}; they must match")
    if topk_idx.shape[0] != x.shape[0]:
        raise ValueError(
            f"{op}: x has {x.shape[0]} rows (tokens) but topk_idx has {topk_idx.shape[0]}; topk_idx must be "
            "[tokens, top-k], one row per row of x"
        )
    if topk_idx.shape[1] < 1:
        raise ValueError(
            f"{op}: topk_idx has no slots (shape {list(topk_idx.shape)}); it must be [tokens, top-k]"
        )
    if x.shape[1] < 1:
        raise ValueError(f"{op}: x has rows of no elements (shape {list(x.shape)})")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"{op}: num_experts must be a positive int, got {num_experts!r}")
    if num_experts % size:
        raise ValueError(
            f"{op}: num_experts ({num_experts}) must be divisible by the group size ({size}): experts are "
            "split evenly, expert e on rank e // (num_experts // group size)"
        )
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"{op}: at most {MAX_EXPERTS} experts are supported, got {num_experts}")
    _check_fp8(op, x, x_scales, quantize, x.shape[1])
    if max_recv_rows is not None and (
        isinstance(max_recv_rows, bool)
        or not isinstance(max_recv_rows, int)
        or not 1 <= max_recv_rows < 1 << 31
    ):
        raise ValueError(f"{op}: max_recv_rows must be None or an int in [1, 2**31), got {max_recv_rows!r}")
    check_float8_grad(op, x, x_scales, quantize)


def check_float8_grad(op: str, x, x_scales, quantize) -> None:
    """A RuntimeError where autograd records and a float8 dispatch's input requires grad: no
    gradient flows through float8 rows, and none may be dropped silently."""
    if not torch.is_grad_enabled():
        return
    if x.requires_grad and (x.dtype in FP8 or quantize is not None):
        raise RuntimeError(
            f"{op}: x requires grad, but no gradient flows through float8 rows (float8 x, or quantize=); "
            "detach x, or dispatch it in bf16/fp16/fp32 to train through the dispatch"
        )
    if x_scales is not None and x_scales.requires_grad:
        raise RuntimeError(
            f"{op}: x_scales requires grad, but no gradient flows to the scales of float8 rows; detach them"
        )


def validate_combine(expert_out, d, topk_weights) -> None:
    """A clear error for combine arguments that do not fit the dispatch ``d``."""
    op = "moe_combine"
    checked(expert_out, "expert_out", op, 2)
    checked(topk_weights, "topk_weights", op, 2)
    tokens_n, slots = d.positions.shape
    hidden = d.tokens.shape[1]
    if d.tokens.dtype in FP8:
        if expert_out.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(
                f"{op}: after a float8 dispatch expert_out must be bf16 or fp16 (the experts' output), got "
                f"{expert_out.dtype}"
            )
    elif expert_out.dtype != d.tokens.dtype:
        raise TypeError(
            f"{op}: expert_out has dtype {expert_out.dtype} but d.tokens has {d.tokens.dtype}; they must "
            "match"
        )
    if expert_out.shape[1] != hidden or expert_out.shape[0] > d.tokens.shape[0]:
        raise ValueError(
            f"{op}: expert_out has shape {list(expert_out.shape)}; it must have {hidden} columns (d.tokens') "
            f"and at most {d.tokens.shape[0]} rows (d.tokens' capacity)"
        )
    if expert_out.device != d.tokens.device:
        raise ValueError(f"{op}: expert_out is on {expert_out.device} but d.tokens is on {d.tokens.device}")
    if not topk_weights.dtype.is_floating_point or topk_weights.dtype not in DTYPES:
        raise TypeError(
            f"{op}: topk_weights must be floating point ({', '.join(map(str, DTYPES))}), got "
            f"{topk_weights.dtype}"
        )
    if tuple(topk_weights.shape) != (tokens_n, slots):
        raise ValueError(
            f"{op}: topk_weights has shape {list(topk_weights.shape)}, expected {[tokens_n, slots]} "
            "(the shape of the topk_idx passed to moe_dispatch)"
        )
    if topk_weights.device != d.tokens.device:
        raise ValueError(
            f"{op}: topk_weights is on {topk_weights.device} but d.tokens is on {d.tokens.device}"
        )


def check_sequence(d) -> Info:
    """The host info of ``d``'s workspace once ``d`` is the latest, not yet combined
    dispatch of its signature; else a clear error."""
    op = "moe_combine"
    ws = d._ws
    if ws is None or not ws.prepared or ws not in INFO:
        raise RuntimeError(
            f"{op}: the workspace of this dispatch was released (release_workspaces(), or a later dispatch "
            "grew it with max_recv_rows=); dispatch again"
        )
    info = INFO[ws]
    if d._call != info.calls:
        raise RuntimeError(
            f"{op}: d is not the latest moe_dispatch of its signature (a later dispatch has reused its "
            "buffers); combine each dispatch before the next one"
        )
    if info.combined == d._call:
        raise RuntimeError(f"{op}: this dispatch was already combined; each dispatch is combined once")
    return info


def raise_recorded(ws: _workspace.Workspace) -> None:
    """Raise (and clear) the routing error the kernels of ``ws`` recorded, if any. Reads
    device memory: synchronise first where kernels run asynchronously."""
    errors = ws.buffers["errors"]
    code, rank, a, b = (int(v) for v in errors.tolist())
    if code == 0:
        return
    errors.zero_()
    if code == ERR_CAPACITY.value:
        raise RuntimeError(
            f"iris.ops.moe_dispatch: rank {rank} of the group needs {a} rows (the rows it receives, or its "
            f"tokens x top-k for the rows coming back in moe_combine), more than the {b} rows of the "
            "buffers (the capacity); no row was moved, d.tokens is not valid and moe_combine returns zeros. "
            "Pass moe_dispatch(..., max_recv_rows=n) (the same n on every rank) at least as large as the "
            "most rows a rank can receive (at most group size x top-k x the largest token count): the "
            "buffers grow to it"
        )
    if code == ERR_EXPERT_ID.value:
        raise ValueError(
            f"iris.ops.moe_dispatch: topk_idx of rank {rank} of the group holds expert id {a}, out of "
            f"range: ids must be -1 (no expert) or in [0, {b}) (num_experts); that slot was left out"
        )
    # ERR_SHORT_OUTPUT: the short rank's own record has the counts, its peers' have -1, -1
    if rank >= 0 and a >= 0:
        raise ValueError(
            f"iris.ops.moe_combine: rank {rank} of the group received {a} rows but its expert_out has "
            f"{b}; expert_out needs a row for every row of d.tokens that holds a token"
        )
    raise ValueError(
        f"iris.ops.moe_combine: rank {rank} of the group passed an expert_out with fewer rows than it "
        "received; this rank's result reads rows it never had"
    )


# --------------------------------------------------------------------------- configs and workspaces


def resolve(
    config: MoEConfig | None, hidden: int, caps, quantize: bool = False, itemsize: int = 2
) -> MoEConfig:
    """``config`` with ``programs``, ``block`` and ``num_warps`` chosen for rows of ``hidden``
    elements of ``itemsize`` bytes on a device of capabilities ``caps`` (``max_recv_rows``
    stays as given: its default is agreed between the ranks when the workspace is made).
    ``quantize``: rows are quantized in blocks of 128, so a block holds whole scale blocks."""
    check_config(config, MoEConfig)
    config = config or MoEConfig()
    if caps.interpreted:  # programs run one after another there: more would only be slower
        programs = 1
    else:
        programs = min(config.programs or caps.sm_count, caps.resident_programs, MAX_PROGRAMS)
    # A row moves in blocks of up to 2048 elements (4 KiB of bf16: a few vectors per thread).
    block = config.block or max(64, min(triton.next_power_of_2(max(hidden, 1)), 2048))
    if quantize:
        block = max(block, SCALE_BLOCK)
    # 16 bytes per thread and store where the block allows (8 elements of 2 bytes or more,
    # 16 of float8's one byte), at most 8 warps.
    warps = config.num_warps or max(1, min(8, block * min(itemsize, 2) // 512))
    return dataclasses.replace(config, programs=max(programs, 1), block=block, num_warps=warps)


def padded(num_experts: int) -> int:
    """Counts per box: a power of two, at least 16 (whole 16-byte groups of lines)."""
    return max(16, triton.next_power_of_2(num_experts))


def row_hint(hidden: int, itemsize: int, cfg: MoEConfig) -> int | None:
    """16 where every row and every block of a row starts on a 16-byte boundary (remote
    stores then move 16-byte vectors), else None."""
    return 16 if (hidden * itemsize) % 16 == 0 and cfg.block * itemsize >= 16 else None


def _ids_per_step(padded_experts: int) -> int:
    """``(token, slot)`` ids a dispatch program counts at once: the comparison of a step's ids
    with every expert is ``ids x padded_experts`` in registers, kept to 8192 elements."""
    return max(16, min(256, 8192 // padded_experts))


def some(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a one-element tensor of its dtype where ``t`` is empty (a valid pointer)."""
    return t if t.numel() else t.new_zeros(1)


def row_dtype(x: torch.Tensor, quantize) -> torch.dtype:
    """The dtype of the rows a dispatch delivers."""
    return quantize if quantize is not None else x.dtype


def _capacity(ws, info, max_recv_rows, cfg, group, x, size, slots) -> int | None:
    """The capacity to make the workspace with, or None when ``ws`` serves as it is."""
    if ws is not None and ws.prepared and (max_recv_rows is None or max_recv_rows <= info.capacity):
        return None
    capacity = max_recv_rows or cfg.max_recv_rows
    if not capacity:
        tokens = runtime.exchange(group, "iris.ops.moe_dispatch workspace", x.shape[0], ValueError)
        capacity = max(1, size * slots * max(tokens))
    if capacity >= 1 << 31:
        raise ValueError(
            f"iris.ops.moe_dispatch: a receive buffer of {capacity} rows (group size x top-k x tokens) is "
            "over 2**31 - 1; pass a smaller max_recv_rows"
        )
    return capacity


def workspace_for(ranks, group, x, slots: int, num_experts: int, cfg: MoEConfig, mode: int, rows_dtype,
                  max_recv_rows):  # fmt: skip
    """The prepared workspace of this signature and group, and its host info. Made
    collectively at the first call (the ranks agree on the default capacity there, from the
    largest token count of any rank), and again, larger, for a call whose ``max_recv_rows``
    exceeds its capacity (the old one is released first)."""
    size, hidden = len(ranks), x.shape[1]
    base = ("moe", ranks, (hidden, slots, num_experts), f"{x.dtype}->{rows_dtype}", cfg, mode)
    table = _TABLES.setdefault(dist.group.WORLD if group is None else group, {})
    ws = table.get(base)
    info = INFO.get(ws) if ws is not None else None
    capacity = _capacity(ws, info, max_recv_rows, cfg, group, x, size, slots)
    if capacity is None:
        return ws, info
    if iris.mem.capturing(x.device):
        raise RuntimeError(
            "iris.ops.moe_dispatch: this call makes its buffers (collectively, with allocations and a "
            "host exchange: the first call of a signature, or one whose max_recv_rows exceeds the "
            "capacity), which a CUDA graph cannot capture; make the same call once before capturing"
        )
    if ws is not None and ws.prepared:
        ws.close()  # collective and synchronised: the ranks grow together
    ep = padded(num_experts)
    programs = cfg.programs
    scale_rows = capacity * (hidden // SCALE_BLOCK) if mode != ROWS_ONLY else 0
    back_dtype = torch.bfloat16 if rows_dtype in FP8 else rows_dtype  # combine's rows: bf16 after float8
    specs = [
        ("cstate", 4, torch.int32),  # the combine kernel's call state (dispatch uses "state")
        ("boxes", 2 * size * (BOX_HEAD + ep), torch.int64),  # two banks of a box per member
        ("hist", programs * ep, torch.int32),
        ("ready", programs, torch.int32),
        ("bad", 2 * programs, torch.int64),
        ("tokens", capacity * hidden, torch.uint8 if rows_dtype in FP8 else rows_dtype),
        ("scales", scale_rows, torch.float32),
        ("origin", capacity, torch.int32),
        ("source", capacity, torch.int64),
        ("arrive", size, torch.int64),
        ("back", capacity * hidden, back_dtype),
        ("done", size, torch.int64),
        ("short", size, torch.int32),
        ("meta", 2, torch.int64),
        ("errors", 4, torch.int64),
    ]
    signature = base[:2] + ((hidden, slots, num_experts, capacity),) + base[3:5] + ((None, False), mode)
    ws = _workspace.acquire(None, signature, None, group, size, x.device, specs)
    table[base] = ws
    INFO[ws] = info = Info(capacity)
    return ws, info


# --------------------------------------------------------------------------- launches


def run_dispatch(
    x, topk_idx, num_experts: int, size: int, cfg: MoEConfig, ws, info: Info, x_scales, quantize
):
    """Launch the dispatch kernel: ``(tokens, scales, counts, offsets, positions)``
    (``tokens`` and ``scales`` views of the workspace; ``scales`` None without float8)."""
    tokens_n, hidden = x.shape
    slots = topk_idx.shape[1]
    local = num_experts // size
    mode = QUANTIZE if quantize is not None else WITH_SCALES if x_scales is not None else ROWS_ONLY
    xk = x if x.stride(1) == 1 or hidden == 1 else x.contiguous()
    if xk.dtype in FP8:
        xk = xk.view(torch.uint8)  # float8 rows move as bytes (exactly, compiled or interpreted)
    sk = x_scales if x_scales is None or x_scales.stride(1) == 1 else x_scales.contiguous()
    idx = topk_idx.contiguous()
    positions = torch.empty((tokens_n, slots), dtype=torch.int32, device=x.device)
    counts = torch.empty(local, dtype=torch.int64, device=x.device)
    offsets = torch.empty(local + 1, dtype=torch.int64, device=x.device)
    b = ws.buffers
    n_scales = hidden // SCALE_BLOCK
    ep = padded(num_experts)
    runtime.launch(
        _moe_dispatch_kernel, cfg.programs, ws.sync, b["state"],
        some(xk), some(sk if sk is not None else b["scales"]), some(idx), some(positions), counts, offsets,
        b["tokens"], b["scales"], b["origin"], b["source"], b["boxes"], b["hist"], b["ready"], b["bad"],
        b["arrive"], b["meta"], b["errors"],
        tokens_n, hidden, max(xk.stride(0), 1), max(sk.stride(0), 1) if sk is not None else 1, info.capacity,
        E=num_experts, K=slots, EP=ep, KP=triton.next_power_of_2(slots), BLOCK_S=_ids_per_step(ep),
        BLOCK_H=cfg.block, HINT=row_hint(hidden, b["tokens"].element_size(), cfg), num_warps=cfg.num_warps,
        SCALES=mode, SP=triton.next_power_of_2(max(n_scales, 1)),
        QDTYPE=getattr(triton.language, _TL_FP8.get(quantize, "float8e4nv")), programs=cfg.programs,
    )  # fmt: skip
    tokens = b["tokens"].view(info.capacity, hidden)
    if quantize is not None or x.dtype in FP8:
        tokens = tokens.view(row_dtype(x, quantize))
    scales = b["scales"].view(info.capacity, n_scales) if mode != ROWS_ONLY else None
    return tokens, scales, counts, offsets, positions


def accumulator(dtype: torch.dtype):
    """The Triton type sums of ``dtype`` values accumulate in: fp64 for fp64, else fp32."""
    return triton.language.float64 if dtype == torch.float64 else triton.language.float32


def run_combine(expert_out, d, topk_weights) -> torch.Tensor:
    """Launch the combine kernel of ``d``: the weighted sums ``[T, H]``."""
    ws, cfg = d._ws, d._cfg
    tokens_n, slots = d.positions.shape
    hidden = d.tokens.shape[1]
    eo = expert_out if expert_out.stride(1) == 1 or hidden == 1 else expert_out.contiguous()
    weights = topk_weights.contiguous()
    y = torch.empty((tokens_n, hidden), dtype=expert_out.dtype, device=expert_out.device)
    b = ws.buffers
    runtime.launch(
        _moe_combine_kernel, cfg.programs, ws.sync, b["cstate"],
        some(eo), some(weights), some(d.topk_idx.contiguous()), some(y), b["back"].view(eo.dtype),
        b["source"], b["done"], b["done"], b["short"], b["meta"], b["errors"],
        tokens_n, hidden, eo.shape[0], max(eo.stride(0), 1), max(y.stride(0), 1),
        E=d.num_experts, K=slots, KP=triton.next_power_of_2(slots), BLOCK_H=cfg.block,
        HINT=row_hint(hidden, eo.element_size(), cfg), num_warps=cfg.num_warps, ACC=accumulator(eo.dtype),
        ENTER=False, programs=cfg.programs,
    )  # fmt: skip
    return y
