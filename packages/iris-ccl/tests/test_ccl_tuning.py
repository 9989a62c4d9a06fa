"""``Config(variant="auto")``'s tuning table and ``Config.programs`` of the persistent kernels.

* The packaged table is valid and picks, for every collective and world size, a variant the
  collective has; it serves only the GPU model and group size it was measured on (others get
  the heuristic); ``IRIS_CCL_TABLE`` replaces it; a malformed table is a clear error;
  ``python -m iris.ccl.tune`` writes a table ``auto`` reads.
* Persistent kernels give the torch result whatever the number of programs: one program
  looping over every tile, and more programs than tiles (the host caps it at the tiles);
  a launch of more programs than stay resident is refused.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import make_input, mismatch, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = pytest.mark.timeout(300)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def variant_for(rules: list, nbytes: int) -> str:
    """The variant of the rule of ``rules`` that covers ``nbytes``."""
    from iris.ccl import tuning

    return tuning.pick(rules, nbytes)[1]


def test_packaged_table_picks_a_variant_of_each_collective():
    from iris.ccl import config

    table = config.tuning_table()
    assert "2" in table["tables"]["NVIDIA H200"], "the packaged table holds the measured 2 x H200"
    for collective in COLLECTIVES:
        for world in (1, 2, 3, 4, 8):
            for model, nvlink in (("NVIDIA H200", True), ("NVIDIA H100 PCIe", False), ("interpreter", None)):
                rules, _ = config.rules_for(collective, world, model, nvlink)
                for nbytes in (1, 8 << 10, 1 << 20, 64 << 20, 1 << 30, 1 << 40):
                    variant = variant_for(rules, nbytes)
                    assert variant in config.VARIANTS[collective] and variant not in ("auto", "gluon")
    # the measured table: small messages take the barrier-free variant, large ones the copy engines
    h200 = config.rules_for("all_reduce", 2, "NVIDIA H200", True)
    assert h200[1].endswith("tuning.json")
    assert variant_for(h200[0], 8 << 10) == "ll" and variant_for(h200[0], 1 << 30) == "copy_engine"
    # on the CPU backend (no GPU model) auto takes the heuristic
    assert config.select("all_reduce", 8 << 10, 2, True, None).variant == "ll"
    assert config.auto_variant("all_reduce", 1 << 30, 2) == "two_shot"


def test_unknown_gpu_model_takes_the_heuristic_not_the_h200_table():
    """A GPU model (or group size) the packaged table was not measured on gets the documented
    heuristic, never the 2 x H200 rules: by size, group size and NVLink."""
    from iris.ccl import _tuning, config

    h200, source = config.rules_for("all_reduce", 2, "NVIDIA H200", True)
    assert source.endswith("tuning.json")
    for model, world in (("NVIDIA H100 80GB HBM3", 2), ("NVIDIA H200", 4), ("NVIDIA H200", 3)):
        for nvlink in (True, False, None):
            rules, source = config.rules_for("all_reduce", world, model, nvlink)
            assert source == "heuristic" and rules != h200
            assert rules == _tuning.heuristic_rules("all_reduce", world, nvlink)
    # by size: ll for small messages (2 x H200 picks boxed at 512 KiB, the heuristic two_shot)
    nvl = config.rules_for("all_reduce", 2, "NVIDIA B200", True)[0]
    assert variant_for(nvl, 128 << 10) == "ll" and variant_for(nvl, 512 << 10) == "two_shot"
    assert variant_for(h200, 512 << 10) == "boxed"
    # by group size: the ll range shrinks as 2/G (all_gather, keyed by the output, keeps it)
    assert _tuning.heuristic_rules("all_reduce", 8, True)[0] == [64 << 10, "ll"]
    assert _tuning.heuristic_rules("all_gather", 8, True)[0] == [1 << 20, "ll"]
    # by NVLink: peers over PCIe move bulk data with the copy engines
    pcie = _tuning.heuristic_rules("all_gather", 2, False)
    assert variant_for(pcie, 64 << 20) == "copy_engine" and variant_for(pcie, 4 << 20) == "push"
    assert variant_for(_tuning.heuristic_rules("reduce_scatter", 2, False), 1 << 30) == "pull"


def test_tune_rules_fold_and_the_written_table_is_read(tmp_path, monkeypatch):
    """``python -m iris.ccl.tune``'s pieces: measured points fold into rules; the table is
    written under the model and group size (keeping other entries) and ``auto`` reads it
    through IRIS_CCL_TABLE for that model only."""
    from iris.ccl import config, tune, tuning

    points = [(8 << 10, "ll"), (1 << 20, "boxed", {"block_size": 8192}), (2 << 20, "boxed")]
    points += [(4 << 20, "boxed"), (64 << 20, "two_shot")]
    assert tuning.fold(points) == [
        [8 << 10, "ll"],
        [1 << 20, "boxed", {"block_size": 8192}],
        [4 << 20, "boxed"],
        [None, "two_shot"],
    ]
    assert tune.table_size("all_gather", 1 << 20, 4) == 4 << 20 and tune.parse_size("2MiB") == 2 << 20
    path = str(tmp_path / "mine.json")
    config.TABLES.write(path, "Test GPU", 4, {"all_reduce": [[1024, "ll"], [None, "one_shot"]]}, "note")
    config.TABLES.write(path, "Test GPU", 2, {"all_gather": [[None, "pull"]]}, "note")
    table = json.loads(Path(path).read_text())
    assert set(table["tables"]["Test GPU"]) == {"2", "4"}
    with pytest.raises(RuntimeError, match="variants of all_reduce"):
        config.TABLES.write(path, "Test GPU", 2, {"all_reduce": [[None, "pull"]]}, "note")
    monkeypatch.setenv("IRIS_CCL_TABLE", path)
    assert config.rules_for("all_reduce", 4, "Test GPU", True) == ([[1024, "ll"], [None, "one_shot"]], path)
    assert config.rules_for("all_reduce", 4, "Other GPU", True)[1] == "heuristic"
    assert config.rules_for("all_gather", 2, "Test GPU", None)[0] == [[None, "pull"]]


# ---------------------------------------------------------------------------- iris.ccl.tuning


def table_format(tmp_path, packaged: dict, legacy: bool = False):
    """A table format of a made-up owner: keys "k1" and "k2", choices "a" and "b" (optionally
    followed by a positive int), the user's table in ``IRIS_TEST_TABLE``."""
    from iris.ccl import tuning

    path = tmp_path / "packaged.json"
    path.write_text(json.dumps(packaged))
    return tuning.TableFormat(
        owner="iris.test",
        env="IRIS_TEST_TABLE",
        packaged=path,
        key="thing",
        bound="max_size",
        choice="choice",
        check=lambda key, rule: key in ("k1", "k2") and rule[1] in ("a", "b") and len(rule) <= 3,
        requirement=lambda key: f"for a thing of k1, k2 with choices a, b (not {key})",
        about="a test table",
        legacy=legacy,
    )


def test_tuning_pick_takes_the_first_covering_rule_and_fold_merges_neighbours():
    from iris.ccl import tuning

    rules = [[10, "a"], [100, "b", 7], [None, "a"]]
    assert [tuning.pick(rules, n) for n in (0, 10, 11, 100, 101, 1 << 40)] == [
        [10, "a"], [10, "a"], [100, "b", 7], [100, "b", 7], [None, "a"], [None, "a"],
    ]  # fmt: skip
    # unsorted points; equal neighbours merge into the larger size; the last is open-ended
    points = [(64, "b"), (1, "a"), (8, "a"), (16, "b", 3), (32, "b", 3), (128, "b")]
    assert tuning.fold(points) == [[8, "a"], [32, "b", 3], [None, "b"]]
    assert tuning.fold([(5, "a")]) == [[None, "a"]] and tuning.fold([]) == []
    # a rule folded from points picks, at every measured size, what was measured there
    folded = tuning.fold(points)
    for size, *choice in points:
        assert tuning.pick(folded, size)[1:] == choice


def test_tuning_model_key_is_the_gpu_model_or_interpreter():
    import dataclasses

    import iris.mem
    from iris.ccl import tuning

    caps = iris.mem.capabilities(torch.device("cpu"))
    assert tuning.model_key(dataclasses.replace(caps, name="")) == tuning.INTERPRETER == "interpreter"
    assert tuning.model_key(dataclasses.replace(caps, name="NVIDIA H200")) == "NVIDIA H200"


@pytest.mark.parametrize(
    "table, legacy, words",
    [
        ("{not json", False, ["iris.test: cannot read the tuning table", "IRIS_TEST_TABLE"]),
        ([1, 2], False, ["iris.test: tuning table", "JSON object", "list"]),
        ({"rules": []}, False, ['"tables" must map GPU models']),
        ({"tables": {"X": []}}, False, ['"tables" must map GPU models']),
        ({"tables": {"X": {"two": {}}}}, False, ["'X' must map group sizes", "thing"]),
        ({"tables": {"X": {"0": {}}}}, False, ["'X' must map group sizes"]),
        ({"tables": {"X": {"2": []}}}, False, ["'X' must map group sizes"]),
        ({"tables": {"X": {"2": {"k1": []}}}}, False, ["'X', group size 2: rules of 'k1'", "[null, choice]"]),
        ({"tables": {"X": {"2": {"k1": [[4, "a"]]}}}}, False, ["[[max_size, choice], ..., [null, choice]]"]),
        ({"tables": {"X": {"2": {"k1": [[None, "a"], [None, "b"]]}}}}, False, ["rules of 'k1'"]),
        ({"tables": {"X": {"2": {"k1": [[-1, "a"], [None, "b"]]}}}}, False, ["rules of 'k1'"]),
        ({"tables": {"X": {"2": {"k1": [[True, "a"], [None, "b"]]}}}}, False, ["rules of 'k1'"]),
        ({"tables": {"X": {"2": {"k1": [[None, "c"]]}}}}, False, ["with choices a, b (not k1)"]),
        ({"tables": {"X": {"2": {"k3": [[None, "a"]]}}}}, False, ["(not k3)"]),
        ({"default": {"k1": [[None, "a"]]}}, False, ['"tables" must map GPU models']),
        ({"default": {"k1": [[4, "a"]]}}, True, ["\"default\": rules of 'k1'"]),
        ({"default": [1]}, True, ['"default" must map each thing']),
        ({"world_sizes": {"2": {"k2": [[None, "c"]]}}}, True, ['"world_sizes", group size 2: rules of']),
        ({"world_sizes": []}, True, ['"world_sizes" must map group sizes']),
    ],
)
def test_tuning_load_names_the_file_and_the_fault(tmp_path, table, legacy, words):
    fmt = table_format(tmp_path, {"tables": {}}, legacy)
    path = tmp_path / "bad.json"
    path.write_text(table if isinstance(table, str) else json.dumps(table))
    with pytest.raises(RuntimeError) as info:
        fmt.load(str(path))
    assert str(path) in str(info.value) and all(w in str(info.value) for w in words), info.value


def test_tuning_rules_come_from_the_user_table_then_the_packaged_one_then_the_heuristic(
    tmp_path, monkeypatch
):
    """Each source serves only its GPU model and group size; the model-less form (a format
    with ``legacy``) only from the user's table, for any model."""
    packaged = {"tables": {"GPU A": {"2": {"k1": [[None, "a"]]}}}, "default": {"k2": [[None, "a"]]}}
    calls = []

    def heuristic():
        calls.append(1)
        return [[None, "b"]]

    monkeypatch.delenv("IRIS_TEST_TABLE", raising=False)
    for legacy in (False, True):
        fmt = table_format(tmp_path, packaged, legacy)
        calls.clear()
        assert fmt.rules_for("k1", 2, "GPU A", heuristic) == ([[None, "a"]], str(fmt.packaged))
        assert not calls, "the heuristic is asked only where no table holds rules"
        for key, size, model in (("k1", 4, "GPU A"), ("k1", 2, "GPU B"), ("k2", 2, "GPU A")):
            assert fmt.rules_for(key, size, model, heuristic) == ([[None, "b"]], "heuristic")
    user = tmp_path / "user.json"
    user.write_text(
        json.dumps(
            {"tables": {"GPU A": {"4": {"k1": [[9, "b"], [None, "a"]]}}}, "default": {"k2": [[None, "b", 1]]}}
        )
    )
    monkeypatch.setenv("IRIS_TEST_TABLE", str(user))
    for legacy in (False, True):
        fmt = table_format(tmp_path, packaged, legacy)
        assert fmt.rules_for("k1", 4, "GPU A", heuristic) == ([[9, "b"], [None, "a"]], str(user))
        # the user's table has nothing for this model and size: the packaged one serves
        assert fmt.rules_for("k1", 2, "GPU A", heuristic) == ([[None, "a"]], str(fmt.packaged))
        assert fmt.rules_for("k1", 4, "GPU B", heuristic)[1] == "heuristic"
        model_less = fmt.rules_for("k2", 8, "GPU B", heuristic)
        assert model_less == (([[None, "b", 1]], str(user)) if legacy else ([[None, "b"]], "heuristic"))
    # a bad user table is an error, not a silent fallback
    user.write_text(json.dumps({"tables": {"GPU A": {"4": {"k1": [[None, "c"]]}}}}))
    with pytest.raises(RuntimeError, match="user.json"):
        table_format(tmp_path, packaged).rules_for("k1", 4, "GPU A", heuristic)


def test_tuning_write_round_trip_keeps_other_entries(tmp_path):
    """``TableFormat.write`` makes a file that loads to what was written, merges into an
    existing one (other models and group sizes kept, the same one replaced), and leaves the
    file as it was when the new rules are bad."""
    fmt = table_format(tmp_path, {"tables": {}})
    path = str(tmp_path / "out.json")
    fmt.write(path, "GPU A", 2, {"k1": [[64, "a"], [None, "b"]]}, "measured on A")
    table = fmt.load(path)
    assert table["tables"] == {"GPU A": {"2": {"k1": [[64, "a"], [None, "b"]]}}}
    assert table["about"] == "a test table" and table["measured"] == {"GPU A": {"2": "measured on A"}}
    fmt.write(path, "GPU A", 4, {"k2": [[None, "a"]]}, "4 ranks")
    fmt.write(path, "GPU B", 2, {"k1": [[None, "b", 5]]}, "B")
    fmt.write(path, "GPU A", 2, {"k1": [[None, "a"]]}, "again")
    table = fmt.load(path)  # read anew: write drops what was cached
    assert table["tables"] == {
        "GPU A": {"2": {"k1": [[None, "a"]]}, "4": {"k2": [[None, "a"]]}},
        "GPU B": {"2": {"k1": [[None, "b", 5]]}},
    }
    assert table["measured"]["GPU A"] == {"2": "again", "4": "4 ranks"}
    before = Path(path).read_text()
    with pytest.raises(RuntimeError, match="with choices a, b"):
        fmt.write(path, "GPU A", 2, {"k1": [[None, "z"]]}, "bad")
    assert Path(path).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "packaged.json"]


@pytest.mark.full
def test_tune_command_smoke_writes_a_table_auto_reads(tmp_path):
    """``torchrun -m iris.ccl.tune --smoke`` end to end on two CPU ranks; a child process
    with IRIS_CCL_TABLE pointing at its output runs what it measured."""
    path = tmp_path / "ccl.json"
    env = {**os.environ, "IRIS_BACKEND": "cpu", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "iris.ccl.tune", "--smoke", "--collectives", "all_reduce,all_gather", "--out", str(path)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    rules = json.loads(path.read_text())["tables"]["interpreter"]["2"]
    assert set(rules) == {"all_reduce", "all_gather"} and rules["all_reduce"][-1][0] is None
    code = "from iris.ccl import config as c; print(c.auto_variant('all_reduce', 1 << 30, 2))"
    out = _in_child(code, str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == rules["all_reduce"][-1][1]


def _in_child(code: str, table: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "IRIS_CCL_TABLE": table, "IRIS_BACKEND": "cpu"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_env_table_replaces_the_packaged_one(tmp_path):
    path = tmp_path / "table.json"
    rules = {c: [[1024, "pull" if c != "all_reduce" else "ring"], [None, "boxed"]] for c in COLLECTIVES}
    path.write_text(json.dumps({"world_sizes": {"2": rules}, "default": rules}))
    code = (
        "from iris.ccl import config as c;"
        "print(c.auto_variant('all_reduce', 1000, 2), c.auto_variant('all_reduce', 4096, 2),"
        " c.auto_variant('all_gather', 10, 5))"
    )
    out = _in_child(code, str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ring", "boxed", "pull"]


def test_table_launch_fields_fill_what_the_caller_left_open(tmp_path):
    """A rule may carry launch fields: Config(variant="auto") takes them on GPUs, a field the
    caller set wins, explicit variants and the interpreter keep the measured defaults."""
    path = tmp_path / "table.json"
    rules = {c: [[None, "push"]] for c in COLLECTIVES}
    rules["all_reduce"] = [
        [1 << 20, "ll"],
        [None, "one_shot", {"block_size": 16384, "num_warps": 32, "programs": 48}],
    ]
    path.write_text(json.dumps({"world_sizes": {"2": rules}}))
    code = (
        "from iris.ccl import config as c\n"
        "def show(cfg): print(cfg.variant, cfg.block_size, cfg.num_warps, cfg.programs)\n"
        "print(c.auto_rule('all_reduce', 64 << 20, 2), c.auto_rule('all_reduce', 1024, 2))\n"
        "show(c.select('all_reduce', 64 << 20, 2, False, None))\n"
        "show(c.select('all_reduce', 64 << 20, 2, False, c.Config(num_warps=8)))\n"
        "show(c.select('all_reduce', 64 << 20, 2, True, None))\n"
        "show(c.select('all_reduce', 64 << 20, 2, False, c.Config(variant='one_shot')))\n"
    )
    out = _in_child(code, str(path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "('one_shot', {'block_size': 16384, 'num_warps': 32, 'programs': 48}) ('ll', {})"
    assert lines[1:] == [
        "one_shot 16384 32 48",
        "one_shot 16384 8 48",
        "one_shot 1024 4 0",
        "one_shot 4096 8 0",
    ]


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", ["cannot read the tuning table"]),
        (json.dumps({"default": {"all_reduce": [[1024, "one_shot"]]}}), ["null", "all_reduce"]),
        (json.dumps({"default": {"all_gather": [[None, "two_shot"]]}}), ["variants of all_gather"]),
        (json.dumps({"default": {"all_reduce": [[None, "ll", {"tiles": 4}]]}}), ["block_size", "all_reduce"]),
        (json.dumps({"default": {"all_reduce": [[None, "ll", {"num_warps": 3}]]}}), ["valid Config values"]),
        (
            json.dumps({"default": {"all_reduce": [[None, "ll", {"programs": True}]]}}),
            ["valid Config values"],
        ),
        (json.dumps({"tables": {"NVIDIA H200": {"two": {}}}}), ["group sizes", "NVIDIA H200"]),
        (json.dumps({"tables": {"X": {"2": {"all_reduce": [[None, "push"]]}}}}), ["variants of all_reduce"]),
        (json.dumps([1, 2]), ["JSON object"]),
    ],
)
def test_bad_table_is_a_clear_error(tmp_path, monkeypatch, content, words):
    """In this process: IRIS_CCL_TABLE is read at every call (each file loaded once)."""
    from iris.ccl import config

    path = tmp_path / "table.json"
    path.write_text(content)
    monkeypatch.setenv("IRIS_CCL_TABLE", str(path))
    with pytest.raises(RuntimeError) as info:
        config.auto_variant("all_reduce", 1, 2)
    assert all(w in str(info.value) for w in words), info.value


def test_benchmark_writes_a_table_that_auto_reads(tmp_path, monkeypatch):
    """benchmarks/ccl/bench_ccl.py --configs --write-table, minus the GPU: rows as the
    benchmark times them (each shaped variant also in the listed shapes) fold into the
    fastest variant per size with its winning shape; the table it writes loads, and
    Config(variant="auto") runs the measured variant in the measured shape."""
    import importlib.util

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location(
        "bench_ccl_under_test", root / "benchmarks/ccl/bench_ccl.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    shapes = bench._parse_shapes("8192x16,16384x32p48")
    assert [bench._shape_label(s) for s in shapes] == ["@8192x16", "@16384x32p48"]
    with pytest.raises(ValueError, match="num_warps"):
        bench._parse_shapes("4096x3")

    def row(nbytes, times):
        r = {"collective": "all_reduce", "bytes": nbytes, "times_us": dict(times)}
        bench._best_shapes(r, shapes)
        return r

    rows = [
        row(
            8 << 10,
            {"iris_ll": 4.0, "iris_boxed": 6.0, "iris_boxed@8192x16": 7.0, "iris_auto": 4.1, "nccl": 9.0},
        ),
        row(8 << 20, {"iris_ll": 60.0, "iris_boxed": 40.0, "iris_boxed@8192x16": 35.0, "iris_auto": 36.0}),
        row(32 << 20, {"iris_boxed": 140.0, "iris_two_shot": 118.0, "iris_two_shot@16384x32p48": 111.0}),
        row(1 << 30, {"iris_two_shot": 3200.0, "iris_copy_engine": 2800.0, "iris_auto": 2700.0}),
    ]
    assert rows[1]["times_us"]["iris_boxed"] == 35.0 and rows[1]["shapes"]["boxed"] == shapes[0]
    assert "iris_boxed@8192x16" not in rows[1]["times_us"] and rows[0]["shapes"]["boxed"] == {}
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda *a: "test GPU")
    path = tmp_path / "table.json"
    bench._write_table(rows, str(path), 2)
    rules = json.loads(path.read_text())["world_sizes"]["2"]["all_reduce"]
    assert rules == [
        [8 << 10, "ll"],
        [8 << 20, "boxed", {"block_size": 8192, "num_warps": 16}],
        [32 << 20, "two_shot", {"block_size": 16384, "num_warps": 32, "programs": 48}],
        [None, "copy_engine"],
    ], rules
    code = (
        "from iris.ccl import config as c\n"
        "for n in (4 << 20, 32 << 20, 64 << 20):\n"
        "    cfg = c.select('all_reduce', n, 2, False, None)\n"
        "    print(cfg.variant, cfg.block_size, cfg.num_warps, cfg.programs)\n"
    )
    out = _in_child(code, str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["boxed 8192 16 0", "two_shot 16384 32 48", "copy_engine 4096 8 0"]


def test_missing_table_is_a_clear_error(tmp_path):
    out = _in_child("from iris.ccl import config; config.tuning_table()", str(tmp_path / "nope.json"))
    assert out.returncode != 0 and "cannot read the tuning table" in out.stderr and "nope.json" in out.stderr


def test_programs_must_be_in_range():
    import iris.ccl as ccl

    with pytest.raises(ValueError, match="programs"):
        ccl.Config(programs=-1)
    with pytest.raises(ValueError, match="programs"):
        ccl.Config(programs=100_000)
    with pytest.raises(TypeError, match="programs"):
        ccl.Config(programs=2.0)


def programs_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    n = 3 * 1024 + 5  # 4 tiles of 1024, the last one partial
    cases = 0
    for programs in (1, 3, 64):
        reductions = (("one_shot", torch.float32), ("two_shot", torch.bfloat16), ("boxed", torch.int32))
        for variant, dtype in reductions:
            cfg = ccl.Config(variant=variant, programs=programs, block_size=1024)
            x = make_input((n,), dtype, rank, programs)
            want = x.clone()
            dist.all_reduce(want)
            out = torch.empty_like(x)
            ccl.all_reduce(out, x, config=cfg)
            if (m := mismatch(out, want, f"all_reduce {variant} programs={programs}")) is not None:
                bad.append(m)
            cases += 1
        for variant in ("push", "pull", "boxed"):
            cfg = ccl.Config(variant=variant, programs=programs, block_size=1024)
            x = make_input((n,), torch.float16, rank, programs + 1)
            want = torch.empty(world_size * n, dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(want, x)
            out = torch.empty_like(want)
            ccl.all_gather(out, x, config=cfg)
            if (m := mismatch(out, want, f"all_gather {variant} programs={programs}")) is not None:
                bad.append(m)
            cases += 1
        # ring and the rooted collectives loop over tiles too (they used to launch a program per tile)
        x = make_input((n,), torch.float32, rank, programs + 2)
        want = x.clone()
        dist.all_reduce(want)
        out = torch.empty_like(x)
        ccl.all_reduce(out, x, config=ccl.Config(variant="ring", programs=programs, block_size=512))
        if (m := mismatch(out, want, f"all_reduce ring programs={programs}")) is not None:
            bad.append(m)
        root = world_size - 1
        got = make_input((n,), torch.float32, rank, programs + 3)
        want = got.clone()
        dist.broadcast(want, root)
        ccl.broadcast(got, root, config=ccl.Config(programs=programs, block_size=512))
        if (m := mismatch(got, want, f"broadcast programs={programs}")) is not None:
            bad.append(m)
        cases += 2
    # A launch with more programs than stay resident is refused before it can hang.
    from iris.ccl import _comm, _host

    comm = _comm.own(None, x.device)
    try:
        _host.launch(None, _host.resident_programs(comm, ccl.Config()) + 1, comm, ccl.Config())
        bad.append("a launch of more programs than resident ones was not refused")
    except RuntimeError as e:
        if "exceed" not in str(e):
            bad.append(f"unexpected error: {e}")
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [2, 3])
def test_any_number_of_programs_gives_the_torch_result(world_size):
    require_world(world_size)
    results = run_world(programs_body, world_size, timeout=240)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, "\n".join(problems)
    assert all(res["cases"] == 24 for res in results)


def logging_body(rank, world_size):
    import io

    import iris.ccl as ccl
    from iris.mem import log

    stream = io.StringIO()
    log.configure("DEBUG", stream=stream)
    x = make_input((100,), torch.float32, rank)
    ccl.all_reduce(x, x)
    log.configure("WARNING")
    return stream.getvalue()


def test_collectives_log_through_the_rank_aware_logger():
    """IRIS_LOG_LEVEL / iris.mem.log: iris.ccl says which communicator and variant it uses,
    each line with the [rank/world] prefix."""
    results = run_world(logging_body, 2, timeout=120)
    for rank, text in enumerate(results):
        lines = text.splitlines()
        assert any(f"[{rank}/2] DEBUG iris.ccl._comm: communicator for group [0, 1]" in ln for ln in lines), (
            text
        )
        call = f"[{rank}/2] DEBUG iris.ccl._host: all_reduce: 400 bytes"
        assert any(call in ln and "variant='ll'" in ln for ln in lines)


def test_programmatic_dependent_launch_only_on_gpus_and_switchable(monkeypatch):
    """``_host.pdl``: never where kernels are interpreted (no griddepcontrol there), on where
    the device has it, and ``IRIS_CCL_PDL=0`` turns it off."""
    import dataclasses
    import types

    import iris.mem
    from iris.ccl import _host

    monkeypatch.delenv("IRIS_CCL_PDL", raising=False)
    interpreted = iris.mem.capabilities(torch.device("cpu"))
    assert interpreted.interpreted and not interpreted.pdl
    assert _host.pdl(types.SimpleNamespace(capabilities=interpreted)) is False
    hopper = dataclasses.replace(interpreted, interpreted=False, pdl=True)
    assert _host.pdl(types.SimpleNamespace(capabilities=hopper)) is True
    monkeypatch.setenv("IRIS_CCL_PDL", "0")
    assert _host.pdl(types.SimpleNamespace(capabilities=hopper)) is False
    monkeypatch.setenv("IRIS_CCL_PDL", "maybe")
    with pytest.raises(ValueError, match="IRIS_CCL_PDL"):
        _host.pdl(types.SimpleNamespace(capabilities=hopper))
