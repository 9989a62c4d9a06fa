"""Tuning tables: rules measured per GPU model and group size that pick how a call runs by
its size, and the pieces of the commands that measure them.

``Config(variant="auto")`` of iris.ccl and ``Config(path="auto")`` of iris.ops read such
tables, ``python -m iris.ccl.tune`` and ``python -m iris.ops.tune`` write them. A table file
(JSON) holds::

    {"tables": {"<GPU model>": {"<group size>": {"<key>": RULES, ...}, ...}, ...},
     "about": "...", "measured": {"<GPU model>": {"<group size>": "how it was measured"}}}

The GPU model is the driver's name of the device (``iris.mem.capabilities(device).name``,
e.g. ``"NVIDIA H200"``), or ``"interpreter"`` where kernels run in Triton's interpreter
(:func:`model_key`); the group size is a decimal string; a key names what is tuned (a
collective, a fused op). ``RULES`` is a list ``[[bound, choice...], ..., [null, choice...]]``:
:func:`pick` takes the first rule whose bound (an int; ``null``: any size) is at least the
call's size. What the size counts (message bytes, multiply-adds) and what a rule chooses
(a variant and launch fields, a path) belong to the table's owner, which describes both in
a :class:`TableFormat`.

Where the rules for a call come from, first match wins (:meth:`TableFormat.rules_for`):

1. the user's table, the file the format's environment variable names: its rules for this
   GPU model and group size (and, for a format that reads them, model-less rules: see
   :attr:`TableFormat.legacy`);
2. the table packaged with the owner: its rules for this GPU model and group size only;
3. the owner's heuristic.

A table measured on another GPU model or group size is never used, and no table is used
where ranks share the GPU (:attr:`iris.mem.Capabilities.shared`: the GPU time-slices their
kernels, so nothing measured with a GPU per rank applies): :meth:`TableFormat.rules_for_machine`
goes straight to the heuristic there, and the tuning commands refuse to run
(:func:`timing_refusal`).

A tuning command (``python -m iris.ccl.tune`` is one) takes :func:`command_parser`'s
arguments, starts with :func:`start_session`, times its candidates with :func:`time_calls`
for each size or shape, folds the fastest into rules with :func:`measure_rules` and ends
with :func:`finish_session`, which writes them (:meth:`TableFormat.write`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

import iris.mem
from iris.mem import bootstrap, settings

#: The model key of a machine whose kernels run in Triton's interpreter (the CPU backend).
INTERPRETER = "interpreter"
#: The element types a tuning command measures in (``--dtype``).
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def model_key(caps: iris.mem.Capabilities) -> str:
    """The key of ``caps``' machine in tuning tables: its GPU model, or :data:`INTERPRETER`."""
    return caps.name or INTERPRETER


def timing_refusal(caps: iris.mem.Capabilities, what: str) -> str | None:
    """None where times taken on ``caps``' machine mean something; else the message with
    which ``what`` (a tuner, a benchmark) refuses to run: ranks share the GPU
    (:attr:`iris.mem.Capabilities.ranks_on_device` > 1), so the GPU time-slices their
    kernels and a time measures the sharing, not Iris."""
    if not caps.shared:
        return None
    return (
        f"{what}: {caps.ranks_on_device} ranks share this GPU ({caps.device}), which runs their kernels in "
        "turns: times measured so mean nothing, so no table is written and no ratio printed. Ranks sharing a "
        "GPU are a mode for correctness (tests, development on one GPU); measure with one GPU per rank "
        "(no more ranks per node than GPUs)."
    )


def refuse_timing(caps: iris.mem.Capabilities, what: str) -> None:
    """Exit (``SystemExit`` with status 2, after rank 0 printed :func:`timing_refusal`'s
    message to stderr) when times on ``caps``' machine mean nothing; else return."""
    message = timing_refusal(caps, what)
    if message is None:
        return
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(message, file=sys.stderr, flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    raise SystemExit(2)


def pick(rules: list, size: int) -> list:
    """The first rule of ``rules`` whose bound covers ``size`` (the last one, open-ended,
    covers every size): ``[bound, choice...]``."""
    return next((rule for rule in rules if rule[0] is None or size <= rule[0]), rules[-1])


def fold(points: list[tuple]) -> list:
    """Rules from measured points ``(size, choice...)`` (what was fastest at that size):
    sorted by size, neighbours with the same choice merged into the rule of the larger size,
    the last rule open-ended (bound ``None``)."""
    rules: list[list] = []
    for size, *choice in sorted(points, key=lambda point: point[0]):
        if rules and rules[-1][1:] == choice:
            rules[-1][0] = size
        else:
            rules.append([size, *choice])
    if rules:
        rules[-1][0] = None
    return rules


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class TableFormat:
    """The tables of one owner (iris.ccl's collectives, iris.ops' fused ops): where they
    are, what a rule may choose, and how errors name them.

    Attributes:
        owner: the package the tables tune, first word of every error (``"iris.ccl"``).
        env: the environment variable naming the user's table (``"IRIS_CCL_TABLE"``).
        packaged: the table shipped with the owner.
        key: what a table's keys name, in errors (``"collective"``).
        bound: what a rule's bound counts, in errors (``"max_bytes"``).
        choice: what a rule chooses, in errors (``"variant"``).
        check: ``check(key, rule)``: whether ``rule`` (a list ``[bound, choice...]`` whose
            bound is already checked) is valid for ``key``; False for a key the owner
            does not tune.
        requirement: ``requirement(key)``: what ``check`` asks of the rules of ``key``, for
            the error a bad rule raises (``"with variants of all_reduce"``).
        about: the ``"about"`` entry of a table file :meth:`write` creates.
        legacy: whether a table may also hold model-less rules, ``{"world_sizes": {"<group
            size>": {key: RULES}}, "default": {key: RULES}}`` (the first form of iris.ccl's
            tables), used from the user's table only, for any GPU model: the user chose it.
    """

    owner: str
    env: str
    packaged: Path
    key: str
    bound: str
    choice: str
    check: Callable[[str, list], bool]
    requirement: Callable[[str], str]
    about: str
    legacy: bool = False

    def load(self, path: str) -> dict:
        """The table in the file ``path``, checked: a RuntimeError naming the file and what
        is wrong with it. Each file is read once (a rewritten one through :meth:`write`)."""
        return _load(self, path)

    def rules_for(
        self, key: str, world_size: int, model: str, heuristic: Callable[[], list]
    ) -> tuple[list, str]:
        """The rules for ``key`` on ``world_size`` GPUs of ``model`` (see :func:`model_key`)
        and where they come from: the user's table (its path), else the packaged one (its
        path), else ``heuristic()`` (``"heuristic"``)."""
        user = settings.text(self.env)
        if user is not None:
            rules = self._measured(self.load(user), key, world_size, model, self.legacy)
            if rules:
                return rules, user
        packaged = str(self.packaged)
        rules = self._measured(self.load(packaged), key, world_size, model, legacy=False)
        if rules:
            return rules, packaged
        return heuristic(), "heuristic"

    def rules_for_machine(
        self, key: str, world_size: int, caps: iris.mem.Capabilities, heuristic: Callable[[], list]
    ) -> tuple[list, str]:
        """:meth:`rules_for` on ``caps``' machine (its :func:`model_key`), except where ranks
        share its GPU (:attr:`iris.mem.Capabilities.shared`): ``heuristic()`` there, whatever
        the tables hold, since no time measured with a GPU per rank applies to a GPU whose
        ranks take turns."""
        if caps.shared:
            return heuristic(), "heuristic"
        return self.rules_for(key, world_size, model_key(caps), heuristic)

    @staticmethod
    def _measured(table: dict, key: str, world_size: int, model: str, legacy: bool) -> list | None:
        size = str(world_size)
        rules = table.get("tables", {}).get(model, {}).get(size, {}).get(key)
        if rules is None and legacy:
            rules = table.get("world_sizes", {}).get(size, {}).get(key) or table.get("default", {}).get(key)
        return rules

    def write(self, path: str, model: str, world_size: int, rules: dict[str, list], note: str) -> None:
        """Put ``rules`` (by key) under ``model`` and ``world_size`` into the table file at
        ``path`` and ``note`` (how they were measured) under ``"measured"``; an existing
        file keeps its other models and group sizes. The file is replaced only once the new
        table has loaded as ``auto`` will read it (a bad rule raises, the file unchanged)."""
        table: dict = {}
        if os.path.exists(path):
            with open(path) as f:
                table = json.load(f)
        table.setdefault("about", self.about)
        table.setdefault("tables", {}).setdefault(model, {})[str(world_size)] = rules
        table.setdefault("measured", {}).setdefault(model, {})[str(world_size)] = note
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(table, f, indent=1)
        try:
            _load(self, tmp)
        except RuntimeError:
            os.remove(tmp)
            raise
        finally:
            # the cache must not keep the temporary file, nor an older read of ``path``
            _load.cache_clear()
        os.replace(tmp, path)


@functools.cache
def _load(fmt: TableFormat, path: str) -> dict:
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{fmt.owner}: cannot read the tuning table {path} ({fmt.env}): {e}") from e
    for where, scope in _scopes(fmt, path, table):
        for key, rules in scope.items():
            if not _valid_rules(fmt, key, rules):
                shape = f"[[{fmt.bound}, {fmt.choice}], ..., [null, {fmt.choice}]]"
                what = f"{where}: rules of {key!r} must be {shape} {fmt.requirement(key)}, got {rules!r}"
                raise _fault(fmt, path, what)
    return table


def _fault(fmt: TableFormat, path: str, what: str) -> RuntimeError:
    return RuntimeError(f"{fmt.owner}: tuning table {path}: {what}")


def _scopes(fmt: TableFormat, path: str, table: object) -> list[tuple[str, dict]]:
    """``(where, {key: rules})`` of every scope of rules in ``table``, its layout checked."""
    layout = f"{{group size: {{{fmt.key}: rules}}}}"
    if not isinstance(table, dict):
        what = f'expected a JSON object {{"tables": {{GPU model: {layout}}}}}, got {type(table).__name__}'
        raise _fault(fmt, path, what)
    # "tables" is required unless the format reads the model-less form, which may stand alone
    models = table.get("tables", {} if fmt.legacy else None)
    if not isinstance(models, dict) or not all(isinstance(groups, dict) for groups in models.values()):
        raise _fault(fmt, path, f'"tables" must map GPU models to {layout}, got {models!r}')
    by_group_size = {repr(model): groups for model, groups in models.items()}
    scopes: list[tuple[str, dict]] = []
    if fmt.legacy:
        by_group_size['"world_sizes"'] = table.get("world_sizes", {})
        default = table.get("default", {})
        if not isinstance(default, dict):
            raise _fault(fmt, path, f'"default" must map each {fmt.key} to its rules, got {default!r}')
        scopes.append(('"default"', default))
    for where, groups in by_group_size.items():
        for size, scope in groups.items() if isinstance(groups, dict) else [(None, groups)]:
            if not (_is_group_size(size) and isinstance(scope, dict)):
                what = f'{where} must map group sizes ("2", ...) to {{{fmt.key}: rules}}'
                what += f", got {size!r}: {scope!r}"
                raise _fault(fmt, path, what)
            scopes.append((f"{where}, group size {size}", scope))
    return scopes


def _is_group_size(text: object) -> bool:
    return isinstance(text, str) and text.isascii() and text.isdigit() and int(text) >= 1


def _valid_rules(fmt: TableFormat, key: str, rules: object) -> bool:
    """A non-empty list of ``[bound, choice...]``, bounds non-negative ints but the last one,
    null, each rule valid for ``key`` by the format's check."""
    if not isinstance(rules, list) or not rules:
        return False
    for i, rule in enumerate(rules):
        if not isinstance(rule, list) or len(rule) < 2:
            return False
        bound, last = rule[0], i == len(rules) - 1
        if last != (bound is None):  # a null bound anywhere else would hide the rules after it
            return False
        if not last and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
            return False
        if not fmt.check(key, rule):
            return False
    return True


# ---------------------------------------------------------------------------- tuning commands


def command_parser(prog: str, doc: str, calls: int) -> argparse.ArgumentParser:
    """The arguments every tuning command takes: ``--out`` (the table file), ``--dtype``,
    ``--rounds``, ``--calls`` (default ``calls`` per timed round) and ``--smoke``; ``doc``'s
    first line describes the command."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    parser.add_argument("--out", required=True, help="the table file to write (updated when it exists)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=calls, help="calls per timed round")
    parser.add_argument("--smoke", action="store_true", help="the CPU backend, tiny sizes, one round")
    return parser


def start_session(parser: argparse.ArgumentParser, args: argparse.Namespace) -> iris.mem.Capabilities:
    """What a tuning command does first: ``--smoke`` only on the CPU backend (one round of
    one call), this rank's GPU (``LOCAL_RANK`` modulo the GPUs present), the process group
    (:func:`iris.mem.bootstrap.group_backend`'s); then the ranks compare their GPUs
    (:func:`iris.mem.node_layout`), and where they share one the command refuses to run
    (:func:`refuse_timing`). Returns the device's capabilities."""
    caps = iris.mem.capabilities(iris.mem.default_device())
    if args.smoke:
        if not caps.interpreted:
            parser.error("--smoke runs on the CPU backend: set IRIS_BACKEND=cpu")
        args.rounds, args.calls = 1, 1
    if caps.streams:
        torch.cuda.set_device(iris.mem.default_device())
    if not dist.is_initialized():
        dist.init_process_group(bootstrap.group_backend(caps.backend))
    iris.mem.node_layout()  # collective: the ranks compare their GPUs (capabilities().ranks_on_device)
    caps = iris.mem.capabilities(iris.mem.default_device())
    refuse_timing(caps, parser.prog)
    return caps


def measure_rules(
    keys: list[str],
    cases: list,
    measure: Callable[[str, object], tuple[int, dict[str, float], list[str]]],
    label: Callable[[object], str] = str,
) -> dict[str, list]:
    """The rules of each of ``keys`` (collectives, ops) over ``cases`` (message sizes,
    shapes). ``measure(key, case)`` returns ``(size, times, problems)``: the size a rule is
    bounded by for that case, microseconds per call by candidate (every rank the same, as
    :func:`time_calls` returns them) and what kept candidates out. Rank 0 prints each case
    (``label(case)`` names it); the fastest candidate of each case is a point, and the
    points fold into rules (:func:`fold`). A key that no candidate ran for gets none."""
    rules = {}
    for key in keys:
        points = []
        for case in cases:
            size, times, problems = measure(key, case)
            if dist.get_rank() == 0:
                cells = ", ".join(f"{name} {t:.1f} us" for name, t in times.items())
                print(f"{key} {label(case)}: {cells or 'nothing ran'}", flush=True)
                for problem in problems:
                    print(f"  {problem}", flush=True)
            if times:
                points.append((size, min(times, key=times.get)))
        if points:
            rules[key] = fold(points)
    return rules


def finish_session(
    fmt: TableFormat,
    args: argparse.Namespace,
    caps: iris.mem.Capabilities,
    rules: dict[str, list],
    measured: str,
) -> int:
    """What a tuning command does last: rank 0 writes ``rules`` to ``args.out`` under this
    machine's model and group size, with a note of how they were measured (``measured``: the
    sizes or shapes) and says how to use the file; every rank then leaves the process group.
    Returns the command's exit status, 0."""
    world, model = dist.get_world_size(), model_key(caps)
    # the heaps made while measuring compared the ranks' GPUs again
    refuse_timing(iris.mem.capabilities(caps.device), f"python -m {fmt.owner}.tune")
    if dist.get_rank() == 0:
        note = (
            f"{world} x {model}, {args.dtype}, NVLink {caps.nvlink}, torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d')}, {measured}, {args.rounds} rounds of {args.calls} calls"
        )
        fmt.write(args.out, model, world, rules, note)
        print(f"wrote the rules for {world} x {model} to {args.out}: export {fmt.env}={args.out}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def time_calls(
    fns: dict[str, Callable[[], object]], device: torch.device, rounds: int, calls: int, group=None
) -> dict[str, float]:
    """Microseconds per call of each of ``fns`` (every rank runs the same ``fns`` in the same
    order): ``rounds`` interleaved rounds of ``calls`` calls each, in an order shuffled the
    same way on every rank; the median over rounds per rank, the maximum over ranks.

    Where work is queued on streams (``iris.mem.capabilities(device).streams``) the calls of
    a round are one CUDA-graph replay timed with events (eager when capture fails); else
    wall-clock time. Each function is called once first (compiles, prepares workspaces)."""
    caps = iris.mem.capabilities(device)
    runners = {}
    for name, fn in fns.items():
        fn()
        runners[name] = _graph(fn, calls, device) if caps.streams else None
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    # the same seed on every rank: the ranks run the functions in the same order
    shuffle = random.Random(1234)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for name in order:
            dist.barrier(group=group)
            samples[name].append(_one_round(fns[name], runners[name], calls, device) / calls)
    medians = torch.tensor([statistics.median(samples[n]) for n in fns], dtype=torch.float64)
    medians = medians.to(device)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(fns, medians.cpu().tolist(), strict=True))


def _graph(fn, calls: int, device: torch.device):
    """A CUDA graph of ``calls`` calls of ``fn``, or None when it cannot be captured."""
    try:
        # a warm-up call on a side stream, as capture requires
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        return graph
    except Exception:  # noqa: BLE001 - time it eagerly instead
        torch.cuda.synchronize(device)
        return None


def _one_round(fn, graph, calls: int, device: torch.device) -> float:
    """Microseconds of one round of ``calls`` calls of ``fn`` (``graph``: their capture)."""
    caps = iris.mem.capabilities(device)
    if caps.streams:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph is not None:
            graph.replay()
        else:
            for _ in range(calls):
                fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3
    iris.mem.synchronize(device)
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    iris.mem.synchronize(device)
    return (time.perf_counter() - started) * 1e6
