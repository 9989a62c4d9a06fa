"""Ranks sharing a GPU, in iris.ccl (CPU tier, the real functions with real inputs): where
the capabilities say the GPU is shared, ``Config(variant="auto")`` reads no tuning table
(neither the packaged one nor the user's) but the heuristic, and the tuners refuse to time
or write anything, with a message that says why."""

import functools

import pytest
import torch.distributed as dist

from iris.ccl import _tuning, config, tuning
from iris.mem.testing import hopper_capabilities as h200

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
# h200(n): an H200 that n ranks use (the packaged table holds rules for this model at 2 ranks)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_auto_reads_no_packaged_table_where_ranks_share_the_gpu(collective):
    heuristic = functools.partial(_tuning.heuristic_rules, collective, 2, True)
    own, source = config.TABLES.rules_for_machine(collective, 2, h200(1), heuristic)
    assert source == str(config.TABLES.packaged) and own != heuristic(), (own, source)
    shared, source = config.TABLES.rules_for_machine(collective, 2, h200(2), heuristic)
    assert (shared, source) == (heuristic(), "heuristic")


def test_auto_reads_no_user_table_where_ranks_share_the_gpu(tmp_path, monkeypatch):
    path = str(tmp_path / "ccl.json")
    config.TABLES.write(path, "NVIDIA H200", 3, {"all_reduce": [[None, "one_shot"]]}, "a test")
    monkeypatch.setenv(config.TABLE_ENV, path)
    heuristic = functools.partial(_tuning.heuristic_rules, "all_reduce", 3, True)
    choose = functools.partial(config.TABLES.rules_for_machine, "all_reduce", 3, heuristic=heuristic)
    assert choose(caps=h200(1)) == ([[None, "one_shot"]], path)
    assert choose(caps=h200(3)) == (heuristic(), "heuristic")


def test_tuners_refuse_where_ranks_share_the_gpu(capsys):
    assert not dist.is_initialized(), "a test left a process group in the pytest process"
    assert tuning.timing_refusal(h200(1), "python -m iris.ccl.tune") is None
    tuning.refuse_timing(h200(1), "python -m iris.ccl.tune")  # a GPU of its own: goes on
    message = tuning.timing_refusal(h200(3), "python -m iris.ccl.tune")
    for words in ("python -m iris.ccl.tune: 3 ranks share this GPU", "no table is written", "no ratio"):
        assert words in message, message
    with pytest.raises(SystemExit) as exit_info:
        tuning.refuse_timing(h200(3), "python -m iris.ops.tune")
    assert exit_info.value.code == 2
    assert "python -m iris.ops.tune: 3 ranks share this GPU" in capsys.readouterr().err
