"""The ``iris`` torch.distributed backend: torch.distributed calls, functional collectives
and DTensor running on iris.ccl.

``import iris.ccl`` registers a torch.distributed backend named ``iris`` for ``cpu`` and
``cuda`` devices, so ``dist.new_group(ranks, backend="iris")`` and
``dist.init_process_group("cpu:gloo,cuda:iris")`` make groups whose collectives
(``dist.all_reduce``, ``all_gather``, ``reduce_scatter_tensor``, ``all_to_all_single``, ...)
run on iris.ccl, synchronously or with ``async_op=True``. Such a group is an
:class:`IrisProcessGroup`; it has a name, so functional collectives
(``torch.distributed._functional_collectives``), ``torch.compile`` over them, and DTensor on a
``DeviceMesh`` of the group reach it too.

Which tensors run on Iris: those on Iris's device (:func:`iris.mem.default_device`: the GPU,
or the CPU under the ``cpu`` backend) when the group's backend for that device type is
``iris``. Other tensors (CPU tensors of a GPU job, for example those of
``dist.all_gather_object``), and every device a ``"cpu:gloo,cuda:iris"`` group maps to
gloo, go through the group's gloo group (:attr:`IrisProcessGroup.host_group`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import iris.mem
from iris.mem import settings as _mem_settings

from . import _comm, _dtypes
from .reduce_op import ReduceOp
from .work import Work

#: The backend's name, as given to ``dist.new_group(backend=...)``.
BACKEND_NAME = "iris"

#: dtypes iris.ccl's kernels reduce; iris.ccl reduces the others it accepts through its
#: conversion path (:mod:`iris.ccl._dtypes`), exactly, in their own dtype.
_REDUCED = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)
_FP8 = tuple(d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d)

_SUPPORTED_OPS = ("SUM", "AVG", "MAX", "MIN")


def _ccl():
    """The iris.ccl package, looked up at call time (so wrappers installed on its functions,
    for example by tests counting calls, are seen)."""
    return sys.modules["iris.ccl"]


def _wire(t: torch.Tensor) -> torch.Tensor:
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


def _op_name(op: Any, collective: str) -> str:
    """The iris.ccl reduction of a torch.distributed ``ReduceOp``, or a ValueError naming the
    operation and what to use."""
    kind = getattr(op, "op", op)
    name = getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]
    name = name.upper()
    if name in _SUPPORTED_OPS:
        return name
    hint = {
        "PREMUL_SUM": "scale the tensor first, then use ReduceOp.SUM",
        "PRODUCT": "use a gloo or nccl group for ReduceOp.PRODUCT",
    }.get(name, f"use a gloo or nccl group for ReduceOp.{name}")
    raise ValueError(
        f"dist.{collective} with ReduceOp.{name} is not supported by the iris backend (iris.ccl reduces "
        f"with SUM, AVG, MAX and MIN); {hint}"
    )


def _check_reduction(t: torch.Tensor, op: str, collective: str) -> None:
    """Raise, before anything is sent, for a reduction iris.ccl cannot make of a dtype its
    kernels do not reduce (float8, AVG of integers or bools, dtypes it cannot move or
    reduce), naming the torch.distributed call."""
    _wire(t)
    if t.dtype in _FP8:
        raise TypeError(
            f"dist.{collective} of {t.dtype}: float8 tensors are moved, not reduced (as with NCCL); "
            "upcast to bfloat16 or float16 to reduce them"
        )
    if op == "AVG" and not t.dtype.is_floating_point:
        raise ValueError(
            f"dist.{collective}: ReduceOp.AVG needs a floating-point dtype, got {t.dtype}; use SUM and divide"
        )
    if t.dtype not in _REDUCED:
        try:
            _dtypes.check_reduction(_iris_op(op), t.dtype, f"dist.{collective}")
        except TypeError as e:
            raise TypeError(f"{e}; or use a gloo group") from None


def _iris_op(op: str):
    return ReduceOp.parse(op)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A flat view of ``t``, or a flat copy when it is not contiguous."""
    return t.reshape(-1) if t.is_contiguous() else t.contiguous().view(-1)


class _IrisWork(Work):
    """The ``torch.distributed.Work`` of a collective of an :class:`IrisProcessGroup`: an
    :class:`iris.ccl.Work` (``wait()`` orders the current stream after the collective,
    ``get_future()`` is completed with the output tensors) whose ``wait()`` also blocks the
    host for a barrier (``blocking``)."""

    def __init__(self, result: list[torch.Tensor], device: torch.device, blocking: bool = False):
        super().__init__(device, result)
        self._blocking = blocking

    def wait(self, timeout: Any = None) -> bool:
        super().wait(timeout)
        if self._blocking and self._event is not None:
            self._event.synchronize()
        return True


class IrisProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on iris.ccl.

    Made by torch.distributed for ``backend="iris"`` (never directly): use it as the
    ``group`` of ``torch.distributed`` calls, of functional collectives, or as the group of a
    ``DeviceMesh``. Ranks passed to and returned by it are group ranks, as for every process
    group.

    Every group has a gloo group over the same ranks, :attr:`host_group`: iris.ccl's
    host-side work for this group (making its heap, host barriers, the argument checks of
    ``IRIS_DEBUG``) runs there, and so do the calls whose tensors are not on Iris's device.
    iris.ccl's communicators (sync flags, staging buffers, heap) for the group are those of
    :attr:`host_group`: one set per iris group.
    """

    def __init__(self, rank: int, size: int, global_ranks: Sequence[int], host_group: dist.ProcessGroup):
        super().__init__(rank, size)
        self._iris_rank = rank
        self._iris_size = size
        #: The group's global ranks, in group-rank order.
        self.global_ranks: list[int] = list(global_ranks)
        #: The gloo group over the same ranks (a regular torch.distributed group): iris.ccl's
        #: host-side work for this group, and the calls whose tensors are not on Iris's device.
        self.host_group: dist.ProcessGroup = host_group
        self._routes: dict[str, str] | None = None

    # ---- identity ------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name torch dispatches to
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"IrisProcessGroup(rank={self._iris_rank}, size={self._iris_size}, ranks={self.global_ranks})"

    # ---- routing -------------------------------------------------------------------------

    def _backend_for(self, device_type: str) -> str:
        """The backend this group's configuration names for ``device_type``."""
        if self._routes is None:
            routes = {}
            try:
                config = str(dist.get_backend_config(self))
            except (RuntimeError, ValueError, KeyError):
                config = ""
            for part in config.split(","):
                device, _, name = part.partition(":")
                if name:
                    routes[device.strip()] = name.strip().lower()
            self._routes = routes
        return self._routes.get(device_type, BACKEND_NAME)

    def _on_iris(self, device: torch.device) -> bool:
        """Whether tensors on ``device`` run on iris.ccl (else on :attr:`host_group`)."""
        return (
            device.type == _mem_settings.default_backend() and self._backend_for(device.type) == BACKEND_NAME
        )

    def _host(self, method: str, *args: Any) -> Any:
        """Run ``method`` of :attr:`host_group` (the same C++ call, on gloo)."""
        return getattr(self.host_group, method)(*args)

    def _global(self, group_rank: int, what: str) -> int:
        if not 0 <= group_rank < self._iris_size:
            raise ValueError(f"{what}: group rank {group_rank} is not in a group of {self._iris_size} ranks")
        return self.global_ranks[group_rank]

    def _work(self, result: list[torch.Tensor], device: torch.device, blocking: bool = False) -> _IrisWork:
        return _IrisWork(result, device, blocking)

    # ---- building blocks on iris.ccl -----------------------------------------------------

    def _all_reduce(self, t: torch.Tensor, op: str) -> None:
        # dtypes the kernels do not reduce: iris.ccl's conversion path (exact, in the dtype)
        if t.dtype not in _REDUCED:
            _check_reduction(t, op, "all_reduce")
        _ccl().all_reduce(t, t, op=op, group=self.host_group)

    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
        if inp.dtype not in _REDUCED:
            _check_reduction(inp, op, "reduce_scatter")
            size, m = self._iris_size, out.numel()
            if inp.numel() != size * m or out.dtype != inp.dtype:
                raise ValueError(
                    f"dist.reduce_scatter: the input holds {inp.numel()} {inp.dtype} elements, expected "
                    f"{size} x {m} {out.dtype} (the group size times the output's)"
                )
        _ccl().reduce_scatter(out, inp, op=op, group=self.host_group)

    def _all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        _ccl().all_gather(_wire(out), _wire(inp), group=self.host_group)

    # ---- collectives (the methods torch.distributed calls) -------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        if not self._on_iris(tensors[0].device):
            return self._host("allreduce", tensors, opts or dist.AllreduceOptions())
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "all_reduce")
        for t in tensors:
            self._all_reduce(t, op)
        return self._work(list(tensors), tensors[0].device)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        if not tensors or not self._on_iris(tensors[0].device):
            return self._host("allreduce_coalesced", tensors, opts or dist.AllreduceCoalescedOptions())
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "all_reduce")
        for t in tensors:
            self._all_reduce(t, op)
        return self._work(list(tensors), tensors[0].device)

    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ):
        inp = input_tensors[0]
        if not self._on_iris(inp.device):
            return self._host("allgather", output_tensors, input_tensors, opts or dist.AllgatherOptions())
        for outs, x in zip(output_tensors, input_tensors):
            self._gather_list(outs, x, "all_gather")
            flat = torch.empty(self._iris_size * x.numel(), dtype=x.dtype, device=x.device)
            self._all_gather(flat, x)
            self._unpack(flat, outs)
        return self._work([t for outs in output_tensors for t in outs], inp.device)

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts=None
    ):
        if not input_list or not self._on_iris(input_list[0].device):
            return self._host(
                "allgather_coalesced", output_lists, input_list, opts or dist.AllgatherOptions()
            )
        return self.allgather(output_lists, input_list, opts)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> dist.Work:
        if not self._on_iris(inp.device):
            return self._host("all_gather_single", output, inp, opts or dist.AllgatherOptions())
        self._all_gather(output, inp)
        return self._work([output], inp.device)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts=None):
        if not inputs or not self._on_iris(inputs[0].device):
            return self._host("all_gather_single_coalesced", outputs, inputs, opts or dist.AllgatherOptions())
        for out, x in zip(outputs, inputs):
            self._all_gather(out, x)
        return self._work(list(outputs), inputs[0].device)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts=None
    ):
        out = output_tensors[0]
        if not self._on_iris(out.device):
            return self._host(
                "reduce_scatter", output_tensors, input_tensors, opts or dist.ReduceScatterOptions()
            )
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter")
        for o, ins in zip(output_tensors, input_tensors):
            self._gather_list(ins, o, "reduce_scatter")
            self._reduce_scatter(o, torch.cat([_flat(t) for t in ins]), op)
        return self._work(list(output_tensors), out.device)

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> dist.Work:
        if not self._on_iris(inp.device):
            return self._host("reduce_scatter_single", output, inp, opts or dist.ReduceScatterOptions())
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter_tensor")
        self._reduce_scatter(output, inp, op)
        return self._work([output], inp.device)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts=None
    ):
        if not inputs or not self._on_iris(inputs[0].device):
            return self._host(
                "reduce_scatter_single_coalesced", outputs, inputs, opts or dist.ReduceScatterOptions()
            )
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter_tensor")
        for out, x in zip(outputs, inputs):
            self._reduce_scatter(out, x, op)
        return self._work(list(outputs), inputs[0].device)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(
        self, output: torch.Tensor, inp: torch.Tensor, output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int], opts: Any = None,
    ) -> dist.Work:  # fmt: skip
        if not self._on_iris(inp.device):
            return self._host(
                "all_to_all_single", output, inp, output_split_sizes, input_split_sizes,
                opts or dist.AllToAllOptions(),
            )  # fmt: skip
        out_rows = list(output_split_sizes) or None
        in_rows = list(input_split_sizes) or None
        if out_rows is None and in_rows is None:
            for name, t in (("input", inp), ("output", output)):
                if t.dim() == 0 or t.shape[0] % self._iris_size:
                    raise ValueError(
                        f"dist.all_to_all_single: the {name} has shape {list(t.shape)}, whose dim 0 the "
                        f"group of {self._iris_size} ranks does not split evenly; pass split sizes"
                    )
            _ccl().all_to_all(_wire(output), _wire(inp), group=self.host_group)
        else:
            _ccl().all_to_all(_wire(output), _wire(inp), out_rows, in_rows, group=self.host_group)
        return self._work([output], inp.device)

    alltoall_base = all_to_all_single

    def alltoall(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None
    ):
        if not self._on_iris(input_tensors[0].device):
            return self._host("alltoall", output_tensors, input_tensors, opts or dist.AllToAllOptions())
        size = self._iris_size
        if len(input_tensors) != size or len(output_tensors) != size:
            raise ValueError(
                f"dist.all_to_all: pass {size} input and {size} output tensors (one per rank of the group), "
                f"got {len(input_tensors)} and {len(output_tensors)}"
            )
        dtypes = {t.dtype for t in (*input_tensors, *output_tensors)}
        if len(dtypes) != 1:
            raise TypeError(
                f"dist.all_to_all: every tensor must have the same dtype, got {sorted(map(str, dtypes))}"
            )
        inp = torch.cat([_flat(t) for t in input_tensors])
        out = torch.empty(sum(t.numel() for t in output_tensors), dtype=inp.dtype, device=inp.device)
        in_rows = [t.numel() for t in input_tensors]
        out_rows = [t.numel() for t in output_tensors]
        _ccl().all_to_all(_wire(out), _wire(inp), out_rows, in_rows, group=self.host_group)
        self._unpack(out, output_tensors)
        return self._work(list(output_tensors), inp.device)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        if not self._on_iris(tensors[0].device):
            return self._host("broadcast", tensors, opts or dist.BroadcastOptions())
        root = self._global(opts.rootRank if opts is not None else 0, "dist.broadcast")
        for t in tensors:
            _ccl().broadcast(_wire(t), root, group=self.host_group)
        return self._work(list(tensors), tensors[0].device)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        t = tensors[0]
        if not self._on_iris(t.device):
            return self._host("reduce", tensors, opts or dist.ReduceOptions())
        op = _op_name(opts.reduceOp, "reduce")
        root = self._global(opts.rootRank, "dist.reduce")
        if t.dtype not in _REDUCED:
            _check_reduction(t, op, "reduce")
        _ccl().reduce(t, t, root, op=op, group=self.host_group)
        return self._work([t], t.device)

    def gather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ):
        inp = input_tensors[0]
        if not self._on_iris(inp.device):
            return self._host("gather", output_tensors, input_tensors, opts or dist.GatherOptions())
        root = self._global(opts.rootRank, "dist.gather")
        is_root = dist.get_rank() == root
        flat = None
        if is_root:
            self._gather_list(output_tensors[0], inp, "gather")
            flat = torch.empty(self._iris_size * inp.numel(), dtype=inp.dtype, device=inp.device)
        _ccl().gather(_wire(flat) if is_root else None, _wire(inp), root, group=self.host_group)
        if is_root:
            self._unpack(flat, output_tensors[0])
        return self._work(output_tensors[0] if is_root else [], inp.device)

    def scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ):
        out = output_tensors[0]
        if not self._on_iris(out.device):
            return self._host("scatter", output_tensors, input_tensors, opts or dist.ScatterOptions())
        root = self._global(opts.rootRank, "dist.scatter")
        flat = None
        if dist.get_rank() == root:
            self._gather_list(input_tensors[0], out, "scatter")
            flat = torch.cat([_flat(t) for t in input_tensors[0]])
        _ccl().scatter(_wire(out), None if flat is None else _wire(flat), root, group=self.host_group)
        return self._work([out], out.device)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        t = tensors[0]
        if not self._on_iris(t.device):
            return self._host("send", tensors, dst, tag)
        self._check_p2p("send", tag)
        _ccl().send(_wire(t), self._global(dst, "dist.send"), group=self.host_group)
        return self._work([t], t.device)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        t = tensors[0]
        if not self._on_iris(t.device):
            return self._host("recv", tensors, src, tag)
        self._check_p2p("recv", tag)
        _ccl().recv(_wire(t), self._global(src, "dist.recv"), group=self.host_group)
        return self._work([t], t.device)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        raise NotImplementedError(
            "dist.recv without src (from any rank) is not supported by the iris backend: iris.ccl matches "
            "messages per sender; pass src"
        )

    def barrier(self, opts: Any = None) -> dist.Work:
        device = iris.mem.default_device()
        if not self._on_iris(device):
            return self._host("barrier", opts or dist.BarrierOptions())
        _ccl().barrier(group=self.host_group)
        return self._work([], device, blocking=True)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        raise NotImplementedError(
            "dist.monitored_barrier is not supported by the iris backend (it is gloo's); use dist.barrier "
            "on the iris group, or monitored_barrier on its gloo group (IrisProcessGroup.host_group)"
        )

    def start_coalescing(self, device: Any = None) -> None:
        """Coalesced calls run one by one as they are issued: nothing to start."""

    def end_coalescing(self, device: Any = None) -> dist.Work:
        return self._work([], torch.device(device) if device is not None else torch.device("cpu"))

    # torch.distributed calls these from Python (the C++ ones would reach the gloo backend
    # that carries the group's name)
    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # ---- helpers -------------------------------------------------------------------------

    def _gather_list(self, tensors: Sequence[torch.Tensor], like: torch.Tensor, collective: str) -> None:
        """``tensors`` holds one tensor per rank, each with ``like``'s element count and dtype."""
        size = self._iris_size
        if len(tensors) != size:
            raise ValueError(
                f"dist.{collective}: pass a list of {size} tensors (one per rank of the group), "
                f"got {len(tensors)}"
            )
        for i, t in enumerate(tensors):
            if t.numel() != like.numel() or t.dtype != like.dtype:
                raise ValueError(
                    f"dist.{collective}: tensor {i} of the list has {t.numel()} {t.dtype} elements, but the "
                    f"iris backend needs {like.numel()} {like.dtype} elements in each (tensors of different "
                    "sizes: pad them to one size)"
                )

    @staticmethod
    def _unpack(flat: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
        """Copy consecutive chunks of ``flat`` into ``outs``."""
        start = 0
        for o in outs:
            o.copy_(flat[start : start + o.numel()].view(o.shape))
            start += o.numel()

    def _check_p2p(self, what: str, tag: int) -> None:
        if tag:
            raise ValueError(
                f"dist.{what} with tag={tag}: the iris backend matches messages in call order per pair of "
                "ranks and has no tags; use tag=0"
            )
        # send/recv run on iris.ccl's own heap for the group, made collectively on first use:
        # beyond two ranks, some collective of the group must have made it already.
        if self._iris_size > 2 and not _has_own_heap(self.host_group):
            raise RuntimeError(
                f"dist.{what} on an iris group of {self._iris_size} ranks before any collective of the "
                "group: "
                "send/recv run on the group's Iris heap, which every rank makes together; call "
                "dist.barrier(group=group) on every rank of the group once before the first send/recv"
            )


def _has_own_heap(group: dist.ProcessGroup) -> bool:
    """Whether iris.ccl has made its own heap (the one send/recv use) for ``group``."""
    comm = _comm._communicators(group).get(None)
    return comm is not None and not comm.heap.closed


def _create(options: Any, pg_options: Any = None) -> IrisProcessGroup:
    """Make the process group of one ``backend="iris"`` group (torch.distributed's creator
    hook, extended form): the group, its gloo host group over the same ranks, and a gloo
    backend registered on it (which gives the group the name functional collectives and
    DTensor find it by)."""
    rank, size, timeout = options.group_rank, options.group_size, options.timeout
    given = list(options.global_ranks_in_group)
    ranks = given or list(range(size))
    name = f"{options.group_id}:iris-host"
    group_name = getattr(c10d, "GroupName", str)(name)
    # The host group is a regular gloo group of torch.distributed under a name and tag of
    # its own (never found in place of the iris group by rank lists).
    host, _ = c10d._new_process_group_helper(
        size, rank, given, "gloo", options.store, group_name, timeout=timeout, pg_tag=name,
        group_desc="gloo group of an iris group",
    )  # fmt: skip
    c10d._world.pg_group_ranks[host] = {g: i for i, g in enumerate(ranks)}
    pg = IrisProcessGroup(rank, size, ranks, host)
    carrier = dist.ProcessGroupGloo(dist.PrefixStore("iris-pg/", options.store), rank, size, timeout)
    for device in ("cpu", "cuda"):
        pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, carrier)
    return pg


def _register() -> None:
    """Register the ``iris`` backend with torch.distributed (once per process)."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


_register()

__all__ = ["BACKEND_NAME", "IrisProcessGroup"]
