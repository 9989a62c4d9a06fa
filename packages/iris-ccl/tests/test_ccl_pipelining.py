"""torch.distributed.pipelining on an ``iris`` group: GPipe and 1F1B schedules, one stage per
rank, with activations of several MiB (each larger than a send/recv mailbox), against the
same model run on one rank.

Every stage is ``x * w + b`` over a row of ``WIDTH`` floats (cheap to compute, so the time
goes to moving activations and gradients between the stages). The reference runs the whole
model on each microbatch in one process and accumulates the gradients, scaled by the number
of microbatches as the schedules do.
"""

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import setup_rank

from iris.mem.testing import run_world

pytestmark = pytest.mark.timeout(900)

#: Floats per row: 65536 x 16 rows = 4 MiB of float32 per microbatch activation.
WIDTH = 65536


class _Stage(torch.nn.Module):
    def __init__(self, width: int, index: int):
        super().__init__()
        g = torch.Generator().manual_seed(100 + index)
        self.w = torch.nn.Parameter(torch.rand(width, generator=g) + 0.5)
        self.b = torch.nn.Parameter(torch.rand(width, generator=g) - 0.5)

    def forward(self, x):
        return x * self.w + self.b


def _loss(out, target):
    return ((out - target) ** 2).mean()


def _pipeline_body(
    rank: int, world: int, schedule: str, rows: int, width: int, microbatches: int
) -> list[str]:
    setup_rank()
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    import iris.ccl  # noqa: F401  registers the backend

    group = dist.new_group(backend="iris")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(microbatches * rows, width, generator=g)
    target = torch.randn(microbatches * rows, width, generator=g)
    stages = [_Stage(width, i) for i in range(world)]
    # the reference: the whole model on one rank, gradients accumulated over microbatches
    losses_ref = []
    for xs, ts in zip(x.chunk(microbatches), target.chunk(microbatches)):
        out = xs
        for s in stages:
            out = s(out)
        loss = _loss(out, ts)
        loss.backward()
        losses_ref.append(loss.detach())
    # the schedules scale the gradients by 1 / microbatches (scale_grads=True, their default)
    want = {n: p.grad / microbatches for n, p in stages[rank].named_parameters()}
    mine = _Stage(width, rank)
    stage = PipelineStage(mine, rank, world, torch.device("cpu"), group=group)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = kind(stage, n_microbatches=microbatches, loss_fn=_loss)
    losses: list = []
    if rank == 0:
        sched.step(x)
    elif rank == world - 1:
        sched.step(target=target, losses=losses)
    else:
        sched.step()
    bad = []
    for name, p in mine.named_parameters():
        if not torch.allclose(p.grad, want[name], atol=1e-5, rtol=1e-4):
            bad.append(f"stage {rank} {name}: grad differs by {float((p.grad - want[name]).abs().max()):g}")
    if rank == world - 1:
        got = torch.stack([loss.detach() for loss in losses])
        if not torch.allclose(got, torch.stack(losses_ref), atol=1e-5, rtol=1e-5):
            bad.append(f"losses {got.tolist()} != {torch.stack(losses_ref).tolist()}")
    return bad


def _both_schedules_body(rank: int, world: int, rows: int, width: int, microbatches: int) -> list[str]:
    return [
        f"{schedule}: {problem}"
        for schedule in ("gpipe", "1f1b")
        for problem in _pipeline_body(rank, world, schedule, rows, width, microbatches)
    ]


def test_gpipe_and_1f1b_three_stages():
    """GPipe and 1F1B over 3 stages with 512 KiB activations (two mailboxes each)."""
    for bad in run_world(_both_schedules_body, 3, 2, WIDTH, 4, timeout=600.0):
        assert not bad, bad


@pytest.mark.full
def test_gpipe_four_stages_4mib():
    """A 4-stage GPipe schedule with 4 MiB activations, gradients equal to one rank's."""
    for bad in run_world(_pipeline_body, 4, "gpipe", 16, WIDTH, 4, timeout=800.0):
        assert not bad, bad


@pytest.mark.full
def test_1f1b_four_stages_4mib():
    """A 4-stage 1F1B schedule with 4 MiB activations, gradients equal to one rank's."""
    for bad in run_world(_pipeline_body, 4, "1f1b", 16, WIDTH, 4, timeout=800.0):
        assert not bad, bad
