"""The tuning tables behind ``Config(variant="auto")``, keyed by GPU model and group size,
and the heuristic that serves machines no table was measured on.

A table file (JSON) holds::

    {"tables": {"<GPU model>": {"<group size>": {"<collective>": RULES, ...}, ...}, ...},
     "about": "...", "measured": "..."}

where ``RULES`` is ``[[max_bytes, variant], ..., [null, variant]]``: the first rule whose
``max_bytes`` (null: any size) is at least the call's message size wins; a rule may add a
third element, ``{block_size, num_warps, chunk_elements, programs}``, the launch shape
measured for it. The GPU model is the driver's name of the device
(``iris.mem.capabilities(device).name``, e.g. ``"NVIDIA H200"``).

Where rules come from, first match wins:

1. the file ``IRIS_CCL_TABLE`` names (written by ``python -m iris.ccl.tune``): its rules for
   this GPU model and group size; a table in the older form (``"world_sizes"`` and
   ``"default"`` without a model, as ``benchmarks/ccl/bench_ccl.py --write-table`` writes)
   applies to whatever GPU it is used on, since the user chose it;
2. the packaged ``tuning.json``: its rules for this GPU model and group size only;
3. :func:`heuristic_rules`: by message size, group size and whether the GPU has NVLink.
   A table measured on another model or group size is never used.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from . import variants
from .settings import TABLE_ENV, table_path

#: Config fields a rule may set besides the variant.
TABLE_FIELDS = ("block_size", "num_warps", "chunk_elements", "programs")
PACKAGED_TABLE = Path(__file__).with_name("tuning.json")

#: Largest message (bytes, as ``select`` sees it) the heuristic sends the ``ll`` way in a
#: group of two; in a group of G it is scaled by 2/G (each rank sends G - 1 copies), except
#: all_gather, whose size is already the output's (G times the input).
LL_BYTES = {
    "all_reduce": 256 << 10,
    "all_gather": 1 << 20,
    "reduce_scatter": 512 << 10,
    "all_to_all": 512 << 10,
}
#: The heuristic's variant above ``ll`` on NVLink (or where the link is not known): those
#: the 2 x H200 table picks for most large sizes and that run on every backend.
NVLINK_BULK = {"all_reduce": "two_shot", "all_gather": "push", "reduce_scatter": "pull", "all_to_all": "push"}
#: Without NVLink (peers over PCIe): the copy engines for the bulk of data movement from
#: this size (bytes) up, where a collective has a copy-engine variant.
PCIE_COPY_ENGINE_BYTES = 8 << 20


#: The model key of a machine whose kernels run in Triton's interpreter (the CPU backend).
INTERPRETER = "interpreter"


def model_key(caps) -> str:
    """The key of ``caps``' machine in tuning tables: the GPU model, or :data:`INTERPRETER`."""
    return caps.name or INTERPRETER


def heuristic_rules(collective: str, world_size: int, nvlink: bool | None) -> list:
    """The rules ``auto`` uses where no table was measured for the machine (see the module
    docstring): ``ll`` up to :data:`LL_BYTES` (scaled by 2/G but all_gather), then
    :data:`NVLINK_BULK`; when the GPU is known to have no NVLink, the copy-engine variant
    from :data:`PCIE_COPY_ENGINE_BYTES` up for collectives that have one."""
    if collective not in LL_BYTES:
        return [[None, variants.default(collective)]]
    limit = LL_BYTES[collective]
    if collective != "all_gather":
        limit = limit * 2 // max(world_size, 2)
    rules: list = [[limit, "ll"]]
    bulk = NVLINK_BULK[collective]
    if nvlink is False and variants.get(collective, "copy_engine") is not None:
        rules.append([max(limit, PCIE_COPY_ENGINE_BYTES), bulk])
        bulk = "copy_engine"
    rules.append([None, bulk])
    return rules


@functools.cache
def load(path: str) -> dict:
    """The table in ``path``, checked (a RuntimeError naming the file and what is wrong)."""
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"iris.ccl: cannot read the tuning table {path} ({TABLE_ENV}): {e}") from e
    if not isinstance(table, dict):
        kind = type(table).__name__
        raise RuntimeError(f"iris.ccl: tuning table {path}: expected a JSON object, got {kind}")
    scopes = [table.get("default", {}), *table.get("world_sizes", {}).values()]
    models = table.get("tables", {})
    if not isinstance(models, dict) or not all(isinstance(g, dict) for g in models.values()):
        raise RuntimeError(
            f'iris.ccl: tuning table {path}: "tables" must map GPU models to {{group size: rules}}, '
            f"got {models!r}"
        )
    for model, groups in models.items():
        for size, scope in groups.items():
            good_size = isinstance(size, str) and size.isdigit() and int(size) >= 1
            if not good_size or not isinstance(scope, dict):
                raise RuntimeError(
                    f'iris.ccl: tuning table {path}: {model!r} must map group sizes ("2", ...) to '
                    f"{{collective: rules}}, got {size!r}: {scope!r}"
                )
            scopes.append(scope)
    for scope in scopes:
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
    from .config import Config

    if not isinstance(rule, list) or len(rule) not in (2, 3) or not isinstance(rule[1], str):
        return False
    if variants.get(collective, rule[1]) is None:  # a registered variant ("auto" is none)
        return False
    if not (rule[0] is None or (isinstance(rule[0], int) and not isinstance(rule[0], bool) and rule[0] >= 0)):
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


def measured_rules(table: dict, collective: str, world_size: int, model: str, legacy: bool) -> list | None:
    """The rules ``table`` holds for ``collective`` on ``world_size`` GPUs of ``model`` (None:
    none); ``legacy``: also its model-less ``world_sizes`` / ``default`` rules."""
    rules = table.get("tables", {}).get(model, {}).get(str(world_size), {}).get(collective) if model else None
    if rules is None and legacy:
        rules = table.get("world_sizes", {}).get(str(world_size), {}).get(collective)
        rules = rules or table.get("default", {}).get(collective)
    return rules


def rules_for(collective: str, world_size: int, model: str, nvlink: bool | None) -> tuple[list, str]:
    """The rules ``auto`` uses for ``collective`` on ``world_size`` GPUs of ``model`` (``""``
    when interpreted), and where they come from (a path, or ``"heuristic"``)."""
    user = table_path()
    if user is not None:
        rules = measured_rules(load(user), collective, world_size, model, legacy=True)
        if rules:
            return rules, user
    rules = measured_rules(load(str(PACKAGED_TABLE)), collective, world_size, model, legacy=False)
    if rules:
        return rules, str(PACKAGED_TABLE)
    return heuristic_rules(collective, world_size, nvlink), "heuristic"


def pick(rules: list, nbytes: int) -> tuple[str, dict[str, int]]:
    """The variant and launch fields of the first rule of ``rules`` covering ``nbytes``."""
    rule = next((r for r in rules if r[0] is None or nbytes <= r[0]), rules[-1])
    return rule[1], dict(rule[2]) if len(rule) == 3 else {}


def fold(points: list[tuple[int, str, dict]]) -> list:
    """Rules from measured points ``(nbytes, fastest variant, its launch fields)``: sorted by
    size, neighbours with the same choice merged, the last one open-ended."""
    rules: list[list] = []
    for nbytes, variant, fields in sorted(points, key=lambda p: p[0]):
        rule = [variant, dict(fields)] if fields else [variant]
        if rules and rules[-1][1:] == rule:
            rules[-1][0] = nbytes
        else:
            rules.append([nbytes, *rule])
    if rules:
        rules[-1][0] = None
    return rules
