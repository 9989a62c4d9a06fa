"""The ``iris`` torch.distributed backend: torch.distributed calls, functional collectives
and DTensor running on iris.ccl.

``import iris.ccl`` registers a torch.distributed backend named ``iris`` for ``cpu`` and
``cuda`` devices, so ``dist.new_group(ranks, backend="iris")`` and
``dist.init_process_group("cpu:gloo,cuda:iris")`` make groups whose collectives
(``dist.all_reduce``, ``all_gather``, ``reduce_scatter_tensor``, ``all_to_all_single``, ...)
and point-to-point calls run on iris.ccl, synchronously or with ``async_op=True``. Such a
group is an :class:`IrisProcessGroup`; it has a name, so functional collectives
(``torch.distributed._functional_collectives``), ``torch.compile`` over them, and DTensor on
a ``DeviceMesh`` of the group reach it too, as do C++ callers (DDP's reducer, the
``torch.ops._c10d_functional`` and ``torch.ops.c10d`` ops: :mod:`iris.ccl._c10d_dispatch`).

Which tensors run on Iris: those on Iris's device (:func:`iris.mem.default_device`: the GPU,
or the CPU under the ``cpu`` backend) when the group's backend for that device type is
``iris``. Other tensors (CPU tensors of a GPU job, for example those of
``dist.all_gather_object``), and every device a ``"cpu:gloo,cuda:iris"`` group maps to
gloo, go through the group's gloo group (:attr:`IrisProcessGroup.host_group`).

Options: ``pg_options=ProcessGroupOptions(heap_size=..., config=...)`` sizes the group's heap
and sets the default :class:`~iris.ccl.Config` of its collectives. The group's ``timeout``
bounds its device-side waits (unless ``IRIS_WAIT_TIMEOUT`` is set) and its calls on CPU
tensors; Iris's own host exchanges over the group give up after ``IRIS_HOST_TIMEOUT`` (or the
group's timeout, if shorter).
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

import iris.mem
from iris.mem import settings as mem_settings

from . import _c10d_dispatch, _comm, _gloo, _pg_args, entry, p2p
from ._pg_args import ProcessGroupOptions, Reduction
from .reduce_op import ReduceOp
from .work import BarrierWork, Work, hidden_from_dynamo

#: The backend's name, as given to ``dist.new_group(backend=...)``.
BACKEND_NAME = "iris"

_C = torch._C._distributed_c10d


def _ccl():
    """The iris.ccl package, looked up at call time (so wrappers installed on its functions,
    for example by tests counting calls, are seen)."""
    return sys.modules["iris.ccl"]


@hidden_from_dynamo("_allgather_base", "_reduce_scatter_base", "_start_coalescing", "_end_coalescing")
class IrisProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives and point-to-point calls run on
    iris.ccl.

    Made by torch.distributed for ``backend="iris"`` (never directly): use it as the
    ``group`` of ``torch.distributed`` calls, of functional collectives, of iris.ccl's and
    iris.ops' functions, or as the group of a ``DeviceMesh``. Ranks passed to and returned
    by it are group ranks, as for every process group.

    Every group has one gloo group over the same ranks, :attr:`host_group`: iris.ccl's
    host-side work for this group (making its heaps, host barriers, the argument checks of
    ``IRIS_DEBUG``) runs there, and so do the calls whose tensors are not on Iris's device.
    iris.ccl keeps one communicator and heap for the group however it is called.

    Point-to-point: ``isend`` / ``irecv`` are queued and start together, when one of their
    handles is waited on (or its future asked for), at the next blocking ``send``/``recv`` or
    collective of the group, or at the end of a ``batch_isend_irecv`` or coalescing block;
    sends and receives started together complete whatever their sizes and pattern
    (:func:`iris.ccl.p2p.exchange`). Tags are accepted; messages between two ranks are
    matched in call order, as NCCL does. A receive from any source is refused (as by NCCL).

    Streams: on GPUs, the group's calls from different streams run one after another in
    call order (each waits for the group's previous call), as NCCL's communicator does.
    """

    def __init__(
        self, rank: int, size: int, global_ranks: Sequence[int], host_group: dist.ProcessGroup,
        timeout: datetime.timedelta, options: ProcessGroupOptions,
    ):  # fmt: skip
        super().__init__(rank, size)
        self._iris_rank = rank
        self._iris_size = size
        #: The group's global ranks, in group-rank order.
        self.global_ranks: list[int] = list(global_ranks)
        #: The gloo group over the same ranks (a regular torch.distributed group): iris.ccl's
        #: host-side work for this group, and the calls whose tensors are not on Iris's device.
        self.host_group: dist.ProcessGroup = host_group
        #: The group's options (``pg_options``).
        self.options = options
        self._timeout = timeout
        self._routes: dict[str, str] | None = None
        self._queued: list[tuple[p2p.Transfer, Work]] = []
        self._last: tuple[Any, Any] | None = None  # (stream, event) of the group's last GPU call

    # ---- identity ------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name torch dispatches to
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"IrisProcessGroup(rank={self._iris_rank}, size={self._iris_size}, ranks={self.global_ranks})"

    @property
    def heap(self) -> iris.mem.SymmetricHeap | None:
        """The group's own heap (once a collective staged through it), else None."""
        comm = _comm._communicators(self.host_group).get(None)
        return comm.heap if comm is not None else None

    # ---- routing -------------------------------------------------------------------------

    def _backend_for(self, device_type: str) -> str:
        """The backend this group's configuration names for ``device_type``."""
        if self._routes is None:
            routes = {}
            try:
                config = str(dist.get_backend_config(self))
            except (RuntimeError, ValueError, KeyError):
                return BACKEND_NAME  # not registered yet (being made)
            for part in config.split(","):
                device, _, name = part.partition(":")
                if name:
                    routes[device.strip()] = name.strip().lower()
            self._routes = routes
        return self._routes.get(device_type, BACKEND_NAME)

    def _on_iris(self, device: torch.device) -> bool:
        """Whether tensors on ``device`` run on iris.ccl (else on :attr:`host_group`)."""
        return (
            device.type == mem_settings.default_backend() and self._backend_for(device.type) == BACKEND_NAME
        )

    def _host(self, method: str, *args: Any) -> Any:
        """Run ``method`` of :attr:`host_group` (the same C++ call, on gloo), with this
        group's timeout where the options leave it unset."""
        self._start_queued()
        *rest, opts = args
        return getattr(self.host_group, method)(*rest, _pg_args.with_timeout(opts, self._timeout))

    def _global(self, group_rank: int, what: str) -> int:
        if not 0 <= group_rank < self._iris_size:
            raise ValueError(f"{what}: group rank {group_rank} is not in a group of {self._iris_size} ranks")
        return self.global_ranks[group_rank]

    # ---- running calls -------------------------------------------------------------------

    def _run(
        self, device: torch.device, outputs: Sequence[torch.Tensor], call: Callable[[], None],
        work: type[Work] = Work,
    ) -> Work:  # fmt: skip
        """Run ``call`` (the iris.ccl calls of one torch.distributed call) after the queued
        point-to-point calls, ordered after the group's previous call on any stream; an
        error the device reported (a timeout, a mismatch, an abort) becomes the Work's."""
        self._start_queued()
        error = None
        with self._in_order(device):
            try:
                call()
            except iris.mem.IrisError as e:
                error = e
        return work(device, outputs, error=error, check=self._checker(device))

    @contextlib.contextmanager
    def _in_order(self, device: torch.device) -> Iterator[None]:
        """On GPUs: the work queued inside waits for the group's previous call when that was
        queued on another stream (iris.ccl's state of a group serves one call at a time)."""
        caps = iris.mem.capabilities(device)
        if not caps.streams:
            yield
            return
        stream = torch.cuda.current_stream(caps.device)
        if self._last is not None and self._last[0] != stream:
            stream.wait_event(self._last[1])
        try:
            yield
        finally:
            event = torch.cuda.Event()
            event.record(stream)
            self._last = (stream, event)

    def _checker(self, device: torch.device) -> Callable[[], None] | None:
        """What a handle calls to learn the device-side errors of its call: on GPUs (where
        kernels only record them), :meth:`_device_errors`; None where a call raises them."""
        return self._device_errors if iris.mem.capabilities(device).streams else None

    def _device_errors(self) -> None:
        """Raise the first error a kernel of this group recorded on the device."""
        for comm in list(_comm._communicators(self.host_group).values()):
            if not comm.heap.closed:
                comm.check()

    def _start_queued(self, timeout: float | None = None) -> None:
        """Start the queued isend/irecv calls, together (see the class)."""
        if not self._queued:
            return
        batch, self._queued = self._queued, []
        device = batch[0][0].tensor.device
        error: BaseException | None = None
        try:
            with self._in_order(device):
                p2p.exchange([t for t, _ in batch], self.host_group, self.options.config, timeout)
        except iris.mem.IrisError as e:
            error = e
        except BaseException as e:
            for _, work in batch:
                work.finish(e)
            raise
        for _, work in batch:
            work.finish(error)

    # ---- reductions ----------------------------------------------------------------------

    def _reduction(self, opts: Any, tensors: Sequence[torch.Tensor], collective: str) -> Reduction:
        red = _pg_args.reduction(opts.reduceOp, collective)
        for t in tensors:
            if t.dtype not in _pg_args.REDUCED or red.factor is not None or red.op is not ReduceOp.SUM:
                _pg_args.check_reduction(t, red, collective)
        return red

    def _all_reduce(self, t: torch.Tensor, red: Reduction) -> None:
        if red.factor is not None:  # PREMUL_SUM: t is both input and output
            t.copy_(red.scaled(t))
        _ccl().all_reduce(t, t, op=red.op, group=self.host_group, config=self.options.config)

    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, red: Reduction) -> None:
        size, m = self._iris_size, out.numel()
        if inp.numel() != size * m or out.dtype != inp.dtype:
            raise ValueError(
                f"dist.reduce_scatter: the input holds {inp.numel()} {inp.dtype} elements, expected "
                f"{size} x {m} {out.dtype} (the group size times the output's)"
            )
        _ccl().reduce_scatter(
            out, red.scaled(inp), op=red.op, group=self.host_group, config=self.options.config
        )

    def _all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        _ccl().all_gather(
            _pg_args.wire(out), _pg_args.wire(inp), group=self.host_group, config=self.options.config
        )

    # ---- collectives (the methods torch.distributed calls) -------------------------------

    def allreduce(self, tensors, opts=None, timeout=None) -> dist.Work:
        tensors, opts = _pg_args.allreduce(tensors, opts, timeout)
        if not self._on_iris(tensors[0].device):
            return self._host("allreduce", tensors, opts)
        red = self._reduction(opts, tensors, "all_reduce")
        return self._run(tensors[0].device, tensors, lambda: [self._all_reduce(t, red) for t in tensors])

    def allreduce_coalesced(self, tensors, opts=None) -> dist.Work:
        tensors = list(tensors)
        opts = _pg_args.options(opts, _C.AllreduceCoalescedOptions)
        if not tensors or not self._on_iris(tensors[0].device):
            return self._host("allreduce_coalesced", tensors, opts)
        red = self._reduction(opts, tensors, "all_reduce_coalesced")
        return self._run(tensors[0].device, tensors, lambda: [self._all_reduce(t, red) for t in tensors])

    def allgather(self, output_tensors, input_tensors, opts=None) -> dist.Work:
        outputs, inputs, opts = _pg_args.allgather(output_tensors, input_tensors, opts)
        if not self._on_iris(inputs[0].device):
            return self._host("allgather", outputs, inputs, opts)
        for outs, x in zip(outputs, inputs):
            _pg_args.check_list(self._iris_size, outs, x, "all_gather")

        def call() -> None:
            for outs, x in zip(outputs, inputs):
                flat = torch.empty(self._iris_size * x.numel(), dtype=x.dtype, device=x.device)
                self._all_gather(flat, x)
                _pg_args.unpack(flat, outs)

        return self._run(inputs[0].device, [t for outs in outputs for t in outs], call)

    def allgather_coalesced(self, output_lists, input_list, opts=None) -> dist.Work:
        """Every rank's ``input_list`` into ``output_lists[rank]`` (tensors of any shapes and
        dtypes, the same on every rank): one all_gather of their bytes."""
        outputs, inputs = [list(o) for o in output_lists], list(input_list)
        opts = _pg_args.options(opts, _C.AllgatherOptions)
        if not inputs or not self._on_iris(inputs[0].device):
            return self._host("allgather_coalesced", outputs, inputs, opts)
        if len(outputs) != self._iris_size or any(len(o) != len(inputs) for o in outputs):
            raise ValueError(
                f"dist.all_gather_coalesced: pass {self._iris_size} output lists (one per rank of the "
                f"group) of {len(inputs)} tensors each (one per input), got {[len(o) for o in outputs]}"
            )
        for outs in outputs:
            for o, x in zip(outs, inputs):
                if o.numel() != x.numel() or o.dtype != x.dtype:
                    raise ValueError(
                        f"dist.all_gather_coalesced: an output of {o.numel()} {o.dtype} elements for an "
                        f"input of {x.numel()} {x.dtype} elements; each output must match its input"
                    )

        def call() -> None:
            packed = torch.cat([_pg_args.as_bytes(x) for x in inputs])
            every = torch.empty(self._iris_size * packed.numel(), dtype=torch.uint8, device=packed.device)
            if packed.numel():
                self._all_gather(every, packed)
            for rank, outs in enumerate(outputs):
                start = rank * packed.numel()
                for o in outs:
                    n = o.numel() * o.element_size()
                    _pg_args.from_bytes(o, every[start : start + n])
                    start += n

        return self._run(inputs[0].device, [t for outs in outputs for t in outs], call)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts=None) -> dist.Work:
        opts = _pg_args.options(opts, _C.AllgatherOptions)
        if not self._on_iris(inp.device):
            return self._host("all_gather_single", output, inp, opts)
        return self._run(inp.device, [output], lambda: self._all_gather(output, inp))

    _allgather_base = all_gather_single

    def _coalesced(self, kind: str, outputs, inputs, opts, options: type, prepare) -> dist.Work:
        """A ``*_coalesced`` call (``opts``: an ``options`` or None): on :attr:`host_group` without
        inputs or off Iris's device; else ``prepare(inputs, opts)`` (which may reject the call)
        returns the function run on each pair of an output and an input."""
        outputs, inputs = list(outputs), list(inputs)
        opts = _pg_args.options(opts, options)
        if not inputs or not self._on_iris(inputs[0].device):
            return self._host(kind, outputs, inputs, opts)
        each = prepare(inputs, opts)
        return self._run(inputs[0].device, outputs, lambda: [each(o, x) for o, x in zip(outputs, inputs)])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> dist.Work:
        kind, options = "all_gather_single_coalesced", _C.AllgatherOptions
        return self._coalesced(kind, outputs, inputs, opts, options, lambda *_: self._all_gather)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None, timeout=None) -> dist.Work:
        outputs, inputs, opts = _pg_args.reduce_scatter(output_tensors, input_tensors, opts, timeout)
        if not self._on_iris(outputs[0].device):
            return self._host("reduce_scatter", outputs, inputs, opts)
        red = self._reduction(opts, outputs, "reduce_scatter")
        for o, ins in zip(outputs, inputs):
            _pg_args.check_list(self._iris_size, ins, o, "reduce_scatter")

        def call() -> None:
            for o, ins in zip(outputs, inputs):
                self._reduce_scatter(o, torch.cat([_pg_args.flat(t) for t in ins]), red)

        return self._run(outputs[0].device, outputs, call)

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts=None) -> dist.Work:
        opts = _pg_args.options(opts, _C.ReduceScatterOptions)
        if not self._on_iris(inp.device):
            return self._host("reduce_scatter_single", output, inp, opts)
        red = self._reduction(opts, [inp], "reduce_scatter_tensor")
        return self._run(inp.device, [output], lambda: self._reduce_scatter(output, inp, red))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> dist.Work:
        def prepare(inputs: list[torch.Tensor], opts):
            red = self._reduction(opts, inputs, "reduce_scatter_tensor")
            return lambda o, x: self._reduce_scatter(o, x, red)

        kind, options = "reduce_scatter_single_coalesced", _C.ReduceScatterOptions
        return self._coalesced(kind, outputs, inputs, opts, options, prepare)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(
        self, output: torch.Tensor, inp: torch.Tensor, output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int], opts: Any = None,
    ) -> dist.Work:  # fmt: skip
        opts = _pg_args.options(opts, _C.AllToAllOptions)
        if not self._on_iris(inp.device):
            return self._host("all_to_all_single", output, inp, output_split_sizes, input_split_sizes, opts)
        out_rows = list(output_split_sizes) or None
        in_rows = list(input_split_sizes) or None
        if out_rows is None and in_rows is None:
            for name, t in (("input", inp), ("output", output)):
                if t.dim() == 0 or t.shape[0] % self._iris_size:
                    raise ValueError(
                        f"dist.all_to_all_single: the {name} has shape {list(t.shape)}, whose dim 0 the "
                        f"group of {self._iris_size} ranks does not split evenly; pass split sizes"
                    )
        wired = (_pg_args.wire(output), _pg_args.wire(inp))
        splits = () if out_rows is None and in_rows is None else (out_rows, in_rows)
        return self._run(
            inp.device, [output],
            lambda: _ccl().all_to_all(*wired, *splits, group=self.host_group, config=self.options.config),
        )  # fmt: skip

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None) -> dist.Work:
        outputs, inputs = list(output_tensors), list(input_tensors)
        opts = _pg_args.options(opts, _C.AllToAllOptions)
        if not self._on_iris(inputs[0].device):
            return self._host("alltoall", outputs, inputs, opts)
        size = self._iris_size
        if len(inputs) != size or len(outputs) != size:
            raise ValueError(
                f"dist.all_to_all: pass {size} input and {size} output tensors (one per rank of the group), "
                f"got {len(inputs)} and {len(outputs)}"
            )
        dtypes = {t.dtype for t in (*inputs, *outputs)}
        if len(dtypes) != 1:
            raise TypeError(
                f"dist.all_to_all: every tensor must have the same dtype, got {sorted(map(str, dtypes))}"
            )

        def call() -> None:
            inp = torch.cat([_pg_args.flat(t) for t in inputs])
            out = torch.empty(sum(t.numel() for t in outputs), dtype=inp.dtype, device=inp.device)
            rows = ([t.numel() for t in outputs], [t.numel() for t in inputs])
            wired = (_pg_args.wire(out), _pg_args.wire(inp))
            _ccl().all_to_all(*wired, *rows, group=self.host_group, config=self.options.config)
            _pg_args.unpack(out, outputs)

        return self._run(inputs[0].device, outputs, call)

    def broadcast(self, tensors, opts=None, timeout=None) -> dist.Work:
        tensors, opts = _pg_args.broadcast(tensors, opts, timeout)
        if not self._on_iris(tensors[0].device):
            return self._host("broadcast", tensors, opts)
        root = self._global(opts.rootRank, "dist.broadcast")
        return self._run(
            tensors[0].device, tensors,
            lambda: [
                _ccl().broadcast(_pg_args.wire(t), root, group=self.host_group, config=self.options.config)
                for t in tensors
            ],
        )  # fmt: skip

    def reduce(self, tensors, opts=None, op=None, timeout=None) -> dist.Work:
        tensors, opts = _pg_args.reduce(tensors, opts, op, timeout)
        t = tensors[0]
        if not self._on_iris(t.device):
            return self._host("reduce", tensors, opts)
        red = self._reduction(opts, tensors, "reduce")
        root = self._global(opts.rootRank, "dist.reduce")

        def call() -> None:
            inp = red.scaled(t)
            _ccl().reduce(t, inp, root, op=red.op, group=self.host_group, config=self.options.config)

        return self._run(t.device, [t], call)

    def _rooted(self, kind: str, outputs, inputs, opts, chunk: torch.Tensor, call) -> dist.Work:
        """A gather or scatter in which this rank holds ``chunk`` and the root the list of every
        rank's: on :attr:`host_group` unless ``chunk`` is on Iris's device; else the root's
        list is checked and ``call(root, is_root)`` runs the iris.ccl call."""
        if not self._on_iris(chunk.device):
            return self._host(kind, outputs, inputs, opts)
        root = self._global(opts.rootRank, f"dist.{kind}")
        is_root = dist.get_rank() == root
        lists = outputs if kind == "gather" else inputs  # the root's list is in lists[0]
        if is_root:
            _pg_args.check_list(self._iris_size, lists[0], chunk, kind)
        received = [chunk] if kind == "scatter" else lists[0] if is_root else []
        return self._run(chunk.device, received, lambda: call(root, is_root))

    def gather(self, output_tensors, input_tensors, opts=None, timeout=None) -> dist.Work:
        outputs, inputs, opts = _pg_args.gather(output_tensors, input_tensors, opts, timeout)
        inp = inputs[0]

        def call(root: int, is_root: bool) -> None:
            flat = inp.new_empty(self._iris_size * inp.numel()) if is_root else None
            wired = _pg_args.wire(flat) if is_root else None
            _ccl().gather(wired, _pg_args.wire(inp), root, group=self.host_group, config=self.options.config)
            if is_root:
                _pg_args.unpack(flat, outputs[0])

        return self._rooted("gather", outputs, inputs, opts, inp, call)

    def scatter(self, output_tensors, input_tensors, opts=None, timeout=None) -> dist.Work:
        outputs, inputs, opts = _pg_args.scatter(output_tensors, input_tensors, opts, timeout)
        out = outputs[0]

        def call(root: int, is_root: bool) -> None:
            flat = torch.cat([_pg_args.flat(t) for t in inputs[0]]) if is_root else None
            wired = _pg_args.wire(flat) if is_root else None
            _ccl().scatter(_pg_args.wire(out), wired, root, group=self.host_group, config=self.options.config)

        return self._rooted("scatter", outputs, inputs, opts, out, call)

    # ---- point to point ------------------------------------------------------------------

    def send(self, tensors, dstRank: int, tag: int = 0) -> dist.Work:  # noqa: N803 - torch's names
        return self._queue("send", tensors, dstRank, tag)

    def recv(self, tensors, srcRank: int, tag: int = 0) -> dist.Work:  # noqa: N803 - torch's names
        return self._queue("recv", tensors, srcRank, tag)

    def _queue(self, kind: str, tensors, peer: int, tag: int) -> dist.Work:
        """Queue a send or recv (see the class); tags are accepted and not matched."""
        tensors = _pg_args.tensor_list(tensors)
        t = tensors[0]
        if not self._on_iris(t.device):
            self._start_queued()
            return getattr(self.host_group, kind)(tensors, peer, tag)
        wired = _pg_args.wire(t)
        rank = self._global(peer, f"dist.{kind}")
        p2p._check_peer(kind, wired, rank, self.host_group)
        work = Work(t.device, [t], pending=self._start_queued, check=self._checker(t.device))
        self._queued.append((p2p.Transfer(kind, wired, rank), work))
        return work

    def recv_anysource(self, tensors, tag: int = 0) -> dist.Work:
        raise NotImplementedError(
            "dist.recv without src (from any rank) is not supported by the iris backend (nor by NCCL): it "
            "matches messages per sender; pass src"
        )

    def start_coalescing(self, device: Any = None) -> None:
        """Calls in a coalescing block run as they are issued (point-to-point ones are
        queued): nothing to start."""

    def end_coalescing(self, device: Any = None) -> dist.Work:
        """Start the queued point-to-point calls; a handle of them."""
        device = torch.device(device) if device is not None else iris.mem.default_device()
        return self._run(device, [], lambda: None)

    # torch.distributed calls these from Python
    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    def barrier(self, opts=None) -> dist.Work:
        opts = _pg_args.barrier(opts)
        device = iris.mem.default_device()
        if not self._on_iris(device):
            return self._host("barrier", opts)
        return self._run(
            device,
            [],
            lambda: _ccl().barrier(group=self.host_group, config=self.options.config),
            BarrierWork,
        )

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        raise NotImplementedError(
            "dist.monitored_barrier is not supported by the iris backend (it is gloo's); use dist.barrier "
            "on the iris group, or monitored_barrier on its gloo group (IrisProcessGroup.host_group)"
        )


@entry.group_resolver
def _resolve(group: Any) -> Any:
    """Calls of iris.ccl and iris.ops given an iris group run on its host group's state."""
    return group.host_group if isinstance(group, IrisProcessGroup) else group


def _create(options: Any, pg_options: Any = None) -> IrisProcessGroup:
    """Make the process group of one ``backend="iris"`` group (torch.distributed's creator
    hook, extended form): the group, its gloo host group over the same ranks, a backend that
    only carries the group's name (a call that reaches it raises), and, where
    torch.distributed is already initialised (``new_group``: every member is here), the
    group's send/recv state."""
    settings = pg_options if pg_options is not None else ProcessGroupOptions()
    if not isinstance(settings, ProcessGroupOptions):
        raise TypeError(
            f"pg_options of an iris group must be an iris.ccl.backend.ProcessGroupOptions, got "
            f"{type(pg_options).__name__}"
        )
    rank, size, timeout = options.group_rank, options.group_size, options.timeout
    world = not options.global_ranks_in_group  # the default group, being made
    ranks = list(options.global_ranks_in_group) or list(range(size))
    # One gloo mesh per group, the host group. Its own timeout bounds Iris's exchanges; the
    # user's calls that run there pass the group's timeout with each call (gloo honours it).
    host = _gloo.subgroup(
        ranks, f"{options.group_id}:iris-host", _gloo.host_timeout(timeout), rank=rank, store=options.store,
        world=world, description="gloo group of an iris group",
    )  # fmt: skip
    pg = IrisProcessGroup(rank, size, ranks, host, timeout, settings)
    carrier_options = _C.FakeProcessGroup.Options()
    carrier_options.error_on_collective = True
    carrier = _C.FakeProcessGroup._create_internal(rank, size, carrier_options)
    for device in ("cpu", "cuda"):
        pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, carrier)
    _comm.configure(
        host, _comm.GroupSettings(heap_bytes=settings.heap_size, wait_timeout=timeout.total_seconds())
    )
    _c10d_dispatch.install(IrisProcessGroup)
    if dist.is_initialized():
        _comm.p2p(host, iris.mem.default_device())
    return pg


def _register() -> None:
    """Register the ``iris`` backend with torch.distributed (once per process)."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


_register()

__all__ = ["BACKEND_NAME", "IrisProcessGroup", "ProcessGroupOptions"]
