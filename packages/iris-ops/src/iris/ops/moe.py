"""Expert parallelism: ``moe_dispatch`` sends every token to the ranks holding its experts,
``moe_combine`` brings the experts' outputs back and sums them with the router's weights.
Each is one kernel launch (the kernels and how they work: :mod:`iris.ops._moe_kernels`), with
no host synchronisation: the row counts travel on the device. Both are differentiable
(:mod:`iris.ops._moe_grad`).

Experts are split evenly and contiguously over the ``G`` ranks of the group: expert ``e``
lives on member ``e // (num_experts // G)``, which holds ``L = num_experts // G`` local
experts. A rank receives the rows routed to its experts ordered by local expert, then
source rank, then token, then slot; a token routed to several experts of one rank crosses
the link once and is replicated there.

What the kernels find wrong (a receive buffer too small, an expert id out of range, an
``expert_out`` shorter than the rows received) they record in the workspace's ``errors``
words; the host raises it (:func:`~iris.ops._moe_host.raise_recorded`) at the next check,
at once where kernels are interpreted. Buffers are reused without a barrier, which holds as
long as every ``moe_combine`` follows its own ``moe_dispatch`` (one combine per dispatch).
"""

from __future__ import annotations

import dataclasses

import torch

import iris.mem
from iris.ccl import entry

from . import _host
from . import _moe_grad as _grad
from . import _moe_host as _mh
from . import workspace as _workspace
from ._moe_host import MAX_EXPERTS, resolve
from .config import MoEConfig, check_config


def check_errors() -> None:
    """Raise the first wait timeout any fused op of this process recorded, then the first
    routing error (capacity, expert id) a MoE kernel recorded.

    Where kernels are interpreted ops raise by themselves; on GPUs kernels only record what
    went wrong, so call this after a synchronisation point (it synchronises the devices
    itself)."""
    _workspace.check_errors()
    for ws in list(_mh.INFO):
        if ws.prepared:
            _mh.raise_recorded(ws)


@dataclasses.dataclass
class MoEDispatch:
    """What :func:`moe_dispatch` returns and :func:`moe_combine` takes.

    Attributes:
        tokens: ``[capacity, H]`` (``capacity`` the same on every rank): the rows this rank
            received, one per (source rank, token, slot) routed to one of its experts,
            ordered by local expert, then source rank, then token, then slot; rows past the
            received total hold stale data. Without autograd recording (``torch.no_grad()``,
            inference mode) it is a view of the op's workspace, valid until the next
            ``moe_dispatch`` of the same signature; while autograd records, a copy (autograd
            may keep it for the experts' backward), differentiable when ``x`` requires grad.
            Float8 (``float8_e4m3fn`` / ``float8_e5m2``) for a float8 dispatch.
        expert_counts: int64 ``[num_experts // G]``: rows per local expert (on the device).
        expert_offsets: int64 ``[num_experts // G + 1]``: exclusive prefix sum of
            ``expert_counts`` (on the device): local expert ``j``'s rows are
            ``tokens[expert_offsets[j]:expert_offsets[j + 1]]``, and ``expert_offsets[-1]``
            is the number of rows received.
        positions: int32 ``[T, K]``: where each slot of this rank's tokens landed in its
            expert's rank's ``tokens`` (-1 for none); what combine reads.
        topk_idx: the routing this rank passed.
        num_experts: the number of experts over the group.
        scales: float32 ``[capacity, H // 128]``, the block scales of float8 rows, in the
            order of ``tokens`` (``value = tokens * scale`` per block of 128 channels); None
            for a dispatch without float8.
    """

    tokens: torch.Tensor
    expert_counts: torch.Tensor
    positions: torch.Tensor
    topk_idx: torch.Tensor
    num_experts: int
    expert_offsets: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    _ws: _workspace.Workspace | None = dataclasses.field(default=None, repr=False)
    _call: int = dataclasses.field(default=0, repr=False)
    _cfg: MoEConfig | None = dataclasses.field(default=None, repr=False)
    _group: object = dataclasses.field(default=None, repr=False)
    _ranks: tuple = dataclasses.field(default=(), repr=False)

    @property
    def capacity(self) -> int:
        """Rows of :attr:`tokens` (the receive buffer's capacity)."""
        return self.tokens.shape[0]

    def num_rows(self) -> int:
        """Rows received (synchronises with the device: for inspection, not inside a graph)."""
        return int(self.expert_counts.sum())

    def rows(self) -> torch.Tensor:
        """``tokens[:num_rows()]`` (synchronises with the device)."""
        return self.tokens[: self.num_rows()]

    def check(self) -> None:
        """Synchronise and raise what the kernels recorded: a capacity overflow, an expert
        id out of range, a wait that timed out."""
        if self._ws is not None and self._ws.prepared:
            iris.mem.synchronize(self._ws.heap.device)
            self._ws.check()
            _mh.raise_recorded(self._ws)


#: The latest dispatches made through ``torch.ops.iris.moe_dispatch``, by the address of
#: their positions tensor (a few: each is combined soon after it is made).
_MADE: dict[int, MoEDispatch] = {}
_MAX_MADE = 64


def remember(d: MoEDispatch) -> None:
    """Keep ``d`` findable from its positions (for ``torch.ops.iris.moe_combine``)."""
    _MADE.pop(d.positions.data_ptr(), None)
    _MADE[d.positions.data_ptr()] = d
    while len(_MADE) > _MAX_MADE:
        _MADE.pop(next(iter(_MADE)))


def recall(positions: torch.Tensor) -> MoEDispatch:
    """The dispatch whose ``positions`` tensor this is."""
    d = _MADE.get(positions.data_ptr())
    if d is None or d.positions.shape != positions.shape:
        raise RuntimeError(
            "torch.ops.iris.moe_combine: positions is not what a live torch.ops.iris.moe_dispatch returned; "
            "pass the positions of the dispatch being combined"
        )
    return d


def routing_of(d: MoEDispatch, source: torch.Tensor | None) -> _grad.Routing:
    """What the gradients of ``d`` (and of its combine) need, copied from the workspace
    (which the next dispatch overwrites): the routing, the row count and, for dispatch's
    gradient, ``source``."""
    meta = d._ws.buffers["meta"].clone()
    return _grad.Routing(
        d.topk_idx.clone(), d.positions, meta, source, d.num_experts, d.capacity, d.tokens.shape[1], d._ranks,
        d._group, d._cfg,
    )  # fmt: skip


# --------------------------------------------------------------------------- dispatch


def _check_dispatch(
    x, topk_idx, num_experts, *, x_scales, quantize, max_recv_rows, group, config, **_
) -> None:
    check_config(config, MoEConfig)
    size = len(_host.group_position(group)[0])
    _mh.validate_dispatch(x, topk_idx, num_experts, size, x_scales, quantize, max_recv_rows)


@entry.op("moe_dispatch", tensors=("x", "topk_idx", "x_scales"), device="x", validate=_check_dispatch)
def moe_dispatch(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, *, x_scales: torch.Tensor | None = None,
    quantize: torch.dtype | None = None, max_recv_rows: int | None = None, group=None, config=None,
) -> MoEDispatch:  # fmt: skip
    """Send each token of this rank to the ranks holding its experts, in one kernel.

    :param x: ``[T, H]`` tokens of this rank (bf16, fp16, fp32, fp64, or float8 with
        ``x_scales``; ``T`` may differ between ranks, ``H`` may not).
    :param topk_idx: ``[T, K]`` global expert ids (int64; int32 accepted), ``-1`` for a slot
        without an expert. Expert ``e`` lives on rank ``e // (num_experts // G)`` of the group.
    :param num_experts: experts over the group, divisible by the group size ``G``.
    :param x_scales: float32 ``[T, H // 128]`` block scales of float8 ``x``
        (``float8_e4m3fn`` / ``float8_e5m2``; ``H`` a multiple of 128), delivered in
        ``d.scales`` beside the rows.
    :param quantize: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``: quantize bf16 / fp16 /
        fp32 ``x`` in the kernel (``scale = max(amax, 1e-12) / fp8_max`` per token and 128
        channels, ``fp8(x / scale)`` rounded to nearest even and saturated), returned in
        ``d.tokens`` and ``d.scales``.
    :param max_recv_rows: rows the receive buffer must hold in this call (the same on every
        rank). When it exceeds the current capacity, the buffers grow to it first
        (collectively; the previous dispatch of this signature can no longer be combined).
        Default: the capacity of earlier calls, the first one's ``MoEConfig.max_recv_rows``
        or ``G * K * max(T)`` over the ranks.
    :param group: torch.distributed group, or None for the world.
    :param config: a :class:`MoEConfig` (the first capacity, programs, tiles).
    :returns: a :class:`MoEDispatch` (``tokens``, ``expert_counts``, ``expert_offsets``,
        ``scales`` and what :func:`moe_combine` needs).

    No host synchronisation: counts stay on the device, so the call can be captured in a
    CUDA graph (after a first call of the same signature made the workspace). A capacity
    overflow or an expert id out of range is recorded on the device and raised by
    :meth:`MoEDispatch.check` / :func:`iris.ops.check_errors` (at once where kernels are
    interpreted). Every rank of the group must call it, with the same ``H``, ``K``,
    ``num_experts``, dtypes, config and ``max_recv_rows``, and (under autograd) with ``x``
    requiring grad alike.
    """
    ranks, _ = _host.group_position(group)
    size = len(ranks)
    caps = iris.mem.capabilities(x.device)
    rows_dtype = _mh.row_dtype(x, quantize)
    cfg = resolve(config, x.shape[1], caps, quantize is not None, rows_dtype.itemsize)
    mode = 2 if quantize is not None else 1 if x_scales is not None else 0
    ws, info = _mh.workspace_for(
        ranks, group, x, topk_idx.shape[1], num_experts, cfg, mode, rows_dtype, max_recv_rows
    )
    tokens, scales, counts, offsets, positions = _mh.run_dispatch(
        x, topk_idx, num_experts, size, cfg, ws, info, x_scales, quantize
    )
    info.calls += 1
    if caps.interpreted:  # the kernel has finished: raise what it recorded now
        _mh.raise_recorded(ws)
    d = MoEDispatch(
        tokens, counts, positions, topk_idx, num_experts, offsets, scales, ws, info.calls, cfg, group, ranks
    )
    if torch.is_grad_enabled():
        # autograd may keep the rows (an expert's weight gradient reads them): a copy, as
        # the workspace is overwritten by the next call; attached to x when x requires grad
        if x.requires_grad:
            d.tokens = _grad.DispatchFunction.apply(x, tokens, routing_of(d, ws.buffers["source"].clone()))
        else:
            d.tokens = tokens.clone()
        d.scales = scales.clone() if scales is not None else None
    return d


# --------------------------------------------------------------------------- combine


def _dispatch_group(args) -> object:
    return args["d"]._group if isinstance(args["d"], MoEDispatch) else None


@entry.op(
    "moe_combine", tensors=("expert_out", "topk_weights"), device="expert_out", group_of=_dispatch_group
)
def moe_combine(expert_out: torch.Tensor, d: MoEDispatch, topk_weights: torch.Tensor) -> torch.Tensor:
    """Bring the experts' outputs back to the tokens' ranks and sum them, in one kernel.

    :param expert_out: ``[n, H]`` with ``d.tokens``' dtype (bf16 or fp16 after a float8
        dispatch): row ``i`` is the expert output of row ``i`` of ``d.tokens`` (``n`` at
        least the rows received; ``d.tokens``' capacity always is).
    :param d: what this rank's latest :func:`moe_dispatch` of the same signature returned
        (one combine per dispatch).
    :param topk_weights: ``[T, K]`` floating-point weights of this rank's slots.
    :returns: ``[T, H]`` in ``expert_out``'s dtype: ``y[t] = sum_k topk_weights[t, k] *
        expert_out[row(t, k)]`` over the slots with an expert, accumulated in fp32 (fp64
        for fp64). Differentiable with respect to ``expert_out`` and ``topk_weights``.
    """
    if not isinstance(d, MoEDispatch):
        raise TypeError(f"moe_combine: d must be what iris.ops.moe_dispatch returned, got {type(d).__name__}")
    _mh.validate_combine(expert_out, d, topk_weights)
    info = _mh.check_sequence(d)
    tokens_n, slots = d.positions.shape
    keep_rows = torch.is_grad_enabled() and topk_weights.requires_grad

    def run():
        y = _mh.run_combine(expert_out, d, topk_weights)
        rows = (
            _grad.slot_rows(d._ws, tokens_n, slots, d.tokens.shape[1], expert_out.dtype)
            if keep_rows
            else None
        )
        return y, rows

    if torch.is_grad_enabled() and (expert_out.requires_grad or topk_weights.requires_grad):
        y = _grad.CombineFunction.apply(expert_out, topk_weights, run, routing_of(d, None))
    else:
        y, _ = run()
    info.combined = d._call
    if iris.mem.capabilities(y.device).interpreted:  # the kernel has finished: raise what it recorded now
        _mh.raise_recorded(d._ws)
    return y


__all__ = [
    "MAX_EXPERTS",
    "MoEDispatch",
    "check_errors",
    "moe_combine",
    "moe_dispatch",
    "resolve",
]
