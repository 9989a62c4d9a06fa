"""``iris.ccl.send`` / ``recv`` and ``barrier``.

Messages are compared with ``torch.distributed`` (gloo ``isend``/``irecv`` of the same data
on CPU, floats as an fp32 upcast) or with the sender's deterministic input. Every test
starts one real multi-process world and loops over its cases inside the ranks; each rank
body returns a list of mismatch descriptions (empty when everything matched).
"""

import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from ccl_testutils import (
    BACKEND,
    DTYPES,
    SIZES,
    device,
    dtype_name,
    make_input,
    mismatch,
    require_world,
    setup_rank,
)

from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

WORLD_TIMEOUT = 300.0
MODES = ("plain", "heap", "strided")


# --------------------------------------------------------------------------- helpers (in ranks)


def _wire(x: torch.Tensor) -> torch.Tensor:
    t = x.detach().cpu().contiguous().clone()
    return t.float() if t.dtype.is_floating_point else t


def ref_exchange(x: torch.Tensor, to: int, frm: int, group) -> torch.Tensor:
    """What ``frm`` sends this rank while this rank sends ``x`` to ``to`` (gloo)."""
    t = _wire(x)
    buf = torch.empty_like(t)
    reqs = [dist.isend(t, to, group=group), dist.irecv(buf, frm, group=group)]
    for r in reqs:
        r.wait()
    return buf.to(x.dtype).to(x.device)


def _layout(x: torch.Tensor, mode: str, heap) -> torch.Tensor:
    """``x``'s values as a plain tensor, a fresh heap tensor, or a non-contiguous view."""
    if mode == "heap":
        return heap.as_symmetric(x.contiguous())
    if mode == "strided":
        view = torch.zeros((*x.shape, 2), dtype=x.dtype, device=x.device)[..., 1]
        view.copy_(x)
        return view
    return x.clone()


def _run(world_size: int, fn, *args, env=None):
    require_world(world_size)
    return run_world(fn, world_size, *args, timeout=WORLD_TIMEOUT, env=env)


def _assert_clean(results, min_cases: int = 1) -> None:
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    assert max(res["cases"] for res in results) >= min_cases


# --------------------------------------------------------------------------- send / recv


def ring_body(rank, world_size, members, sizes):
    """Every member sends to its right neighbour, then receives from its left one (messages
    of up to one mailbox slot do not wait for the receiver), over ``sizes`` with dtypes and
    layouts cycling; compared with gloo's isend/irecv of the same data."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    group = dist.new_group(members) if members is not None else None
    ranks = members if members is not None else list(range(world_size))
    bad: list[str] = []
    if rank not in ranks:
        _expect(bad, ValueError, ["not a member"], ccl.send, torch.ones(3), members[0], group=group)
        return {"bad": bad, "cases": 0}
    heap = iris.mem.init(8 << 20, group=group)
    me = ranks.index(rank)
    right, left = ranks[(me + 1) % len(ranks)], ranks[(me - 1) % len(ranks)]
    cases = 0
    for i, n in enumerate(sizes):
        dtype = DTYPES[i % len(DTYPES)]
        mode = MODES[i % len(MODES)]
        x = make_input((n,), dtype, rank, i)
        want = ref_exchange(x, right, left, group)
        src = _layout(x, mode, heap)
        out = _layout(torch.full_like(x, 77), MODES[(i + 1) % len(MODES)], heap)
        ccl.send(src, right, group=group)
        ccl.recv(out, left, group=group)
        what = f"ring group={ranks} {dtype_name(dtype)} n={n} {mode}"
        if (m := mismatch(out, want, what)) is not None:
            bad.append(m)
        if not torch.equal(src.cpu(), x.cpu()):
            bad.append(f"{what}: send modified its tensor")
        cases += 1
    heap.close()
    return {"bad": bad, "cases": cases}


@pytest.mark.parametrize("world_size", [pytest.param(2, marks=pytest.mark.full), 3, 4])
def test_send_recv_ring(world_size):
    sizes = SIZES + [1, 33, 4099] if world_size == 2 else SIZES + [33]
    _assert_clean(_run(world_size, ring_body, None, sizes), len(sizes))


def test_send_recv_subgroup_of_uneven_ranks():
    """Peers are global ranks of the group [0, 2, 3]; rank 1 is refused."""
    _assert_clean(_run(4, ring_body, [0, 2, 3], [1, 1000, 77]), 3)


# Messages rank 0 sends rank 1 back to back: (shape, dtype, salt).
QUEUE = [
    ((1,), torch.int64, 1),
    ((7,), torch.float16, 2),
    ((3, 333), torch.float32, 3),
    ((4099,), torch.bfloat16, 4),
]


def ordering_body(rank, world_size):
    """Several messages between one pair are received in the order sent, even when the
    receiver starts late; the other direction and other pairs run at the same time."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    ccl.barrier()  # every rank makes the group's communicator together
    if rank == 0:
        for shape, dtype, salt in QUEUE:
            ccl.send(make_input(shape, dtype, 0, salt), 1)
    elif rank == 1:
        time.sleep(0.5)  # the first message waits in the mailbox, the second in send
        for shape, dtype, salt in QUEUE:
            out = torch.empty(shape, dtype=dtype, device=device())
            ccl.recv(out, 0)
            if (m := mismatch(out, make_input(shape, dtype, 0, salt), f"message {salt}")) is not None:
                bad.append(m)
    # Both directions at once within every pair (0, 1), (2, 3).
    partner = rank ^ 1
    if partner < world_size:
        for k in range(3):
            out = torch.zeros(500 + k, dtype=torch.int32, device=device())
            work = ccl.send(make_input((500 + k,), torch.int32, rank, 10 + k), partner, async_op=True)
            if not isinstance(work, ccl.Work) or work.wait() is not True:
                bad.append(f"send(async_op=True) returned {work!r}")
            work = ccl.recv(out, partner, async_op=True)
            if not isinstance(work, ccl.Work) or work.wait() is not True:
                bad.append(f"recv(async_op=True) returned {work!r}")
            if (
                m := mismatch(out, make_input((500 + k,), torch.int32, partner, 10 + k), f"pair {k}")
            ) is not None:
                bad.append(m)
    return {"bad": bad, "cases": 1}


def test_send_recv_order_and_pairs():
    _assert_clean(_run(4, ordering_body))


def large_body(rank, world_size):
    """Messages larger than the mailbox slot (IRIS_CCL_P2P_BYTES=16 KiB here) go in several
    rounds; even ranks send first and odd ranks receive first, so a ring of large messages
    cannot deadlock (send-before-recv on every rank would, as with blocking sends in MPI)."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    cases = 0
    for salt, (n, dtype) in enumerate([(25_001, torch.float32), (8193, torch.float16), (4096, torch.int32)]):
        x = make_input((n,), dtype, rank, salt)
        out = torch.full_like(x, 77)
        if rank % 2 == 0:
            ccl.send(x, right)
            ccl.recv(out, left)
        else:
            ccl.recv(out, left)
            ccl.send(x, right)
        want = make_input((n,), dtype, left, salt)
        if (
            m := mismatch(out, want, f"large {dtype_name(dtype)} n={n} ({n * x.element_size()} bytes)")
        ) is not None:
            bad.append(m)
        cases += 1
    return {"bad": bad, "cases": cases}


def test_send_recv_larger_than_mailbox():
    _assert_clean(_run(3, large_body, env={"IRIS_CCL_P2P_BYTES": "16384"}), 3)


def mixed_alignment_body(rank, world_size):
    """A message of whole 16-byte words sent as int32 vectors is received byte by byte into
    an unaligned view, and the other way round (and the bytes are the same). On GPUs 20
    rounds, the sender never waiting on the host: before run_world synchronised a rank's
    device before its process exited, the sender's last queued launches were killed with it
    and the receiver waited for them in vain (seen as a flaky failure of this test)."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    n = 64 * 1024 + 4  # more than one tile, a whole number of 16-byte words
    x = make_input((n,), torch.float32, 0, 5)
    rounds = 20 if BACKEND == "cuda" else 1
    for unaligned_receiver in (True, False) * rounds:
        buf = torch.zeros(n + 1, dtype=torch.float32, device=device())
        if rank == 0:
            src = buf[1:] if not unaligned_receiver else buf[:n]
            src.copy_(x)
            ccl.send(src, 1)
        elif rank == 1:
            dst = buf[1:] if unaligned_receiver else buf[:n]
            ccl.recv(dst, 0)
            ccl.check_errors()  # a wait that gave up (GPUs record it) is an error, not zeros
            if (m := mismatch(dst, x, f"unaligned receiver={unaligned_receiver}")) is not None:
                bad.append(m)
    ccl.check_errors()  # the sender's waits too (it ran ahead of the receiver all along)
    return {"bad": bad, "cases": 2 * rounds}


def test_send_recv_between_word_and_byte_copies():
    _assert_clean(_run(2, mixed_alignment_body))


def late_receiver_body(rank, world_size, delay):
    """A message of three mailbox slots (the sender waits for the receiver between slots)
    whose receiver starts ``delay`` seconds late: waits are timed (IRIS_WAIT_TIMEOUT), not
    counted; the old default poll count ran out after 15 s at most on H200."""
    setup_rank()
    import iris.ccl as ccl

    ccl.barrier()
    bad: list[str] = []
    n = 3 * int(os.environ["IRIS_CCL_P2P_BYTES"]) // 4 + 4  # whole 16-byte words, 3 slots and a bit
    x = make_input((n,), torch.float32, 0, 7)
    if rank == 0:
        started = time.monotonic()
        ccl.send(x, 1)
        ccl.check_errors()  # synchronises: the sender's own waits for the receiver
        if time.monotonic() - started < delay / 2:
            bad.append(f"the send took {time.monotonic() - started:.1f} s: it did not wait for the receiver")
    elif rank == 1:
        time.sleep(delay)
        out = torch.empty_like(x)
        ccl.recv(out, 0)
        ccl.check_errors()
        if (m := mismatch(out, x, "late receiver")) is not None:
            bad.append(m)
    return {"bad": bad, "cases": 1}


def test_send_waits_for_a_late_receiver():
    # On GPUs the default timeout (300 s) and a delay longer than the old default poll count
    # lasted; the interpreter is slower to start a kernel, so a shorter delay suffices there.
    delay, env = (10.0, {}) if BACKEND == "cuda" else (3.0, {"IRIS_WAIT_TIMEOUT": "60"})
    env["IRIS_CCL_P2P_BYTES"] = str(16 * 1024)
    _assert_clean(_run(2, late_receiver_body, delay, env=env))


def timeout_body(rank, world_size):
    """A recv with no matching send, and a send whose previous message was never received,
    give up with DeviceWaitTimeout naming both ranks; afterwards the pair still works."""
    setup_rank()
    import iris.ccl as ccl
    import iris.mem

    bad: list[str] = []
    ccl.barrier()
    x = torch.arange(10, dtype=torch.float32, device=device())

    def checked(fn, *args):
        """On GPUs a kernel only records the timeout; check_errors() raises it."""
        fn(*args)
        ccl.check_errors()

    if rank == 1:
        words = ["rank 1", "rank 0"]
        _expect(bad, iris.mem.DeviceWaitTimeout, words, checked, ccl.recv, torch.empty_like(x), 0)
    dist.barrier()
    if rank == 0:
        ccl.send(x, 1)  # buffered in rank 1's mailbox
        _expect(bad, iris.mem.DeviceWaitTimeout, ["rank 0", "rank 1"], checked, ccl.send, x + 1, 1)
    dist.barrier()
    if rank == 0:
        ccl.send(x + 2, 1)
    else:
        for k in (0, 2):
            out = torch.empty_like(x)
            ccl.recv(out, 0)
            if (m := mismatch(out, x + k, f"after timeouts, message {k}")) is not None:
                bad.append(m)
    return {"bad": bad, "cases": 1}


def test_send_recv_timeouts_are_reported():
    limit = "2" if os.environ.get("IRIS_BACKEND", "cpu") == "cpu" else "0.5"
    _assert_clean(_run(2, timeout_body, env={"IRIS_WAIT_TIMEOUT": limit}))


# --------------------------------------------------------------------------- bad input


def _expect(bad: list, exc, words, fn, *args, **kwargs) -> None:
    """``fn(*args, **kwargs)`` must raise ``exc`` with every word of ``words`` in its message."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        missing = [w for w in words if w not in str(e)]
        if missing:
            bad.append(f"{fn.__name__}: message lacks {missing}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - reported
        bad.append(f"{fn.__name__}: raised {type(e).__name__} instead of {exc.__name__}: {e}")
        return
    bad.append(f"{fn.__name__}{args!r:.80}: did not raise {exc.__name__}")


def bad_input_body(rank, world_size):
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    t = torch.ones(4, device=device())
    _expect(bad, ValueError, ["itself"], ccl.send, t, rank)
    _expect(bad, ValueError, ["itself"], ccl.recv, t, rank)
    _expect(bad, ValueError, [f"dst={world_size}"], ccl.send, t, world_size)
    _expect(bad, ValueError, ["src=-1"], ccl.recv, t, -1)
    _expect(bad, ValueError, ["src=None"], ccl.recv, t, None)
    _expect(bad, TypeError, ["to_dense"], ccl.send, t.to_sparse(), (rank + 1) % world_size)
    _expect(bad, TypeError, ["torch.Tensor"], ccl.recv, [1.0], (rank + 1) % world_size)
    if world_size > 1:  # nothing was communicated: a valid exchange still works
        out = torch.empty_like(t)
        ccl.send(t * rank, (rank + 1) % world_size)
        ccl.recv(out, (rank - 1) % world_size)
        if (m := mismatch(out, t * ((rank - 1) % world_size), "exchange after bad input")) is not None:
            bad.append(m)
    return {"bad": bad, "cases": 1}


@pytest.mark.parametrize("world_size", [1, 3])
def test_send_recv_bad_input(world_size):
    _assert_clean(_run(world_size, bad_input_body))


# --------------------------------------------------------------------------- barrier


def barrier_body(rank, world_size, members):
    """Repeated barriers (sync and async); the barrier really waits: a late rank holds
    every other member back; members of a subgroup only wait for each other."""
    setup_rank()
    import iris.ccl as ccl

    bad: list[str] = []
    group = dist.new_group(members) if members is not None else None
    ranks = members if members is not None else list(range(world_size))
    if rank not in ranks:
        _expect(bad, ValueError, ["not a member"], ccl.barrier, group)
        return {"bad": bad, "cases": 1}
    for _ in range(20):
        ccl.barrier(group)
    work = ccl.barrier(group=group, async_op=True)
    if not isinstance(work, ccl.Work) or work.wait() is not True:
        bad.append(f"barrier(async_op=True) returned {work!r}")
    late = ranks[-1]
    for _ in range(2):
        if rank == late:
            time.sleep(1.0)
        start = time.monotonic()
        ccl.barrier(group)
        if device().type == "cuda":
            torch.cuda.synchronize()
        waited = time.monotonic() - start
        if len(ranks) > 1 and rank != late and waited < 0.6:
            bad.append(f"barrier returned after {waited:.2f} s although rank {late} arrived 1 s late")
    return {"bad": bad, "cases": 1}


@pytest.mark.parametrize("world_size", [1, pytest.param(2, marks=pytest.mark.full), 3])
def test_barrier(world_size):
    _assert_clean(_run(world_size, barrier_body, None))


def test_barrier_subgroup_of_uneven_ranks():
    _assert_clean(_run(4, barrier_body, [0, 2, 3]))


# --------------------------------------------------------------------------- Hopper compile


def compile_child() -> list[str]:
    """Compile the send, recv and barrier kernels for sm_90 (run with IRIS_BACKEND=cuda, no
    interpreter): with int32 words (messages of whole 16-byte words) the copies must be
    16-byte vectors; the byte form (any other message) must compile."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    lead = {"context": "*i64", "members": "*i32", "flags": "*i32", "epochs": "*i32", "status": "*i64"}
    lead["budget"], lead["SIG"] = "i64", "i32"
    p2p = importlib.import_module("iris.ccl.p2p")
    barrier = importlib.import_module("iris.ccl.barrier")
    common = {"seq": "*i32", "ack": "*i32", "nbytes": "i32", "peer": "i32"}
    common["count"] = "*i32"
    cases = [
        (p2p._transfer_kernel, {"data": f"*{t}", "box": f"*{t}", "SEND": send, **common}, block)
        for t, block in (("i32", 4096), ("u8", 16384))
        for send in (True, False)
    ]
    cases.append((barrier._barrier_kernel, {}, 1024))
    fails = []
    aligned = [["tt.divisibility", 16]]
    for fn, sig, block in cases:
        names = list(fn.arg_names)
        sig = {**lead, **sig}
        attrs = {(names.index(a),): aligned for a in ("data", "box", "nbytes") if a in sig}
        consts = {"RANK": 1, "WORLD": 2, "GROUP": 2, "ME": 1, "BLOCK": block}
        if "SEND" in sig:
            consts["SEND"] = sig.pop("SEND")
        src = ASTSource(fn, {a: sig.get(a, "constexpr") for a in names}, constexprs=consts, attrs=attrs)
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        except Exception as e:  # noqa: BLE001 - reported
            fails.append(f"{fn.__name__}: {type(e).__name__}: {e}"[:2000])
            continue
        ptx = k.asm["ptx"]
        if "sys.release" not in ptx or ".acquire" not in ptx:
            fails.append(f"{fn.__name__}: no release/acquire at system scope in the PTX")
        words = sig.get("box") == "*i32"
        if words and not ("ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx):
            fails.append(f"{fn.__name__} (int32 words): the copies are not 16-byte vectors")
    return fails


def test_p2p_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(IRIS_BACKEND="cuda", TRITON_INTERPRET="0")
    here = os.path.dirname(os.path.abspath(__file__))
    code = "import sys, test_ccl_p2p as t; f = t.compile_child(); print('\\n'.join(f)); sys.exit(bool(f))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
