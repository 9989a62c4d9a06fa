"""Expert parallelism: ``moe_dispatch`` sends every token to the ranks holding its experts,
``moe_combine`` brings the experts' outputs back and sums them with the router's weights.
Each is one kernel launch (the kernels and how they work: :mod:`iris.ops._moe_kernels`), with
no host synchronisation: the row counts travel on the device.

Experts are split evenly and contiguously over the ``G`` ranks of the group: expert ``e``
lives on member ``e // (num_experts // G)``, which holds ``L = num_experts // G`` local
experts. A rank receives the rows routed to its experts ordered by local expert, then
source rank, then token, then slot; a token routed to several experts of one rank crosses
the link once and is replicated there.

What the kernels find wrong (a receive buffer too small, an expert id out of range, an
``expert_out`` shorter than the rows received) they record in the workspace's ``errors``
words; the host raises it (:func:`raise_recorded`) at the next check, at once where kernels
are interpreted. Buffers are reused without a barrier, which holds as long as every
``moe_combine`` follows its own ``moe_dispatch`` (one combine per dispatch).
"""

from __future__ import annotations

import dataclasses
import weakref

import torch
import torch.distributed as dist
import triton

import iris.mem
from iris.ccl import entry
from iris.mem import runtime

from . import _host
from . import workspace as _workspace
from ._moe_kernels import BOX_HEAD, ERR_CAPACITY, ERR_EXPERT_ID, _moe_combine_kernel, _moe_dispatch_kernel
from .config import MAX_PROGRAMS, MoEConfig, check_config

#: Largest number of experts (the histograms live in registers).
MAX_EXPERTS = 4096


@dataclasses.dataclass
class _Info:
    """What the host keeps beside a MoE workspace."""

    capacity: int
    calls: int = 0  # dispatches made with it
    combined: int = 0  # the dispatch the last combine consumed


#: MoE workspaces by process-group object (weakly), then signature; and their host info.
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_errors() -> None:
    """Raise the first wait timeout any fused op of this process recorded, then the first
    routing error (capacity, expert id) a MoE kernel recorded.

    Where kernels are interpreted ops raise by themselves; on GPUs kernels only record what
    went wrong, so call this after a synchronisation point (it synchronises the devices
    itself)."""
    _workspace.check_errors()
    for ws in list(_INFO):
        if ws.prepared:
            raise_recorded(ws)


def raise_recorded(ws: _workspace.Workspace) -> None:
    """Raise (and clear) the routing error the kernels of ``ws`` recorded, if any. Reads
    device memory: synchronise first where kernels run asynchronously."""
    errors = ws.buffers["errors"]
    code, rank, a, b = (int(v) for v in errors.tolist())
    if code == 0:
        return
    errors.zero_()
    if code == ERR_CAPACITY.value:
        raise RuntimeError(
            f"iris.ops.moe_dispatch: rank {rank} of the group needs {a} rows (the rows it receives, or its "
            f"tokens x top-k for the rows coming back in moe_combine), more than the {b} rows of the "
            "buffers (MoEConfig.max_recv_rows); no row was moved, d.tokens is not valid and moe_combine "
            "returns zeros. Pass MoEConfig(max_recv_rows=...) at least as large as the most rows a rank "
            "can receive (at most group size x top-k x the largest token count)"
        )
    if code == ERR_EXPERT_ID.value:
        raise ValueError(
            f"iris.ops.moe_dispatch: topk_idx of rank {rank} of the group holds expert id {a}, out of "
            f"range: ids must be -1 (no expert) or in [0, {b}) (num_experts); that slot was left out"
        )
    # ERR_SHORT_OUTPUT: the short rank's own record has the counts, its peers' have -1, -1
    if rank >= 0 and a >= 0:
        raise ValueError(
            f"iris.ops.moe_combine: rank {rank} of the group received {a} rows but its expert_out has "
            f"{b}; expert_out needs a row for every row of d.tokens that holds a token"
        )
    raise ValueError(
        f"iris.ops.moe_combine: rank {rank} of the group passed an expert_out with fewer rows than it "
        "received; this rank's result reads rows it never had"
    )


@dataclasses.dataclass
class MoEDispatch:
    """What :func:`moe_dispatch` returns and :func:`moe_combine` takes.

    Attributes:
        tokens: ``[capacity, H]`` (capacity: ``MoEConfig.max_recv_rows``, the same on every
            rank): the rows this rank received, one per (source rank, token, slot) routed to
            one of its experts, ordered by local expert, then source rank, then token, then
            slot; rows past the received total hold stale data. It lives in the op's
            workspace: valid until the next ``moe_dispatch`` with the same signature.
        expert_counts: int64 ``[num_experts // G]``: rows per local expert (on the device).
        positions: int32 ``[T, K]``: where each slot of this rank's tokens landed in its
            expert's rank's ``tokens`` (-1 for none); what combine reads.
        topk_idx: the routing this rank passed.
        num_experts: the number of experts over the group.
    """

    tokens: torch.Tensor
    expert_counts: torch.Tensor
    positions: torch.Tensor
    topk_idx: torch.Tensor
    num_experts: int
    _ws: _workspace.Workspace | None = dataclasses.field(default=None, repr=False)
    _call: int = dataclasses.field(default=0, repr=False)
    _cfg: MoEConfig | None = dataclasses.field(default=None, repr=False)
    _group: object = dataclasses.field(default=None, repr=False)

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
            raise_recorded(self._ws)


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


def resolve(config: MoEConfig | None, hidden: int, caps) -> MoEConfig:
    """``config`` with ``programs``, ``block`` and ``num_warps`` chosen for rows of ``hidden``
    elements on a device of capabilities ``caps`` (``max_recv_rows`` stays as given: its
    default is agreed between the ranks when the workspace is made)."""
    check_config(config, MoEConfig)
    config = config or MoEConfig()
    if caps.interpreted:  # programs run one after another there: more would only be slower
        programs = 1
    else:
        programs = min(config.programs or caps.sm_count, caps.resident_programs, MAX_PROGRAMS)
    # A row moves in blocks of up to 2048 elements (4 KiB of bf16: a few vectors per thread).
    block = config.block or max(64, min(triton.next_power_of_2(max(hidden, 1)), 2048))
    warps = config.num_warps or max(1, min(8, block // 256))
    return dataclasses.replace(config, programs=max(programs, 1), block=block, num_warps=warps)


def _padded(num_experts: int) -> int:
    """Counts per box: a power of two, at least 16 (whole 16-byte groups of lines)."""
    return max(16, triton.next_power_of_2(num_experts))


def _ids_per_step(padded_experts: int) -> int:
    """``(token, slot)`` ids a dispatch program counts at once: the comparison of a step's ids
    with every expert is ``ids x padded_experts`` in registers, kept to 8192 elements."""
    return max(16, min(256, 8192 // padded_experts))


def _row_hint(hidden: int, itemsize: int, cfg: MoEConfig) -> int | None:
    """16 where every row and every block of a row starts on a 16-byte boundary (remote
    stores then move 16-byte vectors), else None."""
    return 16 if (hidden * itemsize) % 16 == 0 and cfg.block * itemsize >= 16 else None


def _some(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t``, or a one-element tensor of ``like``'s dtype where ``t`` is empty (a valid pointer)."""
    return t if t.numel() else like.new_zeros(1)


# --------------------------------------------------------------------------- dispatch


def _validate_dispatch(x, topk_idx, num_experts, size: int) -> tuple[int, int, int]:
    """``(tokens, hidden, slots)`` of a dispatch's arguments, or a clear error."""
    op = "moe_dispatch"
    _host._tensor(x, "x", op, 2)
    _host._tensor(topk_idx, "topk_idx", op, 2)
    if x.dtype not in _host.DTYPES:
        raise TypeError(f"{op}: x has dtype {x.dtype}; use one of {', '.join(map(str, _host.DTYPES))}")
    if topk_idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: topk_idx must hold int64 (or int32) expert ids, got {topk_idx.dtype}")
    if topk_idx.device != x.device:
        raise ValueError(f"{op}: topk_idx is on {topk_idx.device} but x is on {x.device}; they must match")
    if topk_idx.shape[0] != x.shape[0]:
        raise ValueError(
            f"{op}: x has {x.shape[0]} rows (tokens) but topk_idx has {topk_idx.shape[0]}; topk_idx must be "
            "[tokens, top-k], one row per row of x"
        )
    if topk_idx.shape[1] < 1:
        raise ValueError(
            f"{op}: topk_idx has no slots (shape {list(topk_idx.shape)}); it must be [tokens, top-k]"
        )
    if x.shape[1] < 1:
        raise ValueError(f"{op}: x has rows of no elements (shape {list(x.shape)})")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"{op}: num_experts must be a positive int, got {num_experts!r}")
    if num_experts % size:
        raise ValueError(
            f"{op}: num_experts ({num_experts}) must be divisible by the group size ({size}): experts are "
            "split evenly, expert e on rank e // (num_experts // group size)"
        )
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"{op}: at most {MAX_EXPERTS} experts are supported, got {num_experts}")
    return x.shape[0], x.shape[1], topk_idx.shape[1]


def _workspace_for(ranks, group, x, hidden: int, slots: int, num_experts: int, cfg: MoEConfig):
    """The prepared workspace of this signature and group (made collectively at its first
    call: the ranks agree on the default capacity there, from the largest token count of any
    rank) and its host info."""
    size = len(ranks)
    signature = ("moe", ranks, (hidden, slots, num_experts), str(x.dtype), cfg, (None, False))
    table = _TABLES.setdefault(dist.group.WORLD if group is None else group, {})
    ws = table.get(signature)
    if ws is not None and ws.prepared:
        return ws, _INFO[ws]
    if iris.mem.capturing(x.device):
        raise RuntimeError(
            "iris.ops.moe_dispatch: the first call of a signature makes its workspace (collectively, with "
            "allocations and a host exchange), which a CUDA graph cannot capture; call it once with the "
            "same hidden size, top-k, num_experts, dtype, group and config before capturing"
        )
    capacity = cfg.max_recv_rows
    if not capacity:
        tokens = runtime.exchange(group, "iris.ops.moe_dispatch workspace", x.shape[0], ValueError)
        capacity = max(1, size * slots * max(tokens))
    if capacity >= 1 << 31:
        raise ValueError(
            f"iris.ops.moe_dispatch: a receive buffer of {capacity} rows (group size x top-k x tokens) is "
            "over 2**31 - 1; pass a smaller MoEConfig(max_recv_rows=...)"
        )
    ep = _padded(num_experts)
    programs = cfg.programs
    specs = [
        ("cstate", 4, torch.int32),  # the combine kernel's call state (dispatch uses "state")
        ("boxes", 2 * size * (BOX_HEAD + ep), torch.int64),  # two banks of a box per member
        ("hist", programs * ep, torch.int32),
        ("ready", programs, torch.int32),
        ("bad", 2 * programs, torch.int64),
        ("tokens", capacity * hidden, x.dtype),
        ("origin", capacity, torch.int32),
        ("source", capacity, torch.int64),
        ("arrive", size, torch.int64),
        ("back", capacity * hidden, x.dtype),
        ("done", size, torch.int64),
        ("short", size, torch.int32),
        ("meta", 2, torch.int64),
        ("errors", 4, torch.int64),
    ]
    ws = _workspace.acquire(None, signature, None, group, size, x.device, specs)
    table[signature] = ws
    _INFO[ws] = info = _Info(capacity)
    return ws, info


def _run_dispatch(x, topk_idx, num_experts: int, size: int, cfg: MoEConfig, ws, info: _Info):
    """Launch the dispatch kernel: ``(tokens, expert counts, positions)``."""
    tokens_n, hidden = x.shape
    slots = topk_idx.shape[1]
    xk = x if x.stride(1) == 1 or hidden == 1 else x.contiguous()
    idx = topk_idx.contiguous()
    positions = torch.empty((tokens_n, slots), dtype=torch.int32, device=x.device)
    counts = torch.empty(num_experts // size, dtype=torch.int64, device=x.device)
    b = ws.buffers
    tokens = b["tokens"].view(info.capacity, hidden)
    ep = _padded(num_experts)
    runtime.launch(
        _moe_dispatch_kernel, cfg.programs, ws.sync, ws.buffers["state"],
        _some(xk, xk), _some(idx, idx), _some(positions, positions), counts, tokens, b["origin"], b["source"],
        b["boxes"], b["hist"], b["ready"], b["bad"], b["arrive"], b["meta"], b["errors"],
        tokens_n, hidden, max(xk.stride(0), 1), info.capacity,
        E=num_experts, K=slots, EP=ep, KP=triton.next_power_of_2(slots), BLOCK_S=_ids_per_step(ep),
        BLOCK_H=cfg.block, HINT=_row_hint(hidden, x.element_size(), cfg), num_warps=cfg.num_warps,
        programs=cfg.programs,
    )  # fmt: skip
    return tokens, counts, positions


def _check_dispatch(x, topk_idx, num_experts, *, group, config, **_) -> None:
    check_config(config, MoEConfig)
    _validate_dispatch(x, topk_idx, num_experts, len(_host.group_position(group)[0]))


@entry.op("moe_dispatch", tensors=("x", "topk_idx"), device="x", validate=_check_dispatch)
def moe_dispatch(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, *, group=None, config=None
) -> MoEDispatch:
    """Send each token of this rank to the ranks holding its experts, in one kernel.

    :param x: ``[T, H]`` tokens of this rank (bf16, fp16 or fp32; ``T`` may differ between
        ranks, ``H`` may not).
    :param topk_idx: ``[T, K]`` global expert ids (int64; int32 accepted), ``-1`` for a slot
        without an expert. Expert ``e`` lives on rank ``e // (num_experts // G)`` of the group.
    :param num_experts: experts over the group, divisible by the group size ``G``.
    :param group: torch.distributed group, or None for the world.
    :param config: a :class:`MoEConfig` (the receive buffer's capacity, programs, tiles).
    :returns: a :class:`MoEDispatch`: ``tokens`` (``[capacity, H]``, received rows ordered by
        local expert, source rank, token, slot; a token routed to several experts of one rank
        crosses the link once and is replicated there), ``expert_counts`` (int64, rows per
        local expert) and what :func:`moe_combine` needs.

    No host synchronisation: counts stay on the device, so the call can be captured in a
    CUDA graph (after a first call of the same signature made the workspace). A capacity
    overflow or an expert id out of range is recorded on the device and raised by
    :meth:`MoEDispatch.check` / :func:`iris.ops.check_errors` (at once where kernels are
    interpreted). Every rank of the group must call it, with the same ``H``, ``K``,
    ``num_experts``, dtype and config.
    """
    ranks, index = _host.group_position(group)
    size = len(ranks)
    hidden, slots = x.shape[1], topk_idx.shape[1]
    caps = iris.mem.capabilities(x.device)
    cfg = resolve(config, hidden, caps)
    ws, info = _workspace_for(ranks, group, x, hidden, slots, num_experts, cfg)
    tokens, counts, positions = _run_dispatch(x, topk_idx, num_experts, size, cfg, ws, info)
    info.calls += 1
    if caps.interpreted:  # the kernel has finished: raise what it recorded now
        raise_recorded(ws)
    return MoEDispatch(tokens, counts, positions, topk_idx, num_experts, ws, info.calls, cfg, group)


# --------------------------------------------------------------------------- combine


def _validate_combine(expert_out: torch.Tensor, d: MoEDispatch, topk_weights: torch.Tensor) -> _Info:
    """The host info of ``d``'s workspace, once the arguments fit ``d`` and ``d`` is the
    latest, not yet combined dispatch of its signature; else a clear error."""
    op = "moe_combine"
    if not isinstance(d, MoEDispatch):
        raise TypeError(f"{op}: d must be what iris.ops.moe_dispatch returned, got {type(d).__name__}")
    _host._tensor(expert_out, "expert_out", op, 2)
    _host._tensor(topk_weights, "topk_weights", op, 2)
    tokens_n, slots = d.positions.shape
    hidden = d.tokens.shape[1]
    if expert_out.dtype != d.tokens.dtype:
        raise TypeError(
            f"{op}: expert_out has dtype {expert_out.dtype} but d.tokens has {d.tokens.dtype}; they must "
            "match"
        )
    if expert_out.shape[1] != hidden or expert_out.shape[0] > d.tokens.shape[0]:
        raise ValueError(
            f"{op}: expert_out has shape {list(expert_out.shape)}; it must have {hidden} columns (d.tokens') "
            f"and at most {d.tokens.shape[0]} rows (d.tokens' capacity)"
        )
    if expert_out.device != d.tokens.device:
        raise ValueError(f"{op}: expert_out is on {expert_out.device} but d.tokens is on {d.tokens.device}")
    if not topk_weights.dtype.is_floating_point or topk_weights.dtype not in _host.DTYPES:
        raise TypeError(
            f"{op}: topk_weights must be floating point ({', '.join(map(str, _host.DTYPES))}), got "
            f"{topk_weights.dtype}"
        )
    if tuple(topk_weights.shape) != (tokens_n, slots):
        raise ValueError(
            f"{op}: topk_weights has shape {list(topk_weights.shape)}, expected {[tokens_n, slots]} "
            "(the shape of the topk_idx passed to moe_dispatch)"
        )
    if topk_weights.device != d.tokens.device:
        raise ValueError(
            f"{op}: topk_weights is on {topk_weights.device} but d.tokens is on {d.tokens.device}"
        )
    ws = d._ws
    if ws is None or not ws.prepared or ws not in _INFO:
        raise RuntimeError(f"{op}: the workspace of this dispatch was released; dispatch again")
    info = _INFO[ws]
    if d._call != info.calls:
        raise RuntimeError(
            f"{op}: d is not the latest moe_dispatch of its signature (a later dispatch has reused its "
            "buffers); combine each dispatch before the next one"
        )
    if info.combined == d._call:
        raise RuntimeError(f"{op}: this dispatch was already combined; each dispatch is combined once")
    return info


def _run_combine(expert_out: torch.Tensor, d: MoEDispatch, topk_weights: torch.Tensor) -> torch.Tensor:
    """Launch the combine kernel of ``d``: the weighted sums ``[T, H]``."""
    ws, cfg = d._ws, d._cfg
    tokens_n, slots = d.positions.shape
    hidden = d.tokens.shape[1]
    eo = expert_out if expert_out.stride(1) == 1 or hidden == 1 else expert_out.contiguous()
    weights = topk_weights.contiguous()
    y = torch.empty((tokens_n, hidden), dtype=expert_out.dtype, device=expert_out.device)
    b = ws.buffers
    runtime.launch(
        _moe_combine_kernel, cfg.programs, ws.sync, b["cstate"],
        _some(eo, eo), _some(weights, weights), _some(d.topk_idx.contiguous(), d.topk_idx), _some(y, y),
        b["back"], b["source"], b["done"], b["short"], b["meta"], b["errors"],
        tokens_n, hidden, eo.shape[0], max(eo.stride(0), 1), max(y.stride(0), 1),
        E=d.num_experts, K=slots, KP=triton.next_power_of_2(slots), BLOCK_H=cfg.block,
        HINT=_row_hint(hidden, eo.element_size(), cfg), num_warps=cfg.num_warps, programs=cfg.programs,
    )  # fmt: skip
    return y


def _dispatch_group(args) -> object:
    return args["d"]._group if isinstance(args["d"], MoEDispatch) else None


@entry.op(
    "moe_combine", tensors=("expert_out", "topk_weights"), device="expert_out", group_of=_dispatch_group
)
def moe_combine(expert_out: torch.Tensor, d: MoEDispatch, topk_weights: torch.Tensor) -> torch.Tensor:
    """Bring the experts' outputs back to the tokens' ranks and sum them, in one kernel.

    :param expert_out: ``[n, H]`` with ``d.tokens``' dtype: row ``i`` is the expert output of
        row ``i`` of ``d.tokens`` (``n`` at least the rows received; ``d.tokens``' capacity
        always is).
    :param d: what this rank's latest :func:`moe_dispatch` of the same signature returned
        (one combine per dispatch).
    :param topk_weights: ``[T, K]`` floating-point weights of this rank's slots.
    :returns: ``[T, H]`` in ``expert_out``'s dtype: ``y[t] = sum_k topk_weights[t, k] *
        expert_out[row(t, k)]`` over the slots with an expert, accumulated in fp32.
    """
    info = _validate_combine(expert_out, d, topk_weights)
    y = _run_combine(expert_out, d, topk_weights)
    info.combined = d._call
    if iris.mem.capabilities(y.device).interpreted:  # the kernel has finished: raise what it recorded now
        raise_recorded(d._ws)
    return y


__all__ = [
    "MAX_EXPERTS",
    "MoEDispatch",
    "check_errors",
    "moe_combine",
    "moe_dispatch",
    "resolve",
]
