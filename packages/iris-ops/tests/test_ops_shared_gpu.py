"""Ranks sharing a GPU, in iris.ops (CPU tier, the real selection with real inputs): where
the capabilities say the GPU is shared, ``Config(path="auto")`` reads no table of paths (the
user's included) but the heuristic."""

import functools

from iris.ccl import tuning
from iris.mem.testing import hopper_capabilities as h200
from iris.ops import _select


def test_auto_path_reads_no_table_where_ranks_share_the_gpu(tmp_path, monkeypatch):
    path = str(tmp_path / "ops.json")
    _select.TABLES.write(path, "NVIDIA H200", 2, {"matmul_all_reduce": [[None, "fused"]]}, "a test")
    monkeypatch.setenv("IRIS_OPS_TABLE", path)
    heuristic = functools.partial(_select.heuristic_rules, "matmul_all_reduce", 2, True, False)
    rules, source = _select.TABLES.rules_for_machine("matmul_all_reduce", 2, h200(1), heuristic)
    assert (rules, source) == ([[None, "fused"]], path)
    rules, source = _select.TABLES.rules_for_machine("matmul_all_reduce", 2, h200(2), heuristic)
    assert (rules, source) == (heuristic(), "heuristic")
    # the table said fused at any size; the heuristic keeps a small GEMM composed
    assert tuning.pick(rules, 1 << 20)[1] == "composed"
