"""iris.ops's fused ops as ``torch.library`` custom ops (``torch.ops.iris.*``), beside
iris.ccl's collectives, with the argument mapping of :mod:`iris.ccl.library`; and the
compiled form of each public op (what it runs under ``torch.compile``, registered with
:mod:`iris.ccl.entry`).

Each GEMM op has a mutating form with a trailing underscore (``torch.ops.iris.matmul_all_reduce_
(out, a, b, bias, ...)``, writing ``out``) and a functional form returning new tensors
(``torch.ops.iris.matmul_all_reduce(a, b, bias, ...)``); after ``group`` and ``config`` both
take float8 operands' ``scale_a`` and ``scale_b``, and the functional form an ``out_dtype``
(default: ``a``'s dtype; bf16 or fp32 for float8 operands). ``all_reduce_rmsnorm_`` takes
``scale`` and ``scales_out`` last; ``all_reduce_rmsnorm_quantized(inp, weight, eps, residual,
group, config, out_dtype, scale)`` is the functional form with a float8 output, returning
``(out, residual_out, scales)`` (``scales``: the per-row scales, ``[tokens]``, when ``scale``
is None; empty otherwise). ``group`` is the process group's
``group_name`` (``""``: the default group); ``config`` is
:func:`iris.ccl.library.encode_config` of an :class:`iris.ops.Config` (an
:class:`~iris.ops.AllReduceRMSNormConfig` for ``all_reduce_rmsnorm``, a
:class:`~iris.ops.MoEConfig` for the MoE ops), ``""`` for None. A
:class:`~iris.ops.Workspace` cannot be passed: the ops use the workspace they keep per call
signature.

The compiled forms call the functional forms (ordered effects: compiled graphs keep every
call in program order on every rank) and copy the result into the caller's output.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist

from iris.ccl import entry
from iris.ccl.library import (
    NAMESPACE,
    decode_config,
    encode_config,
    group_name,
    keep_in_order,
    register_config,
    resolve_group,
)

from .all_gather_matmul import all_gather_matmul as run_all_gather_matmul
from .all_reduce_rmsnorm import all_reduce_rmsnorm as run_all_reduce_rmsnorm
from .config import AllReduceRMSNormConfig, Config, MoEConfig
from .matmul_all_gather import matmul_all_gather as run_matmul_all_gather
from .matmul_all_reduce import matmul_all_reduce as run_matmul_all_reduce
from .matmul_reduce_scatter import matmul_reduce_scatter as run_matmul_reduce_scatter

register_config(Config)
register_config(AllReduceRMSNormConfig)
register_config(MoEConfig)


def _group_size(group: str) -> int:
    return dist.get_world_size(resolve_group(group)) if dist.is_initialized() else 1


def _cfg(config: str, cls=Config):
    return decode_config(config, cls)


def _kw(group: str, config: str, cls=Config) -> dict:
    return {"group": resolve_group(group), "config": _cfg(config, cls)}


# --------------------------------------------------------------------------- the GEMM ops


def _mm_shape(
    a: torch.Tensor, b: torch.Tensor, rows: int = 1, cols: int = 1, divide: bool = False
) -> list[int]:
    """``(M, N)`` of ``a @ b`` with M multiplied by ``rows`` and N by ``cols`` (or divided)."""
    m, n = a.shape[0], b.shape[1]
    if divide:
        return [m // rows, n // cols]
    return [m * rows, n * cols]


def _agm_shape(args: dict) -> list[int]:
    rows = _group_size(args["group"]) if args["gather_dim"] == 0 else 1
    return _mm_shape(args["a_shard"], args["b"], rows)


def _mrs_shape(args: dict) -> list[int]:
    size, dim = _group_size(args["group"]), args["scatter_dim"]
    return _mm_shape(args["a"], args["b"], size if dim == 0 else 1, size if dim == 1 else 1, divide=True)


#: The parameters every GEMM custom op takes after its own (the functional form also
#: ``out_dtype``), and their defaults.
_GEMM_TAIL = "str group='', str config='', Tensor? scale_a=None, Tensor? scale_b=None"
_GEMM_TAIL_DEFAULTS = {"group": "", "config": "", "scale_a": None, "scale_b": None}


@dataclasses.dataclass(frozen=True)
class _GemmOp:
    """One fused GEMM op as two custom ops: ``torch.ops.iris.<name>_(out, <params>, group,
    config, scale_a, scale_b)`` writes ``out`` (through the public function ``run``),
    ``torch.ops.iris.<name>(<params>, group, config, scale_a, scale_b, out_dtype)`` returns a
    new tensor of ``shape(arguments by name)`` and ``out_dtype`` (None: ``a``'s)."""

    name: str
    params: str
    run: Callable
    shape: Callable[[dict], list[int]]

    @property
    def names(self) -> list[str]:
        """The parameters' names, in schema order: the op's own, then ``group``, ``config``,
        ``scale_a`` and ``scale_b`` (the functional form: then ``out_dtype``)."""
        return [p.split()[1].split("=")[0] for p in self.params.split(", ")] + list(_GEMM_TAIL_DEFAULTS)

    @property
    def defaults(self) -> dict:
        """The defaults of the schema's parameters (a custom op passes only what it was given)."""
        found = {**_GEMM_TAIL_DEFAULTS, "out_dtype": None}
        for param in self.params.split(", "):
            name, _, default = param.split()[1].partition("=")
            if default:
                found[name] = ast.literal_eval(default)
        return found

    def _bind(self, args: tuple) -> dict:
        return {**self.defaults, **dict(zip([*self.names, "out_dtype"], args))}

    def define(self) -> tuple:
        """Register the mutating and the functional custom op (with its fake); returns both."""
        mutating = torch.library.custom_op(
            f"{NAMESPACE}::{self.name}_", self._mutate, mutates_args=("out",),
            schema=f"(Tensor(a!) out, {self.params}, {_GEMM_TAIL}) -> ()",
        )  # fmt: skip
        functional = torch.library.custom_op(
            f"{NAMESPACE}::{self.name}",
            self._compute,
            mutates_args=(),
            schema=f"({self.params}, {_GEMM_TAIL}, ScalarType? out_dtype=None) -> Tensor",
        )
        mutating.register_fake(_nothing)
        functional.register_fake(lambda *args: self._new_out(self._bind(args)))
        return mutating, functional

    def _new_out(self, kw: dict) -> torch.Tensor:
        first = kw[self.names[0]]
        return first.new_empty(self.shape(kw), dtype=kw["out_dtype"] or first.dtype)

    def _mutate(self, out: torch.Tensor, *args) -> None:
        self._run(out, self._bind(args))

    def _run(self, out: torch.Tensor, kw: dict) -> None:
        kw = dict(kw)
        kw.pop("out_dtype")
        where = _kw(kw.pop("group"), kw.pop("config"))
        self.run(out, **kw, **where)

    def _compute(self, *args) -> torch.Tensor:
        kw = self._bind(args)
        out = self._new_out(kw)
        self._run(out, kw)
        return out

    def compiled(self, args: dict) -> None:
        """The compiled form of the public op: the functional op, copied into ``out``."""
        group, config = _no_workspace(self.name, args)
        functional = getattr(torch.ops.iris, self.name)
        own = (args[n] for n in self.names[:-4])
        out = args["out"]
        out.copy_(functional(*own, group, config, args["scale_a"], args["scale_b"], out.dtype))


def _nothing(*args, **kwargs) -> None:
    return None


GEMM_OPS = (
    _GemmOp("matmul_all_reduce", "Tensor a, Tensor b, Tensor? bias=None", run_matmul_all_reduce,
            lambda args: _mm_shape(args["a"], args["b"])),
    _GemmOp("all_gather_matmul", "Tensor a_shard, Tensor b, Tensor? bias=None, int gather_dim=0",
            run_all_gather_matmul, _agm_shape),
    _GemmOp("matmul_all_gather", "Tensor a, Tensor b, Tensor? bias=None", run_matmul_all_gather,
            lambda args: _mm_shape(args["a"], args["b"], _group_size(args["group"]))),
    _GemmOp("matmul_reduce_scatter", "Tensor a, Tensor b, Tensor? bias=None, int scatter_dim=0",
            run_matmul_reduce_scatter, _mrs_shape),
)  # fmt: skip
for _op in GEMM_OPS:
    _mutating, _functional = _op.define()
    keep_in_order(_functional)  # never dropped, in program order on every rank
    keep_in_order(_mutating, ordered=False)
    entry.compiled_form(_op.name)(_op.compiled)


# --------------------------------------------------------------------------- all_reduce_rmsnorm


@torch.library.custom_op(
    f"{NAMESPACE}::all_reduce_rmsnorm_", mutates_args=("out", "residual_out", "scales_out")
)
def all_reduce_rmsnorm_(
    out: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
    residual: torch.Tensor | None = None, residual_out: torch.Tensor | None = None, group: str = "",
    config: str = "", scale: torch.Tensor | None = None, scales_out: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """``iris.ops.all_reduce_rmsnorm(out, inp, weight, eps, residual=..., residual_out=...,
    scale=..., scales_out=...)``."""
    kw = _kw(group, config, AllReduceRMSNormConfig)
    run_all_reduce_rmsnorm(
        out, inp, weight, eps, residual=residual, residual_out=residual_out, scale=scale,
        scales_out=scales_out, **kw,
    )  # fmt: skip


@torch.library.custom_op(f"{NAMESPACE}::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(
    inp: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None,
    group: str = "", config: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """New tensors ``(out, residual_out)``: ``s = all_reduce(inp) + residual`` (when given)
    and ``out = rmsnorm(s) * weight``."""
    out = torch.empty_like(inp, memory_format=torch.contiguous_format)
    residual_out = torch.empty_like(inp, memory_format=torch.contiguous_format)
    # every argument given: torch 2.11's in-place bookkeeping indexes the mutated arguments
    # (scales_out is the 10th) among the ones passed
    all_reduce_rmsnorm_(out, inp, weight, eps, residual, residual_out, group, config, None, None)
    return out, residual_out


@all_reduce_rmsnorm.register_fake
def _(inp, weight, eps=1e-6, residual=None, group="", config=""):
    like = torch.empty_like(inp, memory_format=torch.contiguous_format)
    return like, torch.empty_like(like)


@torch.library.custom_op(f"{NAMESPACE}::all_reduce_rmsnorm_quantized", mutates_args=())
def all_reduce_rmsnorm_quantized(
    inp: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None, group: str,
    config: str, out_dtype: torch.dtype, scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """New tensors ``(out, residual_out, scales)``: ``out`` float8 of ``out_dtype``, quantized
    with the static ``scale``, or with per-row scales returned in ``scales`` (``[tokens]``;
    empty with a static ``scale``)."""
    out, residual_out, scales = _quantized_outputs(inp, out_dtype, scale)
    all_reduce_rmsnorm_(
        out, inp, weight, eps, residual, residual_out, group, config, scale, scales if scale is None else None
    )
    return out, residual_out, scales


@all_reduce_rmsnorm_quantized.register_fake
def _(inp, weight, eps, residual, group, config, out_dtype, scale=None):
    return _quantized_outputs(inp, out_dtype, scale)


def _quantized_outputs(inp: torch.Tensor, out_dtype: torch.dtype, scale) -> tuple:
    out = torch.empty(inp.shape, dtype=out_dtype, device=inp.device)
    residual_out = torch.empty_like(inp, memory_format=torch.contiguous_format)
    scales = torch.empty(inp.shape[0] if scale is None else 0, dtype=torch.float32, device=inp.device)
    return out, residual_out, scales


all_reduce_rmsnorm_.register_fake(_nothing)
keep_in_order(all_reduce_rmsnorm, all_reduce_rmsnorm_quantized)
keep_in_order(all_reduce_rmsnorm_, ordered=False)


# --------------------------------------------------------------------------- compiled forms


def _no_workspace(name: str, args: dict) -> tuple[str, str]:
    """The ``group`` and ``config`` strings of a call (a RuntimeError for a workspace:
    compiled code keeps one per call signature itself)."""
    if args["workspace"] is not None:
        raise RuntimeError(
            f"{name}(workspace=...) is not supported inside torch.compile: the compiled op keeps a "
            "workspace per call signature itself; leave workspace=None there"
        )
    cls = AllReduceRMSNormConfig if name == "all_reduce_rmsnorm" else Config
    return group_name(args["group"]), encode_config(args["config"], cls)


@entry.compiled_form("all_reduce_rmsnorm")
def _(args: dict) -> None:
    keys = _no_workspace("all_reduce_rmsnorm", args)
    inp, weight, eps, residual, out = args["inp"], args["weight"], args["eps"], args["residual"], args["out"]
    if args["scale"] is not None or args["scales_out"] is not None:  # a float8 out
        quantized = torch.ops.iris.all_reduce_rmsnorm_quantized
        normed, summed, scales = quantized(inp, weight, eps, residual, *keys, out.dtype, args["scale"])
        if args["scales_out"] is not None:
            args["scales_out"].copy_(scales)
    else:
        normed, summed = torch.ops.iris.all_reduce_rmsnorm(inp, weight, eps, residual, *keys)
    out.copy_(normed)
    if args["residual_out"] is not None:
        args["residual_out"].copy_(summed)
