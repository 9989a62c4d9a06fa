"""iris.ops's fused ops as ``torch.library`` custom ops (``torch.ops.iris.*``), beside
iris.ccl's collectives, with the argument mapping of :mod:`iris.ccl.library`; and the
compiled form of each public op (what it runs under ``torch.compile``, registered with
:mod:`iris.ccl.entry`).

Each GEMM op has a mutating form with a trailing underscore (``torch.ops.iris.matmul_all_reduce_
(out, a, b, bias, ...)``, writing ``out``) and a functional form returning new tensors
(``torch.ops.iris.matmul_all_reduce(a, b, bias, ...)``). ``group`` is the process group's
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

from . import moe
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


# --------------------------------------------------------------------------- mutating forms


@torch.library.custom_op(f"{NAMESPACE}::matmul_all_reduce_", mutates_args=("out",))
def matmul_all_reduce_(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, group: str = "",
    config: str = "",
) -> None:  # fmt: skip
    """``iris.ops.matmul_all_reduce(out, a, b, bias)``."""
    run_matmul_all_reduce(out, a, b, bias, **_kw(group, config))


@torch.library.custom_op(f"{NAMESPACE}::all_gather_matmul_", mutates_args=("out",))
def all_gather_matmul_(
    out: torch.Tensor, a_shard: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
    gather_dim: int = 0, group: str = "", config: str = "",
) -> None:  # fmt: skip
    """``iris.ops.all_gather_matmul(out, a_shard, b, bias, gather_dim=...)``."""
    run_all_gather_matmul(out, a_shard, b, bias, gather_dim=gather_dim, **_kw(group, config))


@torch.library.custom_op(f"{NAMESPACE}::matmul_all_gather_", mutates_args=("out",))
def matmul_all_gather_(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, group: str = "",
    config: str = "",
) -> None:  # fmt: skip
    """``iris.ops.matmul_all_gather(out, a, b, bias)``."""
    run_matmul_all_gather(out, a, b, bias, **_kw(group, config))


@torch.library.custom_op(f"{NAMESPACE}::matmul_reduce_scatter_", mutates_args=("out",))
def matmul_reduce_scatter_(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
    scatter_dim: int = 0, group: str = "", config: str = "",
) -> None:  # fmt: skip
    """``iris.ops.matmul_reduce_scatter(out, a, b, bias, scatter_dim=...)``."""
    run_matmul_reduce_scatter(out, a, b, bias, scatter_dim=scatter_dim, **_kw(group, config))


@torch.library.custom_op(f"{NAMESPACE}::all_reduce_rmsnorm_", mutates_args=("out", "residual_out"))
def all_reduce_rmsnorm_(
    out: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
    residual: torch.Tensor | None = None, residual_out: torch.Tensor | None = None, group: str = "",
    config: str = "",
) -> None:  # fmt: skip
    """``iris.ops.all_reduce_rmsnorm(out, inp, weight, eps, residual=..., residual_out=...)``."""
    kw = _kw(group, config, AllReduceRMSNormConfig)
    run_all_reduce_rmsnorm(out, inp, weight, eps, residual=residual, residual_out=residual_out, **kw)


# --------------------------------------------------------------------------- functional forms


def _mm_shape(
    a: torch.Tensor, b: torch.Tensor, rows: int = 1, cols: int = 1, divide: bool = False
) -> list[int]:
    m, n = a.shape[0], b.shape[1]
    if divide:
        return [m // rows, n // cols]
    return [m * rows, n * cols]


@torch.library.custom_op(f"{NAMESPACE}::matmul_all_reduce", mutates_args=())
def matmul_all_reduce(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, group: str = "", config: str = ""
) -> torch.Tensor:
    """A new ``(M, N)`` tensor: ``all_reduce(a @ b) + bias``."""
    out = a.new_empty(_mm_shape(a, b))
    matmul_all_reduce_(out, a, b, bias, group, config)
    return out


def _agm_shape(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group: str) -> list[int]:
    return _mm_shape(a_shard, b, _group_size(group) if gather_dim == 0 else 1)


@torch.library.custom_op(f"{NAMESPACE}::all_gather_matmul", mutates_args=())
def all_gather_matmul(
    a_shard: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, gather_dim: int = 0,
    group: str = "", config: str = "",
) -> torch.Tensor:  # fmt: skip
    """A new ``(M, N)`` tensor: ``all_gather(a_shard, gather_dim) @ b + bias``."""
    out = a_shard.new_empty(_agm_shape(a_shard, b, gather_dim, group))
    all_gather_matmul_(out, a_shard, b, bias, gather_dim, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::matmul_all_gather", mutates_args=())
def matmul_all_gather(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, group: str = "", config: str = ""
) -> torch.Tensor:
    """A new ``(G*M, N)`` tensor: ``all_gather(a @ b + bias)`` along M."""
    out = a.new_empty(_mm_shape(a, b, _group_size(group)))
    matmul_all_gather_(out, a, b, bias, group, config)
    return out


def _mrs_shape(a: torch.Tensor, b: torch.Tensor, scatter_dim: int, group: str) -> list[int]:
    size = _group_size(group)
    return _mm_shape(a, b, size if scatter_dim == 0 else 1, size if scatter_dim == 1 else 1, divide=True)


@torch.library.custom_op(f"{NAMESPACE}::matmul_reduce_scatter", mutates_args=())
def matmul_reduce_scatter(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, scatter_dim: int = 0, group: str = "",
    config: str = "",
) -> torch.Tensor:  # fmt: skip
    """A new tensor: this rank's chunk (``(M/G, N)`` or ``(M, N/G)``) of ``a @ b`` summed
    over the group, + its slice of ``bias``."""
    out = a.new_empty(_mrs_shape(a, b, scatter_dim, group))
    matmul_reduce_scatter_(out, a, b, bias, scatter_dim, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(
    inp: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None,
    group: str = "", config: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """New tensors ``(out, residual_out)``: ``s = all_reduce(inp) + residual`` (when given)
    and ``out = rmsnorm(s) * weight``."""
    out = torch.empty_like(inp, memory_format=torch.contiguous_format)
    residual_out = torch.empty_like(inp, memory_format=torch.contiguous_format)
    all_reduce_rmsnorm_(out, inp, weight, eps, residual, residual_out, group, config)
    return out, residual_out


# --------------------------------------------------------------------------- fake implementations


def _nothing(*args, **kwargs) -> None:
    return None


MUTATING = (
    matmul_all_reduce_,
    all_gather_matmul_,
    matmul_all_gather_,
    matmul_reduce_scatter_,
    all_reduce_rmsnorm_,
)
ORDERED = (matmul_all_reduce, all_gather_matmul, matmul_all_gather, matmul_reduce_scatter, all_reduce_rmsnorm)
for _op in MUTATING:
    _op.register_fake(_nothing)
keep_in_order(*ORDERED)
keep_in_order(*MUTATING, ordered=False)


@matmul_all_reduce.register_fake
def _(a, b, bias=None, group="", config=""):
    return a.new_empty(_mm_shape(a, b))


@all_gather_matmul.register_fake
def _(a_shard, b, bias=None, gather_dim=0, group="", config=""):
    return a_shard.new_empty(_agm_shape(a_shard, b, gather_dim, group))


@matmul_all_gather.register_fake
def _(a, b, bias=None, group="", config=""):
    return a.new_empty(_mm_shape(a, b, _group_size(group)))


@matmul_reduce_scatter.register_fake
def _(a, b, bias=None, scatter_dim=0, group="", config=""):
    return a.new_empty(_mrs_shape(a, b, scatter_dim, group))


@all_reduce_rmsnorm.register_fake
def _(inp, weight, eps=1e-6, residual=None, group="", config=""):
    like = torch.empty_like(inp, memory_format=torch.contiguous_format)
    return like, torch.empty_like(like)


# --------------------------------------------------------------------------- expert parallelism
#
# moe_dispatch returns the receive buffer (``[capacity, H]``, its row count decided when the
# workspace is made: a size the fake implementation declares data-dependent), the counts per
# local expert and the positions of this rank's slots; moe_combine takes those positions back
# and finds the dispatch they came from.


@torch.library.custom_op(f"{NAMESPACE}::moe_dispatch", mutates_args=())
def moe_dispatch(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, group: str = "", config: str = ""
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``iris.ops.moe_dispatch``: ``(tokens, expert_counts, positions)``."""
    d = moe.moe_dispatch(x, topk_idx, num_experts, group=resolve_group(group), config=_cfg(config, MoEConfig))
    moe.remember(d)
    return d.tokens, d.expert_counts, d.positions


@torch.library.custom_op(f"{NAMESPACE}::moe_combine", mutates_args=())
def moe_combine(
    expert_out: torch.Tensor, topk_weights: torch.Tensor, topk_idx: torch.Tensor, positions: torch.Tensor,
    num_experts: int, group: str = "", config: str = "",
) -> torch.Tensor:  # fmt: skip
    """``iris.ops.moe_combine`` of the dispatch that returned ``positions``."""
    return moe.moe_combine(expert_out, moe.recall(positions), topk_weights)


@moe_dispatch.register_fake
def _(x, topk_idx, num_experts, group="", config=""):
    rows = torch.library.get_ctx().new_dynamic_size()
    counts = x.new_empty(num_experts // _group_size(group), dtype=torch.int64)
    return x.new_empty(rows, x.shape[1]), counts, x.new_empty(topk_idx.shape, dtype=torch.int32)


@moe_combine.register_fake
def _(expert_out, topk_weights, topk_idx, positions, num_experts, group="", config=""):
    return expert_out.new_empty(positions.shape[0], expert_out.shape[1])


keep_in_order(moe_dispatch, moe_combine)


# --------------------------------------------------------------------------- compiled forms


def _no_workspace(name: str, args: dict) -> tuple[str, str]:
    """The ``group`` and ``config`` strings of a GEMM op's call (a RuntimeError for a
    workspace: compiled code keeps one per call signature itself)."""
    if args["workspace"] is not None:
        raise RuntimeError(
            f"{name}(workspace=...) is not supported inside torch.compile: the compiled op keeps a "
            "workspace per call signature itself; leave workspace=None there"
        )
    cls = AllReduceRMSNormConfig if name == "all_reduce_rmsnorm" else Config
    return group_name(args["group"]), encode_config(args["config"], cls)


@entry.compiled_form("matmul_all_reduce")
def _(args: dict) -> None:
    keys = _no_workspace("matmul_all_reduce", args)
    args["out"].copy_(torch.ops.iris.matmul_all_reduce(args["a"], args["b"], args["bias"], *keys))


@entry.compiled_form("all_gather_matmul")
def _(args: dict) -> None:
    keys = _no_workspace("all_gather_matmul", args)
    result = torch.ops.iris.all_gather_matmul(
        args["a_shard"], args["b"], args["bias"], args["gather_dim"], *keys
    )
    args["out"].copy_(result)


@entry.compiled_form("matmul_all_gather")
def _(args: dict) -> None:
    keys = _no_workspace("matmul_all_gather", args)
    args["out"].copy_(torch.ops.iris.matmul_all_gather(args["a"], args["b"], args["bias"], *keys))


@entry.compiled_form("matmul_reduce_scatter")
def _(args: dict) -> None:
    keys = _no_workspace("matmul_reduce_scatter", args)
    a, b, bias, dim = args["a"], args["b"], args["bias"], args["scatter_dim"]
    args["out"].copy_(torch.ops.iris.matmul_reduce_scatter(a, b, bias, dim, *keys))


@entry.compiled_form("all_reduce_rmsnorm")
def _(args: dict) -> None:
    keys = _no_workspace("all_reduce_rmsnorm", args)
    inp, weight, eps, residual = args["inp"], args["weight"], args["eps"], args["residual"]
    normed, summed = torch.ops.iris.all_reduce_rmsnorm(inp, weight, eps, residual, *keys)
    args["out"].copy_(normed)
    if args["residual_out"] is not None:
        args["residual_out"].copy_(summed)


@entry.compiled_form("moe_dispatch")
def _(args: dict) -> moe.MoEDispatch:
    x, topk_idx, num_experts, group, config = (
        args[n] for n in ("x", "topk_idx", "num_experts", "group", "config")
    )
    tokens, counts, positions = torch.ops.iris.moe_dispatch(
        x, topk_idx, num_experts, group_name(group), encode_config(config, MoEConfig)
    )
    return moe.MoEDispatch(tokens, counts, positions, topk_idx, num_experts, None, 0, config, group)


@entry.compiled_form("moe_combine")
def _(args: dict) -> torch.Tensor:
    d = args["d"]
    key = encode_config(d._cfg, MoEConfig)
    return torch.ops.iris.moe_combine(
        args["expert_out"],
        args["topk_weights"],
        d.topk_idx,
        d.positions,
        d.num_experts,
        group_name(d._group),
        key,
    )
