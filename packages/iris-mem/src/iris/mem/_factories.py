"""The torch-like tensor factories of the symmetric heap (``heap.zeros``, ``heap.randn``, ...).

:class:`TensorFactories` is a base class of :class:`~iris.mem.SymmetricHeap`: every factory
validates its arguments like its torch namesake, allocates on the heap (collective by
convention, like every allocation) and fills the tensor in place. A fill that raises gives
the space back, so a failed call leaves the heap as it was on every rank.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch


def _parse_size(size: tuple[Any, ...]) -> tuple[int, ...]:
    """Accept ``f(2, 3)``, ``f((2, 3))`` and ``f(torch.Size([2, 3]))`` like torch."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dims = []
    for d in size:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise TypeError(f"size must be a sequence of ints, got {size!r}")
        if d < 0:
            raise ValueError(f"size must not be negative, got {size!r}")
        dims.append(int(d))
    return tuple(dims)


class TensorFactories:
    """Torch-like factories allocating on the heap. The heap provides ``device``,
    ``_allocate(shape, dtype)``, ``_undo(tensor)``, ``is_symmetric`` and ``require_symmetric``.

    Every factory takes torch's keywords: ``dtype`` (default: torch's default dtype),
    ``device`` (None or the heap's device), ``requires_grad`` and ``out`` (a heap tensor of the
    right shape and dtype to fill instead of allocating); other torch keywords
    (``layout``, ``pin_memory``, ...) are accepted and ignored.
    """

    def _factory(
        self,
        size: tuple[Any, ...],
        dtype: torch.dtype | None,
        device: Any,
        requires_grad: bool,
        out: torch.Tensor | None,
        default_dtype: torch.dtype | None = None,
        fill: Callable[[torch.Tensor], object] | None = None,
    ) -> torch.Tensor:
        """Allocate (or validate ``out``), then ``fill`` the tensor in place. A fill that
        raises (an unsupported dtype, a value out of range) gives the space back."""
        shape = _parse_size(size)
        self._check_device(device)
        dtype = dtype or default_dtype or torch.get_default_dtype()
        if out is not None:
            self.require_symmetric(out, "out")
            if tuple(out.shape) != shape or out.dtype != dtype:
                raise ValueError(
                    f"out has shape {list(out.shape)} and dtype {out.dtype}; expected {list(shape)}, {dtype}"
                )
            tensor = out
        else:
            tensor = self._allocate(shape, dtype)
        if fill is not None:
            try:
                with torch.no_grad():
                    fill(tensor)
            except Exception:
                if out is None:
                    self._undo(tensor)
                raise
        if requires_grad:
            tensor.requires_grad_(True)
        return tensor

    def _check_device(self, device: Any) -> None:
        """``device`` must be None or the heap's device (``"cuda"`` without an index passes
        for a heap on any GPU, as torch's current-device default would)."""
        if device is None or torch.device(device) == self.device:
            return
        if torch.device(device).type == self.device.type == "cuda" and torch.device(device).index is None:
            return
        raise ValueError(
            f"device={device!r} does not match the heap's device {self.device}; heap tensors "
            "always live on the heap's device (leave device=None)"
        )

    def empty(
        self, *size, dtype=None, device=None, requires_grad=False, out=None, **_torch_kwargs
    ) -> torch.Tensor:
        """Uninitialised tensor on the heap, like :func:`torch.empty`."""
        with torch.no_grad():
            return self._factory(size, dtype, device, requires_grad, out)

    def zeros(
        self, *size, dtype=None, device=None, requires_grad=False, out=None, **_torch_kwargs
    ) -> torch.Tensor:
        """Tensor of zeros on the heap, like :func:`torch.zeros`."""
        with torch.no_grad():
            return self._factory(size, dtype, device, requires_grad, out, fill=torch.Tensor.zero_)

    def ones(
        self, *size, dtype=None, device=None, requires_grad=False, out=None, **_torch_kwargs
    ) -> torch.Tensor:
        """Tensor of ones on the heap, like :func:`torch.ones`."""
        with torch.no_grad():
            return self._factory(size, dtype, device, requires_grad, out, fill=lambda t: t.fill_(1))

    def full(
        self, size, fill_value, *, dtype=None, device=None, requires_grad=False, out=None, **_
    ) -> torch.Tensor:
        """Tensor filled with ``fill_value`` on the heap, like :func:`torch.full`."""
        if dtype is None:
            dtype = torch.full((), fill_value).dtype  # torch's rule: bool, int64 or the default float
        with torch.no_grad():
            shape = (size,) if isinstance(size, int) else tuple(size)
            return self._factory(shape, dtype, device, requires_grad, out, fill=lambda t: t.fill_(fill_value))

    def rand(self, *size, generator=None, dtype=None, device=None, requires_grad=False, out=None, **_):
        """Uniform random numbers in [0, 1) on the heap, like :func:`torch.rand`."""
        with torch.no_grad():
            fill = lambda t: t.uniform_(0, 1, generator=generator)  # noqa: E731
            return self._factory(size, dtype, device, requires_grad, out, fill=fill)

    def randn(self, *size, generator=None, dtype=None, device=None, requires_grad=False, out=None, **_):
        """Standard normal random numbers on the heap, like :func:`torch.randn`."""
        with torch.no_grad():
            fill = lambda t: t.normal_(0, 1, generator=generator)  # noqa: E731
            return self._factory(size, dtype, device, requires_grad, out, fill=fill)

    def randint(self, *args, generator=None, dtype=None, device=None, requires_grad=False, out=None, **_):
        """Random integers in [low, high) on the heap: ``randint(high, size)`` or
        ``randint(low, high, size)``, like :func:`torch.randint` (default dtype int64)."""
        if len(args) == 2:
            low, (high, size) = 0, args
        elif len(args) == 3:
            low, high, size = args
        else:
            raise TypeError("randint takes (high, size) or (low, high, size)")
        if high <= low:
            raise ValueError(f"randint needs low < high, got low={low}, high={high}")
        with torch.no_grad():
            fill = lambda t: t.random_(low, high, generator=generator)  # noqa: E731
            return self._factory((tuple(size),), dtype, device, requires_grad, out, torch.int64, fill)

    def arange(self, start, end=None, step=1, *, dtype=None, device=None, requires_grad=False, out=None, **_):
        """1-D tensor from ``start`` to ``end`` (exclusive) in ``step``, like :func:`torch.arange`."""
        if end is None:
            start, end = 0, start
        values = torch.arange(start, end, step, dtype=dtype)
        return self._from_values(values, device, requires_grad, out)

    def linspace(self, start, end, steps, *, dtype=None, device=None, requires_grad=False, out=None, **_):
        """``steps`` evenly spaced values from ``start`` to ``end``, like :func:`torch.linspace`."""
        values = torch.linspace(start, end, steps, dtype=dtype)
        return self._from_values(values, device, requires_grad, out)

    def _from_values(self, values: torch.Tensor, device, requires_grad: bool, out) -> torch.Tensor:
        """A heap copy of ``values``, computed by torch on the host (arange, linspace)."""
        return self._factory(
            tuple(values.shape), values.dtype, device, requires_grad, out, fill=lambda t: t.copy_(values)
        )

    def zeros_like(self, input: torch.Tensor, *, dtype=None, requires_grad=False, **_) -> torch.Tensor:
        """Zeros on the heap with the shape (and dtype) of ``input``."""
        return self.zeros(tuple(input.shape), dtype=dtype or input.dtype, requires_grad=requires_grad)

    def ones_like(self, input: torch.Tensor, *, dtype=None, requires_grad=False, **_) -> torch.Tensor:
        """Ones on the heap with the shape (and dtype) of ``input``."""
        return self.ones(tuple(input.shape), dtype=dtype or input.dtype, requires_grad=requires_grad)

    def empty_like(self, input: torch.Tensor, *, dtype=None, requires_grad=False, **_) -> torch.Tensor:
        """Uninitialised heap tensor with the shape (and dtype) of ``input``."""
        return self.empty(tuple(input.shape), dtype=dtype or input.dtype, requires_grad=requires_grad)

    def as_symmetric(self, tensor: torch.Tensor) -> torch.Tensor:
        """A heap tensor holding a copy of ``tensor`` (same shape and dtype, contiguous).

        Collective by convention, like every allocation. A tensor already on the heap is
        returned as it is.
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"as_symmetric needs a torch.Tensor, got {type(tensor).__name__}")
        if self.is_symmetric(tensor):
            return tensor
        out = self.empty(tuple(tensor.shape), dtype=tensor.dtype)
        with torch.no_grad():
            out.copy_(tensor)
        return out
