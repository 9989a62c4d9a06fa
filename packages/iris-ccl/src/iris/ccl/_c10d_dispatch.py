"""The ``torch.ops.c10d`` ops of an ``iris`` group run on iris.ccl.

C++ reaches a process group in two ways. Virtual methods that torch's Python trampoline
forwards (``allreduce``, ``broadcast``, ``send``, ...) land in the group's Python methods.
The others (``all_gather_single`` behind ``torch.ops._c10d_functional.all_gather_into_tensor_out``
and inductor's FSDP passes, ``reduce_scatter_single``, ``reduce``, ``gather``, ``scatter``,
``alltoall``, ``allgather_coalesced``, ...), and any direct call of a ``torch.ops.c10d`` op,
go through the dispatcher to the kernel of the tensors' device, which hands the call to the
backend registered on the group for that device. An iris group registers a backend only
for its name (a call that reaches it raises), so those calls must not get there.

:func:`install` registers, for every ``c10d`` op that takes a process group, a kernel under
the ``BackendSelect`` dispatch key, which the dispatcher runs before the device's kernel for
any tensor: for an iris group and real tensors it calls the group's Python method with the
same arguments as torch's own kernel would give the backend, and returns its result (its
handle as a C++ ``Work`` over the handle's future); for every other group, and for fake or
meta tensors (tracing), it hands the call on to the device's kernel unchanged. Installed
when the first iris group is made, so processes that make none are untouched.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_C = torch._C._distributed_c10d
_K = torch._C.DispatchKey
#: Keys of tensors the iris group does not run: fake, meta (tracing) and Python subclasses.
_TRACING_KEYS = (_K.Python, _K.Meta)

_library: torch.library.Library | None = None


def _opts(cls: type, timeout: int = -1, **fields: Any) -> Any:
    """An options object of ``cls`` with ``fields`` and the op's timeout (ms; negative: unset)."""
    opts = cls()
    for name, value in fields.items():
        setattr(opts, name, value)
    if timeout >= 0:
        opts.timeout = datetime.timedelta(milliseconds=timeout)
    return opts


def _op(reduce_op: Any) -> dist.ReduceOp:
    """torch.distributed's ``ReduceOp`` of the op's boxed one (its type only: a PREMUL_SUM's
    factor does not travel through the dispatcher)."""
    return dist.ReduceOp(dist.ReduceOp.RedOpType(reduce_op.op()))


def _work(work: dist.Work) -> Any:
    """A C++ ``Work`` completed with ``work``'s future (the Python handle itself would not be
    kept alive by the C++ caller)."""
    return _C._create_work_from_future(work.get_future()).boxed()


# Each handler takes the group and the op's arguments by name (defaults filled in) and
# returns what the op returns, as torch's own kernel (Ops.cpp) does with the backend.
_HANDLERS: dict[str, Callable[..., Any]] = {
    "allreduce_": lambda pg, a: (
        a["tensors"],
        _work(
            pg.allreduce(a["tensors"], _opts(_C.AllreduceOptions, a["timeout"], reduceOp=_op(a["reduce_op"])))
        ),
    ),
    "allreduce_coalesced_": lambda pg, a: _work(
        pg.allreduce_coalesced(
            a["tensors"], _opts(_C.AllreduceCoalescedOptions, a["timeout"], reduceOp=_op(a["reduce_op"]))
        )
    ),
    "allgather_": lambda pg, a: (
        a["output_tensors"],
        _work(
            pg.allgather(a["output_tensors"], a["input_tensors"], _opts(_C.AllgatherOptions, a["timeout"]))
        ),
    ),
    "_allgather_base_": lambda pg, a: (
        a["output_tensor"],
        _work(
            pg.all_gather_single(
                a["output_tensor"], a["input_tensor"], _opts(_C.AllgatherOptions, a["timeout"])
            )
        ),
    ),
    "allgather_coalesced_": lambda pg, a: _work(
        pg.allgather_coalesced(a["output_lists"], a["input_list"], _opts(_C.AllgatherOptions))
    ),
    "allgather_into_tensor_coalesced_": lambda pg, a: _work(
        pg.all_gather_single_coalesced(a["outputs"], a["inputs"], _opts(_C.AllgatherOptions))
    ),
    "reduce_scatter_": lambda pg, a: (
        a["output_tensors"],
        _work(
            pg.reduce_scatter(
                a["output_tensors"],
                a["input_tensors"],
                _opts(_C.ReduceScatterOptions, a["timeout"], reduceOp=_op(a["reduce_op"])),
            )
        ),
    ),  # fmt: skip
    "_reduce_scatter_base_": lambda pg, a: (
        a["output_tensor"],
        _work(
            pg.reduce_scatter_single(
                a["output_tensor"],
                a["input_tensor"],
                _opts(_C.ReduceScatterOptions, a["timeout"], reduceOp=_op(a["reduce_op"])),
            )
        ),
    ),  # fmt: skip
    "reduce_scatter_tensor_coalesced_": lambda pg, a: _work(
        pg.reduce_scatter_single_coalesced(
            a["outputs"],
            a["inputs"],
            _opts(_C.ReduceScatterOptions, a["timeout"], reduceOp=_op(a["reduce_op"])),
        )
    ),
    "reduce_": lambda pg, a: _work(
        pg.reduce(
            a["tensors"],
            _opts(_C.ReduceOptions, a["timeout"], reduceOp=_op(a["reduce_op"]), rootRank=a["root_rank"]),
        )
    ),
    "broadcast_": lambda pg, a: (
        a["tensors"],
        _work(pg.broadcast(a["tensors"], _opts(_C.BroadcastOptions, a["timeout"], rootRank=a["root_rank"]))),
    ),
    "gather_": lambda pg, a: _work(
        pg.gather(
            a["output_tensors"],
            a["input_tensors"],
            _opts(_C.GatherOptions, a["timeout"], rootRank=a["root_rank"]),
        )
    ),
    "scatter_": lambda pg, a: (
        a["output_tensors"],
        _work(
            pg.scatter(
                a["output_tensors"],
                a["input_tensors"],
                _opts(_C.ScatterOptions, a["timeout"], rootRank=a["root_rank"]),
            )
        ),
    ),  # fmt: skip
    "alltoall_": lambda pg, a: (
        a["output_tensors"],
        _work(pg.alltoall(a["output_tensors"], a["input_tensors"], _opts(_C.AllToAllOptions, a["timeout"]))),
    ),
    "alltoall_base_": lambda pg, a: _work(
        pg.all_to_all_single(
            a["output"],
            a["input"],
            a["output_split_sizes"],
            a["input_split_sizes"],
            _opts(_C.AllToAllOptions, a["timeout"]),
        )
    ),  # fmt: skip
    "barrier": lambda pg, a: _work(
        pg.barrier(_opts(_C.BarrierOptions, a["timeout"], device_ids=a["device_ids"]))
    ),
    "send": lambda pg, a: _work(pg.send(a["tensors"], a["dst"], a["tag"])),
    "recv_": lambda pg, a: _work(pg.recv(a["tensors"], a["src"], a["tag"])),
    "recv_any_source_": lambda pg, a: _work(pg.recv_anysource(a["tensors"], a["tag"])),
    "monitored_barrier_": lambda pg, a: pg.monitored_barrier(),
}


def install(group_class: type) -> None:
    """Register the kernels (once per process): calls whose group is a ``group_class`` run
    its methods."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("c10d", "IMPL")
    for name, handler in _HANDLERS.items():
        op = getattr(torch.ops.c10d, name).default
        library.impl(name, _kernel(op, handler, group_class), "BackendSelect", with_keyset=True)
    _library = library


def _kernel(op: Any, handler: Callable[..., Any], group_class: type) -> Callable[..., Any]:
    arguments = op._schema.arguments
    names = [a.name for a in arguments]
    defaults = {a.name: a.default_value for a in arguments if a.has_default_value()}
    at = names.index("process_group")

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        group = _iris_group(args[at] if len(args) > at else kwargs.get("process_group"), group_class)
        if group is None or any(keyset.has(k) for k in _TRACING_KEYS):
            return op.redispatch(keyset.remove(_K.BackendSelect), *args, **kwargs)
        bound = {**defaults, **dict(zip(names, args)), **kwargs}
        return handler(group, bound)

    return kernel


def _iris_group(boxed: Any, group_class: type) -> Any:
    """The Python group of a boxed process group when it is a ``group_class``, else None."""
    if boxed is None:
        return None
    group = boxed if isinstance(boxed, dist.ProcessGroup) else dist.ProcessGroup.unbox(boxed)
    return group if isinstance(group, group_class) else None
