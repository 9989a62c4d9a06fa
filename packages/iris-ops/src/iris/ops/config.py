"""``Config``: how a fused op runs, and the table that picks one by shape."""

from __future__ import annotations

import dataclasses

import torch

#: Values of ``Config.path``.
PATHS = ("auto", "fused", "composed")
#: Largest number of persistent programs a fused op launches (the sync slots of a workspace).
MAX_PROGRAMS = 1024


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


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
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Config.{name} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"Config.{name} must be >= 0 (0 chooses), got {value}")
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value and (not _power_of_two(value) or not 16 <= value <= 256):
                raise ValueError(f"Config.{name} must be a power of two from 16 to 256, got {value}")
        if self.num_warps and (not _power_of_two(self.num_warps) or self.num_warps > 16):
            raise ValueError(f"Config.num_warps must be a power of two up to 16, got {self.num_warps}")
        if self.num_stages > 8:
            raise ValueError(f"Config.num_stages must be at most 8, got {self.num_stages}")
        if self.num_sms > MAX_PROGRAMS:
            raise ValueError(f"Config.num_sms must be at most {MAX_PROGRAMS}, got {self.num_sms}")
        if self.split not in ("auto", "m", "n"):
            raise ValueError(f"Config.split must be 'auto', 'm' or 'n', got {self.split!r}")
        if self.order not in ("auto", "peers_first", "spread"):
            raise ValueError(f"Config.order must be 'auto', 'peers_first' or 'spread', got {self.order!r}")
        if self.path not in PATHS:
            raise ValueError(f"Config.path must be 'auto', 'fused' or 'composed', got {self.path!r}")
        for name in ("tma", "stream"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"Config.{name} must be True, False or None, got {value!r}")


def check_config(config: object) -> None:
    """A clear TypeError for a ``config`` that is not a :class:`Config` (or None)."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be an iris.ops.Config or None, got {type(config).__name__}")


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
    128x128x32 with pointer loads for tf32. Under the interpreter small tiles
    keep interpreted programs cheap.
    """
    check_config(config)
    config = config or Config()
    if interpreted:
        bm, bn, bk, warps, stages, sms, group = 16, 16, 32, 4, 1, 4, 2
    elif dtype == torch.float32:
        bm, bn, bk, warps, stages, group = (64, 64, 64, 4, 3, 8) if rows <= 64 else (128, 128, 32, 8, 3, 8)
        sms = device_sms
    elif rows <= 16:
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
    tma = config.tma
    if tma is None:
        tma = not interpreted and dtype != torch.float32 and rows > 16
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
