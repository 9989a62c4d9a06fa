"""Launch a real multi-process world on this machine, for tests and examples.

:func:`run_world` starts ``world_size`` fresh processes joined by torch.distributed (a
file store in a private temporary folder, so concurrent worlds never collide), runs a
function in each, and returns what every rank returned. A rank that raises, crashes or
outlives the deadline fails the whole world: every rank is killed at the deadline and
the error names the ranks and shows their tracebacks.

A world needs ranks, not GPUs: with the cuda backend its ranks use the GPUs present round
robin (``LOCAL_RANK`` modulo their number), so on a machine with fewer GPUs than ranks, one
included, ranks share GPUs (:func:`shares_gpus`). :func:`gpu_skip_reason` says why a case
cannot run here (no GPU at all, or a case that needs a GPU per rank). Where ranks share a
GPU, each hand-off between them waits for the GPU to switch processes, so every deadline
grows by the number of ranks per GPU (:func:`deadline_scale`).

Deadlines must hold on a loaded machine: with ``IRIS_TEST_DURATIONS`` set to a file path,
every world and example appends one JSON line to it (the pytest test that ran it, the world
size, the deadline and the seconds taken), which ``.ci/check_deadlines.py`` compares.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from .bootstrap import host_group
from .machine import Capabilities
from .watchdog import CLEAN_END, describe_exception, report_exit

_PRELOAD = ["torch", "triton", "triton.language"]

#: What a rank's process runs first, as source for the built-in ``exec`` (which the process
#: finds without importing anything). A rank's environment must be in place before any
#: module of Iris is imported, since some read variables at import (``IRIS_DEBUG`` decides
#: whether kernels carry bounds checks), and a function of this module as the process's
#: target would import the whole ``iris.mem`` package first. ``SYS_PATH``: the launcher's
#: ``sys.path``, so that the function is unpickled by reference like in the launcher.
_RANK_ENTRY = """
import os, sys
sys.path[:] = SYS_PATH + [p for p in sys.path if p not in SYS_PATH]
os.environ.update(ENV)
from iris.mem.testing import _run_rank
_run_rank(*ARGS)
"""


@dataclasses.dataclass
class RankResult:
    """What one rank of a world did: its exit code, return value or error text."""

    rank: int
    exitcode: int | None
    value: Any = None
    error: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and self.error is None and not self.timed_out


class WorldError(RuntimeError):
    """One or more ranks of a world failed, crashed or timed out."""

    def __init__(self, message: str, results: list[RankResult]):
        super().__init__(message)
        self.results = results


def record_duration(
    kind: str, world_size: int, timeout: float, seconds: float, what: str = "", timed_out: bool = False
) -> None:
    """Append a duration record to ``$IRIS_TEST_DURATIONS`` when it is set (see the module
    docstring). One ``write`` of one line in append mode: concurrent writers do not mix.
    ``timed_out``: the run was killed at its deadline (its test failed, or meant it to happen)."""
    path = os.environ.get("IRIS_TEST_DURATIONS")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or "-"
    line = json.dumps(
        {"test": test, "kind": kind, "what": what, "world_size": world_size, "timeout": timeout,
         "seconds": round(seconds, 3), "timed_out": timed_out}
    )  # fmt: skip
    with open(path, "a") as f:
        f.write(line + "\n")


def _run_rank(
    payload: bytes, rank: int, world_size: int, store: str, result_path: str, timeout_s: float
) -> None:
    """The life of one rank of a world (started by :data:`_RANK_ENTRY`): join the world, run
    the function, write what it returned or raised to ``result_path``, exit."""
    code = 1
    outcome: dict[str, Any]
    try:
        torch.set_num_threads(1)
        fn, args, kwargs, backend = pickle.loads(payload)
        dist.init_process_group(
            backend=backend,
            init_method=f"file://{store}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        # Finish the rendezvous on every rank before any rank can run ahead, finish and
        # tear its connections down under a peer that is still connecting. On the CPU: a
        # world of NCCL alone barriers through a gloo group of the same ranks, since NCCL
        # refuses ranks that share a GPU.
        dist.barrier(group=host_group(None))
        try:
            try:
                value = fn(rank, world_size, *args, **kwargs)
            except BaseException as e:  # tell the peers' watchdogs, as an uncaught exception would
                report_exit(describe_exception(e))
                raise
            report_exit(CLEAN_END)  # as the end of a Python program would (os._exit skips atexit)
            # The rank's queued GPU work is part of its result: os._exit below would kill
            # kernels still in flight (a send whose receiver has not caught up yet).
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
        finally:
            dist.destroy_process_group()
        outcome = {"value": value}
        code = 0
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit
        outcome = {"error": traceback.format_exc()}
    try:
        with open(result_path, "wb") as f:
            pickle.dump(outcome, f)
    except Exception:  # noqa: BLE001 - an unpicklable return value becomes an error
        with open(result_path, "wb") as f:
            pickle.dump({"error": f"rank {rank} returned an unpicklable value\n{traceback.format_exc()}"}, f)
        code = 1
    os._exit(code)


def launch_world(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    backend: str = "gloo",
    **kwargs: Any,
) -> list[RankResult]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` new processes.

    :param fn: a module-level (picklable) function. A rank's result is taken after its
        current CUDA device has finished the work ``fn`` queued.
    :param timeout: seconds until every rank still running is killed (SIGKILL); times
        :func:`deadline_scale` where the ranks share GPUs.
    :param env: extra environment variables for the ranks (set before ``fn`` runs, so
        variables read at import, like ``IRIS_DEBUG``, take effect in modules ``fn``
        imports).
    :param backend: torch.distributed backend of the ranks' default group.
    :returns: one :class:`RankResult` per rank; never raises for a rank's failure.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    timeout = timeout * deadline_scale(world_size)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    folder = tempfile.mkdtemp(prefix="iris-world-")
    store = os.path.join(folder, "store")
    payload = pickle.dumps((fn, args, kwargs, backend))
    # Ranks use the backend named by env, else by this process's IRIS_BACKEND, else cpu.
    iris_backend = (env or {}).get("IRIS_BACKEND") or os.environ.get("IRIS_BACKEND") or "cpu"
    rank_env = {"IRIS_BACKEND": iris_backend, "OMP_NUM_THREADS": "1"}
    if iris_backend == "cpu":
        rank_env["TRITON_INTERPRET"] = "1"
    rank_env.update(env or {})
    procs = []
    started = time.monotonic()
    try:
        for rank in range(world_size):
            path = os.path.join(folder, f"rank{rank}.pkl")
            env_of_rank = {
                **rank_env,
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world_size),  # as torchrun sets it: one node
            }
            entry = {
                "SYS_PATH": list(sys.path),
                "ENV": env_of_rank,
                "ARGS": (payload, rank, world_size, store, path, timeout),
            }
            p = ctx.Process(target=exec, args=(_RANK_ENTRY, entry), name=f"iris-rank{rank}")
            p.start()
            procs.append(p)
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        timed_out = [p.is_alive() for p in procs]
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.join()
        results = []
        for rank, p in enumerate(procs):
            path = os.path.join(folder, f"rank{rank}.pkl")
            result = RankResult(rank, p.exitcode, timed_out=timed_out[rank])
            if os.path.exists(path):
                with open(path, "rb") as f:
                    outcome = pickle.load(f)
                result.value = outcome.get("value")
                result.error = outcome.get("error")
            elif timed_out[rank]:
                result.error = f"rank {rank} was still running after {timeout:g} s and was killed"
            else:
                result.error = f"rank {rank} died with exit code {p.exitcode} before reporting"
            results.append(result)
        seconds = time.monotonic() - started
        record_duration("world", world_size, timeout, seconds, getattr(fn, "__name__", ""), any(timed_out))
        return results
    finally:
        for p in procs:
            if p.is_alive():  # only on an exception in this function
                os.kill(p.pid, signal.SIGKILL)
                p.join()
        shutil.rmtree(folder, ignore_errors=True)


def run_world(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0,
    env: Mapping[str, str] | None = None, backend: str = "gloo", **kwargs: Any,
) -> list[Any]:  # fmt: skip
    """Like :func:`launch_world`, but return the ranks' values and raise
    :class:`WorldError` (with every failing rank's traceback) unless all ranks succeeded."""
    results = launch_world(fn, world_size, *args, timeout=timeout, env=env, backend=backend, **kwargs)
    failed = [r for r in results if not r.ok]
    if failed:
        parts = []
        for r in failed:
            what = "timed out" if r.timed_out else f"exit code {r.exitcode}"
            parts.append(f"--- rank {r.rank} ({what}) ---\n{r.error or ''}")
        raise WorldError(
            f"{len(failed)} of {world_size} ranks failed:\n" + "\n".join(parts),
            results,
        )
    return [r.value for r in results]


def _test_backend() -> str:
    return os.environ.get("IRIS_BACKEND", "cpu")


def visible_gpus() -> int:
    """GPUs this process sees (0 without CUDA); asks the driver, creates no CUDA context."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def shares_gpus(world_size: int, gpus: int | None = None) -> bool:
    """Whether a world of ``world_size`` ranks on the cuda backend (``IRIS_BACKEND``) has
    ranks sharing a GPU on this machine (more ranks than ``gpus``, default the visible GPUs).
    Then NCCL cannot serve it (it refuses two ranks on one GPU): references come from gloo
    or from a computation in one process, and times mean nothing."""
    if _test_backend() != "cuda":
        return False
    return world_size > (visible_gpus() if gpus is None else gpus)


def gpu_skip_reason(world_size: int, separate_gpus: str | None = None, gpus: int | None = None) -> str | None:
    """Why a case of ``world_size`` ranks cannot run here, or None when it can.

    On the cpu backend every world can. On the cuda backend a world needs one GPU, whatever
    its size (ranks share GPUs round robin). ``separate_gpus`` names what the case shows that
    only a GPU per rank can (``"link bandwidth between GPUs"``, ``"peer access between
    GPUs"``): such a case needs ``world_size`` GPUs, and its reason says so.

    :param gpus: the GPUs to count with (default: the visible ones).
    """
    if _test_backend() != "cuda":
        return None
    found = visible_gpus() if gpus is None else gpus
    if found < 1:
        return "IRIS_BACKEND=cuda but no GPU is visible"
    if separate_gpus and found < world_size:
        return (
            f"{separate_gpus} needs {world_size} separate GPUs (one per rank), found {found}: ranks "
            "sharing a GPU cannot show it"
        )
    return None


def require_world(world_size: int, separate_gpus: str | None = None) -> None:
    """Skip the calling pytest test when :func:`gpu_skip_reason` says this machine cannot
    run a world of ``world_size`` ranks (the test helpers of every Iris package call it)."""
    reason = gpu_skip_reason(world_size, separate_gpus)
    if reason:
        import pytest  # optional: only tests call this, and they run under pytest

        pytest.skip(reason)


def hopper_capabilities(ranks_on_device: int = 1, name: str = "NVIDIA H200") -> Capabilities:
    """The capabilities an H200-like GPU (132 SMs, NVLink) reports when ``ranks_on_device``
    ranks use it: for tests, on any machine, of the choices made from them (tuning tables
    by GPU model, what ranks sharing a GPU may not do)."""
    return Capabilities(
        torch.device("cuda", 0), "cuda", False, 132, (9, 0), 132, True, True, True,
        name=name, nvlink=True, ranks_on_device=ranks_on_device,
    )  # fmt: skip


def deadline_scale(world_size: int, gpus: int | None = None) -> int:
    """How many times its deadline a world of ``world_size`` ranks may take on this machine:
    the ranks per GPU where they share GPUs (:func:`shares_gpus`: the GPU runs one process at
    a time, and each hand-off between them waits for a switch), else 1."""
    if not shares_gpus(world_size, gpus):
        return 1
    found = visible_gpus() if gpus is None else gpus
    return -(-world_size // max(found, 1))


def run_example(path: str | os.PathLike, nproc: int, timeout: float = 180.0) -> str:
    """Run a self-checking example script under torchrun and return its output.

    The script defines ``NAME = "..."`` and prints ``[rank r/w] NAME: validated`` on every
    rank (or ``FAILED``). Runs on the backend of ``IRIS_BACKEND`` (the interpreter for
    ``cpu``). Raises AssertionError naming what went wrong: an exit code, a missing rank
    line, a FAILED line, or the deadline (``timeout`` seconds, times :func:`deadline_scale`).
    """
    timeout = timeout * deadline_scale(nproc)
    path = os.fspath(path)
    with open(path) as f:
        match = re.search(r'^NAME = "([^"]+)"', f.read(), re.MULTILINE)
    if not match:
        raise AssertionError(f"{path} defines no NAME constant")
    backend = os.environ.get("IRIS_BACKEND", "cpu")
    env = {**os.environ, "IRIS_BACKEND": backend, "OMP_NUM_THREADS": "1"}
    if backend == "cpu":
        env["TRITON_INTERPRET"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        path,
    ]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        record_duration("example", nproc, timeout, time.monotonic() - started, os.path.basename(path), True)
        raise AssertionError(
            f"{path} with {nproc} rank(s) did not finish in {timeout:g} s:\n{exc.stdout}\n{exc.stderr}"
        ) from None
    record_duration("example", nproc, timeout, time.monotonic() - started, os.path.basename(path))
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"{path} with {nproc} rank(s) exited {proc.returncode}:\n{output}")
    for rank in range(nproc):
        line = f"[rank {rank}/{nproc}] {match.group(1)}: validated"
        if line not in proc.stdout:
            raise AssertionError(f"rank {rank} did not print {line!r}:\n{output}")
    if "FAILED" in proc.stdout:
        raise AssertionError(output)
    return output


def run_nodes(
    script: str | os.PathLike, nodes: int, per_node: int, *args: str, timeout: float = 240.0,
    marker: str = "CHECKS OK rank",
) -> str:  # fmt: skip
    """Run ``script`` as a job of ``nodes`` nodes of ``per_node`` ranks on this machine: one
    torchrun agent per node (static rendezvous on a free local port; each agent is a node
    for :func:`iris.mem.node_layout`), the script given ``args``. Every agent is killed
    at ``timeout`` seconds. Returns the agents' output; raises AssertionError unless every
    agent exited 0 and every rank printed a line ``"<marker> <global rank>"``.

    Runs on the backend of ``IRIS_BACKEND`` (``cpu`` when unset); ``IRIS_NODE_ID`` is
    removed from the agents' environment, so that each agent is a node."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = os.environ.get("IRIS_BACKEND", "cpu")
    env = {**os.environ, "IRIS_BACKEND": backend, "OMP_NUM_THREADS": "1"}
    if backend == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env.pop("IRIS_NODE_ID", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={per_node}"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={port}", "--max_restarts=0"]
    started = time.monotonic()
    agents = [
        subprocess.Popen(
            [*cmd, f"--node_rank={i}", os.fspath(script), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        for i in range(nodes)
    ]
    outputs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=max(1.0, started + timeout - time.monotonic()))
            outputs.append(out)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    name = f"{os.path.basename(os.fspath(script))} {nodes}x{per_node}"
    seconds = time.monotonic() - started
    record_duration("nodes", nodes * per_node, timeout, seconds, name, len(outputs) < nodes)
    text = "\n".join(outputs)
    if len(outputs) < nodes:
        raise AssertionError(f"the agents did not finish within {timeout:g} s:\n{text[-4000:]}")
    codes = [agent.returncode for agent in agents]
    if codes != [0] * nodes:
        raise AssertionError(f"agent exit codes {codes}:\n{text[-6000:]}")
    # Ranks share the agents' output, so a line may hold the marker of several ranks.
    seen = set(re.findall(re.escape(marker) + r"\s+(\d+)", text))
    if seen != {str(r) for r in range(nodes * per_node)}:
        raise AssertionError(f"ranks that printed {marker!r}: {sorted(seen)}\n{text[-4000:]}")
    return text


__all__ = [
    "RankResult",
    "WorldError",
    "deadline_scale",
    "gpu_skip_reason",
    "hopper_capabilities",
    "launch_world",
    "record_duration",
    "require_world",
    "run_example",
    "run_nodes",
    "run_world",
    "shares_gpus",
    "visible_gpus",
]


_SCALAR_LOAD = re.compile(r"^(?:@%p\d+ )?ld(?:\.volatile)?\.global\.b32 \{ %r\d+ \}, \[ (%rd\d+) \+ 0 \];")


def unordered_counter_updates(ptx: str) -> list[str]:
    """Counters that every thread of a program reads and one thread then rewrites with no
    CTA barrier (``bar.sync``) between, in a kernel's PTX: one PTX line pair per finding.

    Triton lowers ``c = tl.load(p) + 1; tl.store(p, c)`` on a scalar to a load by every
    thread and a store by one (a predicated ``st.global.b32`` to the same address register);
    a warp that loads after that store takes ``c + 1`` for its own value, so the threads of
    one program disagree (a generation counter then makes some warps wait for a generation
    nobody publishes). A ``tl.debug_barrier()`` between the load and the store orders them.
    The scan is linear (branches are not followed), which suits the straight-line counter
    updates of barrier code.
    """
    lines = [ln.strip() for ln in ptx.splitlines()]
    problems = []
    for i, line in enumerate(lines):
        match = _SCALAR_LOAD.match(line)
        if not match:
            continue
        store = re.compile(r"^@%p\d+ st\.global\.b32 \[ " + re.escape(match.group(1)) + r" \+ 0 \]")
        for later in lines[i + 1 :]:
            if later.startswith(("bar.sync", "barrier.sync")):
                break
            if store.match(later):
                problems.append(f"{line} ... {later}: no bar.sync between")
                break
    return problems
