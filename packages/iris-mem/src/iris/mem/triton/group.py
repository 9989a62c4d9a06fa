"""``Group``: the device-side view of a :class:`iris.mem.runtime.SyncState`: the ranks a
kernel synchronises with and their per-program sync slots."""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from ._compat import aggregate
from .context import Context
from .sync import group_sync


@aggregate
class Group:
    """Members of a group of ranks (a collective's, a fused op's) and their per-program sync slots.

    Fields: ``members`` (pointer to the members' heap ranks, int32), ``flags`` and
    ``epochs`` (sync state on the heap, see :func:`group_sync`), ``status`` (int64[4]
    timeout record), ``budget`` (ns per wait, ``IRIS_WAIT_TIMEOUT``), ``size`` and ``index`` (this rank's
    position in ``members``), both constexpr, and ``sig``, the call's signature that every
    barrier checks (0 where the kernel checks none).
    """

    members: tl.tensor
    flags: tl.tensor
    epochs: tl.tensor
    status: tl.tensor
    budget: tl.tensor
    size: tl.constexpr
    index: tl.constexpr
    sig: tl.tensor

    @constexpr_function
    def __init__(self, members, flags, epochs, status, budget, size, index, sig):
        self.members = members
        self.flags = flags
        self.epochs = epochs
        self.status = status
        self.budget = budget
        self.size = tl.constexpr(size)
        self.index = tl.constexpr(index)
        self.sig = sig

    @staticmethod
    @triton.jit
    def initialize(members, flags, epochs, status, budget, size: tl.constexpr, index: tl.constexpr, sig=0):
        """Build the group from a collective kernel's leading arguments (``sig``: the
        kernel's ``SIG`` argument, see :func:`iris.mem.runtime.launch`)."""
        return Group(members, flags, epochs, status, budget, size, index, tl.cast(sig, tl.int32))

    @triton.jit
    def rank(self, i):
        """Heap rank of member ``i`` (0 <= i < size)."""
        return tl.load(self.members + i)

    @triton.jit
    def sync(self, ctx, slot, fence: tl.constexpr = False):
        """Barrier of sync slot ``slot`` (usually the program id) across the members: every
        thread's earlier loads and stores (remote ones included) come before the peers pass
        it. ``fence=True`` also fences every thread at system scope first (not needed for
        that; see :func:`group_sync`)."""
        group_sync(
            ctx,
            self.members,
            self.flags,
            self.epochs,
            self.status,
            self.budget,
            slot,
            self.size,
            self.index,
            fence,
            self.sig,
        )


@triton.jit
def enter_group(
    context, members, flags, epochs, status, budget,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, SYNC: tl.constexpr = True,
    SIG=0,
):  # fmt: skip
    """The start of a persistent kernel over a :class:`iris.mem.runtime.SyncState`: its
    ``Context``, its ``Group`` (checking the call signature ``SIG`` at every barrier) and the
    program id, after (``SYNC``) the start barrier of the program's sync slot (nothing
    remote before it, so without a fence)."""
    ctx = Context.initialize(context, RANK, WORLD)
    group = Group.initialize(members, flags, epochs, status, budget, GROUP, ME, SIG)
    pid = tl.program_id(0)
    if SYNC:
        group.sync(ctx, pid, False)
    return ctx, group, pid
