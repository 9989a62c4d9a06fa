"""Device-side helpers of the collectives: the start of a persistent tile kernel, the
combine of a reduction and the launch counter of the flag-in-data kernels. The group
barrier itself lives in :mod:`iris.mem.triton.sync` (shared with the heap's device barrier
and the fused ops)."""

import triton
import triton.language as tl

from iris.mem.triton.group import enter_group
from iris.mem.triton.sync import enter_launch, group_sync, thread_fence
from iris.mem.utils import record_timeout


@triton.jit
def enter_tiles(context, members, flags, epochs, status, budget, n, RANK, WORLD, GROUP, ME, BLOCK, SIG):
    """The start of a persistent kernel over ``n`` elements in tiles of ``BLOCK``:
    :func:`~iris.mem.triton.group.enter_group` (after the start barrier) and the number of
    tiles, ``(ctx, group, pid, ntiles)``. The kernel's constexprs stay constexprs here."""
    ctx, group, pid = enter_group(
        context, members, flags, epochs, status, budget, RANK, WORLD, GROUP, ME, SIG=SIG
    )
    return ctx, group, pid, tl.cdiv(n, BLOCK)


@triton.jit
def combine(acc, x, OP: tl.constexpr):
    """``acc (op) x`` for OP "sum"/"avg" (add), "max", "min" or "product". MAX and MIN of
    floats propagate NaN (as torch's do; compiled, the default would drop it, interpreted not)."""
    if OP == "max":
        return tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
    elif OP == "min":
        return tl.minimum(acc, x, propagate_nan=tl.PropagateNan.ALL)
    elif OP == "product":
        return acc * x
    else:
        return acc + x


@triton.jit
def advance_launch_counter(launches, UNIT: tl.constexpr):
    """Add this program's share of ``UNIT`` to the launch counter ``*launches``: every launch
    adds exactly ``UNIT`` whatever its grid (``UNIT // P`` per program, program 0 also the
    remainder), with an atomic whose result nobody waits for. A program that read the
    counter at its start sees less than ``UNIT`` of its own launch's additions, so
    ``counter // UNIT`` numbers the launches the same way in every program."""
    programs = tl.num_programs(0)
    share = UNIT // programs
    if tl.program_id(0) == 0:
        share += UNIT - share * programs
    tl.atomic_add(launches, share.to(launches.dtype.element_ty), sem="relaxed", scope="gpu")


__all__ = [
    "advance_launch_counter",
    "combine",
    "enter_launch",
    "enter_tiles",
    "group_sync",
    "record_timeout",
    "thread_fence",
]
