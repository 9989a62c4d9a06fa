"""``Config``: how a collective runs, and the table that picks one by message size."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from . import variants
from .settings import TABLE_ENV, table_path

#: Upper bound of ``Config.programs``: the sync slots of a communicator (``_comm.MAX_SLOTS``).
MAX_PROGRAMS = 8192


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """Launch configuration of a collective. Every field 0 or "auto" means "choose".

    Attributes:
        variant: algorithm; see :data:`VARIANTS` (collectives with one algorithm take "auto";
            the variants are registered in :mod:`iris.ccl.variants`).
        block_size: elements per tile, a power of two (``ll``: 32-bit words per tile).
        num_warps: warps per program, a power of two up to 32.
        chunk_elements: elements per kernel launch when a message is split (staging through
            the workspace splits messages larger than the workspace anyway); for the
            ``copy_engine`` all_reduce, elements of each member's chunk per pipelined piece.
        programs: programs (thread blocks) of a collective kernel; each loops over its
            share of the tiles (0: one per SM on GPUs, 2 in the interpreter). Every program
            waits on its twins on the peers, so more programs than the GPU holds at once
            can hang.
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
        allowed = variants.names().get(collective, ("auto",))
        if self.variant not in allowed:
            raise ValueError(f"{collective} has no variant {self.variant!r}; use one of {', '.join(allowed)}")


def check_config(config: object) -> None:
    """A clear TypeError for a ``config`` that is not a :class:`Config` (or None)."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be an iris.ccl.Config or None, got {type(config).__name__}")


def select(collective: str, nbytes: int, world_size: int, interpreted: bool, config: Config | None) -> Config:
    """The configuration to run: ``config`` with every "choose" field filled in.

    With ``variant="auto"`` the variant, and on GPUs the tile, warps and programs the table
    measured for it, come from the tuning table (:func:`auto_rule`); fields the caller set
    win over the table's. Otherwise tiles follow measured defaults; on the CPU backend
    (interpreter) larger tiles mean fewer interpreted programs, which is what costs time
    there.
    """
    check_config(config)
    config = config or Config()
    config.check_variant(collective)
    variant = config.variant
    measured: dict[str, int] = {}
    if variant == "auto" and collective in variants.names():
        variant, measured = auto_rule(collective, nbytes, world_size)
        if interpreted:  # the table's launch shapes are GPU measurements
            measured = {}
    chosen = variants.get(collective, variant)
    if chosen is not None:
        chosen.check_backend(interpreted)
    fields = {name: getattr(config, name) or measured.get(name, 0) for name in TABLE_FIELDS}
    if variant == "ll" and not interpreted:
        # tiles of 32-bit words, the fastest measured on 2 x H200 for each size class
        default = 256 if nbytes <= (256 << 10) else 1024 if nbytes <= (2 << 20) else 2048
    else:
        default = 1024 if interpreted else (1024 if nbytes <= (64 << 10) else 4096)
    fields["block_size"] = fields["block_size"] or default
    fields["num_warps"] = fields["num_warps"] or (4 if fields["block_size"] <= 1024 else 8)
    return dataclasses.replace(config, variant=variant, **fields)


#: Config fields a tuning-table rule may set besides the variant (``Config(variant="auto")``
#: on GPUs; fields the caller sets win).
TABLE_FIELDS = ("block_size", "num_warps", "chunk_elements", "programs")
#: Environment variable naming a tuning table to use instead of the packaged one.
_PACKAGED_TABLE = Path(__file__).with_name("tuning.json")


@functools.cache
def _load_table(path: str) -> dict:
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"iris.ccl: cannot read the tuning table {path} ({TABLE_ENV}): {e}") from e
    for scope in [table.get("default", {}), *table.get("world_sizes", {}).values()]:
        for collective, rules in scope.items():
            ok = isinstance(rules, list) and rules and rules[-1][0] is None
            ok = ok and all(_valid_rule(r, collective) for r in rules)
            if not ok:
                raise RuntimeError(
                    f"iris.ccl: tuning table {path}: rules for {collective!r} must be [[max_bytes, variant], "
                    f"..., [null, variant]] with variants of {collective}, each optionally followed by "
                    f"{{field: value}} of {list(TABLE_FIELDS)} (valid Config values), got {rules!r}"
                )
    return table


def _valid_rule(rule: object, collective: str) -> bool:
    """``[max_bytes or None, variant]`` or ``[max_bytes or None, variant, {field: value}]``."""
    if not isinstance(rule, list) or len(rule) not in (2, 3) or not isinstance(rule[1], str):
        return False
    if variants.get(collective, rule[1]) is None:  # a registered variant ("auto" is none)
        return False
    if not (rule[0] is None or (isinstance(rule[0], int) and rule[0] >= 0)):
        return False
    if len(rule) == 3:
        fields = rule[2]
        if not isinstance(fields, dict) or not set(fields) <= set(TABLE_FIELDS):
            return False
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in fields.values()):
            return False
        try:
            Config(**fields)
        except ValueError:
            return False
    return True


def tuning_table() -> dict:
    """The tuning table in use: the file ``$IRIS_CCL_TABLE`` names, else the packaged
    ``tuning.json`` (measured on 2 x H200)."""
    return _load_table(table_path() or str(_PACKAGED_TABLE))


def auto_variant(collective: str, nbytes: int, world_size: int) -> str:
    """The variant ``Config(variant="auto")`` runs for a message of ``nbytes`` (the output
    for all_gather, the input otherwise) on ``world_size`` ranks."""
    return auto_rule(collective, nbytes, world_size)[0]


def auto_rule(collective: str, nbytes: int, world_size: int) -> tuple[str, dict[str, int]]:
    """The variant ``Config(variant="auto")`` runs for a message of ``nbytes`` (see
    :func:`auto_variant`) and the launch fields (of :data:`TABLE_FIELDS`) the table measured
    for it, ``{}`` where the rule names none."""
    table = tuning_table()
    rules = table.get("world_sizes", {}).get(str(world_size), {}).get(collective)
    rules = rules or table.get("default", {}).get(collective) or [[None, variants.default(collective)]]
    rule = next((r for r in rules if r[0] is None or nbytes <= r[0]), rules[-1])
    return rule[1], dict(rule[2]) if len(rule) == 3 else {}


def __getattr__(name: str):
    """``VARIANTS``: the variants each collective accepts ("auto" picks from the table), as
    registered in :mod:`iris.ccl.variants` (read when first asked for: the modules holding
    the variants import this one)."""
    if name == "VARIANTS":
        return variants.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
