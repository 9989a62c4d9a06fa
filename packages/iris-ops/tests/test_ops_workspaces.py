"""The workspaces the ops keep for calls made without ``workspace=``: a bounded cache per
group (every rank evicts the same one, at the same call), released collectively by
``release_workspaces()`` (every group, or one) and ``workspace_scope()``, with no barrier
needed before.

Each call is checked against torch.distributed (gloo): eviction and release must never
leave wrong results, a hang or a leak (conftest.py checks /dev/shm around every test).
"""

import gc
import os

import pytest
import torch
from ops_testutils import require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.timeout(300)]
HIDDEN = 8


def _files_and_mappings() -> tuple[int, int]:
    with open("/proc/self/maps") as f:
        return len(os.listdir("/proc/self/fd")), sum(1 for _ in f)


def _norm_call(rank, tokens: int, group=None) -> str | None:
    """One all_reduce_rmsnorm of ``tokens`` rows (a signature of its own), checked against
    the gloo all-reduce; None when right."""
    import torch.distributed as dist

    import iris.ops

    g = torch.Generator().manual_seed(tokens * 31 + rank)
    inp = torch.randn(tokens, HIDDEN, generator=g).to(setup_rank())
    weight = torch.ones(HIDDEN, device=inp.device)
    out = torch.empty_like(inp)
    iris.ops.all_reduce_rmsnorm(out, inp, weight, group=group)
    s = inp.double().clone()
    dist.all_reduce(s, group=group)
    want = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)
    err = (out.double() - want).abs().max().item()
    return None if err <= 1e-4 else f"T={tokens}: off by {err}"


def bound_body(rank, world_size, calls, limit):
    """``calls`` workspaces made the way an op without ``workspace=`` makes them, for
    signatures differing in the token count only (decode batches of varying size), with the
    cache limited to ``limit``: what each leaves open; then real calls, checked, while the
    cache evicts."""
    import iris.ops
    from iris.ops import workspace

    workspace.MAX_KEPT = limit
    dev = setup_rank()
    ranks = tuple(range(world_size))
    specs = [("data", 64, torch.float32), ("flags", 8, torch.int32)]
    seen = []
    for tokens in range(1, calls + 1):
        signature = ("all_reduce_rmsnorm", ranks, (tokens, HIDDEN), "torch.float32", None, (None, False))
        ws = workspace.acquire(None, signature, None, None, world_size, dev, specs)
        assert ws.prepared and ws.buffers["data"].numel() == 64
        if tokens in (limit + 2, calls):
            # A closed heap's mapping goes with the last tensor viewing it, which the heap's
            # own reference cycles keep until the cyclic garbage collector runs.
            gc.collect()
            seen.append(_files_and_mappings())
    kept = sum(len(t) for t in workspace._IMPLICIT.values())
    # Real calls: each new token count evicts the least recently used workspace.
    bad = [p for t in (1, 2, 3, 4, 2, 5, 3, 1) if (p := _norm_call(rank, t)) is not None]
    kept_after = sum(len(t) for t in workspace._IMPLICIT.values())
    iris.ops.release_workspaces()  # no barrier before: release synchronises by itself
    return bad, seen, kept, kept_after


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts /proc/self/fd and /proc/self/maps")
def test_variable_token_counts_keep_workspaces_bounded():
    """50 token counts keep at most ``MAX_KEPT`` workspaces: open files and mappings stop
    growing once the cache is full (each workspace kept a heap: one more descriptor and
    mapping per call, without bound); real calls stay right while the cache evicts."""
    calls, limit = 50, 3
    for rank, (bad, seen, kept, kept_after) in enumerate(run_world(bound_body, 2, calls, limit, timeout=240)):
        assert not bad, f"rank {rank}: {bad}"
        assert kept <= limit and kept_after <= limit, f"rank {rank}: {kept}, {kept_after} kept, limit {limit}"
        (fds0, maps0), (fds, maps) = seen
        # Unbounded, each call kept a heap: +1 descriptor and +1-2 mappings a call (about 45
        # and 90 here); a few mappings come and go with the allocator.
        assert fds <= fds0 + 1 and maps <= maps0 + 4, (
            f"rank {rank}: open files {fds0} -> {fds}, mappings {maps0} -> {maps} from call {limit + 2} to "
            f"{calls}: {seen}"
        )


def release_body(rank, world_size):
    """release_workspaces(group=...) releases that group's only; workspace_scope releases
    what was made inside it (nested scopes their own) and keeps it when the block raises."""
    import torch.distributed as dist

    from iris.ops import release_workspaces, workspace, workspace_scope

    other = dist.new_group(list(range(world_size)))
    bad = []

    def kept(group=None):
        table = workspace._IMPLICIT.get(dist.group.WORLD if group is None else group, {})
        return sorted(ws._signature[2][0][0] for ws in table.values())

    for tokens, group in ((1, None), (2, other)):
        bad += filter(None, [_norm_call(rank, tokens, group)])
    release_workspaces(group=other)
    if kept(other) or kept() != [1]:
        bad.append(f"release_workspaces(group=other) left {kept(other)} of other, {kept()} of the world")
    with workspace_scope():
        bad += filter(None, [_norm_call(rank, 3)])
        with workspace_scope():
            bad += filter(None, [_norm_call(rank, 4), _norm_call(rank, 1)])
        if kept() != [1, 3]:
            bad.append(f"after the inner scope: {kept()}, expected [1, 3]")
    if kept() != [1]:
        bad.append(f"after the outer scope: {kept()}, expected [1]")
    try:
        with workspace_scope():
            bad += filter(None, [_norm_call(rank, 5)])
            raise KeyError("inside")
    except KeyError:
        pass
    if kept() != [1, 5]:
        bad.append(f"a scope that raised released its workspaces: {kept()}")
    release_workspaces()
    if workspace._IMPLICIT and any(workspace._IMPLICIT.values()):
        bad.append("release_workspaces() left workspaces")
    bad += filter(None, [_norm_call(rank, 1)])  # prepared again
    release_workspaces()
    return bad


@pytest.mark.parametrize("world_size", [1, 3])
def test_release_by_group_and_scope(world_size):
    require_world(world_size)
    for rank, bad in enumerate(run_world(release_body, world_size, timeout=240)):
        assert not bad, f"rank {rank}: {bad}"
