"""Measure this machine and write the tuning table ``Config(variant="auto")`` reads.

Run it on every GPU of the group size you use (one process per GPU), then point
``IRIS_CCL_TABLE`` at the file::

    torchrun --nproc-per-node 8 -m iris.ccl.tune --out ~/iris-ccl-table.json
    export IRIS_CCL_TABLE=~/iris-ccl-table.json

For each collective and message size it times every variant that can be picked (the
slow reference forms and Gluon aside) on tensors of a symmetric heap, checks each result
against torch.distributed, and keeps the fastest. The rules go into the table under this
machine's GPU model and group size (other entries of an existing ``--out`` file are kept).
Times are device times of CUDA-graph replays where work is queued on streams, wall-clock
times otherwise; each variant is timed in interleaved rounds, median per rank, maximum over
ranks. ``--smoke`` runs the whole command on the CPU backend with tiny sizes, in seconds.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import iris.ccl as ccl
import iris.mem

from . import config, tuning, variants

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
#: Variants a table never picks: the slow reference forms, and Gluon (one kernel form of
#: push, not every build has it).
LEFT_OUT = ("ring", "atomic", "spinlock", "gluon")
SIZES = [8 << 10, 32 << 10, 128 << 10, 512 << 10, 1 << 20, 2 << 20, 8 << 20, 32 << 20, 128 << 20]
SMOKE_SIZES = [1 << 10, 16 << 10]


def parse_size(text: str) -> int:
    """``"256MiB"`` -> 268435456 (units B, KiB, MiB, GiB; a bare number is bytes)."""
    text = text.strip()
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def candidates(collective: str, interpreted: bool, only: list[str] | None) -> list[str]:
    """The variants of ``collective`` to time (``only``: those of them)."""
    names = [
        name
        for (c, name), v in variants.registry().items()
        if c == collective and name not in LEFT_OUT and not (interpreted and v.compiled_only)
    ]
    return [n for n in names if n in only] if only else names


def _reference(collective: str, inp: torch.Tensor, world: int) -> torch.Tensor:
    if collective == "all_reduce":
        want = inp.clone()
        dist.all_reduce(want)
    elif collective == "all_gather":
        want = inp.new_empty(world * inp.numel())
        dist.all_gather_into_tensor(want, inp)
    elif collective == "reduce_scatter":
        want = inp.new_empty(inp.numel() // world)
        dist.reduce_scatter_tensor(want, inp)
    else:
        want = torch.empty_like(inp)
        dist.all_to_all_single(want, inp)
    return want


def measure(
    collective: str, nbytes: int, heap, dtype, names: list[str], rounds: int, calls: int
) -> tuple[int, dict[str, float], list[str]]:
    """``(size, times_us by variant, problems)`` of ``collective`` on ``nbytes`` per rank,
    ``size`` the one its rule is bounded by (:func:`table_size`)."""
    world, item = heap.world_size, torch.empty((), dtype=dtype).element_size()
    numel = max(world, nbytes // item // world * world)
    inp = heap.empty((numel,), dtype=dtype)
    gen = torch.Generator().manual_seed(heap.rank + 1)
    values = torch.randint(-8, 8, (numel,), generator=gen).to(dtype)  # exact sums in any dtype
    inp.copy_(values.to(inp.device))
    want = _reference(collective, inp, world)
    out = heap.empty(tuple(want.shape), dtype=dtype)
    fns, problems = {}, {}
    for name in names:
        cfg = ccl.Config(variant=name)

        def call(cfg=cfg):
            getattr(ccl, collective)(out, inp, config=cfg)

        try:
            out.fill_(0)
            call()
            iris.mem.synchronize(inp.device)
            if not torch.equal(out, want):
                problems[name] = "wrong result"
        except Exception as e:  # noqa: BLE001 - a variant that cannot run here is left out
            problems[name] = f"{type(e).__name__}: {e}"[:200]
        failed = torch.tensor([name in problems], dtype=torch.int32, device=inp.device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if failed.item():
            problems.setdefault(name, "failed on another rank")
        else:
            fns[name] = call
    times = tuning.time_calls(fns, inp.device, rounds, calls) if fns else {}
    del fns
    heap.free(inp, out)
    return table_size(collective, nbytes, world), times, [f"{n}: {p}" for n, p in problems.items()]


def table_size(collective: str, nbytes: int, world: int) -> int:
    """The size a rule of ``collective`` is keyed by for ``nbytes`` per rank: the output for
    all_gather, the input otherwise (what ``iris.ccl.config.select`` is given)."""
    return nbytes * world if collective == "all_gather" else nbytes


def main(argv: list[str] | None = None) -> int:
    parser = tuning.command_parser("python -m iris.ccl.tune", __doc__, calls=20)
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--sizes", default="", help="bytes per rank: 8KiB,1MiB,64MiB (default 8 KiB-128 MiB)")
    parser.add_argument("--variants", default="", help="time only these variants")
    args = parser.parse_args(argv)
    caps = tuning.start_session(parser, args)
    world = dist.get_world_size()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s] or (SMOKE_SIZES if args.smoke else SIZES)
    collectives = [c for c in args.collectives.split(",") if c]
    unknown = sorted(set(collectives) - set(COLLECTIVES))
    if unknown:
        parser.error(f"unknown collectives {unknown}; choose from {', '.join(COLLECTIVES)}")
    only = [v for v in args.variants.split(",") if v] or None
    if args.smoke and only is None:
        only = ["ll", "push", "two_shot", "pull"]
    dtype = tuning.DTYPES[args.dtype]
    names = {collective: candidates(collective, caps.interpreted, only) for collective in collectives}
    with iris.mem.init(max(64 << 20, 4 * world * max(sizes) + (32 << 20))) as heap:

        def timed(collective: str, nbytes: int) -> tuple[int, dict[str, float], list[str]]:
            return measure(collective, nbytes, heap, dtype, names[collective], args.rounds, args.calls)

        rules = tuning.measure_rules(collectives, sizes, timed, label=lambda nbytes: f"{nbytes} B")
    return tuning.finish_session(config.TABLES, args, caps, rules, f"sizes {sizes} B per rank")


if __name__ == "__main__":
    sys.exit(main())
