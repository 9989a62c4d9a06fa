"""Shared start-up and reporting of the iris.ccl examples (not an example itself)."""

import atexit
import os
import sys

import torch
import torch.distributed as dist

import iris.mem  # noqa: F401 - first: it decides whether Triton kernels are interpreted


def setup() -> tuple[int, int, torch.device]:
    """Join the torchrun job (NCCL on GPUs, gloo on the CPU backend): rank, world, device."""
    on_gpu = torch.cuda.is_available() and os.environ.get("IRIS_BACKEND", "cuda") != "cpu"
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        # Exiting with a live process group can abort the process; tear it down at exit.
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        if "RANK" in os.environ:
            dist.init_process_group("nccl" if on_gpu else "gloo")
        else:  # a world of one without a launcher
            dist.init_process_group(
                "nccl" if on_gpu else "gloo", store=dist.HashStore(), rank=0, world_size=1
            )
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
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
