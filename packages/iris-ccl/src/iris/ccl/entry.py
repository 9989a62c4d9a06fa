"""The one way into every public collective and fused op.

Each public function of iris.ccl and iris.ops is written as what it does on one node, for
the tensor dtypes its kernels handle, in eager mode, and decorated with :func:`op`. The
decorator does everything around it, in this order:

1. **torch.compile.** While dynamo traces, the call becomes the op's *compiled form*, which
   calls its ``torch.ops.iris`` custom op (an opaque node with a fake implementation).
   Registered by the module that defines the custom ops, with :func:`compiled_form`.
2. **A world on first use.** Without ``torch.distributed.init_process_group``, the first
   call sets the default process group up as :func:`iris.mem.init` does (from torchrun's
   environment, or a world of one).
3. **Conversions.** Calls with tensors the kernels do not handle (iris.ccl's dtypes detour:
   float64, int8, complex, ...) are taken over by a *conversion*, registered with
   :func:`conversion`, which calls the public function again with tensors that the kernels
   handle.
4. **Validation.** The op's ``validate`` function (an argument of :func:`op`) checks the
   call before anything is sent, so that bad input raises on every rank in the same way
   whichever path runs next.
5. **Groups spanning nodes.** A heap spans one node; over a group whose ranks sit on several
   nodes the call runs the op's *staged form* (Iris within each node, torch.distributed
   between nodes), registered with :func:`staged_form`, given the group's
   :class:`~iris.ccl.nodes.NodeGroups`.
6. **The op itself**, on one node. The :class:`~iris.ccl.Work` an ``async_op=True`` call
   returns is completed with the call's output tensors (``get_future()``).

Before the conversions, the call's ``group`` becomes the group whose Iris state it uses
(:func:`group_resolver`: a torch.distributed group made with ``backend="iris"`` keeps its
state on its gloo group), so that every way of calling an op with a group shares one
communicator and heap.

Each step is written once, here; the modules that provide a compiled form, a conversion or
a staged form register it, and the op's own module imports nothing of theirs. Forms take
the call's arguments as a dict (parameter name -> value, defaults filled in), so that one
form serves positional and keyword calls alike.

While ``torch.profiler`` records, every call is a ``record_function`` range named after the
op, with the shapes and dtypes of its tensors and the size of its group.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

import iris.mem
from iris.mem import bootstrap, settings

from . import nodes
from .work import Work

#: What a conversion returns when the call is not one it converts.
PASS = object()

Args = dict[str, Any]


@dataclasses.dataclass(eq=False)
class Spec:
    """What :func:`op` knows of one public op.

    Attributes:
        name: the op's name (``"all_reduce"``, ``"matmul_all_reduce"``, ...).
        package: the distribution's import name that owns it (``"iris.ccl"``, ``"iris.ops"``).
        fn: the single-node function (the decorated one).
        public: the public function (what callers, and conversions, call).
        tensors: names of its tensor parameters (the conversions look at these).
        outputs: names of the tensors the returned :class:`~iris.ccl.Work`'s future holds.
        device: name of the tensor parameter whose device the op runs on (None: the
            current device, :func:`iris.mem.default_device`).
        validate: checks a call's arguments (called with them as keywords), or None.
        group_of: the call's process group from its arguments (default: its ``group``).
    """

    name: str
    package: str
    fn: Callable
    public: Callable
    tensors: tuple[str, ...]
    outputs: tuple[str, ...]
    device: str | None
    validate: Callable[..., None] | None
    group_of: Callable[[Mapping[str, Any]], Any]
    signature: inspect.Signature
    #: positional parameters in order, and every parameter's default (required ones absent)
    positional: tuple[str, ...]
    defaults: dict[str, Any]
    #: every parameter's name
    names: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.names = frozenset(self.signature.parameters)

    def device_of(self, args: Mapping[str, Any]) -> torch.device:
        """The device a call with ``args`` runs on."""
        tensor = args.get(self.device) if self.device is not None else None
        return tensor.device if isinstance(tensor, torch.Tensor) else iris.mem.default_device()

    def bind(self, args: tuple, kwargs: dict) -> Args:
        """The call's arguments by parameter name, defaults filled in. A call that does not
        fit the signature raises Python's own TypeError (from ``inspect``)."""
        given = self.positional[: len(args)]
        if len(args) <= len(self.positional) and not any(name in kwargs for name in given):
            bound = dict(self.defaults)
            bound.update(zip(given, args))
            bound.update(kwargs)
            if bound.keys() == self.names:  # nothing missing, nothing unknown
                return bound
        return dict(self._slow_bind(args, kwargs))

    def _slow_bind(self, args: tuple, kwargs: dict) -> Mapping[str, Any]:
        bound = self.signature.bind(*args, **kwargs)  # raises the TypeError a plain call would
        bound.apply_defaults()
        return bound.arguments


#: Every public op by name, and the forms registered for each.
OPS: dict[str, Spec] = {}
_COMPILED: dict[str, Callable[[Args], Any]] = {}
_STAGED: dict[str, Callable[[nodes.NodeGroups, Args], None]] = {}
_CONVERSIONS: dict[str, list[Callable[[Spec, Args], Any]]] = {}
_GROUP_RESOLVERS: list[Callable[[Any], Any]] = []


def op(
    name: str,
    *,
    tensors: tuple[str, ...] = (),
    outputs: tuple[str, ...] = (),
    device: str | None = None,
    validate: Callable[..., None] | None = None,
    group_of: Callable[[Mapping[str, Any]], Any] | None = None,
) -> Callable[[Callable], Callable]:
    """Decorate the single-node function of the public op ``name`` (module docstring).

    :param tensors: its tensor parameters.
    :param outputs: the tensors an ``async_op=True`` call's :class:`~iris.ccl.Work` future holds.
    :param device: the tensor parameter whose device the op runs on (None: the current device).
    :param validate: called with the call's arguments as keywords before anything runs (it
        may accept ``**_`` for those it does not look at); raises on bad input.
    :param group_of: the call's process group, from its arguments by name, where the op has
        no ``group`` parameter (None: its ``group`` argument, or the world).
    """

    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        params = signature.parameters.values()
        positional = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        defaults = {p.name: p.default for p in params if p.default is not p.empty}

        @functools.wraps(fn)
        def public(*args, **kwargs):
            return _call(spec, spec.bind(args, kwargs))

        spec = Spec(
            name, fn.__module__.rsplit(".", 1)[0], fn, public, tensors, outputs, device, validate,
            group_of or _group_argument, signature, positional, defaults,
        )  # fmt: skip
        if name in OPS:
            raise RuntimeError(
                f"iris: the op {name!r} is registered twice ({OPS[name].fn.__module__}, {fn.__module__})"
            )
        OPS[name] = spec
        return public

    return decorate


def _group_argument(args: Mapping[str, Any]) -> Any:
    return args.get("group")


def compiled_form(name: str) -> Callable[[Callable[[Args], Any]], Callable[[Args], Any]]:
    """Register how op ``name`` runs under ``torch.compile``: a function of the call's
    arguments that calls the op's custom op (and copies its result into the caller's
    outputs). It returns what the public function returns, never a handle."""

    def register(form: Callable[[Args], Any]) -> Callable[[Args], Any]:
        _COMPILED[name] = form
        return form

    return register


def staged_form(name: str) -> Callable:
    """Register how op ``name`` runs over a group spanning nodes: a function of the group's
    :class:`~iris.ccl.nodes.NodeGroups` and the call's (validated) arguments."""

    def register(form: Callable[[nodes.NodeGroups, Args], None]) -> Callable:
        _STAGED[name] = form
        return form

    return register


def conversion(*names: str) -> Callable:
    """Register a conversion for the ops ``names``: a function of the op's :class:`Spec` and
    the call's arguments that returns :data:`PASS` for calls it leaves alone, else the
    call's result (having called ``spec.public`` with arguments the op handles)."""

    def register(form: Callable[[Spec, Args], Any]) -> Callable:
        for name in names:
            _CONVERSIONS.setdefault(name, []).append(form)
        return form

    return register


def group_resolver(resolve: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Register ``resolve(group) -> group``: the group whose Iris state (communicator, heap)
    a call given ``group`` runs on; ``group`` itself for groups it does not know. Applied to
    every eager call's ``group`` before anything else."""
    _GROUP_RESOLVERS.append(resolve)
    return resolve


def ensure_world() -> None:
    """Initialise torch.distributed's default group as :func:`iris.mem.init` does, if nobody
    has: from the launcher's environment (torchrun), else a world of one. A world of one made
    here is destroyed at exit."""
    if dist.is_initialized():
        return
    if bootstrap.ensure_initialized(settings.default_backend()):
        atexit.register(_destroy_private_world)


def _destroy_private_world() -> None:
    if dist.is_initialized() and dist.get_world_size() == 1:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def _call(spec: Spec, args: Args) -> Any:
    """One call of ``spec``'s op (module docstring)."""
    if torch.compiler.is_compiling():
        return _compiled(spec, args)
    if not dist.is_initialized():
        ensure_world()
    if torch.autograd.profiler._is_profiler_enabled:
        with torch.profiler.record_function(_range_name(spec, args)):
            return _eager(spec, args)
    return _eager(spec, args)


def _eager(spec: Spec, args: Args) -> Any:
    group = args.get("group")
    if group is not None:
        for resolve in _GROUP_RESOLVERS:
            group = resolve(group)
        args["group"] = group
    for convert in _CONVERSIONS.get(spec.name, ()):
        result = convert(spec, args)
        if result is not PASS:
            return result
    if spec.validate is not None:
        spec.validate(**args)
    group = nodes.spanning(spec.group_of(args), lambda: spec.device_of(args))
    if group is not None:
        _form(_STAGED, spec, "over a group spanning several nodes")(group, args)
        return Work(spec.device_of(args)) if args.get("async_op") else None
    work = spec.fn(**args)
    if work is not None and spec.outputs:
        work._set_outputs([args[n] for n in spec.outputs])
    return work


def _compiled(spec: Spec, args: Args) -> Any:
    if args.get("async_op"):
        raise RuntimeError(
            f"{spec.name}(async_op=True) is not supported inside torch.compile: the compiled graph runs "
            "the op in order on the current stream; call it with async_op=False there"
        )
    return _form(_COMPILED, spec, "under torch.compile")(args)


def _form(table: dict, spec: Spec, where: str) -> Callable:
    form = table.get(spec.name)
    if form is None:  # a new op registered without this form: say so instead of guessing
        raise NotImplementedError(
            f"{spec.package}.{spec.name} cannot run {where}: it registers no form for it"
        )
    return form


def _range_name(spec: Spec, args: Args) -> str:
    """``iris.ccl.all_reduce(inp=float32[4096], group=3)``: the op, its tensors' dtypes and
    shapes, and its group's size, as a profiler range's name."""
    parts = []
    for name in spec.tensors:
        t = args.get(name)
        if isinstance(t, torch.Tensor):
            parts.append(f"{name}={str(t.dtype).removeprefix('torch.')}{list(t.shape)}")
    if dist.is_initialized():
        parts.append(f"group={dist.get_world_size(spec.group_of(args))}")
    return f"{spec.package}.{spec.name}({', '.join(parts)})"
