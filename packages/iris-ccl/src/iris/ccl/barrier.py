"""``barrier``: a device-side barrier of a group's ranks.

One program runs the group's barrier on sync slot 0 (generation counters: nothing is reset
between calls or CUDA graph replays). The barrier is ordered on the current stream: work
queued before it on any rank happens before work queued after it on every rank.
"""

from __future__ import annotations

import triton
import triton.language as tl

import iris.mem
from iris.mem.triton import Context

from . import _comm, _host, entry
from .config import Config, select
from .triton import Group
from .work import Work


@triton.jit
def _barrier_kernel(
    context, members, flags, epochs, status, budget,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    SIG=0,
):  # fmt: skip
    """Barrier of sync slot 0 across the group's members."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, flags, epochs, status, budget, GROUP, ME, SIG)
    group.sync(ctx, 0)


def _check(group, **_) -> None:
    _host.check_consistent("barrier", group)


@entry.op("barrier", validate=_check)
def barrier(group=None, async_op: bool = False, *, config: Config | None = None) -> Work | None:
    """Device barrier of ``group`` (None: the world) on iris.ccl's own heap for the group.

    On the CPU backend it returns once every rank has reached it; on GPUs it is queued on
    the current stream (the host does not wait: use the returned :class:`Work` or
    ``torch.cuda.synchronize()`` for that). The heap lives on the current GPU unless
    ``IRIS_BACKEND=cpu`` or no GPU is visible.
    """
    comm = _comm.own(group, iris.mem.default_device())
    if comm.size > 1:
        cfg = select("barrier", 0, comm.size, comm.capabilities.interpreted, config)
        with comm.signed("barrier"):
            _host.launch(_barrier_kernel, 1, comm, cfg)
    return _host.finish(comm, async_op)
