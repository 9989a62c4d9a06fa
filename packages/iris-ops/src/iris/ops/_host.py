"""Host-side helpers shared by the fused ops: validation, the group, the heap, launching."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import iris.mem
from iris.ccl import Work, entry
from iris.mem import runtime

from . import workspace as _workspace
from .config import FP8, Config, select

#: Dtypes the ops take (fp32 runs on tf32 tensor cores); accumulation is always fp32.
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# FP8 (from .config): the float8 formats, GEMM inputs and all_reduce_rmsnorm's quantized output.
#: Output dtypes of a GEMM with float8 inputs.
FP8_OUT = (torch.bfloat16, torch.float32)


def names(dtypes) -> str:
    """``"torch.bfloat16, torch.float16"``: dtypes for an error message."""
    return ", ".join(map(str, dtypes))


def check_scale(t: Any, name: str, op: str, device: torch.device, shapes: tuple[tuple[int, ...], ...]):
    """``t`` is an fp32 tensor of one element or of one of ``shapes``, on ``device``, usable."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor (float32), got {type(t).__name__}")
    check_usable(t, f"{op}: {name}")
    if t.dtype != torch.float32:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; scales are float32")
    if t.numel() != 1 and tuple(t.shape) not in shapes:
        allowed = " or ".join(str(list(s)) for s in shapes)
        raise ValueError(f"{op}: {name} has shape {list(t.shape)}; expected one element or {allowed}")
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but the inputs are on {device}; they must match")


def _tensor(t: Any, name: str, op: str, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {list(t.shape)}")
    check_usable(t, f"{op}: {name}")
    return t


def check_usable(t: torch.Tensor, what: str) -> None:
    """An error for a tensor on a closed heap (and, in debug mode, in a freed range of a heap)
    or on an aborted one, named ``what``. An aborted heap's tensors are refused whatever the
    call would do with them (a call with plain outputs would only read them, but nothing may
    use an aborted heap again)."""
    iris.mem.check_live(t, what)
    heap = iris.mem.heap_of(t)
    if heap is not None and heap.aborted:
        try:
            heap.get_device_context()  # raises the heap's own AbortedError: who failed, why
        except iris.mem.AbortedError as e:
            raise iris.mem.AbortedError(
                f"{what} ({list(t.shape)}, {t.dtype}) lies on a symmetric heap that was aborted: {e}",
                e.rank,
                e.reason,
            ) from None


def check_operands(op: str, out, a, b, bias, scale_a=None, scale_b=None) -> None:
    """Types, ranks, dtypes and devices of a fused op's tensors (shapes are the op's own,
    but for the scales': one element, or ``[rows of a, 1]`` / ``[1, columns of b]``)."""
    a_name = "a" if op != "all_gather_matmul" else "a_shard"
    _tensor(out, "out", op, 2)
    _tensor(a, a_name, op, 2)
    _tensor(b, "b", op, 2)
    if bias is not None:
        _tensor(bias, "bias", op, 1)
    named = [("out", out), (a_name, a), ("b", b)] + ([("bias", bias)] if bias is not None else [])
    if a.dtype in FP8:
        _check_fp8_operands(op, a_name, out, a, b, bias)
    elif a.dtype not in DTYPES:
        raise TypeError(f"{op}: dtype {a.dtype} is not supported; use one of {names(DTYPES + FP8)}")
    else:
        for name, t in named:
            if t.dtype != a.dtype:
                raise TypeError(
                    f"{op}: {name} has dtype {t.dtype} but {a_name} has {a.dtype}; they must match"
                )
        for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
            if t is not None:
                raise TypeError(f"{op}: {name} scales float8 inputs only; {a_name} has dtype {a.dtype}")
    for name, t in named:
        if t.device != a.device:
            raise ValueError(f"{op}: {name} is on {t.device} but {a_name} is on {a.device}; they must match")
    if scale_a is not None:
        check_scale(scale_a, "scale_a", op, a.device, ((a.shape[0], 1),))
    if scale_b is not None:
        check_scale(scale_b, "scale_b", op, a.device, ((1, b.shape[1]),))
    for name, t in named[1:] + [("scale_a", scale_a), ("scale_b", scale_b)]:
        if t is not None and overlaps(out, t):
            raise ValueError(f"{op}: out overlaps {name}; the output must not share memory with an input")


def _check_fp8_operands(op: str, a_name: str, out, a, b, bias) -> None:
    """Float8 ``a``: ``b`` float8 too (either format), ``out`` (and ``bias``) bf16 or fp32."""
    if b.dtype not in FP8:
        raise TypeError(
            f"{op}: {a_name} has dtype {a.dtype} but b has {b.dtype}; with a float8 {a_name}, b must be "
            f"float8 too ({names(FP8)})"
        )
    if out.dtype not in FP8_OUT:
        raise TypeError(
            f"{op}: out has dtype {out.dtype}; the product of float8 inputs is written in {names(FP8_OUT)}"
        )
    if bias is not None and bias.dtype != out.dtype:
        raise TypeError(f"{op}: bias has dtype {bias.dtype} but out has {out.dtype}; they must match")


def scale_operand(scale: torch.Tensor | None, dim: int, placeholder: torch.Tensor) -> tuple:
    """``(tensor, stride, given)`` of a scale as the kernels read it: element ``i`` (a row of A,
    ``dim`` 0, or a column of B, ``dim`` 1) at ``tensor + i * stride``; stride 0 for one
    scale. Without one, ``placeholder`` (never read)."""
    if scale is None:
        return placeholder, 0, False
    return scale, (0 if scale.numel() == 1 else scale.stride(dim)), True


#: What the docstrings of ``matmul_all_gather``, ``matmul_all_reduce`` and
#: ``matmul_reduce_scatter`` say alike; :func:`gemm_op` puts it where a docstring has the
#: line ``{GEMM_PARAMS}``, at that line's indentation.
GEMM_PARAMS = """\
:param scale_a: float8 only: ``a``'s scale (``value = fp8 x scale``, as
    :func:`torch._scaled_mm` takes it), a one-element float32 tensor or ``[M, 1]`` (per
    row); this rank's own. None: 1.
:param scale_b: float8 only: ``b``'s, one element or ``[1, N]`` (per column). None: 1.
:param group: torch.distributed group, or None for the world.
:param async_op: return a :class:`~iris.ccl.Work` handle instead of None."""


def gemm_op(name: str, validate, a: str = "a"):
    """The :func:`iris.ccl.entry.op` decorator of a fused GEMM op ``name``: tensors ``out``,
    ``a`` (named ``a``), ``b``, ``bias``, ``scale_a``, ``scale_b``; it runs on ``a``'s device
    and returns ``out``. A ``{GEMM_PARAMS}`` line of the docstring becomes :data:`GEMM_PARAMS`."""
    tensors = ("out", a, "b", "bias", "scale_a", "scale_b")
    register = entry.op(name, tensors=tensors, outputs=("out",), device=a, validate=validate)

    def decorate(fn):
        if fn.__doc__:  # None under python -OO
            fn.__doc__ = re.sub(
                r"^( *)\{GEMM_PARAMS\}$",
                lambda line: textwrap.indent(GEMM_PARAMS, line[1]),
                fn.__doc__,
                flags=re.MULTILINE,
            )
        return register(fn)

    return decorate


def check_call(op: str, out, a, b, bias, group, scale_a=None, scale_b=None) -> tuple:
    """The checks every fused op starts with (operands, group, inner dimensions): returns
    ``(global ranks of group, this rank's index, M, K, N)`` of ``a @ b``."""
    check_operands(op, out, a, b, bias, scale_a, scale_b)
    ranks, index = group_position(group)
    return (ranks, index, *matmul_dims(op, a, b))


def matmul_dims(op: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    """``(M, K, N)`` of ``a @ b``; a ValueError when the inner dimensions differ."""
    (m, k), (k2, n) = a.shape, b.shape
    if k2 != k:
        raise ValueError(
            f"{op}: a is {list(a.shape)} and b is {list(b.shape)}; a's columns must equal b's rows"
        )
    return m, k, n


def check_shape(op: str, out: torch.Tensor, shape: tuple[int, int], why: str) -> None:
    """A ValueError unless ``out`` has ``shape`` (``why`` says where that comes from)."""
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{op}: out has shape {list(out.shape)}, expected {list(shape)} ({why})")


def check_bias(op: str, bias, n: int) -> None:
    if bias is not None and bias.shape[0] != n:
        raise ValueError(f"{op}: bias has {bias.shape[0]} elements, expected {n} (the columns of a @ b)")


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of ``a`` and ``b`` (any layout) intersect."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False

    def span(t):
        hi = sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if st > 0)
        return t.data_ptr(), t.data_ptr() + (hi + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def group_position(group) -> tuple[tuple[int, ...], int]:
    """``(global ranks of group, this process's index)``; group None is the world."""
    ranks, index = runtime.group_index(group)
    return tuple(ranks), index


def divisible(op: str, what: str, value: int, size: int) -> None:
    if value % size:
        raise ValueError(f"{op}: {what} ({value}) must be divisible by the group size ({size})")


def resolve(rows: int, cols: int, a: torch.Tensor, config: Config | None, wide: bool = False) -> Config:
    """The config to run, for output tiles over ``rows x cols`` (``wide``: see ``select``)."""
    caps = iris.mem.capabilities(a.device)
    return select(rows, cols, a.dtype, caps.sm_count, caps.interpreted, config, wide)


def heap_of(out: torch.Tensor, ranks: tuple[int, ...]):
    """The heap holding ``out`` when it spans exactly ``ranks`` (in that order), else None."""
    heap = iris.mem.heap_of(out)
    if heap is not None and tuple(heap.global_ranks) == ranks:
        return heap
    return None


def writable_in_place(out: torch.Tensor, heap) -> bool:
    """Whether peers can store into ``out`` directly: on the heap, row-major contiguous."""
    return heap is not None and out.is_contiguous()


def workspace_for(op: str, ranks, index, shapes, a, cfg, extra, out, in_place_out, specs, workspace, group):
    """The prepared workspace of this call (see :func:`iris.ops.workspace.acquire`)."""
    heap = heap_of(out, ranks)
    dtypes = str(a.dtype) if out.dtype == a.dtype else f"{a.dtype} -> {out.dtype}"
    signature = (op, ranks, shapes, dtypes, cfg, (id(heap) if heap is not None else None, in_place_out))
    signature = signature + (extra,)
    return _workspace.acquire(workspace, signature, heap, group, len(ranks), a.device, specs)


def launch(kernel, grid: int, ws: _workspace.Workspace, cfg: Config, *args, **meta) -> None:
    """Launch the GEMM kernel ``kernel`` on ``grid`` programs over the workspace's sync state
    (:func:`iris.mem.runtime.launch`), its ``state`` words, ``args``, the config's constexprs
    and ``INTERPRETED`` (whether the workspace's device interprets kernels: the GEMM core's
    interpreter-safe K loop, see :mod:`iris.ops._gemm`)."""
    interpreted = iris.mem.capabilities(ws.heap.device).interpreted
    runtime.launch(
        kernel, grid, ws.sync, ws.buffers["state"], *args, programs=max(grid, cfg.num_sms),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, INTERPRETED=interpreted, **meta,
    )  # fmt: skip


def tma_operand(t: torch.Tensor, block: tuple[int, int], use: bool):
    """``(descriptor, True)`` to read ``t`` through the tensor memory accelerator in blocks of
    ``block``, when ``use`` and its layout allows it (2-D, row-major rows 16-byte aligned,
    not empty); else ``(t, False)``: the kernel reads ``t`` with pointers."""
    itemsize = t.element_size()
    if (
        not use
        or t.numel() == 0
        or t.stride(1) != 1
        or (t.stride(0) * itemsize) % 16
        or t.data_ptr() % 16
        or block[1] * itemsize < 16
    ):
        return t, False
    return TensorDescriptor.from_tensor(t, list(block)), True


def finish(device: torch.device, async_op: bool) -> Work | None:
    return Work(device) if async_op else None


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def aligned(t: torch.Tensor, *elements: int) -> bool:
    """Whether tiles of ``t`` (a matrix with row-major rows, or a flat buffer), offset by any
    multiple of each of ``elements``, start rows on 16-byte boundaries: peers can then store
    them in vectors."""
    itemsize = t.element_size()
    steps = [*elements, *([t.stride(0)] if t.dim() == 2 else [])]
    return t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and all(s * itemsize % 16 == 0 for s in steps)
