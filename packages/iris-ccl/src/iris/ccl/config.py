"""``Config``: how a collective runs, and the table that picks one by message size."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import iris.mem

from . import _tuning, tuning, variants
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


def select(
    collective: str, nbytes: int, world_size: int, interpreted: bool, config: Config | None, device=None
) -> Config:
    """The configuration to run: ``config`` with every "choose" field filled in.

    With ``variant="auto"`` the variant, and on GPUs the tile, warps and programs the table
    measured for it, come from the tuning table of ``device``'s GPU model and the group size
    or the heuristic (:func:`auto_rule`; ``device`` None: the default device); fields the caller set
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
        variant, measured = auto_rule(collective, nbytes, world_size, device)
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


def _valid_rule(collective: str, rule: list) -> bool:
    """``[max_bytes or None, variant]`` or ``[max_bytes or None, variant, {field: value}]``
    with a registered variant of ``collective`` ("auto" is none) and launch fields of
    :data:`TABLE_FIELDS` that make a valid :class:`Config`."""
    if len(rule) not in (2, 3) or not isinstance(rule[1], str) or variants.get(collective, rule[1]) is None:
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


#: The tuning tables of the collectives: ``tables[GPU model][group size][collective]`` =
#: ``[[max_bytes, variant], ..., [null, variant]]``, a rule optionally followed by the
#: launch fields measured for it; ``IRIS_CCL_TABLE`` may also name a table of the first,
#: model-less form (``"world_sizes"`` / ``"default"``, as ``benchmarks/ccl/bench_ccl.py
#: --write-table`` writes), which then applies to whatever GPU it is used on.
TABLES = tuning.TableFormat(
    owner="iris.ccl",
    env=TABLE_ENV,
    packaged=Path(__file__).with_name("tuning.json"),
    key="collective",
    bound="max_bytes",
    choice="variant",
    check=_valid_rule,
    requirement=lambda collective: (
        f"with variants of {collective}, each optionally followed by {{field: value}} of "
        f"{list(TABLE_FIELDS)} (valid Config values)"
    ),
    about="iris.ccl tuning table written by python -m iris.ccl.tune (iris.ccl.tuning)",
    legacy=True,
)
# the names benchmarks/ccl/bench_ccl.py reads the packaged table by
_PACKAGED_TABLE = TABLES.packaged
_load_table = TABLES.load


def tuning_table() -> dict:
    """The tuning table file in use: the one ``$IRIS_CCL_TABLE`` names, else the packaged
    ``tuning.json`` (keyed by GPU model and group size; see :data:`TABLES`)."""
    return TABLES.load(table_path() or str(TABLES.packaged))


def rules_for(collective: str, world_size: int, model: str, nvlink: bool | None) -> tuple[list, str]:
    """The rules ``auto`` uses for ``collective`` on ``world_size`` GPUs of ``model`` (see
    :func:`iris.ccl.tuning.model_key`), and where they come from (a path, or
    ``"heuristic"``): ``IRIS_CCL_TABLE``, the packaged table, else
    :func:`iris.ccl._tuning.heuristic_rules` by ``nvlink``."""
    heuristic = functools.partial(_tuning.heuristic_rules, collective, world_size, nvlink)
    return TABLES.rules_for(collective, world_size, model, heuristic)


def auto_variant(collective: str, nbytes: int, world_size: int, device=None) -> str:
    """The variant ``Config(variant="auto")`` runs for a message of ``nbytes`` (the output
    for all_gather, the input otherwise) on ``world_size`` ranks of ``device`` (None: the
    default device)."""
    return auto_rule(collective, nbytes, world_size, device)[0]


def auto_rule(collective: str, nbytes: int, world_size: int, device=None) -> tuple[str, dict[str, int]]:
    """The variant ``Config(variant="auto")`` runs for a message of ``nbytes`` (see
    :func:`auto_variant`) and the launch fields (of :data:`TABLE_FIELDS`) the table measured
    for it, ``{}`` where the rule names none. The rules are those measured for ``device``'s
    GPU model and ``world_size`` (``IRIS_CCL_TABLE``, then the packaged table), else the
    heuristic of :func:`iris.ccl._tuning.heuristic_rules`; the heuristic alone where ranks
    share the GPU (:attr:`iris.mem.Capabilities.shared`)."""
    caps = iris.mem.capabilities(device if device is not None else iris.mem.default_device())
    heuristic = functools.partial(_tuning.heuristic_rules, collective, world_size, caps.nvlink)
    rules, _ = TABLES.rules_for_machine(collective, world_size, caps, heuristic)  # no table on a shared GPU
    rule = tuning.pick(rules, nbytes)
    return rule[1], dict(rule[2]) if len(rule) == 3 else {}


def __getattr__(name: str):
    """``VARIANTS``: the variants each collective accepts ("auto" picks from the table), as
    registered in :mod:`iris.ccl.variants` (read when first asked for: the modules holding
    the variants import this one)."""
    if name == "VARIANTS":
        return variants.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
