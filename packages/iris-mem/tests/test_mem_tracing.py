"""Device tracing: what kernels record, what the host exports, and that it costs nothing off.

One traced world (3 ranks on the CPU tier, 2 GPUs on the GPU tier) runs a kernel whose
every program puts a block into the right neighbour's heap inside a user region, adds to
a counter there, gets and loads blocks from the left neighbour and drops an unclosed mark.
The ranks export per-rank and merged Chrome JSON; the tests below read the files and check
every event against what the kernel did (rank, target, bytes, heap offset, nesting in
time), then the ``max_events`` overflow (counted, reported, never written past the buffer),
a kernel built with ``tracing=False`` (records nothing), and the PNG render. Compile checks
prove that ``tracing=False`` leaves the Hopper PTX identical to a kernel that never mentions
tracing, and that ``tracing=True`` reads ``%globaltimer`` and ``%smid``.
"""

import io
import json
import os
import struct

import pytest
import torch
import triton
import triton.language as tl
from mem_testutils import BACKEND, HEAP, MULTI_WORLD, pattern, require_world

import iris.mem
import iris.mem.triton as imt
from iris.mem import log, trace_format
from iris.mem.testing import run_world
from iris.mem.triton import HEAP_BASES_OFFSET, Context

N = 70  # elements: programs of BLOCK lanes, the last one partly masked
BLOCK = 32
PROGRAMS = triton.cdiv(N, BLOCK)
LANES = [min(BLOCK, N - p * BLOCK) for p in range(PROGRAMS)]
DTYPE = torch.float16  # put/get payload: 2 bytes per lane; the loaded ids are int64 (8 bytes)
EVENTS_PER_PROGRAM = 6  # exchange region, put, atomic_add, get, load, mark
SMALL = 7  # max_events of the overflow run

pytestmark = [pytest.mark.timeout(300)]


@triton.jit
def traced_exchange(ctx, src, dst, out, ids, ids_out, counter, offs, n, right, left, pid, EXCHANGE, MARK):
    """The traced kernel's body, layout-free (test_mem_gluon's Gluon kernel runs it too): a
    user region around a put to ``right``, an atomic there, a get and a load from ``left``,
    and an instant mark."""
    mask = offs < n
    region = ctx.tracing.record_event_start(
        EXCHANGE, target_rank=right, address=dst + offs, mask=mask, arg=pid
    )
    ctx.put(src + offs, dst + offs, right, mask=mask)
    ctx.tracing.record_event_end(region)
    ctx.atomic_add(counter, 1, right)
    ctx.get(src + offs, out + offs, left, mask=mask)
    tl.store(ids_out + offs, ctx.load(ids + offs, left, mask=mask), mask=mask)
    ctx.tracing.record_event_start(MARK, address=counter)  # never closed: an instant


@triton.jit
def _traced_kernel(
    context, src, dst, out, ids, ids_out, counter, n,
    EXCHANGE: tl.constexpr, MARK: tl.constexpr, TRACE: tl.constexpr,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    ctx = Context.initialize(context, RANK, WORLD, tracing=TRACE)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    right = (RANK + 1) % WORLD
    left = (RANK + WORLD - 1) % WORLD
    traced_exchange(ctx, src, dst, out, ids, ids_out, counter, offs, n, right, left, pid, EXCHANGE, MARK)


def traced_buffers(heap, rank):
    """The traced kernel's buffers, in one allocation sequence: src, dst, out, ids, ids_out,
    counter."""
    src = heap.as_symmetric(pattern(N, DTYPE, rank).to(heap.device))
    dst, out = heap.zeros(N, dtype=DTYPE), heap.zeros(N, dtype=DTYPE)
    ids = heap.as_symmetric((torch.arange(N, dtype=torch.int64) + 1000 * rank).to(heap.device))
    ids_out = heap.zeros(N, dtype=torch.int64)
    counter = heap.zeros(1, dtype=torch.int32)
    return src, dst, out, ids, ids_out, counter


def traced_data_ok(rank, world_size, dst, out, ids_out, counter) -> bool:
    """Whether the traced kernel moved the left neighbour's data (one count per program)."""
    left = (rank - 1) % world_size
    return (
        torch.equal(dst.cpu(), pattern(N, DTYPE, left))
        and torch.equal(out.cpu(), pattern(N, DTYPE, left))
        and torch.equal(ids_out.cpu(), torch.arange(N) + 1000 * left)
        and counter.item() == PROGRAMS
    )


def traced_world_body(rank, world_size, folder):
    stream = io.StringIO()
    log.configure(stream=stream)
    with iris.mem.init(HEAP) as heap:
        exchange, mark = heap.tracing.register("exchange"), heap.tracing.register("mark")
        src, dst, out, ids, ids_out, counter = traced_buffers(heap, rank)
        heap.barrier()

        def launch(trace):
            _traced_kernel[(PROGRAMS,)](
                heap.get_device_context(), src, dst, out, ids, ids_out, counter, N,
                EXCHANGE=exchange, MARK=mark, TRACE=trace, RANK=rank, WORLD=world_size, BLOCK=BLOCK,
            )  # fmt: skip
            heap.barrier()

        base = heap.get_heap_bases()[rank].item()
        result = {
            "codes": (exchange, mark, heap.tracing.register("exchange")),
            "offsets": {name: t.data_ptr() - base for name, t in (("src", src), ("dst", dst), ("ids", ids))},
        }
        launch(True)  # before enable(): counted as dropped, nothing written
        result["before_enable"] = heap.tracing.stats()
        heap.tracing.enable(max_events=1000)
        counter.zero_()
        heap.barrier()
        launch(True)
        result["data_ok"] = traced_data_ok(rank, world_size, dst, out, ids_out, counter)
        result["raw"] = heap.tracing.events()
        result["stats"] = heap.tracing.stats()
        result["per_rank"] = heap.tracing.export(os.path.join(folder, "trace.json"))
        result["merged"] = heap.tracing.export(os.path.join(folder, "merged.json"), merge=True)

        heap.tracing.enable(max_events=SMALL)
        heap.barrier()
        launch(True)
        result["small_stats"] = heap.tracing.stats()
        result["guard"] = heap.tracing.buffer[-trace_format.GUARD_WORDS :].tolist()
        result["small"] = heap.tracing.export(os.path.join(folder, "small_{rank}.json"))

        heap.tracing.reset()
        launch(False)
        result["untraced_stats"] = heap.tracing.stats()
    result["log"] = stream.getvalue()
    return result


@pytest.fixture(scope="module")
def traced_world(tmp_path_factory):
    require_world(MULTI_WORLD)
    folder = str(tmp_path_factory.mktemp("trace"))
    results = run_world(traced_world_body, MULTI_WORLD, folder, timeout=240)
    return folder, results


def _load(path):
    with open(path) as f:
        return json.load(f)


def _events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] in ("X", "i")]


def _expected(rank, world, offsets):
    """Multiset of (name, program, target, bytes, heap_offset) the kernel records on ``rank``."""
    right, left = (rank + 1) % world, (rank - 1) % world
    rows = []
    for p, lanes in enumerate(LANES):
        block = p * BLOCK
        rows += [
            ("exchange", p, right, 2 * lanes, offsets["dst"] + 2 * block),
            ("put", p, right, 2 * lanes, offsets["dst"] + 2 * block),
            ("atomic_add", p, right, 4, None),  # the counter: offset checked separately
            ("get", p, left, 2 * lanes, offsets["src"] + 2 * block),
            ("load", p, left, 8 * lanes, offsets["ids"] + 8 * block),
            ("mark", p, None, 4, None),
        ]
    return sorted(rows, key=repr)


def _observed(events):
    rows = []
    for e in events:
        a = e["args"]
        offset = a.get("heap_offset") if e["name"] not in ("atomic_add", "mark") else None
        rows.append((e["name"], e["tid"], a.get("target"), a.get("bytes"), offset))
    return sorted(rows, key=repr)


@pytest.mark.gpu
def test_traced_kernel_computes_the_same_data(traced_world):
    _, results = traced_world
    assert [r["data_ok"] for r in results] == [True] * MULTI_WORLD
    base = trace_format.USER_EVENT_BASE
    assert results[0]["codes"] == (base, base + 1, base)  # registering a name again gives its code


@pytest.mark.gpu
def test_per_rank_json_has_every_event_with_rank_target_and_bytes(traced_world):
    folder, results = traced_world
    for rank, r in enumerate(results):
        assert r["per_rank"] == os.path.join(folder, f"trace_rank{rank}.json")
        trace = _load(r["per_rank"])
        events = _events(trace)
        assert len(events) == EVENTS_PER_PROGRAM * PROGRAMS
        assert {e["pid"] for e in events} == {rank}
        assert _observed(events) == _expected(rank, MULTI_WORLD, r["offsets"])
        meta = trace["otherData"]["ranks"]
        assert [(m["rank"], m["recorded"], m["dropped"], m["max_events"]) for m in meta] == [
            (rank, EVENTS_PER_PROGRAM * PROGRAMS, 0, 1000)
        ]
        assert meta[0]["guard_intact"] and trace["otherData"]["dropped_events"] == 0
        assert {e["name"]: e["ph"] for e in events}["mark"] == "i"
        assert all(e["ph"] == "X" for e in events if e["name"] != "mark")


@pytest.mark.gpu
def test_events_nest_in_time_within_each_program(traced_world):
    """Timestamps follow program order: put inside the exchange region, then the atomic,
    the get and the load, each with a non-negative duration."""
    _, results = traced_world
    for r in results:
        by_slot = sorted(r["raw"], key=lambda e: e["slot"])
        for p in range(PROGRAMS):
            ev = {e["name"]: e for e in by_slot if e["program"] == p}
            assert ev["exchange"]["start"] <= ev["put"]["start"] <= ev["put"]["end"] <= ev["exchange"]["end"]
            order = [ev[n] for n in ("exchange", "atomic_add", "get", "load")]
            assert all(a["end"] <= b["start"] for a, b in zip(order, order[1:]))
            assert ev["mark"]["end"] == 0 and ev["mark"]["start"] >= ev["load"]["end"]
            assert ev["exchange"]["arg"] == p
        if BACKEND == "cuda":
            assert all(e["sm"] >= 0 for e in by_slot)
        else:
            assert all(e["sm"] == -1 for e in by_slot)


@pytest.mark.gpu
def test_merged_json_is_the_union_of_the_ranks_on_one_clock(traced_world):
    folder, results = traced_world
    assert results[0]["merged"] == os.path.join(folder, "merged.json")
    assert all(r["merged"] is None for r in results[1:])
    merged = _load(results[0]["merged"])
    events = _events(merged)
    assert {e["pid"] for e in events} == set(range(MULTI_WORLD))
    per_rank = [e for r in results for e in _events(_load(r["per_rank"]))]
    key = lambda e: (e["pid"], e["tid"], e["args"]["slot"])  # noqa: E731
    # Per-rank files and the merged file share the time origin (the earliest enable()).
    assert sorted(events, key=key) == sorted(per_rank, key=key)
    assert min(e["ts"] for e in events) >= 0
    assert [m["rank"] for m in merged["otherData"]["ranks"]] == list(range(MULTI_WORLD))
    assert merged["otherData"]["recorded_events"] == EVENTS_PER_PROGRAM * PROGRAMS * MULTI_WORLD
    names = {e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"rank {r}" for r in range(MULTI_WORLD)}


@pytest.mark.gpu
def test_max_events_counts_drops_and_never_writes_past_the_buffer(traced_world):
    _, results = traced_world
    total = EVENTS_PER_PROGRAM * PROGRAMS
    for rank, r in enumerate(results):
        assert r["before_enable"] == {"max_events": 0, "recorded": 0, "dropped": total, "guard_intact": True}
        assert r["small_stats"] == {
            "max_events": SMALL,
            "recorded": SMALL,
            "dropped": total - SMALL,
            "guard_intact": True,
        }
        assert r["guard"] == [trace_format.GUARD] * trace_format.GUARD_WORDS
        small = _load(r["small"])
        assert len(_events(small)) == SMALL
        assert small["otherData"]["dropped_events"] == total - SMALL
        warning = f"[{rank}/{MULTI_WORLD}] WARNING iris.mem.tracing: {total - SMALL} trace events dropped"
        assert warning in r["log"]


@pytest.mark.gpu
def test_kernel_built_without_tracing_records_nothing(traced_world):
    _, results = traced_world
    for r in results:
        assert r["untraced_stats"] == {"max_events": SMALL, "recorded": 0, "dropped": 0, "guard_intact": True}


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_render_draws_merged_and_per_rank_traces(traced_world, tmp_path):
    pytest.importorskip("matplotlib")
    from iris.mem import tracing

    folder, results = traced_world
    merged_png = tracing.render(results[0]["merged"], tmp_path / "merged.png")
    width, height = _png_size(merged_png)
    assert width > 800 and height > 200
    # The command line, from the per-rank files.
    files = [r["per_rank"] for r in results]
    assert tracing.main(["render", *files, str(tmp_path / "ranks.png"), "--title", "ranks"]) == 0
    assert _png_size(tmp_path / "ranks.png")[0] > 800


def test_render_rejects_a_file_without_events(tmp_path):
    from iris.mem import tracing

    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="no trace events"):
        tracing.render(empty, tmp_path / "x.png")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a Chrome trace"):
        tracing.render(tmp_path / "bad.json", tmp_path / "x.png")


def tracing_errors_body(rank, world_size):
    with iris.mem.init(HEAP) as heap:
        errors = {}
        for bad in (0, -5, 2.5, True, "10"):
            try:
                heap.tracing.enable(max_events=bad)
            except ValueError as e:
                errors[repr(bad)] = str(e)
        try:
            heap.tracing.export("never.json")
        except RuntimeError as e:
            errors["export"] = str(e)
        try:
            heap.tracing.register("")
        except ValueError as e:
            errors["register"] = str(e)
        return errors


def test_bad_tracing_arguments_raise_clear_errors():
    (errors,) = run_world(tracing_errors_body, 1, timeout=120)
    assert len(errors) == 7, errors
    assert all(
        "max_events must be a positive number" in errors[k] for k in ("0", "-5", "2.5", "True", "'10'")
    )
    assert "call heap.tracing.enable() first" in errors["export"]
    assert "non-empty string" in errors["register"]


# --------------------------------------------------------------------------- logging


@pytest.fixture
def iris_log():
    """Capture the ``iris`` logger's output; restore its stream and level afterwards."""
    root = log.get_logger(log.ROOT)  # sets the handler up if nothing has yet
    stream_before, level_before = root.handlers[0].stream, root.level
    stream = io.StringIO()
    log.configure(stream=stream)
    yield stream
    log.configure(level=level_before, stream=stream_before)


def test_log_lines_carry_rank_and_world(iris_log, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    log.get_logger("iris.mem.test").warning("hello %d", 7)
    log.get_logger("ccl_thing").error("routed under iris")
    lines = iris_log.getvalue().splitlines()
    assert lines == ["[2/3] WARNING iris.mem.test: hello 7", "[2/3] ERROR iris.ccl_thing: routed under iris"]


@pytest.mark.parametrize(
    "level, shown",
    [("", ["warning", "error"]), ("debug", ["debug", "info", "warning", "error"]), ("ERROR", ["error"])],
)
def test_log_level_comes_from_iris_log_level(iris_log, monkeypatch, level, shown):
    monkeypatch.setenv("IRIS_LOG_LEVEL", level)
    log.configure()
    logger = log.get_logger("iris.mem.test")
    for name in ("debug", "info", "warning", "error"):
        getattr(logger, name)(name)
    assert [line.rsplit(" ", 1)[-1] for line in iris_log.getvalue().splitlines()] == shown


def test_bad_iris_log_level_is_a_clear_error(iris_log, monkeypatch):
    monkeypatch.setenv("IRIS_LOG_LEVEL", "chatty")
    with pytest.raises(ValueError, match="IRIS_LOG_LEVEL='chatty' is not a log level"):
        log.configure()


# --------------------------------------------------------------------------- Hopper compile


@triton.jit
def _rma_kernel(
    context, src, dst, flags, n, peer,
    FUNCTIONAL: tl.constexpr, TRACE: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Every RMA method through ``Context`` (with a user region) or, with FUNCTIONAL, the
    same calls through the functional API, which knows nothing of tracing."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if FUNCTIONAL:
        bases = context + HEAP_BASES_OFFSET
        x = imt.load(src + offs, RANK, peer, bases, mask=mask, other=0.0)
        imt.store(dst + offs, x, RANK, peer, bases, mask=mask)
        imt.get(src + offs, dst + offs, peer, RANK, bases, mask=mask)
        imt.put(src + offs, dst + offs, RANK, peer, bases, mask=mask)
        imt.copy(src + offs, dst + offs, peer, RANK, RANK, bases, mask=mask)
        imt.atomic_add(flags, 1, RANK, peer, bases, sem="release", scope="sys")
        imt.atomic_max(flags + 1, 1, RANK, peer, bases)
        imt.atomic_xchg(flags + 2, 1, RANK, peer, bases)
        imt.atomic_cas(flags + 3, 0, 1, RANK, peer, bases, sem="acquire", scope="sys")
    else:
        ctx = Context.initialize(context, RANK, WORLD, tracing=TRACE)
        region = ctx.tracing.record_event_start(3072, target_rank=peer, address=dst + offs, mask=mask)
        x = ctx.load(src + offs, peer, mask=mask, other=0.0)
        ctx.store(dst + offs, x, peer, mask=mask)
        ctx.get(src + offs, dst + offs, peer, mask=mask)
        ctx.put(src + offs, dst + offs, peer, mask=mask)
        ctx.copy(src + offs, dst + offs, peer, RANK, mask=mask)
        ctx.atomic_add(flags, 1, peer, sem="release", scope="sys")
        ctx.atomic_max(flags + 1, 1, peer)
        ctx.atomic_xchg(flags + 2, 1, peer)
        ctx.atomic_cas(flags + 3, 0, 1, peer, sem="acquire", scope="sys")
        ctx.tracing.record_event_end(region)


def _instructions(ptx: str) -> list[str]:
    """PTX without debug information: line markers, the labels they use, debug sections."""
    body = ptx.split(".section\t.debug", 1)[0].split(".section .debug", 1)[0]
    lines = (ln.strip() for ln in body.splitlines())
    return [ln for ln in lines if ln and not ln.startswith((".loc", ".file", "$L__tmp"))]


def child_main(group: str) -> dict:
    """Compile in the child process (see test_mem_compile.run_child)."""
    from test_mem_compile import _compile, toolchain_missing

    missing = toolchain_missing()
    if missing:
        return {"skip": missing}
    from iris.mem.tracing import _read_clock_kernel

    fails, report = [], {}
    sig = {"context": "*i64", "src": "*fp32", "dst": "*fp32", "flags": "*i32", "n": "i32", "peer": "i32"}
    ptx = {}
    for name, functional, trace in (("functional", True, False), ("off", False, False), ("on", False, True)):
        consts = {"FUNCTIONAL": functional, "TRACE": trace, "RANK": 1, "WORLD": 3, "BLOCK": 256}
        ptx[name] = _compile(_rma_kernel, sig, consts, aligned=("src", "dst")).asm["ptx"]
    report["lines"] = {k: len(_instructions(v)) for k, v in ptx.items()}
    if _instructions(ptx["off"]) != _instructions(ptx["functional"]):
        fails.append("tracing=False PTX differs from the same calls through the functional API")
    for needle in ("%globaltimer", "%smid"):
        if needle not in ptx["on"]:
            fails.append(f"tracing=True PTX does not read {needle}")
        if needle in ptx["off"]:
            fails.append(f"tracing=False PTX reads {needle}")
    clock = _compile(_read_clock_kernel, {"out": "*i64"}, {})
    if "%globaltimer" not in clock.asm["ptx"] or not clock.asm.get("cubin"):
        fails.append("the clock-calibration kernel does not read %globaltimer")
    # The kernels the GPU tier launches (user events without an address, scalar pointers).
    world = {"context": "*i64", "src": "*fp16", "dst": "*fp16", "out": "*fp16", "ids": "*i64",
             "ids_out": "*i64", "counter": "*i32", "n": "i32"}  # fmt: skip
    handoff = {"context": "*i64", "data": "*fp32", "flag": "*i32", "n": "i32", "budget": "i32"}
    for trace in (False, True):
        consts = {"EXCHANGE": 4096, "MARK": 4097, "TRACE": trace, "RANK": 0, "WORLD": 2, "BLOCK": BLOCK}
        _compile(_traced_kernel, world, consts)
    for rank in (0, 1):
        consts = {"SEND": 4096, "WAIT": 4097, "RANK": rank, "WORLD": 2, "BLOCK": BLOCK}
        if "%globaltimer" not in _compile(_handoff_kernel, handoff, consts).asm["ptx"]:
            fails.append(f"hand-off kernel of rank {rank} does not read %globaltimer")
    return {"failures": fails, "report": report}


def test_tracing_compiles_away_and_reads_the_gpu_clock_on_hopper():
    from test_mem_compile import run_child

    result = run_child("tracing", module="test_mem_tracing")
    assert result["failures"] == [], "\n".join(result["failures"])
    lines = result["report"]["lines"]
    assert lines["on"] > lines["off"], lines  # negative control: tracing=True does add code


# --------------------------------------------------------------------------- GPU: real clocks

SLEEP_S = 0.1  # rank 0 starts its kernel this long after rank 1 starts waiting


@triton.jit
def _handoff_kernel(context, data, flag, n, budget, SEND: tl.constexpr, WAIT: tl.constexpr,
                    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Rank 0 puts a block into rank 1 and raises its flag (release); rank 1 waits for the
    flag (acquire) inside a WAIT region."""
    ctx = Context.initialize(context, RANK, WORLD, tracing=True)
    offs = tl.arange(0, BLOCK)
    if RANK == 0:
        region = ctx.tracing.record_event_start(SEND, target_rank=1)
        ctx.put(data + offs, data + offs, 1, mask=offs < n)
        ctx.atomic_xchg(flag, 1, 1, sem="release", scope="sys")
        ctx.tracing.record_event_end(region)
    else:
        region = ctx.tracing.record_event_start(WAIT, target_rank=0)
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
        spins = tl.full([], 0, tl.int32)
        while (seen == 0) & (spins < budget):
            seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
            spins += 1
        ctx.tracing.record_event_end(region)


def handoff_body(rank, world_size, folder):
    import time

    with iris.mem.init(HEAP) as heap:
        send, wait = heap.tracing.register("send"), heap.tracing.register("wait")
        data = heap.ones(BLOCK, dtype=torch.float32)
        flag = heap.zeros(1, dtype=torch.int32)
        heap.tracing.enable(max_events=64)
        for measured in (False, True):  # the first round compiles the kernel
            flag.zero_()
            heap.tracing.reset()
            heap.barrier()
            if rank == 0 and measured:
                time.sleep(SLEEP_S)
            _handoff_kernel[(1,)](
                heap.get_device_context(), data, flag, BLOCK, 1 << 26,
                SEND=send, WAIT=wait, RANK=rank, WORLD=world_size, BLOCK=BLOCK,
            )  # fmt: skip
            heap.barrier()
        sms = torch.cuda.get_device_properties(heap.device).multi_processor_count if BACKEND == "cuda" else 0
        path = heap.tracing.export(os.path.join(folder, "handoff.json"), merge=True)
        return {"flag": flag.item(), "path": path, "sms": sms, "events": heap.tracing.events()}


@pytest.mark.gpu
@pytest.mark.skipif(BACKEND != "cuda", reason="real GPU clocks: run with IRIS_BACKEND=cuda on 2 GPUs")
def test_gpu_clocks_are_ns_and_aligned_across_ranks(tmp_path):
    """On GPUs: the waiting rank's region lasts about the host's sleep (so the clock counts
    ns), ends after the other rank raised the flag (so the ranks' clocks are aligned within
    the tolerance), and every event names a real SM."""
    require_world(2, separate_gpus="the alignment of two GPUs' clocks")
    results = run_world(handoff_body, 2, str(tmp_path), timeout=240)
    assert results[1]["flag"] == 1
    for r in results:
        assert all(0 <= e["sm"] < r["sms"] for e in r["events"])
        assert all(e["end"] >= e["start"] > 0 for e in r["events"])
    events = {e["name"]: e for e in _events(_load(results[0]["path"]))}
    wait, xchg, send = events["wait"], events["atomic_xchg"], events["send"]
    assert (wait["pid"], xchg["pid"], send["pid"]) == (1, 0, 0)
    assert 0.5 * SLEEP_S * 1e6 <= wait["dur"] <= 20 * SLEEP_S * 1e6, wait
    tolerance_us = 50.0  # clock pairing error of the two ranks, both sides
    wait_end = wait["ts"] + wait["dur"]
    assert wait_end >= xchg["ts"] - tolerance_us, (wait, xchg)
    assert wait_end <= xchg["ts"] + xchg["dur"] + 5000.0, (wait, xchg)  # seen within 5 ms
    assert send["ts"] >= wait["ts"] + 0.5 * SLEEP_S * 1e6 - tolerance_us
