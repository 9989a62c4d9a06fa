"""Where ranks share a GPU, the benchmarks refuse to time anything and the two-GPU acceptance
suite refuses to start (CPU tier: the real functions with real inputs; a ``Capabilities`` of
a shared GPU is built, as only a GPU machine would report one)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import iris.mem

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


timing = _module("bench_timing_under_test", BENCHMARKS / "bench_timing.py")
acc = _module("acceptance_refusal_under_test", BENCHMARKS / "acceptance.py")


def gpu(ranks_on_device: int) -> iris.mem.Capabilities:
    return dataclasses.replace(
        iris.mem.capabilities("cpu"), device=torch.device("cuda", 0), backend="cuda", interpreted=False,
        sm_count=132, compute_capability=(9, 0), resident_programs=132, pdl=True, tma=True, streams=True,
        name="NVIDIA H200", nvlink=True, ranks_on_device=ranks_on_device,
    )  # fmt: skip


def test_a_benchmark_refuses_where_ranks_share_the_gpu(capsys):
    assert not dist.is_initialized(), "a test left a process group in the pytest process"
    own = gpu(1)
    assert timing.refuse_shared_gpu(own) is own
    with pytest.raises(SystemExit) as exit_info:
        timing.refuse_shared_gpu(gpu(2))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "2 ranks share this GPU" in err and "no ratio printed" in err, err


def test_every_benchmark_refuses_before_it_times():
    """Each benchmark script calls the refusal once its heap or process group is up."""
    scripts = sorted(BENCHMARKS.glob("*/bench_*.py"))
    assert scripts
    missing = [
        p.relative_to(ROOT).as_posix()
        for p in scripts
        if not re.search(r"refuse_shared_gpu\(", p.read_text())
    ]
    assert not missing, f"benchmarks that time on a shared GPU: {missing}"


def test_the_two_gpu_suite_refuses_fewer_than_two_gpus():
    assert acc.suite_refusal("two-gpu", 2) is None
    message = acc.suite_refusal("two-gpu", 1)
    assert message is not None and "--suite one-gpu" in message and "share a GPU" in message
    assert acc.suite_refusal("one-gpu", 1) is None
    assert acc.suite_refusal("one-gpu", 0) is not None


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    for value, count in (("0", 1), ("0,1", 2), ("", 0), ("3, 5, 7", 3), ("-1", 0)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert acc.visible_gpus() == count, value
