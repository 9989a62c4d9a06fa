"""The heuristic behind ``Config(variant="auto")`` on machines no tuning table was measured
on: a variant by message size, group size and whether the GPU has NVLink.

The tables themselves (``IRIS_CCL_TABLE``, then the packaged ``tuning.json``, keyed by GPU
model and group size) are read by :data:`iris.ccl.config.TABLES`, an
:class:`iris.ccl.tuning.TableFormat`; this heuristic serves where neither holds rules for
the machine.
"""

from __future__ import annotations

from . import variants

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


def heuristic_rules(collective: str, world_size: int, nvlink: bool | None) -> list:
    """The rules ``auto`` uses where no table was measured for the machine: ``ll`` up to
    :data:`LL_BYTES` (scaled by 2/G but all_gather), then :data:`NVLINK_BULK`; when the GPU
    is known to have no NVLink, the copy-engine variant from :data:`PCIE_COPY_ENGINE_BYTES`
    up for collectives that have one."""
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
