"""iris.ccl's collectives as ``torch.library`` custom ops (``torch.ops.iris.*``).

``torch.compile`` cannot trace into a collective (host-side planning, Triton launches,
heap bookkeeping), so each public collective is also an opaque custom op with a fake
(meta) implementation. The public functions call these ops when
``torch.compiler.is_compiling()`` and run as before otherwise, so eager calls pay nothing.

Two forms of each collective:

* **mutating**, named with a trailing underscore (``torch.ops.iris.all_reduce_(out, inp,
  ...)``): writes the caller's output (declared in ``mutates_args``) and returns nothing;
  what the public functions call under ``torch.compile``;
* **functional** (``torch.ops.iris.all_reduce(inp, ...)``): returns a new tensor.

Arguments a custom op cannot take as Python objects are passed as primitives:

* ``group``: the process group's ``group_name`` (``""``: the default group), resolved in
  the op with ``torch.distributed``'s registry of group names;
* ``op``: the reduction's name (``"sum"``, ``"avg"``, ``"max"``, ``"min"``);
* ``config``: :func:`encode_config` of the :class:`~iris.ccl.Config` (``""``: None), every
  field as ``name=repr(value)`` joined by ``;``, turned back into the same object by
  :func:`decode_config`.

``barrier`` and ``send`` return nothing and mutate nothing, so they are registered as
ordered side effects (compiled graphs keep them, in program order); so is ``recv``
(functional form; the public ``recv`` copies its result into the caller's tensor).
"""

from __future__ import annotations

import ast
import dataclasses

import torch
import torch.distributed as dist

from .config import Config
from .reduce_op import ReduceOp

NAMESPACE = "iris"


# --------------------------------------------------------------------------- argument mapping


def group_name(group) -> str:
    """The string a custom op takes for ``group``: its ``group_name``, ``""`` for None."""
    return "" if group is None else group.group_name


def resolve_group(name: str):
    """The process group a custom op's ``group`` string names (None for ``""``)."""
    if not name:
        return None
    return dist.distributed_c10d._resolve_process_group(name)


def group_size(name: str) -> int:
    """The size of the group ``name``; sets the world up first where torch.distributed is
    not initialised (as the first iris.ccl call does, :func:`iris.ccl._entry.ensure_world`)."""
    if not dist.is_initialized():
        from ._entry import ensure_world

        ensure_world()
    return dist.get_world_size(resolve_group(name))


def op_name(op) -> str:
    """The string a custom op takes for a reduction (``ReduceOp``, a name, or
    torch.distributed's ``ReduceOp``)."""
    if isinstance(op, ReduceOp):
        return op.value
    if isinstance(op, str):
        return op
    return str(op)  # torch.distributed.ReduceOp: ReduceOp.parse reads its last part


def encode_config(config, cls=Config) -> str:
    """``config`` (a ``cls`` dataclass or None) as a string a custom op can take."""
    if config is None:
        return ""
    if not isinstance(config, cls):
        raise TypeError(
            f"config must be an {cls.__module__}.{cls.__name__} or None, got {type(config).__name__}"
        )
    return ";".join(f"{name}={getattr(config, name)!r}" for name in _fields(cls))


def decode_config(key: str, cls=Config):
    """The ``cls`` object :func:`encode_config` made ``key`` from (None for ``""``)."""
    if not key:
        return None
    fields = {}
    for item in key.split(";"):
        name, _, value = item.partition("=")
        fields[name] = ast.literal_eval(value)
    return cls(**fields)


#: Field names of each config class (filled at import: torch.compile does not trace
#: ``dataclasses.fields``).
_FIELDS: dict = {}


def register_config(cls) -> None:
    """Make ``cls`` (a dataclass of primitive fields) usable with :func:`encode_config`."""
    _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))


def _fields(cls) -> tuple[str, ...]:
    return _FIELDS[cls]


register_config(Config)


def no_async(name: str, async_op: bool) -> None:
    """Under torch.compile a collective runs in the compiled graph's order: no handle."""
    if async_op:
        raise RuntimeError(
            f"{name}(async_op=True) is not supported inside torch.compile: the compiled graph runs "
            "the collective in order on the current stream; call it with async_op=False there"
        )


def _rows(inp: torch.Tensor, factor: int, divide: bool, what: str) -> list[int]:
    """``inp``'s shape with dim 0 multiplied (or divided) by ``factor`` (0-d: ``[factor]``)."""
    shape = list(inp.shape) or [1]
    if divide:
        if shape[0] % factor:
            raise ValueError(f"{what}: dim 0 of inp ({shape[0]}) is not divisible by the group size {factor}")
        shape[0] //= factor
    else:
        shape[0] *= factor
    return shape


def _cfg(config: str) -> Config | None:
    return decode_config(config, Config)


# --------------------------------------------------------------------------- mutating forms


@torch.library.custom_op(f"{NAMESPACE}::all_reduce_", mutates_args=("out",))
def all_reduce_(
    out: torch.Tensor, inp: torch.Tensor, op: str = "sum", group: str = "", config: str = ""
) -> None:
    """``iris.ccl.all_reduce(out, inp)``."""
    from .all_reduce import all_reduce

    all_reduce(out, inp, op=op, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::all_gather_", mutates_args=("out",))
def all_gather_(out: torch.Tensor, inp: torch.Tensor, group: str = "", config: str = "") -> None:
    """``iris.ccl.all_gather(out, inp)``."""
    from .all_gather import all_gather

    all_gather(out, inp, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::reduce_scatter_", mutates_args=("out",))
def reduce_scatter_(
    out: torch.Tensor, inp: torch.Tensor, op: str = "sum", group: str = "", config: str = ""
) -> None:
    """``iris.ccl.reduce_scatter(out, inp)``."""
    from .reduce_scatter import reduce_scatter

    reduce_scatter(out, inp, op=op, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::all_to_all_", mutates_args=("out",))
def all_to_all_(
    out: torch.Tensor, inp: torch.Tensor, output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None, group: str = "", config: str = "",
) -> None:  # fmt: skip
    """``iris.ccl.all_to_all(out, inp, output_split_sizes, input_split_sizes)``."""
    from .all_to_all import all_to_all

    all_to_all(
        out, inp, output_split_sizes, input_split_sizes, group=resolve_group(group), config=_cfg(config)
    )


@torch.library.custom_op(f"{NAMESPACE}::broadcast_", mutates_args=("tensor",))
def broadcast_(tensor: torch.Tensor, src: int, group: str = "", config: str = "") -> None:
    """``iris.ccl.broadcast(tensor, src)``."""
    from .broadcast import broadcast

    broadcast(tensor, src, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::reduce_", mutates_args=("out",))
def reduce_(
    out: torch.Tensor | None, inp: torch.Tensor, dst: int, op: str = "sum", group: str = "", config: str = ""
) -> None:
    """``iris.ccl.reduce(out, inp, dst)``."""
    from .reduce import reduce

    reduce(out, inp, dst, op=op, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::gather_", mutates_args=("out",))
def gather_(out: torch.Tensor | None, inp: torch.Tensor, dst: int, group: str = "", config: str = "") -> None:
    """``iris.ccl.gather(out, inp, dst)``."""
    from .gather import gather

    gather(out, inp, dst, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::scatter_", mutates_args=("out",))
def scatter_(
    out: torch.Tensor, inp: torch.Tensor | None, src: int, group: str = "", config: str = ""
) -> None:
    """``iris.ccl.scatter(out, inp, src)``."""
    from .scatter import scatter

    scatter(out, inp, src, group=resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::barrier", mutates_args=())
def barrier(group: str = "", config: str = "") -> None:
    """``iris.ccl.barrier()``."""
    from .barrier import barrier as _barrier

    _barrier(resolve_group(group), config=_cfg(config))


@torch.library.custom_op(f"{NAMESPACE}::send", mutates_args=())
def send(tensor: torch.Tensor, dst: int, group: str = "", config: str = "") -> None:
    """``iris.ccl.send(tensor, dst)``."""
    from .p2p import send as _send

    _send(tensor, dst, group=resolve_group(group), config=_cfg(config))


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
    out = inp.new_empty(_rows(inp, group_size(group), False, "all_gather"))
    all_gather_(out, inp, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::reduce_scatter", mutates_args=())
def reduce_scatter(inp: torch.Tensor, op: str = "sum", group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: this rank's chunk (along dim 0) of the reduction of ``inp``."""
    out = inp.new_empty(_rows(inp, group_size(group), True, "reduce_scatter"))
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
    out = inp.new_empty(_rows(inp, group_size(group), False, "gather"))
    gather_(out, inp, dst, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::scatter", mutates_args=())
def scatter(inp: torch.Tensor, src: int, group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor: chunk ``i`` (along dim 0) of rank ``src``'s ``inp`` on the group's
    ``i``-th rank. Every rank passes an ``inp`` of the same shape (read on ``src`` only)."""
    out = inp.new_empty(_rows(inp, group_size(group), True, "scatter"))
    scatter_(out, inp, src, group, config)
    return out


@torch.library.custom_op(f"{NAMESPACE}::recv", mutates_args=())
def recv(tensor: torch.Tensor, src: int, group: str = "", config: str = "") -> torch.Tensor:
    """A new tensor shaped like ``tensor``: the next message from global rank ``src``."""
    from .p2p import recv as _recv

    out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    _recv(out, src, group=resolve_group(group), config=_cfg(config))
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

# Every rank must run the same collectives in the same order, or its peers wait for it. A
# compiled graph may drop an op whose result is unused on this rank (a reduce's output off
# the root, say), and the ranks' graphs differ where they use the rank, so their schedulers
# could order independent ops differently: every op is marked side-effectful (never
# dropped) and the ordered ones carry an effect token (never reordered).
for _op in ORDERED:
    _op.register_effect(torch.library.EffectType.ORDERED)
for _op in ORDERED + MUTATING:
    torch.fx.node.has_side_effect(_op._opoverload)


@all_reduce.register_fake
def _(inp, op="sum", group="", config=""):
    return torch.empty_like(inp, memory_format=torch.contiguous_format)


@all_gather.register_fake
def _(inp, group="", config=""):
    return inp.new_empty(_rows(inp, group_size(group), False, "all_gather"))


@reduce_scatter.register_fake
def _(inp, op="sum", group="", config=""):
    return inp.new_empty(_rows(inp, group_size(group), True, "reduce_scatter"))


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
    return inp.new_empty(_rows(inp, group_size(group), False, "gather"))


@scatter.register_fake
def _(inp, src, group="", config=""):
    return inp.new_empty(_rows(inp, group_size(group), True, "scatter"))


@recv.register_fake
def _(tensor, src, group="", config=""):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------- what the public functions call


def compiled(name: str, *args, op=None, group=None, config=None, async_op: bool = False):
    """The call the public ``iris.ccl.<name>`` makes under torch.compile, with its
    positional ``args``: the functional op (ordered, see :data:`ORDERED`) on flat views,
    its result copied into the caller's output. Returns None (no handle: see
    :func:`no_async`)."""
    no_async(name, async_op)
    iris = torch.ops.iris
    gname, key = group_name(group), encode_config(config)
    if op is not None:
        op = op_name(op)
    if name == "all_reduce":
        out, inp = args
        out.copy_(iris.all_reduce(inp, op, gname, key).view(out.shape))
    elif name == "all_gather":
        out, inp = args
        out.copy_(iris.all_gather(inp.reshape(-1), gname, key).view(out.shape))
    elif name == "reduce_scatter":
        out, inp = args
        out.copy_(iris.reduce_scatter(inp.reshape(-1), op, gname, key).view(out.shape))
    elif name == "all_to_all":
        out, inp, out_splits, in_splits = args
        if out_splits is None and in_splits is None:
            out.copy_(iris.all_to_all(inp.reshape(-1), None, None, gname, key).view(out.shape))
        else:
            if out_splits is None:  # equal splits of out's rows
                size = dist.get_world_size(group)
                out_splits = [out.shape[0] // size] * size
            out.copy_(iris.all_to_all(inp, out_splits, in_splits, gname, key))
    elif name == "broadcast":
        tensor, src = args
        tensor.copy_(iris.broadcast(tensor, src, gname, key))
    elif name in ("reduce", "gather"):
        out, inp, dst = args
        flat = inp.reshape(-1)
        result = (
            iris.reduce(flat, dst, op, gname, key) if name == "reduce" else iris.gather(flat, dst, gname, key)
        )
        if out is not None and dist.get_rank() == dst:  # the other ranks' out is left alone
            out.copy_(result.view(out.shape))
    elif name == "scatter":
        out, inp, src = args
        if inp is None:  # read on the source only: any tensor of the size does elsewhere
            inp = out.new_empty((dist.get_world_size(group) * out.numel(),))
        out.copy_(iris.scatter(inp.reshape(-1), src, gname, key).view(out.shape))
    elif name == "barrier":
        iris.barrier(gname, key)
    elif name == "send":
        tensor, dst = args
        iris.send(tensor, dst, gname, key)
    else:  # recv
        tensor, src = args
        tensor.copy_(iris.recv(tensor, src, gname, key))
    return None
