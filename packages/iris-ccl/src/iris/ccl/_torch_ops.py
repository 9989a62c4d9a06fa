"""iris.ccl's collectives as ``torch.library`` custom ops (``torch.ops.iris.*``), and the
compiled form of each public collective (what it runs under ``torch.compile``, registered
with :mod:`iris.ccl.entry`).

Two forms of each collective:

* **mutating**, named with a trailing underscore (``torch.ops.iris.all_reduce_(out, inp,
  ...)``): writes the caller's output (declared in ``mutates_args``) and returns nothing;
* **functional** (``torch.ops.iris.all_reduce(inp, ...)``): returns a new tensor; what the
  compiled forms call (ordered effects keep them in program order on every rank), copying
  the result into the caller's output.

Arguments are mapped to primitives as :mod:`iris.ccl.library` describes. ``barrier`` and
``send`` return nothing and mutate nothing, so they are ordered side effects (compiled
graphs keep them, in program order); so is ``recv`` (functional form; the public ``recv``
copies its result into the caller's tensor).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import entry
from .all_gather import all_gather as run_all_gather
from .all_reduce import all_reduce as run_all_reduce
from .all_to_all import all_to_all as run_all_to_all
from .barrier import barrier as run_barrier
from .broadcast import broadcast as run_broadcast
from .config import Config
from .gather import gather as run_gather
from .library import (
    NAMESPACE,
    decode_config,
    dim0_scaled,
    encode_config,
    group_name,
    group_size,
    keep_in_order,
    op_name,
    resolve_group,
)
from .p2p import recv as run_recv
from .p2p import send as run_send
from .reduce import reduce as run_reduce
from .reduce_scatter import reduce_scatter as run_reduce_scatter
from .scatter import scatter as run_scatter


def _cfg(config: str) -> Config | None:
    return decode_config(config, Config)


# --------------------------------------------------------------------------- mutating forms


def _reducing(name: str, run):
    """The mutating op ``<name>_`` of the reducing collective ``run`` (``all_reduce`` and
    ``reduce_scatter`` take the same arguments)."""

    def mutating(
        out: torch.Tensor, inp: torch.Tensor, op: str = "sum", group: str = "", config: str = ""
    ) -> None:
        run(out, inp, op=op, group=resolve_group(group), config=_cfg(config))

    mutating.__name__ = mutating.__qualname__ = f"{name}_"
    mutating.__doc__ = f"``iris.ccl.{name}(out, inp)``."
    return torch.library.custom_op(f"{NAMESPACE}::{name}_", mutating, mutates_args=("out",))


all_reduce_ = _reducing("all_reduce", run_all_reduce)


@torch.library.custom_op(f"{NAMESPACE}::all_gather_", mutates_args=("out",))
def all_gather_(out: torch.Tensor, inp: torch.Tensor, group: str = "", config: str = "") -> None:
    """``iris.ccl.all_gather(out, inp)``."""

    run_all_gather(out, inp, group=resolve_group(group), config=_cfg(config))


reduce_scatter_ = _reducing("reduce_scatter", run_reduce_scatter)


@torch.library.custom_op(f"{NAMESPACE}::all_to_all_", mutates_args=("out",))
def all_to_all_(
    out: torch.Tensor, inp: torch.Tensor, output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None, group: str = "", config: str = "",
) -> None:  # fmt: skip
    """``iris.ccl.all_to_all(out, inp, output_split_sizes, input_split_sizes)``."""

    run_all_to_all(
        out, inp, output_split_sizes, input_split_sizes, group=resolve_group(group), config=_cfg(config)
    )


@torch.library.custom_op(f"{NAMESPACE}::broadcast_", mutates_args=("tensor",))
def broadcast_(tensor: torch.Tensor, src: int, group: str = "", config: str = "") -> None:
    """``iris.ccl.broadcast(tensor, src)``."""

    run_broadcast(tensor, src, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::reduce_", mutates_args=("out",))
def reduce_(
    out: torch.Tensor | None, inp: torch.Tensor, dst: int, op: str = "sum", group: str = "", config: str = ""
) -> None:
    """``iris.ccl.reduce(out, inp, dst)``."""

    run_reduce(out, inp, dst, op=op, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::gather_", mutates_args=("out",))
def gather_(out: torch.Tensor | None, inp: torch.Tensor, dst: int, group: str = "", config: str = "") -> None:
    """``iris.ccl.gather(out, inp, dst)``."""

    run_gather(out, inp, dst, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::scatter_", mutates_args=("out",))
def scatter_(
    out: torch.Tensor, inp: torch.Tensor | None, src: int, group: str = "", config: str = ""
) -> None:
    """``iris.ccl.scatter(out, inp, src)``."""

    run_scatter(out, inp, src, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::barrier", mutates_args=())
def barrier(group: str = "", config: str = "") -> None:
    """``iris.ccl.barrier()``."""

    run_barrier(resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::send", mutates_args=())
def send(tensor: torch.Tensor, dst: int, group: str = "", config: str = "") -> None:
    """``iris.ccl.send(tensor, dst)``."""

    run_send(tensor, dst, group=resolve_group(group), config=_cfg(config))


# --------------------------------------------------------------------------- functional forms


@torch.library.custom_op(f"{NAMESPACE}::all_reduce", mutates_args=())
def all_reduce(inp: torch.Tensor, op: str = "sum", group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: the reduction of ``inp`` over the group."""
    out = torch.empty_like(inp, memory_format=torch.contiguous_format)
    all_reduce_(out, inp, op, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::all_gather", mutates_args=())
def all_gather(inp: torch.Tensor, group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: every rank's ``inp`` concatenated along dim 0 (0-d: stacked)."""
    out = inp.new_empty(dim0_scaled(inp, group_size(group), False, "all_gather"))
    all_gather_(out, inp, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::reduce_scatter", mutates_args=())
def reduce_scatter(inp: torch.Tensor, op: str = "sum", group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: this rank's chunk (along dim 0) of the reduction of ``inp``."""
    out = inp.new_empty(dim0_scaled(inp, group_size(group), True, "reduce_scatter"))
    reduce_scatter_(out, inp, op, group, config)
    return out


def _a2a_shape(inp: torch.Tensor, output_split_sizes: list[int] | None) -> list[int]:
    if output_split_sizes is None:
        return list(inp.shape)
    return [sum(output_split_sizes), *inp.shape[1:]]


@torch.library.custom_op(f"{NAMESPACE}::all_to_all", mutates_args=())
def all_to_all(
    inp: torch.Tensor, output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None, group: str = "", config: str = "",
) -> torch.Tensor:  # fmt: skip
    """A new tensor: the chunks every rank sent this one (``inp``'s shape without
    ``output_split_sizes``, else ``sum(output_split_sizes)`` rows of ``inp``'s)."""
    out = inp.new_empty(_a2a_shape(inp, output_split_sizes))
    all_to_all_(out, inp, output_split_sizes, input_split_sizes, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::broadcast", mutates_args=())
def broadcast(tensor: torch.Tensor, src: int, group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: rank ``src``'s ``tensor`` on every rank."""
    out = tensor.clone(memory_format=torch.contiguous_format)
    broadcast_(out, src, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::reduce", mutates_args=())
def reduce(inp: torch.Tensor, dst: int, op: str = "sum", group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: the reduction on rank ``dst``; uninitialised on the other ranks."""
    out = torch.empty_like(inp, memory_format=torch.contiguous_format)
    reduce_(out, inp, dst, op, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::gather", mutates_args=())
def gather(inp: torch.Tensor, dst: int, group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: every rank's ``inp`` concatenated along dim 0 on rank ``dst``;
    uninitialised on the other ranks (same shape everywhere)."""
    out = inp.new_empty(dim0_scaled(inp, group_size(group), False, "gather"))
    gather_(out, inp, dst, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::scatter", mutates_args=())
def scatter(inp: torch.Tensor, src: int, group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: chunk ``i`` (along dim 0) of rank ``src``'s ``inp`` on the group's
    ``i``-th rank. Every rank passes an ``inp`` of the same shape (read on ``src`` only)."""
    out = inp.new_empty(dim0_scaled(inp, group_size(group), True, "scatter"))
    scatter_(out, inp, src, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::recv", mutates_args=())
def recv(tensor: torch.Tensor, src: int, group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor shaped like ``tensor``: the next message from global rank ``src``."""

    out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    run_recv(out, src, group=resolve_group(group), config=_cfg(config))
    return out


# --------------------------------------------------------------------------- fake implementations


def _nothing(*args, **kwargs) -> None:
    return None


for _op in (all_reduce_, all_gather_, reduce_scatter_, all_to_all_, broadcast_, reduce_, gather_, scatter_):
    _op.register_fake(_nothing)
barrier.register_fake(_nothing)
send.register_fake(_nothing)


#: Ops that run in program order: ordered effects thread one token through their calls.
#: torch does not order mutating ops by effects, so these are the functional forms (and
#: ``barrier`` and ``send``), the ones the public functions call under torch.compile.
ORDERED = (
    all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter, recv, barrier,
    send,
)  # fmt: skip
MUTATING = (all_reduce_, all_gather_, reduce_scatter_, all_to_all_, broadcast_, reduce_, gather_, scatter_)

keep_in_order(*ORDERED)
keep_in_order(*MUTATING, ordered=False)


@all_reduce.register_fake
def _(inp, op="sum", group="", config=""):
    return torch.empty_like(inp, memory_format=torch.contiguous_format)


@all_gather.register_fake
def _(inp, group="", config=""):
    return inp.new_empty(dim0_scaled(inp, group_size(group), False, "all_gather"))


@reduce_scatter.register_fake
def _(inp, op="sum", group="", config=""):
    return inp.new_empty(dim0_scaled(inp, group_size(group), True, "reduce_scatter"))


@all_to_all.register_fake
def _(inp, output_split_sizes=None, input_split_sizes=None, group="", config=""):
    return inp.new_empty(_a2a_shape(inp, output_split_sizes))


@broadcast.register_fake
def _(tensor, src, group="", config=""):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


@reduce.register_fake
def _(inp, dst, op="sum", group="", config=""):
    return torch.empty_like(inp, memory_format=torch.contiguous_format)


@gather.register_fake
def _(inp, dst, group="", config=""):
    return inp.new_empty(dim0_scaled(inp, group_size(group), False, "gather"))


@scatter.register_fake
def _(inp, src, group="", config=""):
    return inp.new_empty(dim0_scaled(inp, group_size(group), True, "scatter"))


@recv.register_fake
def _(tensor, src, group="", config=""):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------- compiled forms
# Each takes the public call's arguments (parameter name -> value) and runs the functional op
# on flat views, copying its result into the caller's output.


def _keys(args: dict) -> tuple[str, str]:
    """The custom ops' ``group`` and ``config`` strings of a call."""
    return group_name(args["group"]), encode_config(args["config"])


@entry.compiled_form("all_reduce")
def _(args: dict) -> None:
    out, inp = args["out"], args["inp"]
    out.copy_(torch.ops.iris.all_reduce(inp, op_name(args["op"]), *_keys(args)).view(out.shape))


@entry.compiled_form("all_gather")
def _(args: dict) -> None:
    out, inp = args["out"], args["inp"]
    out.copy_(torch.ops.iris.all_gather(inp.reshape(-1), *_keys(args)).view(out.shape))


@entry.compiled_form("reduce_scatter")
def _(args: dict) -> None:
    out, inp = args["out"], args["inp"]
    out.copy_(
        torch.ops.iris.reduce_scatter(inp.reshape(-1), op_name(args["op"]), *_keys(args)).view(out.shape)
    )


@entry.compiled_form("all_to_all")
def _(args: dict) -> None:
    out, inp = args["out"], args["inp"]
    out_splits, in_splits = args["output_split_sizes"], args["input_split_sizes"]
    if out_splits is None and in_splits is None:
        out.copy_(torch.ops.iris.all_to_all(inp.reshape(-1), None, None, *_keys(args)).view(out.shape))
        return
    if out_splits is None:  # equal splits of out's rows
        size = dist.get_world_size(args["group"])
        out_splits = [out.shape[0] // size] * size
    out.copy_(torch.ops.iris.all_to_all(inp, out_splits, in_splits, *_keys(args)))


@entry.compiled_form("broadcast")
def _(args: dict) -> None:
    tensor = args["tensor"]
    tensor.copy_(torch.ops.iris.broadcast(tensor, args["src"], *_keys(args)))


@entry.compiled_form("reduce")
def _(args: dict) -> None:
    out, dst = args["out"], args["dst"]
    result = torch.ops.iris.reduce(args["inp"].reshape(-1), dst, op_name(args["op"]), *_keys(args))
    if out is not None and dist.get_rank() == dst:  # the other ranks' out is left alone
        out.copy_(result.view(out.shape))


@entry.compiled_form("gather")
def _(args: dict) -> None:
    out, dst = args["out"], args["dst"]
    result = torch.ops.iris.gather(args["inp"].reshape(-1), dst, *_keys(args))
    if out is not None and dist.get_rank() == dst:  # the other ranks' out is left alone
        out.copy_(result.view(out.shape))


@entry.compiled_form("scatter")
def _(args: dict) -> None:
    out, inp = args["out"], args["inp"]
    if inp is None:  # read on the source only: any tensor of the size does elsewhere
        inp = out.new_empty((dist.get_world_size(args["group"]) * out.numel(),))
    out.copy_(torch.ops.iris.scatter(inp.reshape(-1), args["src"], *_keys(args)).view(out.shape))


@entry.compiled_form("barrier")
def _(args: dict) -> None:
    torch.ops.iris.barrier(*_keys(args))


@entry.compiled_form("send")
def _(args: dict) -> None:
    torch.ops.iris.send(args["tensor"], args["dst"], *_keys(args))


@entry.compiled_form("recv")
def _(args: dict) -> None:
    tensor = args["tensor"]
    tensor.copy_(torch.ops.iris.recv(tensor, args["src"], *_keys(args)))
