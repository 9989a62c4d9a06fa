"""The one path of every collective with variants (all_reduce, all_gather, reduce_scatter,
all_to_all): validate, plan, run.

1. :func:`validate`: the tensors, the config and the output's size for the group;
2. :func:`run` plans the call: flat contiguous input and output (the input copied where the
   output overlaps it in a way the collective cannot use), the resolved config and variant
   (:mod:`iris.ccl.variants`), the communicator (the caller's heap in place, or iris.ccl's
   own heap, staged), the exits for empty messages and groups of one, and the variant's
   fallback where a requirement does not hold;
3. ``variant.run(plan)``; then the result goes back into a non-contiguous output and the
   call returns its :class:`~iris.ccl.work.Work` handle (``async_op``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import _comm, _host, variants
from .config import Config
from .reduce_op import ReduceOp, from_accumulator
from .variants import Variant
from .work import Work


@dataclasses.dataclass(frozen=True)
class Plan:
    """A call made ready for its variant (at least two members, at least one element each).

    Attributes:
        collective: the collective ("all_reduce", ...).
        comm: the communicator it runs on.
        cfg: the resolved config (``cfg.variant`` the variant that runs).
        in_place: whether ``src`` and ``dst`` are on ``comm``'s heap (else the caller's
            tensors are anywhere and ``comm`` is iris.ccl's own heap, with staging buffers).
        src: the input, flat and contiguous.
        dst: the output, flat and contiguous (the caller's, or scratch copied back after).
        count: elements per member: the whole input of all_reduce and all_gather, one
            chunk (``G`` in the input) of reduce_scatter and all_to_all.
        op: the reduction (None: the collective does not reduce).
        group: the torch.distributed group (None: the world).
    """

    collective: str
    comm: _comm.Communicator
    cfg: Config
    in_place: bool
    src: torch.Tensor
    dst: torch.Tensor
    count: int
    op: ReduceOp | None
    group: Any

    @property
    def op_value(self) -> str:
        """The kernels' name of the reduction ("sum" where nothing is reduced)."""
        return "sum" if self.op is None else self.op.value

    def launches(self, element_bytes: int) -> Iterator[tuple[int, int]]:
        """``(start, length)`` of each launch over :attr:`count`, a launch covering at most
        what :func:`iris.ccl._host.max_elements` allows for ``element_bytes`` per element."""
        per_launch = _host.max_elements(self.cfg, element_bytes, not self.in_place, self.comm)
        return _host.chunks(self.count, per_launch)


def validate(collective: str, out, inp, group, config, out_numel: Callable[[int], int]) -> tuple[int, int]:
    """Check ``out`` and ``inp`` (tensors of supported, equal dtypes on one device), ``config``
    and that ``out`` has ``out_numel(G)`` elements (G: the size of ``group``). Returns the
    group's size and this process's index in it."""
    _host.check_tensor(out, "out")
    _host.check_tensor(inp, "inp")
    _host.check_config(config)
    size, index = _host.group_position(group)
    _host.check_pair(out, inp, collective, out_numel(size))
    return size, index


def _never(src: torch.Tensor, dst: torch.Tensor) -> bool:
    return False


def run(
    collective: str,
    out: torch.Tensor,
    inp: torch.Tensor,
    count: int,
    *,
    group,
    config: Config | None,
    async_op: bool,
    op: object = None,
    overlap_ok: Callable[[torch.Tensor, torch.Tensor], bool] = _never,
) -> Work | None:
    """Plan a validated call and run its variant (module docstring).

    :param count: elements per member (:attr:`Plan.count`).
    :param op: the reduction as the caller gave it (None: the collective does not reduce).
    :param overlap_ok: ``overlap_ok(src, dst)`` for flat ``src`` and ``dst`` that overlap:
        whether the collective can use them so (else it works on a copy of the input, staged).
    """
    rop = None if op is None else ReduceOp.parse(op)
    if rop is not None:
        _host.check_op(rop, inp.dtype)
    src, dst = _host.contiguous_pair(inp, out)
    stage = _host.overlaps(src, dst) and not overlap_ok(src, dst)
    if stage:  # the output would overwrite input still needed
        src = src.clone()
    nbytes = max(inp.numel(), out.numel()) * inp.element_size()
    cfg = _host.resolve(collective, [out, inp], group, config, nbytes, op=rop, stage=stage)
    variant = _variant(collective, cfg.variant)
    comm, in_place = _host.place(
        collective, [out, inp], group, cfg, nbytes, stage or variant.own_heap(inp.dtype)
    )
    variant.check_op(rop)
    if count == 0:
        return _host.finish(comm, async_op)
    if comm.size == 1:  # a reduction over one member rounds as any does (float8: saturates)
        dst.copy_(src if rop is None else from_accumulator(src, dst.dtype))
    else:
        variant, plan = _fallback(variant, Plan(collective, comm, cfg, in_place, src, dst, count, rop, group))
        signature = {"count": count, "dtype": src.dtype, "op": plan.op_value, "variant": plan.cfg.variant}
        with comm.signed(collective, **signature):
            variant.run(plan)
    _host.copy_back(out, dst)
    return _host.finish(comm, async_op)


def _variant(collective: str, name: str) -> Variant:
    variant = variants.get(collective, name)
    if variant is None:
        raise RuntimeError(f"internal: {collective} resolved to variant {name!r}, which is not registered")
    return variant


def _fallback(variant: Variant, plan: Plan) -> tuple[Variant, Plan]:
    """``variant`` and ``plan``, or where the call does not meet the variant's requirements
    its fallback and the plan with the fallback's name in ``cfg.variant``."""
    unmet = (variant.in_place and not plan.in_place) or (
        variant.disjoint and _host.overlaps(plan.src, plan.dst)
    )
    if not unmet or variant.fallback is None:
        return variant, plan
    cfg = dataclasses.replace(plan.cfg, variant=variant.fallback)
    return _variant(plan.collective, variant.fallback), dataclasses.replace(plan, cfg=cfg)
