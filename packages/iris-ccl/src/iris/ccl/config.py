"""``Config``: how a collective runs, and the table that picks one by message size."""

from __future__ import annotations

import dataclasses

#: Variants each collective accepts ("auto" picks from the table).
VARIANTS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("auto", "boxed", "one_shot", "two_shot", "ring", "atomic", "spinlock"),
    "all_gather": ("auto", "boxed", "push", "pull", "gluon"),
    "reduce_scatter": ("auto", "boxed", "push", "pull"),
    "all_to_all": ("auto", "boxed", "push", "pull"),
}


#: Upper bound of ``Config.programs``: the sync slots of a communicator (``_comm.MAX_SLOTS``).
MAX_PROGRAMS = 8192


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """Launch configuration of a collective. Every field 0 or "auto" means "choose".

    Attributes:
        variant: algorithm; see :data:`VARIANTS` (collectives with one algorithm take "auto").
        block_size: elements per tile, a power of two.
        num_warps: warps per program, a power of two up to 32.
        chunk_elements: elements per kernel launch when a message is split (staging through
            the workspace splits messages larger than the workspace anyway).
        programs: programs (thread blocks) of a persistent collective kernel; each loops
            over its share of the tiles between one start and one end barrier (0: one per
            SM on GPUs, 2 in the interpreter). Collectives with a per-tile barrier ignore it.
    """

    variant: str = "auto"
    block_size: int = 0
    num_warps: int = 0
    chunk_elements: int = 0
    programs: int = 0

    def __post_init__(self) -> None:
        for name in ("block_size", "num_warps", "chunk_elements", "programs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Config.{name} must be an int, got {value!r}")
        if not isinstance(self.variant, str) or not self.variant:
            raise ValueError(f"Config.variant must be a non-empty string, got {self.variant!r}")
        if self.block_size and (self.block_size < 16 or self.block_size & (self.block_size - 1)):
            raise ValueError(f"Config.block_size must be a power of two >= 16, got {self.block_size}")
        if self.num_warps and (self.num_warps > 32 or self.num_warps & (self.num_warps - 1)):
            raise ValueError(f"Config.num_warps must be a power of two <= 32, got {self.num_warps}")
        if self.chunk_elements < 0:
            raise ValueError(f"Config.chunk_elements must be >= 0, got {self.chunk_elements}")
        if not 0 <= self.programs <= MAX_PROGRAMS:
            raise ValueError(f"Config.programs must be in [0, {MAX_PROGRAMS}], got {self.programs}")

    def check_variant(self, collective: str) -> None:
        """Raise ValueError unless ``variant`` is one ``collective`` implements."""
        allowed = VARIANTS.get(collective, ("auto",))
        if self.variant not in allowed:
            raise ValueError(f"{collective} has no variant {self.variant!r}; use one of {', '.join(allowed)}")


def check_config(config: object) -> None:
    """A clear TypeError for a ``config`` that is not a :class:`Config` (or None)."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be an iris.ccl.Config or None, got {type(config).__name__}")


def select(collective: str, nbytes: int, world_size: int, interpreted: bool, config: Config | None) -> Config:
    """The configuration to run: ``config`` with every "choose" field filled in.

    The table below is the best known per size class; on the CPU backend (interpreter)
    larger tiles mean fewer interpreted programs, which is what costs time there.
    """
    check_config(config)
    config = config or Config()
    config.check_variant(collective)
    variant = config.variant
    if variant == "gluon" and interpreted:
        raise RuntimeError(
            f"{collective}: Config(variant='gluon') needs the cuda backend: Gluon kernels compile for "
            "NVIDIA GPUs only and do not run in Triton's interpreter (the cpu backend); use another variant"
        )
    if variant == "auto":
        if collective == "all_reduce":
            variant = "one_shot" if nbytes <= (256 << 10) or world_size <= 2 else "two_shot"
        elif collective in VARIANTS:
            variant = "push"
    block = config.block_size or (1024 if interpreted else (1024 if nbytes <= (64 << 10) else 4096))
    warps = config.num_warps or (4 if block <= 1024 else 8)
    chunk = config.chunk_elements or 0
    return dataclasses.replace(
        config, variant=variant, block_size=block, num_warps=warps, chunk_elements=chunk
    )
