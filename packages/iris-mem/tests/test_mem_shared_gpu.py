"""Ranks sharing a GPU (the cuda backend with more ranks than GPUs).

CPU tier: the pure parts, called with real inputs: the rank-to-GPU mapping and the count of
ranks on a GPU (from the launcher's layout, from a node layout, from PCI bus ids), the
backend of the groups Iris makes and where its host exchanges run, the one-time warning,
and, in a real world of two processes, the groups Iris makes under a gloo world.

GPU tier (``-m gpu``, ``IRIS_BACKEND=cuda``): every world here runs on one GPU whatever the
machine has (``CUDA_VISIBLE_DEVICES`` narrowed to its first GPU): the probe of
``benchmarks/mem/probe_shared_gpu.py`` at 2 and 3 ranks (a kernel spinning on a flag that a
peer's later kernel sets completes, with one program or every SM held), a heap, its
barriers and reads of every peer's heap over a world of NCCL alone (Iris's host exchanges go
through a gloo group of the same ranks), and ``iris.mem.init`` under torchrun picking gloo
for the world.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import iris.mem
from iris.mem import bootstrap, machine, nodes, testing
from iris.mem.testing import run_world

BACKEND = os.environ.get("IRIS_BACKEND", "cpu")
ROOT = Path(__file__).resolve().parents[3]
PROBE = ROOT / "benchmarks" / "mem" / "probe_shared_gpu.py"
pytestmark = pytest.mark.timeout(600)


# --------------------------------------------------------------------------- CPU tier: pure parts


def test_rank_to_gpu_is_the_local_rank_modulo_the_gpus():
    assert [machine.gpu_index(r, 1) for r in range(4)] == [0, 0, 0, 0]
    assert [machine.gpu_index(r, 2) for r in range(5)] == [0, 1, 0, 1, 0]
    assert [machine.gpu_index(r, 8) for r in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="gpus must be at least 1"):
        machine.gpu_index(0, 0)


@pytest.mark.parametrize(
    ("local_world", "gpus", "expected"),
    [
        (3, 1, [3, 3, 3]),  # every rank on the one GPU
        (4, 2, [2, 2, 2, 2]),
        (3, 2, [2, 1, 2]),  # ranks 0 and 2 on GPU 0, rank 1 alone on GPU 1
        (2, 8, [1, 1]),  # a GPU per rank
    ],
)
def test_ranks_on_a_gpu_from_the_launchers_layout(local_world, gpus, expected):
    counts = [
        machine.launcher_ranks_on_gpu(rank, local_world, gpus, machine.gpu_index(rank, gpus))
        for rank in range(local_world)
    ]
    assert counts == expected
    assert machine.launcher_shares_gpus(local_world, gpus) == (max(expected) > 1)


def test_ranks_on_a_gpu_without_a_launcher_or_for_another_device():
    assert machine.launcher_ranks_on_gpu(None, 4, 1, 0) == 1  # no LOCAL_RANK
    assert machine.launcher_ranks_on_gpu(0, None, 1, 0) == 1  # no LOCAL_WORLD_SIZE
    assert machine.launcher_ranks_on_gpu(1, 4, 2, 0) == 1  # rank 1 uses GPU 1, not 0
    assert not machine.launcher_shares_gpus(None, 1)
    assert not machine.launcher_shares_gpus(4, 0)


def test_ranks_sharing_from_every_ranks_gpu():
    bus_ids = ["0000:1b:00.0", "0000:1b:00.0", "0000:2c:00.0", "0000:1b:00.0"]
    assert [machine.ranks_sharing(bus_ids, r) for r in range(4)] == [3, 3, 1, 3]
    assert machine.ranks_sharing([None, None], 0) == 1  # no GPU: shares with nobody


def test_node_layout_counts_the_ranks_on_each_gpu():
    layout = nodes.NodeLayout(
        ranks=(0, 1, 2, 3, 4),
        keys=("a/0", "a/1"),
        nodes=((0, 1, 2), (3, 4)),
        node=0,
        gpus=("GPU-x", "GPU-x", "GPU-y", "GPU-x", None),  # two agents on one host share GPU-x
    )
    assert [layout.ranks_on_gpu(r) for r in range(5)] == [3, 3, 1, 3, 1]
    assert layout.gpu_of(2) == "GPU-y"
    bare = nodes.NodeLayout(ranks=(0, 1), keys=("a/",), nodes=((0, 1),), node=0)
    assert bare.ranks_on_gpu(1) == 1 and bare.gpu_of(1) is None


def test_worlds_need_ranks_not_gpus(monkeypatch):
    """What the GPU tier's require_world asks, for given GPU counts (the cuda backend)."""
    monkeypatch.setenv("IRIS_BACKEND", "cuda")
    assert testing.gpu_skip_reason(4, gpus=1) is None  # four ranks share the one GPU
    assert testing.gpu_skip_reason(2, gpus=0) == "IRIS_BACKEND=cuda but no GPU is visible"
    reason = testing.gpu_skip_reason(3, "link bandwidth between GPUs", gpus=2)
    assert reason.startswith("link bandwidth between GPUs needs 3 separate GPUs") and "found 2" in reason
    assert testing.gpu_skip_reason(2, "link bandwidth between GPUs", gpus=2) is None
    assert [testing.shares_gpus(n, gpus=2) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert [testing.deadline_scale(n, gpus=1) for n in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert [testing.deadline_scale(n, gpus=2) for n in (2, 3, 4, 5)] == [1, 2, 2, 3]
    monkeypatch.setenv("IRIS_BACKEND", "cpu")  # processes, no GPUs: nothing to skip or stretch
    assert testing.gpu_skip_reason(4, "link bandwidth between GPUs", gpus=0) is None
    assert testing.deadline_scale(4, gpus=1) == 1 and not testing.shares_gpus(4, gpus=1)


def test_capabilities_say_whether_the_gpu_is_shared():
    base = iris.mem.capabilities("cpu")
    assert base.ranks_on_device == 1 and not base.shared
    shared = base.__class__(**{**base.__dict__, "ranks_on_device": 3})
    assert shared.shared


@pytest.mark.parametrize(
    ("device_backend", "parent", "shared", "expected"),
    [
        ("cpu", None, False, "gloo"),
        ("cpu", "cuda:nccl", True, "gloo"),
        ("cuda", None, False, "cuda:nccl,cpu:gloo"),  # the world, a GPU per rank
        ("cuda", None, True, "gloo"),  # the world, ranks sharing GPUs: NCCL would refuse
        ("cuda", "cpu:gloo,cuda:gloo", False, "gloo"),  # under a gloo world
        ("cuda", "gloo", False, "gloo"),
        ("cuda", "cuda:nccl", False, "cuda:nccl,cpu:gloo"),  # under NCCL alone: gloo added for the CPU
        ("cuda", "cpu:gloo,cuda:nccl", False, "cuda:nccl,cpu:gloo"),
        ("cuda", "cpu:gloo,cuda:iris", False, "cuda:nccl,cpu:gloo"),
    ],
)
def test_backend_of_the_groups_iris_makes(device_backend, parent, shared, expected):
    assert bootstrap.backend_for(device_backend, parent, shared) == expected


def test_world_backend_before_torch_distributed_is_up():
    """The decision ensure_initialized takes (no process group yet) on this machine's GPUs,
    or, where this process has a process group already, the rule for groups made under it."""
    assert bootstrap.group_backend("cpu") == "gloo"
    if dist.is_initialized():
        parent = str(dist.get_backend_config())
        assert bootstrap.group_backend("cuda") == bootstrap.backend_for("cuda", parent, False)
        return
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    shared = machine.launcher_shares_gpus(iris.mem.settings.local_world_size(), gpus)
    assert bootstrap.group_backend("cuda") == ("gloo" if shared else "cuda:nccl,cpu:gloo")


def test_the_shared_gpu_warning_is_issued_once():
    index = 97  # a device index no real GPU of this process has
    was = machine._warned_shared
    machine._warned_shared = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            machine.note_ranks_on_device(index, 1)  # a GPU of its own: no warning
            machine.note_ranks_on_device(index, 3)
            machine.note_ranks_on_device(index, 2)  # fewer than known: nothing changes
            machine.note_ranks_on_device(index, 4)  # more: recorded, but warned already
        shared = [w for w in caught if issubclass(w.category, iris.mem.SharedGpuWarning)]
        assert len(shared) == 1, [str(w.message) for w in caught]
        text = str(shared[0].message)
        for words in ("3 ranks share GPU cuda:97", "correctness, not speed", "tuning tables are not read"):
            assert words in text, text
        assert machine._RANKS_ON_DEVICE[index] == 4
        assert not machine.warn_shared(2, index)  # once per process
    finally:
        machine._RANKS_ON_DEVICE.pop(index, None)
        machine._warned_shared = was


def groups_body(rank, world_size):
    """In a gloo world (run_world's): the groups Iris makes use gloo for every tensor, and
    Iris's host exchanges run on the groups themselves (they have a CPU backend)."""
    made = nodes.subgroup(None, range(world_size), "test-shared-gpu", "cuda")
    return (
        bootstrap.group_backend("cuda"),
        str(dist.get_backend_config(made)),
        bootstrap.host_group(None) is None,
        bootstrap.host_group(made) is made,
        bootstrap.exchange(made, "a test exchange", rank),
    )


@pytest.mark.skipif(BACKEND != "cpu", reason="the groups of a gloo world (CPU tier)")
def test_groups_iris_makes_under_a_gloo_world():
    for backend, config, world_on_cpu, group_on_cpu, exchanged in run_world(groups_body, 2, timeout=120):
        assert backend == "gloo" and "nccl" not in config, (backend, config)
        assert world_on_cpu and group_on_cpu
        assert exchanged == [0, 1]


# --------------------------------------------------------------------------- GPU tier: one GPU


def _one_gpu() -> dict[str, str]:
    """The environment that narrows a world to the first visible GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    return {"CUDA_VISIBLE_DEVICES": visible}


gpu_only = pytest.mark.skipif(
    BACKEND != "cuda" or not torch.cuda.is_available(), reason="GPU-only test: run with IRIS_BACKEND=cuda"
)


def probe_body(rank, world_size):
    spec = importlib.util.spec_from_file_location("probe_shared_gpu", PROBE)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    with iris.mem.init(1 << 24) as heap:
        return probe.probe(heap, trials=2, rounds=50, barriers=30, delay=0.1, budget=30.0)


@pytest.mark.gpu
@gpu_only
@pytest.mark.skipif(not PROBE.is_file(), reason=f"{PROBE} not found (not a source checkout)")
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_spinning_kernel_progresses_while_ranks_share_the_gpu(world_size):
    """A kernel spinning on a flag that only a later kernel of another process on the same GPU
    sets completes (time slicing switches the processes), with one program and with every SM
    held; a hand-off, a token around the ranks and a device barrier take less than a second."""
    results = run_world(probe_body, world_size, timeout=480, env=_one_gpu())
    r = results[0]
    assert r["ranks_on_device"] == world_size, r
    for case in ("late_flag", "full_grid", "ring", "device_barrier"):
        assert r[case]["completed"], (case, r)
    assert r["late_flag"]["handoff_us_max"] < 1e6, r
    assert r["full_grid"]["handoff_us_max"] < 1e6, r
    assert r["ring"]["per_handoff_us"] < 1e6, r
    assert r["device_barrier"]["per_call_us"] < 1e6, r


def nccl_world_body(rank, world_size):
    """A world of NCCL alone on one GPU: the heap, its host and device barriers and reads of
    every peer's heap work, since Iris's host exchanges go through a gloo group of the same
    ranks; the sharing is warned about once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with iris.mem.init(1 << 24) as heap:
            x = heap.full((1000,), float(rank + 1))
            heap.barrier()
            heap.device_barrier()
            # every peer's twin read through its mapping in this process (same GPU)
            total = sum(float(heap.peer_tensor(x, r)[-1]) for r in range(world_size))
            heap.barrier()
            sharing = heap.capabilities.ranks_on_device
    shared = [w for w in caught if issubclass(w.category, iris.mem.SharedGpuWarning)]
    return total, sharing, len(shared), str(dist.get_backend_config())


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_world_of_nccl_alone_serves_iris_on_one_gpu(world_size):
    results = run_world(nccl_world_body, world_size, timeout=300, backend="nccl", env=_one_gpu())
    for total, sharing, warned, config in results:
        assert total == world_size * (world_size + 1) / 2
        assert sharing == world_size
        assert warned == 1
        assert "nccl" in config


_LAUNCHED = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import iris.mem
    heap = iris.mem.init(1 << 20)  # no process group yet: iris.mem.init brings the world up
    t = torch.ones(3, device=heap.device)
    dist.all_reduce(t)  # the world's own collective, on a GPU tensor
    ok = float(t[0]) == dist.get_world_size() and heap.capabilities.ranks_on_device == dist.get_world_size()
    print(f"world {dist.get_backend_config()} rank {dist.get_rank()} {'OK' if ok else 'WRONG'}", flush=True)
    heap.close()
    """
)


@pytest.mark.gpu
@gpu_only
def test_init_without_a_process_group_picks_gloo_where_ranks_share_the_gpu(tmp_path):
    script = tmp_path / "launched.py"
    script.write_text(_LAUNCHED)
    env = {**os.environ, **_one_gpu(), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3"]
    cmd.append(str(script))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    lines = [line for line in proc.stdout.splitlines() if line.startswith("world ")]
    assert len(lines) == 3 and all(line.endswith(" OK") for line in lines), output
    assert all("nccl" not in line for line in lines), output
