"""Which path a fused op takes for a shape: its fused kernel, or the composition of
``torch.matmul`` and an iris.ccl collective (``Config.path``).

``Config(path="auto")`` (the default) decides from the size of the GEMM one rank computes,
``work = M x N x K`` multiply-adds (M its rows: this rank's rows for matmul_all_gather, the
gathered rows for all_gather_matmul), with rules read, first match wins, from:

1. the table file ``IRIS_OPS_TABLE`` names (written by ``python -m iris.ops.tune``);
2. the packaged ``tuning.json``;

each keyed by GPU model (``iris.mem.capabilities(device).name``) and group size and read
through :mod:`iris.ccl.tuning` (:data:`TABLES`)::

    {"tables": {"<GPU model>": {"<group size>": {"<op>": [[max_work, path], ..., [null, path]]}}}}

(the first rule whose ``max_work`` is at least the call's work wins; null: any work), and
where neither holds rules for this model and group size,

3. :func:`heuristic_rules`, never a table measured on another machine, and nothing but the
   heuristic where ranks share the GPU (:attr:`iris.mem.Capabilities.shared`).

Every rank decides from the same facts (the shape, the group size, the GPU model and its
links), so every rank of a group of identical GPUs takes the same path.
"""

from __future__ import annotations

import functools
from pathlib import Path

import iris.mem
from iris.ccl import tuning

from .config import Config, check_config

OPS = ("matmul_all_reduce", "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_gather")
PATHS = ("fused", "composed")

#: Work (multiply-adds of one rank's GEMM) from which the heuristic runs the fused kernel in
#: a group of two GPUs joined by NVLink; in a group of G it is scaled by G/2. Below it the
#: composition is expected to be faster: estimated from the 2 x H200 measurements of
#: docs/performance.md (the fused ops against torch.matmul plus the time Iris's collective
#: takes for the same message), where the fused kernels trail matmul + NCCL at M <= 128
#: rows of 8192 x 4096 (work 2^32) and lead from M = 1024 (2^35) up. matmul_all_gather,
#: whose rows are one rank's, led from its smallest shape there, 8 rows (2^28) but only
#: narrowly: it switches from 2^31.
FUSED_FROM = {
    "matmul_all_reduce": 1 << 33,
    "all_gather_matmul": 1 << 33,
    "matmul_reduce_scatter": 1 << 33,
    "matmul_all_gather": 1 << 31,
}


def heuristic_rules(op: str, world_size: int, nvlink: bool | None, interpreted: bool) -> list:
    """The rules ``auto`` uses without a measured table:

    * kernels interpreted (the CPU backend, which exists to run and test the kernels):
      always fused;
    * a group of one: composed (there is nothing to overlap, and ``torch.matmul`` is the
      faster GEMM);
    * GPUs known to have no NVLink (peers over PCIe): composed; the fused kernels were
      tuned and measured over NVLink only;
    * otherwise composed below :data:`FUSED_FROM` (scaled by G/2: the fused kernels
      synchronise with every peer), fused from there up.
    """
    if interpreted:
        return [[None, "fused"]]
    if world_size <= 1 or nvlink is False:
        return [[None, "composed"]]
    return [[FUSED_FROM[op] * world_size // 2 - 1, "composed"], [None, "fused"]]


def _valid_rule(op: str, rule: list) -> bool:
    """``[max_work or None, path]`` for an op of :data:`OPS`."""
    return op in OPS and len(rule) == 2 and rule[1] in PATHS


#: The path tables of the fused ops: ``tables[GPU model][group size][op]`` =
#: ``[[max_work, path], ..., [null, path]]``.
TABLES = tuning.TableFormat(
    owner="iris.ops",
    env="IRIS_OPS_TABLE",
    packaged=Path(__file__).with_name("tuning.json"),
    key="op",
    bound="max_work",
    choice="path",
    check=_valid_rule,
    requirement=lambda op: f"for an op of {list(OPS)} with paths of {list(PATHS)}",
    about="iris.ops path table written by python -m iris.ops.tune (iris.ops._select)",
)


def rules_for(
    op: str, world_size: int, model: str, nvlink: bool | None, interpreted: bool
) -> tuple[list, str]:
    """The rules ``auto`` uses for ``op`` on ``world_size`` GPUs of ``model`` (see
    :func:`iris.ccl.tuning.model_key`), and where they come from (a table's path, or
    ``"heuristic"``)."""
    heuristic = functools.partial(heuristic_rules, op, world_size, nvlink, interpreted)
    return TABLES.rules_for(op, world_size, model, heuristic)


def path(op: str, work: int, world_size: int, device, config: Config | None) -> str:
    """``"fused"`` or ``"composed"``: what ``op`` runs for a GEMM of ``work`` multiply-adds
    per rank in a group of ``world_size`` on ``device`` (``config.path`` unless "auto")."""
    check_config(config)
    chosen = config.path if config is not None else "auto"
    if chosen != "auto":
        return chosen
    caps = iris.mem.capabilities(device)
    heuristic = functools.partial(heuristic_rules, op, world_size, caps.nvlink, caps.interpreted)
    rules, _ = TABLES.rules_for_machine(op, world_size, caps, heuristic)  # no table on a shared GPU
    return tuning.pick(rules, work)[1]
