"""Shared start-up and reporting of the iris.ccl examples (not an example itself)."""

import atexit
import os
import sys

import torch
import torch.distributed as dist

import iris.mem  # first: it decides whether Triton kernels are interpreted
from iris.mem import bootstrap


def setup() -> tuple[int, int, torch.device]:
    """Join the torchrun job: rank, world, device. The process group is the one Iris would
    make (:func:`iris.mem.bootstrap.group_backend`): NCCL for GPU tensors and gloo for CPU
    tensors on GPUs, gloo alone on the CPU backend and where ranks share a GPU (more ranks
    than GPUs: NCCL refuses two ranks on one GPU)."""
    on_gpu = torch.cuda.is_available() and os.environ.get("IRIS_BACKEND", "cuda") != "cpu"
    device = iris.mem.default_device()  # on GPUs: LOCAL_RANK modulo the GPUs present
    if on_gpu:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # Exiting with a live process group can abort the process; tear it down at exit.
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        backend = bootstrap.group_backend("cuda" if on_gpu else "cpu")
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:  # a world of one without a launcher
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), device


def check(errors: list[str], what: str, got: torch.Tensor, want: torch.Tensor, atol: float = 1e-4) -> None:
    """Record a mismatch between ``got`` and ``want``."""
    if got.shape != want.shape or not torch.allclose(got.float(), want.float(), atol=atol, rtol=1e-4):
        worst = (got.float() - want.float()).abs().max().item() if got.shape == want.shape else "shape"
        errors.append(f"{what}: max error {worst}")


def report(name: str, errors: list[str], note: str = "") -> int:
    """One line per rank (a single write, so lines of ranks do not interleave); exit code."""
    rank, world = dist.get_rank(), dist.get_world_size()
    verdict = f"FAILED: {'; '.join(errors)}" if errors else f"validated {note}".rstrip()
    sys.stdout.write(f"[rank {rank}/{world}] {name}: {verdict}\n")
    sys.stdout.flush()
    return 1 if errors else 0
