"""The configs of iris.ops' ops, the checks they share, and the table of tiles of the fused
GEMM ops.

* :class:`Config`: the fused GEMM + communication ops (``matmul_all_reduce``,
  ``all_gather_matmul``, ``matmul_all_gather``, ``matmul_reduce_scatter``); :func:`select`
  fills in the fields left to choose.
* :class:`AllReduceRMSNormConfig`: ``all_reduce_rmsnorm``.
* :class:`MoEConfig`: ``moe_dispatch`` and ``moe_combine``.

A config only checks its own fields (types and ranges, with a message naming the field); the
op's resolve step fills in what is left to choose, for the shape and for the device
(``iris.mem.capabilities``: SM count, interpreted or compiled kernels) of the call.
"""

from __future__ import annotations

import dataclasses

import torch

#: Values of ``Config.path``.
PATHS = ("auto", "fused", "composed")
#: Values of ``AllReduceRMSNormConfig.form``.
NORM_FORMS = ("auto", "ll", "rs_ag")
#: Largest number of persistent programs a fused op launches (the sync slots of a workspace).
MAX_PROGRAMS = 1024
#: The float8 input dtypes of the fused GEMM ops.
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


# --------------------------------------------------------------------------- shared checks


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _either(choices: tuple[str, ...]) -> str:
    """``"'a', 'b' or 'c'"``."""
    quoted = [repr(c) for c in choices]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _check_counts(config, names: tuple[str, ...]) -> None:
    """Each field of ``names`` is an int >= 0 (0: the op chooses)."""
    cls = type(config).__name__
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{cls}.{name} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{cls}.{name} must be >= 0 (0 chooses), got {value}")


def _check_power_of_two(config, name: str, low: int, high: int) -> None:
    """Field ``name``, unless 0, is a power of two in ``[low, high]``."""
    value = getattr(config, name)
    if value and (not _power_of_two(value) or not low <= value <= high):
        span = f"up to {high}" if low == 1 else f"from {low} to {high}"
        raise ValueError(f"{type(config).__name__}.{name} must be a power of two {span}, got {value}")


def _check_at_most(config, name: str, high: int) -> None:
    value = getattr(config, name)
    if value > high:
        raise ValueError(f"{type(config).__name__}.{name} must be at most {high}, got {value}")


def _check_choice(config, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{type(config).__name__}.{name} must be {_either(choices)}, got {value!r}")


def _check_optional_bools(config, names: tuple[str, ...]) -> None:
    """Each field of ``names`` is True, False or None (None: the op chooses)."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{type(config).__name__}.{name} must be True, False or None, got {value!r}")


# --------------------------------------------------------------------------- the configs


#: The int fields of ``Config`` (0: chosen by :func:`select`).
_INT_FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages", "num_sms", "comm_sms")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """Launch configuration of a fused op. Every field left at 0 (or ``"auto"``) is chosen
    from the table of best-known settings for the shape, dtype and device.

    Attributes:
        block_m: rows of an output tile (power of two, 16-256).
        block_n: columns of an output tile (power of two, 16-256).
        block_k: K step of the inner loop (power of two, 16-256).
        group_m: rows of tiles visited together (grouped order, for L2 reuse), >= 1.
        num_warps: warps per program (power of two, 1-16).
        num_stages: software-pipelining depth of the K loop (1-8).
        num_sms: persistent programs (1-1024); default: the device's SM count (4 under the
            interpreter), never more than the tiles. Programs wait on programs of the
            peers, so more than the GPU holds at once can stall a call until its waits give
            up after ``IRIS_WAIT_TIMEOUT`` (``check_errors`` then raises).
        comm_sms: ``all_gather_matmul`` only: programs that push this rank's shard of A to
            the other ranks before they join the GEMM (forced to 1 under the interpreter,
            where programs run one after the other).
        split: ``matmul_all_reduce`` only: the dimension along which output tiles are
            assigned to the rank that reduces them, ``"m"`` or ``"n"``.
        order: ``matmul_reduce_scatter`` and ``matmul_all_reduce`` only: the order in
            which a program computes its tiles. ``"peers_first"``: the tiles of the other
            ranks' chunks first (all partials are sent early, the own chunk reduced last);
            ``"spread"``: odd programs walk their tiles backwards, so about half of the
            partials leave in each part of the call, and an own tile that is not a
            program's last is parked in the output (in the output's dtype, like the peers'
            partials) and reduced after the program's next tile. ``"auto"``:
            ``"peers_first"`` (with ``stream`` the faster on 2 x H200).
        stream: ``matmul_reduce_scatter`` and ``matmul_all_reduce`` only: a partial tile
            for a peer is staged locally and copied a few rows per K step while the
            program computes its next tile, instead of being stored to the peer at once
            (where the program's threads wait for the link when many push together); for
            ``matmul_all_reduce`` in a group of two also its reduced tiles. None chooses
            (on).
        tma: read A and B through Hopper's tensor memory accelerator (host tensor
            descriptors) where their layout allows it (row-major, 16-byte aligned rows),
            instead of ``cp.async`` loads; None chooses (on for bf16/fp16, where it
            measured faster on H200 at every shape tried; off for tf32).
        path: what runs. ``"fused"``: the op's fused kernel (every other field applies to
            it); ``"composed"``: ``torch.matmul`` (cuBLAS on GPUs) and the iris.ccl
            collective with ``variant="auto"``, one after the other (the collective first for
            ``all_gather_matmul``); ``"auto"``: whichever the tuning table measured faster for
            the shape on this GPU model and group size, else a heuristic (see
            :doc:`/performance`); the fused kernel wherever kernels are interpreted.
    """

    block_m: int = 0
    block_n: int = 0
    block_k: int = 0
    group_m: int = 0
    num_warps: int = 0
    num_stages: int = 0
    num_sms: int = 0
    comm_sms: int = 0
    split: str = "auto"
    order: str = "auto"
    stream: bool | None = None
    tma: bool | None = None
    path: str = "auto"

    def __post_init__(self) -> None:
        _check_counts(self, _INT_FIELDS)
        for name in ("block_m", "block_n", "block_k"):
            _check_power_of_two(self, name, 16, 256)
        _check_power_of_two(self, "num_warps", 1, 16)
        _check_at_most(self, "num_stages", 8)
        _check_at_most(self, "num_sms", MAX_PROGRAMS)
        _check_choice(self, "split", ("auto", "m", "n"))
        _check_choice(self, "order", ("auto", "peers_first", "spread"))
        _check_choice(self, "path", PATHS)
        _check_optional_bools(self, ("tma", "stream"))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AllReduceRMSNormConfig:
    """How :func:`~iris.ops.all_reduce_rmsnorm` runs; fields left at 0 / ``"auto"`` / None are
    chosen per shape.

    Attributes:
        form: ``"ll"`` (one-shot flag-in-data exchange, for decode sizes), ``"rs_ag"``
            (reduce-scatter of rows, norm, all-gather, for large token counts) or
            ``"auto"`` (``"ll"`` while each rank sends at most ``LL_MAX_BYTES``).
        block: elements of a row held in registers at once (power of two, 64-16384);
            default: the row rounded up to a power of two, at most 8192 (4096 in the
            interpreter). Longer rows take two passes.
        num_warps: warps per program (power of two, 1-16); default: ``block / 512``
            within 4-16.
        programs: persistent programs (1-1024, never more than the device keeps resident);
            default: one per row (``"ll"``: per pushed piece as well) up to the SM count.
        spread: ``"ll"`` only: spread the pushes over every program in pieces of two
            lines (16 bytes) per thread (2048 bf16 elements with 16 warps) instead of each
            program pushing the rows it receives. None: on where programs run concurrently
            (compiled kernels). Never when ``out`` is ``inp`` (a program must read its rows
            before it overwrites them).
    """

    form: str = "auto"
    block: int = 0
    num_warps: int = 0
    programs: int = 0
    spread: bool | None = None

    def __post_init__(self) -> None:
        _check_choice(self, "form", NORM_FORMS)
        _check_counts(self, ("block", "num_warps", "programs"))
        _check_power_of_two(self, "block", 64, 16384)
        _check_power_of_two(self, "num_warps", 1, 16)
        _check_at_most(self, "programs", MAX_PROGRAMS)
        _check_optional_bools(self, ("spread",))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MoEConfig:
    """How :func:`~iris.ops.moe_dispatch` and :func:`~iris.ops.moe_combine` run; fields left
    at 0 are chosen.

    Attributes:
        max_recv_rows: capacity of a rank's receive buffer (``d.tokens`` has this many
            rows on every rank), the most rows any rank may receive in one call. Default:
            ``G * K * T_max``, with ``T_max`` the largest token count of any rank at the
            first call (the worst case: every slot of every rank routed to one rank). A
            call that would exceed it moves no row, records the error on the device, and
            the host raises it at the next check (:meth:`~iris.ops.MoEDispatch.check`,
            :func:`iris.ops.check_errors`; at once where kernels are interpreted). A call's
            ``moe_dispatch(..., max_recv_rows=n)`` grows the buffers to ``n`` when larger.
        programs: persistent programs (1-1024); default: the device's SM count (1 where
            kernels are interpreted, where programs run one after another).
        block: elements of a row moved at once (power of two, 64-16384); default: the row
            rounded up to a power of two, at most 2048.
        num_warps: warps per program (power of two, 1-16); default ``block / 256`` in 1-8.
    """

    max_recv_rows: int = 0
    programs: int = 0
    block: int = 0
    num_warps: int = 0

    def __post_init__(self) -> None:
        _check_counts(self, ("max_recv_rows", "programs", "block", "num_warps"))
        # Row positions travel as int32 in the kernels (origin, positions).
        if self.max_recv_rows >= 1 << 31:
            raise ValueError(f"MoEConfig.max_recv_rows must be below 2**31, got {self.max_recv_rows}")
        _check_at_most(self, "programs", MAX_PROGRAMS)
        _check_power_of_two(self, "block", 64, 16384)
        _check_power_of_two(self, "num_warps", 1, 16)


def check_config(config: object, cls: type = Config, op: str | None = None) -> None:
    """A clear TypeError for a ``config`` that is not a ``cls`` (or None); ``op`` prefixes
    the message with the op's name."""
    if config is not None and not isinstance(config, cls):
        prefix = f"{op}: " if op else ""
        wanted = f"iris.ops.{cls.__name__}"
        raise TypeError(f"{prefix}config must be an {wanted} or None, got {type(config).__name__}")


def select(
    rows: int,
    cols: int,
    dtype: torch.dtype,
    device_sms: int,
    interpreted: bool,
    config: Config | None,
    wide: bool = False,
) -> Config:
    """``config`` with every field left to choose filled in, for output tiles covering
    ``rows x cols`` (per owner or per shard where the op splits them) of ``dtype``.

    The table is the best known on Hopper (H200), measured with ``bench_ops.py --tune``:
    128x256x64 tiles, 8 warps, 3 stages, read through TMA, for large 16-bit GEMMs; when that
    leaves fewer than two tiles per SM, 128x128x64 with 4 stages, or with ``wide`` (the ops
    for which it measured faster there: all_gather_matmul, matmul_reduce_scatter and,
    with its partials streamed, matmul_all_reduce: 133.7 against 143.4 us at M = 1024)
    128x256x64 with 4 stages; for decode shapes (M <= 128, bound
    by reading B in few long K loops) 64x128x128 tiles, 4 warps, 4 stages, TMA (128x64x128
    above 64 rows; up to 16 rows 16x128x256 with 3 stages and pointer loads, which waste
    no tensor-core rows on padding: 37-46 us instead of 44-59 us at M = 1 and 16);
    128x128x32 with pointer loads for tf32. Float8 (not yet measured): the 16-bit table
    with twice the K step (the same bytes per pipeline stage), at most 256, and at least 64
    rows a tile (``wgmma``: Hopper has no float8 ``mma.sync``), so decode shapes get the
    64x128 tiles, through TMA. Under the interpreter small tiles keep interpreted programs
    cheap.
    """
    check_config(config)
    config = config or Config()
    if interpreted:
        bm, bn, bk, warps, stages, sms, group = 16, 16, 32, 4, 1, 4, 2
    elif dtype == torch.float32:
        bm, bn, bk, warps, stages, group = (64, 64, 64, 4, 3, 8) if rows <= 64 else (128, 128, 32, 8, 3, 8)
        sms = device_sms
    elif rows <= 16 and dtype not in FP8:
        bm, bn, bk, warps, stages, group = 16, 128, 256, 4, 3, 8
        sms = device_sms
    elif rows <= 128:
        bm, bn = (64, 128) if rows <= 64 else (128, 64)
        bk, warps, stages, group = 128, 4, 4, 8
        sms = device_sms
    else:
        bm, bk, warps, group = 128, 64, 8, 8
        # Wide tiles once every SM gets at least two of them; deeper pipelining otherwise.
        many = -(-rows // 128) * -(-cols // 256) >= 2 * device_sms
        bn, stages = (256, 3) if many else (256 if wide else 128, 4)
        sms = device_sms
    # Hopper's copy engine for 16-bit GEMMs (measured faster on H200: 883 vs 1049 us at
    # 8192 x 8192 x 4096, 148 vs 183 us at M = 1024); pointer loads for tf32, for the
    # 16-row decode tiles (as fast or faster there: 36.8 vs 38.4 us, matmul_all_reduce at
    # M = 1) and under the interpreter.
    if dtype in FP8 and not interpreted:
        bk = min(2 * bk, 256)
    tma = config.tma
    if tma is None:
        tma = not interpreted and dtype != torch.float32 and (rows > 16 or dtype in FP8)
    return dataclasses.replace(
        config,
        block_m=config.block_m or bm,
        block_n=config.block_n or bn,
        block_k=config.block_k or bk,
        group_m=config.group_m or group,
        num_warps=config.num_warps or warps,
        num_stages=config.num_stages or stages,
        num_sms=min(config.num_sms or sms, MAX_PROGRAMS),
        comm_sms=1 if interpreted else (config.comm_sms or 16),
        tma=tma,
    )
