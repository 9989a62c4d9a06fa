"""Data, fully sharded and tensor parallelism over an ``iris`` group, eager and under
``torch.compile``, against the same model trained on one rank.

Each test trains a small MLP for a few SGD steps on data that differs per rank, with the
group made by ``dist.new_group(backend="iris")``, and compares the parameters (or the
gradients) with the unsharded model trained on every rank's data at once, which is what
DDP / FSDP2 (mean of the ranks' gradients) and TP (the same math, split) compute.
Compiled tests use the ``aot_eager`` backend (dynamo and AOTAutograd, no C++ compiler).
"""

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import device, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

STEPS = 3
LR = 0.1


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.ReLU(), torch.nn.Linear(24, 6)).to(device())


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, 12, generator=g).to(device()), torch.randn(5, 6, generator=g).to(device())


def _reference(world: int) -> torch.nn.Module:
    """The model trained on one rank: each step's gradient is the mean of the ranks' own."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(
            torch.nn.functional.mse_loss(model(x), y) for x, y in (_batch(r, step) for r in range(world))
        )
        (loss / world).backward()
        opt.step()
    return model


def _train(model: torch.nn.Module, rank: int, compiled: bool) -> None:
    run = torch.compile(model, backend="aot_eager") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _batch(rank, step)
        torch.nn.functional.mse_loss(run(x), y).backward()
        opt.step()


def _differences(model: torch.nn.Module, want: torch.nn.Module) -> list[str]:
    bad = []
    for (name, got), ref in zip(model.named_parameters(), want.parameters()):
        got = got.full_tensor() if hasattr(got, "full_tensor") else got
        if not torch.allclose(got.detach(), ref.detach(), atol=1e-5, rtol=1e-5):
            bad.append(f"{name}: differs by {float((got - ref).abs().max()):g}")
    return bad


def _ddp_body(rank: int, world: int, compiled: bool) -> list[str]:
    setup_rank()
    import iris.ccl  # noqa: F401  registers the backend

    group = dist.new_group(backend="iris")
    model = torch.nn.parallel.DistributedDataParallel(_mlp(), process_group=group)
    _train(model, rank, compiled)
    return _differences(model.module, _reference(world))


def test_compiled_ddp_over_an_iris_group():
    """``torch.compile`` of a DDP model over an iris group compiles (dynamo does not trace
    into the group's methods when DDP rebuilds its buckets) and trains as on one rank."""
    require_world(2)
    for bad in run_world(_ddp_body, 2, True, timeout=300.0):
        assert not bad, bad


def _fsdp_body(rank: int, world: int, compiled: bool) -> list[str]:
    setup_rank()
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    import iris.ccl  # noqa: F401

    group = dist.new_group(backend="iris")
    mesh = DeviceMesh.from_group(group, device().type)
    model = _mlp()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(model, rank, compiled)
    return _differences(model, _reference(world))


def test_fsdp2_training_equals_the_unsharded_model():
    """FSDP2 ``fully_shard`` over an iris group (3 ranks; 2 on GPUs, where FSDP2 issues its
    all-gathers and reduce-scatters from two streams) trains as the unsharded model."""
    world = 3 if device().type == "cpu" else 2
    require_world(world)
    for bad in run_world(_fsdp_body, world, False, timeout=300.0):
        assert not bad, bad


@pytest.mark.full
def test_compiled_fsdp2_over_an_iris_group():
    """FSDP2 over an iris group under ``torch.compile`` trains as the unsharded model."""
    require_world(2)
    for bad in run_world(_fsdp_body, 2, True, timeout=500.0):
        assert not bad, bad


def _tp_body(rank: int, world: int, compiled: bool) -> list[str]:
    setup_rank()
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import iris.ccl  # noqa: F401

    group = dist.new_group(backend="iris")
    mesh = DeviceMesh.from_group(group, device().type)
    model = parallelize_module(_mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    # every rank trains on the same (whole) batch: TP splits the model, not the data
    run = torch.compile(model, backend="aot_eager") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    want = _mlp()
    want_opt = torch.optim.SGD(want.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _batch(0, step)
        for m, o in ((run, opt), (want, want_opt)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    return _differences(model, want)


@pytest.mark.full
def test_compiled_tensor_parallel_over_an_iris_group():
    """Column- then row-parallel linears over an iris group under ``torch.compile`` train as
    the unsplit model."""
    require_world(2)
    for bad in run_world(_tp_body, 2, True, timeout=500.0):
        assert not bad, bad
