"""The ``copy_engine`` variants (all_reduce, all_gather, all_to_all) and
``SymmetricHeap.peer_tensor`` they are built on, against ``torch.distributed``.

The variant needs its output on a heap spanning the group: these tests use heap tensors
(out of place, so the copies and the pipelined reduction run), messages that the group
does not divide (the remainder goes through ``boxed``), several pieces
(``Config.chunk_elements``), every op and several dtypes, repeated calls on the same
buffers; and the fallbacks (in place, plain tensors), which must give the same results.
On the CPU backend the copies are memory copies between the processes' heaps; the same
bodies run on GPUs (copy engines, side streams) with ``IRIS_BACKEND=cuda``.
"""

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import dtype_name, make_input, mismatch, reduced, require_world, setup_rank

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

WORLD_TIMEOUT = 400.0
#: Element counts: not multiples of the group size or of the reduction's block.
COUNTS = (1, 5, 4099, 20_011)


def _gathered(x: torch.Tensor) -> list[torch.Tensor]:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, x.detach().cpu())
    return everyone


def copy_engine_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    bad: list[str] = []
    cases = 0
    salt = 0
    with iris.mem.init(1 << 23) as heap:
        hin = heap.zeros(world_size * COUNTS[-1])
        hout = heap.zeros(world_size * COUNTS[-1])
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for n in COUNTS:
                ops = ["SUM", "MAX"] + (["AVG"] if dtype.is_floating_point else ["MIN"])
                for op in ops if n == 4099 else ops[:1]:
                    # default pieces (two), and about three pieces of each member's chunk
                    for piece in (0, max(1, n // (3 * world_size))):
                        salt += 1
                        x = make_input((n,), dtype, rank, salt)
                        inp = hin.view(dtype)[:n]
                        out = hout.view(dtype)[:n]
                        inp.copy_(x)
                        out.fill_(77)
                        cfg = ccl.Config(variant="copy_engine", chunk_elements=piece)
                        what = f"all_reduce {op} {dtype_name(dtype)} n={n} piece={piece}"
                        for repeat in range(2):  # the same buffers again: nothing left over
                            ccl.all_reduce(out, inp, op=getattr(ccl.ReduceOp, op), config=cfg)
                            if (m := mismatch(out, reduced(x, op), f"{what} call {repeat}")) is not None:
                                bad.append(m)
                            cases += 1
                        if not torch.equal(inp, x):
                            bad.append(f"{what}: the input was modified")
            # all_gather and all_to_all, out of place and all_gather in place (own chunk).
            for n in COUNTS:
                salt += 1
                x = make_input((n,), dtype, rank, salt)
                out = hout.view(dtype)[: world_size * n]
                out.fill_(77)
                ccl.all_gather(out, x, config=ccl.Config(variant="copy_engine"))
                want = torch.cat(_gathered(x)).to(out.device)
                if (m := mismatch(out, want, f"all_gather {dtype_name(dtype)} n={n}")) is not None:
                    bad.append(m)
                out.fill_(77)
                out[rank * n : (rank + 1) * n].copy_(x)
                ccl.all_gather(out, out[rank * n : (rank + 1) * n], config=ccl.Config(variant="copy_engine"))
                if (m := mismatch(out, want, f"all_gather in place {dtype_name(dtype)} n={n}")) is not None:
                    bad.append(m)
                y = make_input((world_size * n,), dtype, rank, salt + 1)
                out.fill_(77)
                ccl.all_to_all(out, y, config=ccl.Config(variant="copy_engine"))
                want = torch.cat([g[rank * n : (rank + 1) * n] for g in _gathered(y)]).to(out.device)
                if (m := mismatch(out, want, f"all_to_all {dtype_name(dtype)} n={n}")) is not None:
                    bad.append(m)
                cases += 3
        # Fallbacks: in place and plain tensors run another variant, same results.
        x = make_input((4099,), torch.float32, rank, 999)
        h = hin[:4099]
        h.copy_(x)
        ccl.all_reduce(h, h, config=ccl.Config(variant="copy_engine"))
        if (m := mismatch(h, reduced(x, "SUM"), "all_reduce in place (fallback)")) is not None:
            bad.append(m)
        plain = torch.empty_like(x)
        ccl.all_reduce(plain, x, config=ccl.Config(variant="copy_engine"))
        if (m := mismatch(plain, reduced(x, "SUM"), "all_reduce plain (fallback)")) is not None:
            bad.append(m)
        g = torch.empty(world_size * 4099, device=x.device)
        ccl.all_gather(g, x, config=ccl.Config(variant="copy_engine"))
        want = torch.cat(_gathered(x)).to(g.device)
        if (m := mismatch(g, want, "all_gather plain (fallback)")) is not None:
            bad.append(m)
        cases += 3
        heap.barrier()
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize(
    "world_size", [pytest.param(2, marks=pytest.mark.full), 3, pytest.param(4, marks=pytest.mark.full)]
)
def test_copy_engine_matches_torch_distributed(world_size):
    require_world(world_size)
    results = run_world(copy_engine_body, world_size, timeout=WORLD_TIMEOUT)
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    for r, res in enumerate(results):
        assert res["cases"] >= 3 * (len(COUNTS) + 2) * 2 * 2, f"rank {r} checked only {res['cases']} cases"


def peer_tensor_body(rank, world_size):
    setup_rank()
    import iris.mem

    bad: list[str] = []
    with iris.mem.init(1 << 20) as heap:
        buf = heap.full((world_size, 33), -1.0)
        heap.barrier()
        for peer in range(world_size):  # write my row into every rank's buffer
            heap.peer_tensor(buf, peer)[rank].fill_(float(rank))
        heap.barrier()
        want = torch.arange(world_size, dtype=torch.float32).repeat_interleave(33).view(world_size, 33)
        if not torch.equal(buf.cpu(), want):
            bad.append(f"peer_tensor writes: got {buf.cpu().tolist()}")
        view = heap.peer_tensor(buf[1:], (rank + 1) % world_size)
        if view.shape != buf[1:].shape or view.dtype != buf.dtype:
            bad.append(f"peer_tensor view: shape {list(view.shape)} dtype {view.dtype}")
        if heap.peer_tensor(buf, rank) is not buf:
            bad.append("peer_tensor of the own rank is not the tensor itself")
        for args, error in (
            ((torch.zeros(3, device=buf.device), 0), ValueError),  # not on the heap
            ((buf.t(), 0), ValueError),  # not contiguous
            ((buf, world_size), ValueError),
            ((buf, -1), ValueError),
            (("buf", 0), TypeError),
        ):
            try:
                heap.peer_tensor(*args)
            except error:
                continue
            bad.append(f"peer_tensor{args[1:]} with a bad argument did not raise")
        heap.barrier()
    return bad


@pytest.mark.parametrize("world_size", [2, 3])
def test_peer_tensor(world_size):
    require_world(world_size)
    for bad in run_world(peer_tensor_body, world_size, timeout=120):
        assert bad == []
