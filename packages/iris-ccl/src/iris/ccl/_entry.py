"""What every public collective does around its own work (:func:`public`).

* **A world on first use.** Without ``torch.distributed.init_process_group`` the first call
  sets the default process group up the way :func:`iris.mem.init` does
  (:func:`iris.mem.bootstrap.ensure_initialized`: from torchrun's environment, or a world of
  one without a launcher).
* **dtypes.** Tensors of dtypes the kernels do not handle themselves go through
  :mod:`iris.ccl._dtypes` (moved as their bytes, reduced by a conversion path).
* **Handles.** The :class:`~iris.ccl.Work` an ``async_op=True`` call returns is completed
  with the call's output tensors (``get_future()``).

Under ``torch.compile`` the wrapper steps aside: the collective calls its custom op, whose
implementation calls the public function again, eagerly.
"""

from __future__ import annotations

import atexit
import functools
import inspect
from collections.abc import Callable

import torch
import torch.distributed as dist

from . import _dtypes


def ensure_world() -> None:
    """Initialise torch.distributed's default group as :func:`iris.mem.init` does, if nobody
    has: from the launcher's environment (torchrun), else a world of one. A world of one made
    here is destroyed at exit."""
    if dist.is_initialized():
        return
    from iris.mem import bootstrap, settings

    if bootstrap.ensure_initialized(settings.default_backend()):
        atexit.register(_destroy_private_world)


def _destroy_private_world() -> None:
    if dist.is_initialized() and dist.get_world_size() == 1:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def _getter(params: tuple[str, ...], name: str) -> Callable[[tuple, dict], object]:
    """A function reading argument ``name`` of a call ``(args, kwargs)`` (None if absent)."""
    index = params.index(name)

    def get(args: tuple, kwargs: dict) -> object:
        return args[index] if index < len(args) else kwargs.get(name)

    return get


def public(name: str, tensors: tuple[str, ...] = (), outputs: tuple[str, ...] = ()):
    """Decorate the public collective ``name``: ``tensors`` names its tensor parameters,
    ``outputs`` those the returned :class:`~iris.ccl.Work`'s future is completed with."""

    def decorate(fn):
        params = tuple(inspect.signature(fn).parameters)
        get_tensors = [_getter(params, n) for n in tensors]
        get_outputs = [_getter(params, n) for n in outputs]

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if torch.compiler.is_compiling():
                return fn(*args, **kwargs)
            if not dist.is_initialized():
                ensure_world()
            for get in get_tensors:
                t = get(args, kwargs)
                if isinstance(t, torch.Tensor) and _dtypes.converts(t):
                    return _dtypes.run(name, call, params, tensors, outputs, args, kwargs)
            work = fn(*args, **kwargs)
            if work is not None:
                work._set_outputs([get(args, kwargs) for get in get_outputs])
            return work

        return call

    return decorate
