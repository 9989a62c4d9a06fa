"""A tensor-parallel Llama-3 decoder layer: NCCL against Iris collectives and Iris fused ops, in one run.

    torchrun --nproc-per-node 2 benchmarks/ops/bench_decoder.py --out benchmarks/ops/results-decoder
    torchrun --nproc-per-node 2 benchmarks/ops/bench_decoder.py --models 8b --decode 16 --prefill ""
    IRIS_BACKEND=cpu torchrun --nproc-per-node 2 benchmarks/ops/bench_decoder.py --smoke  # no GPU

The layer is ``TPDecoderLayer`` of ``examples/25_tp_decoder.py`` (RMSNorm, q/k/v as one
column-parallel linear, RoPE, grouped-query attention, row-parallel output projection, RMSNorm,
gated SiLU MLP column/row parallel), at the shapes of Llama-3-8B (hidden 4096, 32 heads, 8 KV
heads, ffn 14336) and Llama-3-70B (8192, 64, 8, 28672), bf16, over every rank of the job
(tensor parallelism 2 on two GPUs). Phases: decode (``--decode``, default 1, 16 and 64
tokens: that many sequences, each adding one token to a KV cache of ``--context`` tokens,
default 1024) and prefill (``--prefill``, default 2048 and 8192 tokens: one causal sequence).

Forms (``--forms``), each with the same weights and inputs:

* ``nccl``: ``dist.all_reduce`` (compiled: functional collectives) on the default NCCL group
  after each row-parallel linear; ``iris``: the same calls on a group made with
  ``backend="iris"`` (iris.ccl); ``fused``: ``iris.ops.matmul_all_reduce`` for the
  row-parallel linears;
* sequence parallel (tokens divided among the ranks between the linears; where the tokens
  divide by the world size): ``nccl_sp`` and ``iris_sp`` (all-gather before the
  column-parallel linears, reduce-scatter after the row-parallel ones, on the NCCL and the
  iris group), ``fused_sp`` (``iris.ops.all_gather_matmul`` / ``matmul_reduce_scatter``);
* ``local`` and ``local_sp``: the same layer with its collectives left out (wrong results),
  the time of its computation alone.

Modes (``--modes``): ``eager``; ``compiled`` (``torch.compile``, inductor, fullgraph);
``graphed`` (inductor with ``mode="reduce-overhead"``: CUDA graphs). On the CPU backend
(``--smoke``) ``compiled`` uses ``aot_eager`` and ``graphed`` is left out.

Every form's output is first checked against the NCCL form's (eager) output; a form that
differs is reported and not timed. Times: per contender, consecutive calls (enough for about
2 ms) between CUDA events after the ranks start together, in rounds whose order is shuffled
from round to round (the same order on every rank), median over ``--reps`` rounds per rank,
maximum over the ranks. Prints, per model, tokens and mode, each form's time, ``nccl/form``
(the NCCL form of the same layout over this form: above 1 is faster than NCCL) and
``comm``: the share of the form's time above the layer without communication
(``1 - local / form``); writes ``results.json`` into ``--out``. ``--smoke`` runs the script on
the CPU backend (gloo, Triton's interpreter, a tiny layer, wall-clock times) to check it
without GPUs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "25_tp_decoder.py")
sys.path.insert(0, os.path.dirname(HERE))
from bench_timing import any_rank, command_line, refuse_shared_gpu, start_together, use_rank_gpu  # noqa: E402 - benchmarks/bench_timing.py

FORMS = ("nccl", "iris", "fused", "nccl_sp", "iris_sp", "fused_sp", "local", "local_sp")
MODES = ("eager", "compiled", "graphed")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: Largest ``max |form - nccl| / max |nccl|`` accepted per dtype (outputs of a whole layer,
#: partial sums rounded to the dtype in different orders).
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-3}
#: The NCCL form each form is compared with and the no-communication form of its layout.
BASELINE = {f: ("nccl_sp", "local_sp") if f.endswith("_sp") else ("nccl", "local") for f in FORMS}


def load_example():
    """``examples/25_tp_decoder.py`` as a module (the layer, its forms and shapes)."""
    if not os.path.isfile(EXAMPLE):
        raise SystemExit(f"{EXAMPLE} not found: bench_decoder.py runs from a source checkout")
    spec = importlib.util.spec_from_file_location("tp_decoder", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


#: Where the run's tensors live: this rank's GPU, or the CPU with --smoke.
DEVICE = torch.device("cpu")


def _agree(values: list[float], op) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=DEVICE)
    dist.all_reduce(t, op=op)
    return t.tolist()


def make_comms(ex, forms: list[str], world: int) -> dict[str, object]:
    """The communication object of each form (collective: every rank makes the iris group)."""
    iris_group = dist.new_group(backend="iris")
    make = {
        "nccl": lambda: ex.TorchComm(dist.group.WORLD),
        "iris": lambda: ex.TorchComm(iris_group),
        "fused": lambda: ex.FusedComm(None),
        "nccl_sp": lambda: ex.TorchComm(dist.group.WORLD, sequence_parallel=True),
        "iris_sp": lambda: ex.TorchComm(iris_group, sequence_parallel=True),
        "fused_sp": lambda: ex.FusedComm(None, sequence_parallel=True),
        "local": lambda: ex.NoComm(world),
        "local_sp": lambda: ex.NoComm(world, sequence_parallel=True),
    }
    return {f: make[f]() for f in forms}


class Timer:
    """Interleaved timing of argument-free callables (see the module docstring)."""

    def __init__(self, cuda: bool, graphed: bool):
        self.cuda, self.graphed = cuda, graphed

    def _calls(self, fn, calls: int) -> None:
        for _ in range(calls):
            if self.graphed:  # each call a new generation of the CUDA-graph trees: no re-recording
                torch.compiler.cudagraph_mark_step_begin()
            fn()

    def sample_us(self, fn, calls: int) -> float:
        if not self.cuda:
            dist.barrier()
            start = time.perf_counter()
            self._calls(fn, calls)
            return (time.perf_counter() - start) * 1e6 / calls
        start_together()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._calls(fn, calls)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / calls

    def times_us(self, fns: dict[str, object], reps: int, target_us: float) -> dict[str, float]:
        calls = {}
        for name, fn in fns.items():  # calls per sample: about target_us of work, the same on every rank
            took = self.sample_us(fn, 1)
            calls[name] = int(
                -_agree([-float(max(1, min(20, int(target_us / max(took, 1.0)))))], dist.ReduceOp.MAX)[0]
            )
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for r in range(reps):
            order = list(fns)
            random.Random(r).shuffle(order)  # the same order on every rank (the calls are collectives)
            for name in order:
                samples[name].append(self.sample_us(fns[name], calls[name]))
        medians = _agree([statistics.median(samples[name]) for name in fns], dist.ReduceOp.MAX)
        return dict(zip(fns, medians))


def _mismatch(got: torch.Tensor, want: torch.Tensor, tol: float) -> str | None:
    if got.shape != want.shape:
        return f"shape {list(got.shape)} != {list(want.shape)}"
    err = (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-30)
    return None if err <= tol else f"max error {err:.3g} of the largest value (tolerance {tol:g})"


def run_case(ex, args, comms, shard, shape, model: str, tokens: int, phase: str):
    """Check and time every form and mode at one model, token count and phase: rows, failures."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device, dtype, cuda = DEVICE, args.dtype_t, DEVICE.type == "cuda"
    torch.compiler.reset()  # the compiled graphs of earlier cases go
    g = torch.Generator().manual_seed(1)  # the same input on every rank
    x = torch.randn(tokens, shape.hidden, generator=g).to(device, dtype)
    context = args.context if phase == "decode" else 0
    positions = torch.full((tokens,), context) if phase == "decode" else torch.arange(tokens)
    cos, sin = ex.rope_tables(positions.to(device), shape, dtype) if not args.no_rope else (None, None)
    layers = {}
    for form, comm in comms.items():
        if form.endswith("_sp") and tokens % world:
            continue  # sequence parallel needs the tokens to divide among the ranks
        layer = ex.TPDecoderLayer(shard, shape, world, comm)
        layer.set_rope(cos, sin)
        layers[form] = layer
    if phase == "decode":  # this rank's KV heads of a cache (the same tensors for every form)
        cg = torch.Generator().manual_seed(100 + rank)
        cache_shape = (tokens, layers["nccl"].kv_heads, context, shape.head_dim)
        cache = [torch.randn(cache_shape, generator=cg).to(device, dtype) for _ in range(2)]
        for layer in layers.values():
            layer.set_cache(*cache)
    mine = slice(rank * tokens // world, (rank + 1) * tokens // world)
    inputs = {form: x[mine] if form.endswith("_sp") else x for form in layers}
    with torch.no_grad():
        want = layers["nccl"](x).clone()  # the reference: the NCCL form, eager
    rows, failures = [], []
    for mode in args.modes:
        if mode == "graphed" and not cuda:
            continue
        torch.compiler.reset()  # the graphs of the mode before go (the layers are compiled again)
        fns, problems = {}, []
        for form, layer in layers.items():
            what = f"{model} {tokens} tokens {mode} {form}"
            fn = layer
            if mode != "eager":
                kw = (
                    {"backend": "aot_eager"}
                    if not cuda
                    else {"mode": "reduce-overhead"}
                    if mode == "graphed"
                    else {}
                )
                fn = torch.compile(layer, fullgraph=True, dynamic=False, **kw)
            problem = None
            try:
                with torch.no_grad():
                    for _ in range(3 if mode == "graphed" else 2):  # compile, workspaces, capture
                        if mode == "graphed":
                            torch.compiler.cudagraph_mark_step_begin()
                        out = fn(inputs[form])
                    if not form.startswith("local"):
                        problem = _mismatch(
                            out, want[mine] if form.endswith("_sp") else want, TOLERANCE[dtype]
                        )
            except Exception as e:  # noqa: BLE001 - a form that fails is reported, not fatal
                problem = f"{type(e).__name__}: {e}"
            problems.append(problem)
            if problem is not None:
                failures.append(f"{what}: {problem}")
            fns[form] = lambda fn=fn, inp=inputs[form]: fn(inp)
        for form, bad, problem in zip(list(fns), any_rank([p is not None for p in problems]), problems):
            if bad:  # left out on every rank (the forms' collectives stay matched)
                del fns[form]
                if problem is None:
                    failures.append(f"{model} {tokens} tokens {mode} {form}: failed on another rank")
        with torch.no_grad():
            times = Timer(cuda, mode == "graphed").times_us(fns, args.reps, args.target_us)
        for form, t in times.items():
            nccl, local = (times.get(b) if not form.startswith("local") else None for b in BASELINE[form])
            case = {"model": model, "tokens": tokens, "phase": phase, "context": context, "mode": mode}
            ratios = {
                "nccl_over_form": nccl / t if nccl else None,
                "comm_share": 1 - local / t if local else None,
            }
            rows.append({**case, "form": form, "time_us": t, **ratios})
    del layers, inputs
    torch.compiler.reset()
    import iris.ops

    iris.ops.release_workspaces()  # collective
    if cuda:
        torch.cuda.empty_cache()
    return rows, failures


def _report(rows, failures, args, world) -> None:
    import triton

    import iris.ops

    cuda = DEVICE.type == "cuda"
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else ["cpu"],
        "world_size": world,
        "dtype": str(args.dtype_t).replace("torch.", ""),
        "context": args.context,
        "rope": not args.no_rope,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "iris_ops": iris.ops.__version__,
        "command": command_line(),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "failures": failures}, f, indent=1)
    print(f"\n# tensor-parallel decoder layer, {world} x {meta['gpus'][0]}, {meta['dtype']}")
    print("| model | tokens | phase | mode | form | time (us) | nccl/form | comm share |")
    print("|---" * 8 + "|")
    for r in rows:
        ratio = f"{r['nccl_over_form']:.2f}" if r["nccl_over_form"] is not None else "-"
        share = f"{100 * r['comm_share']:.0f}%" if r["comm_share"] is not None else "-"
        cells = (
            f"{r['model']} | {r['tokens']} | {r['phase']} | {r['mode']} | {r['form']} | {r['time_us']:.1f}"
        )
        print(f"| {cells} | {ratio} | {share} |")
    if failures:
        print("\nFAILED checks (not timed):\n  " + "\n  ".join(failures))
    print(f"\nwrote {os.path.join(args.out, 'results.json')}")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/ops/results-decoder")
    parser.add_argument("--models", default="8b,70b", help="comma-separated: 8b, 70b")
    parser.add_argument("--decode", help="decode token counts (sequences of one new token); default 1,16,64")
    parser.add_argument("--prefill", help="prefill token counts (one sequence); default 2048,8192")
    parser.add_argument("--context", type=int, help="KV-cache length of each decode sequence; default 1024")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-rope", action="store_true", help="leave rotary embeddings out")
    parser.add_argument(
        "--smoke", action="store_true", help="check the script on the CPU backend, a tiny layer"
    )
    args = parser.parse_args()
    global DEVICE
    ex = load_example()
    if args.smoke:
        models = {"tiny": ex.TINY}
        defaults = {"decode": "2", "prefill": "6", "context": 5}
        args.dtype = "fp32"
        args.target_us = 1.0
        args.reps = min(args.reps, 2)
        dist.init_process_group("gloo")
    else:
        defaults = {"decode": "1,16,64", "prefill": "2048,8192", "context": 1024}
        models = {"8b": ex.LLAMA3_8B, "70b": ex.LLAMA3_70B}
        models = {m: models[m] for m in args.models.split(",") if m}
        DEVICE, args.target_us = use_rank_gpu(), 2000.0
        dist.init_process_group("nccl")
    refuse_shared_gpu()  # before anything is timed: ranks sharing a GPU measure nothing
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.dtype_t = DTYPES[args.dtype]
    # Every form compiles the same forward: more entries than torch's default limit of 8
    # (named recompile_limit from torch 2.7, cache_size_limit before).
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 4 * len(FORMS)))
    args.modes = [m for m in args.modes.split(",") if m]
    forms = [f for f in args.forms.split(",") if f]
    unknown = sorted(set(forms) - set(FORMS)) + sorted(set(args.modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown forms or modes: {unknown} (forms: {FORMS}; modes: {MODES})")
    forms = list(dict.fromkeys(["nccl", *forms]))  # the reference is always there
    rank, world = dist.get_rank(), dist.get_world_size()
    comms = make_comms(ex, forms, world)
    rows, failures = [], []
    for model, shape in models.items():
        shard = ex.shard_weights(ex.make_weights(shape, args.dtype_t, DEVICE), shape, rank, world)
        for phase, counts in (("decode", _ints(args.decode)), ("prefill", _ints(args.prefill))):
            for tokens in counts:
                r, f = run_case(ex, args, comms, shard, shape, model, tokens, phase)
                rows += r
                failures += f
                if rank == 0:
                    print(f"{model} {phase} {tokens} tokens: {len(r)} timings, {len(f)} failures", flush=True)
        del shard
    if rank == 0:
        _report(rows, failures, args, world)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
