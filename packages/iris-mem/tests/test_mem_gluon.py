"""The Gluon device API (:mod:`iris.mem.gluon`) compiles for Hopper, without a GPU.

Gluon kernels never run in Triton's interpreter, so the two tiers test them differently:

* CPU tier (this file): a fresh Python (``IRIS_BACKEND=cuda``, no ``TRITON_INTERPRET``; see
  ``test_mem_compile.run_child``) compiles every kernel below with
  ``triton.compile(GluonASTSource(...), target=GPUTarget("cuda", 90, 32))`` (Gluon IR ->
  TTGIR -> LLVM -> PTX -> ptxas -> cubin) and checks the PTX: every method and dtype, every
  atomic under every (sem, scope), ``.sys`` + ``.release``/``.acquire`` on flags,
  16-byte vectors with ``hint=16`` (and not without), the ``IRIS_DEBUG`` bounds check.
* GPU tier (test_mem_gluon_gpu.py): the same kernels run between the GPUs.
"""

import re

import pytest
import torch
import triton
from test_mem_atomics import OPS
from test_mem_compile import (
    ALIGNED,
    ATOMIC_SUPPORT,
    TARGET_ARCH,
    TYPES,
    _acquire_lines,
    _atom_lines,
    _check_debug_code,
    _global_loads,
    run_child,
    toolchain_missing,
)
from test_mem_gpu import message_rounds
from test_mem_rma import TILE_M, TILE_N
from test_mem_tracing import traced_exchange
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from iris.mem.gluon import Context

pytestmark = [pytest.mark.timeout(300)]

#: Elements of the 1-D kernels' blocks (two per thread of one warp).
BLOCK = 64
#: (sem, scope) pairs every atomic is compiled under; None is Triton's default.
ORDERS = [(None, None)] + [
    (s, c) for s in ("acquire", "release", "acq_rel", "relaxed") for c in ("cta", "gpu", "sys")
]
#: Rows of the atomics kernels' [9, BLOCK] buffers: one atomic each.
ATOMIC_ROWS = [*OPS, "cas"]
N_ORDERS: gl.constexpr = gl.constexpr(len(ORDERS))
N_ROWS: gl.constexpr = gl.constexpr(len(ATOMIC_ROWS))
#: Which rows each dtype supports on sm_90 (test_mem_compile's ATOMIC_SUPPORT groups).
GROUP_ROWS = (("add", "sub"), ("xchg",), ("xor", "and", "or"), ("min", "max"), ("cas",))
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "int32",
         torch.int64: "int64"}  # fmt: skip


def supported_rows(name: str) -> list[str]:
    """Atomics Triton supports for dtype ``name`` ("fp32", ...) on sm_90."""
    return [op for on, ops in zip(ATOMIC_SUPPORT[name], GROUP_ROWS) if on for op in ops]


def rows_mask(name: str) -> int:
    """``ROWS`` bit mask of the atomics kernels for dtype ``name``."""
    return sum(1 << i for i, op in enumerate(ATOMIC_ROWS) if op in supported_rows(name))


# --------------------------------------------------------------------------- kernels


@gluon.jit
def _lanes(BLOCK: gl.constexpr):
    """Offsets of this program's block, in a 1-D layout of BLOCK / (32 * warps) per thread."""
    layout: gl.constexpr = gl.BlockedLayout([BLOCK // (32 * gl.num_warps())], [32], [gl.num_warps()], [0])
    return gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)


@gluon.jit
def _identity_kernel(context, buf, out):
    """``ctx.rank``, ``ctx.world_size``, then ``ctx.translate(buf, p)`` for every rank p."""
    ctx = Context.initialize(context)
    gl.store(out, ctx.rank.to(gl.int64))
    gl.store(out + 1, ctx.world_size.to(gl.int64))
    for p in range(ctx.world_size):
        gl.store(out + 2 + p, ctx.translate(buf, p).to(gl.int64, bitcast=True))


@gluon.jit
def _rma_kernel(
    context, src, put_src, store_vals, load_out, store_dst, get_dst, put_dst, n, peer,
    BLOCK: gl.constexpr, OTHER: gl.constexpr, HINT: gl.constexpr,
):  # fmt: skip
    """load, store, get and put between this rank and ``peer`` under the mask of
    ``test_mem_rma`` (lanes >= n and every 5th lane from 2 off)."""
    ctx = Context.initialize(context)
    offs = _lanes(BLOCK)
    mask = (offs < n) & (offs % 5 != 2)
    gl.store(load_out + offs, ctx.load(src + offs, peer, mask=mask, other=OTHER, hint=HINT))
    ctx.store(store_dst + offs, gl.load(store_vals + offs), peer, mask=mask, hint=HINT)
    ctx.get(src + offs, get_dst + offs, peer, mask=mask, other=OTHER, hint=HINT)
    ctx.put(put_src + offs, put_dst + offs, peer, mask=mask, other=OTHER, hint=HINT)


@gluon.jit
def _copy_kernel(
    context, src, dst, n, from_rank, to_rank, BLOCK: gl.constexpr, OTHER: gl.constexpr, HINT: gl.constexpr
):
    ctx = Context.initialize(context)
    offs = _lanes(BLOCK)
    mask = (offs < n) & (offs % 5 != 2)
    ctx.copy(src + offs, dst + offs, from_rank, to_rank, mask=mask, other=OTHER, hint=HINT)


@gluon.jit
def _cache_kernel(context, src, dst, peer, BLOCK: gl.constexpr):
    """Every cache modifier and ``volatile`` on loads, every one on stores (unmasked)."""
    ctx = Context.initialize(context)
    offs = _lanes(BLOCK)
    a = ctx.load(src + offs, peer, cache_modifier=".ca")
    a += ctx.load(src + offs, peer, cache_modifier=".cg")
    a += ctx.load(src + offs, peer, cache_modifier=".cv")
    a += ctx.load(src + offs, peer, volatile=True)
    ctx.store(dst + offs, a, peer, cache_modifier=".wb")
    ctx.store(dst + offs, a, peer, cache_modifier=".cg")
    ctx.store(dst + offs, a, peer, cache_modifier=".cs")
    ctx.store(dst + offs, a, peer, cache_modifier=".wt")
    ctx.get(src + offs, dst + offs, peer, load_cache_modifier=".cg", store_cache_modifier=".wt")
    ctx.put(src + offs, dst + offs, peer, load_cache_modifier=".ca", store_cache_modifier=".cs")


@gluon.jit
def _vector_kernel(context, src, dst, peer, BLOCK: gl.constexpr, HINT: gl.constexpr):
    """Unmasked remote load then remote store: 16-byte vectors with ``HINT=16``."""
    ctx = Context.initialize(context)
    offs = _lanes(BLOCK)
    ctx.store(dst + offs, ctx.load(src + offs, peer, hint=HINT), peer, hint=HINT)


@gluon.jit
def _tile_kernel(context, src, dst, out, stride, m, n, peer, TILE_M: gl.constexpr, TILE_N: gl.constexpr):
    """[TILE_M, TILE_N] tiles in a 2-D layout with ``hint=(1, TILE_N)``: load ``peer``'s
    ``src`` into the local ``out`` (masked-off lanes get ``other=-5``, test_mem_rma's OTHER)
    and store the local ``src`` into ``peer``'s ``dst``."""
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [gl.num_warps(), 1], [1, 0])
    ctx = Context.initialize(context)
    rm = gl.program_id(0) * TILE_M + gl.arange(0, TILE_M, layout=gl.SliceLayout(1, layout))
    rn = gl.program_id(1) * TILE_N + gl.arange(0, TILE_N, layout=gl.SliceLayout(0, layout))
    offs = rm[:, None] * stride + rn[None, :]
    mask = (rm[:, None] < m) & (rn[None, :] < n)
    gl.store(out + offs, ctx.load(src + offs, peer, mask=mask, other=-5, hint=(1, TILE_N)))
    ctx.store(dst + offs, gl.load(src + offs), peer, mask=mask, hint=(1, TILE_N))


@gluon.constexpr_function
def _op_of(row):
    return ATOMIC_ROWS[row]


@gluon.constexpr_function
def _sem_of(k):
    return ORDERS[k][0]


@gluon.constexpr_function
def _scope_of(k):
    return ORDERS[k][1]


@gluon.jit
def _atomic_row(ctx, OP: gl.constexpr, ptr, val, cmp, mask, peer, SEM: gl.constexpr, SCOPE: gl.constexpr):
    """``ctx.atomic_<OP>(...)`` with ``mask`` (CAS: unmasked, comparing with ``cmp``)."""
    if OP == "add":
        old = ctx.atomic_add(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
    elif OP == "sub":
        old = ctx.atomic_sub(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
    elif OP == "xchg":
        old = ctx.atomic_xchg(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
    elif OP == "xor":
        old = ctx.atomic_xor(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
    elif OP == "and":
        old = ctx.atomic_and(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
    elif OP == "or":
        old = ctx.atomic_or(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
    elif OP == "min":
        old = ctx.atomic_min(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
    elif OP == "max":
        old = ctx.atomic_max(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
    else:
        old = ctx.atomic_cas(ptr, cmp, val, peer, sem=SEM, scope=SCOPE)
    return old


@gluon.jit
def _every_atomic(
    ctx, targets, vals, cmps, olds, offs, mask, peer,
    BLOCK: gl.constexpr, ROWS: gl.constexpr, SEM: gl.constexpr, SCOPE: gl.constexpr,
):  # fmt: skip
    """Row ``i`` of ``targets`` ([9, BLOCK], ``ATOMIC_ROWS``: add ... max, cas) gets its
    atomic with the operands of row ``i`` of ``vals``, for every bit ``i`` set in ``ROWS``;
    the returned old values go to row ``i`` of ``olds`` (masked-off lanes untouched)."""
    cmp = gl.load(cmps + offs)
    for i in gl.static_range(N_ROWS):
        if (ROWS >> i) & 1:
            at = i * BLOCK + offs
            old = _atomic_row(ctx, _op_of(i), targets + at, gl.load(vals + at), cmp, mask, peer, SEM, SCOPE)
            if _op_of(i) == "cas":
                gl.store(olds + at, old)
            else:
                gl.store(olds + at, old, mask=mask)


@gluon.jit
def _atomics_kernel(context, targets, vals, cmps, olds, n, peer, BLOCK: gl.constexpr, ROWS: gl.constexpr):
    """Every atomic of ``ROWS``, once, on ``peer``, acq_rel at system scope, under
    test_mem_atomics's mask (lanes >= n and every 3rd lane from 1 off; CAS unmasked)."""
    ctx = Context.initialize(context)
    offs = _lanes(BLOCK)
    mask = (offs < n) & (offs % 3 != 1)
    _every_atomic(ctx, targets, vals, cmps, olds, offs, mask, peer, BLOCK, ROWS, "acq_rel", "sys")


@gluon.jit
def _atomic_orders_kernel(
    context, targets, vals, cmps, olds, n, peer, BLOCK: gl.constexpr, ROWS: gl.constexpr
):
    """Compile-only: every atomic of ``ROWS`` under every (sem, scope) of ``ORDERS``."""
    ctx = Context.initialize(context)
    offs = _lanes(BLOCK)
    for k in gl.static_range(N_ORDERS):
        _every_atomic(
            ctx, targets, vals, cmps, olds, offs, offs < n, peer, BLOCK, ROWS, _sem_of(k), _scope_of(k)
        )


@gluon.jit
def _contention_kernel(context, c32, c64, cf32, log, ITERS: gl.constexpr):
    """Every program adds, ITERS times, to the counters of every rank: 1 to the int32 one
    (logging the old value), RANK + 1 to the int64 and fp32 ones."""
    ctx = Context.initialize(context)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    for i in range(ITERS):
        for t in range(ctx.world_size):
            old = ctx.atomic_add(c32, 1, t, sem="acq_rel", scope="sys")
            ctx.atomic_add(c64, (ctx.rank + 1).to(gl.int64), t, scope="sys")
            ctx.atomic_add(cf32, (ctx.rank + 1).to(gl.float32), t, sem="relaxed", scope="sys")
            gl.store(log + (t * nprog + pid) * ITERS + i, old)


@gluon.jit
def _message_passing_kernel(context, data, flag, ack, errors, rounds, budget, BLOCK: gl.constexpr):
    """test_mem_gpu's message passing (:func:`message_rounds`) around a ring of any size,
    in a Gluon layout."""
    ctx = Context.initialize(context)
    nxt = (ctx.rank + 1) % ctx.world_size
    prv = (ctx.rank + ctx.world_size - 1) % ctx.world_size
    gl.store(errors, message_rounds(ctx, data, flag, ack, _lanes(BLOCK), nxt, prv, rounds, budget))


@gluon.jit
def _flags_kernel(context, flags, out, peer, DEFAULTS: gl.constexpr):
    """Flag traffic only: release/sys publishes and acquire/sys polls (``DEFAULTS``: the same
    atomics with the default acq_rel/gpu, the negative control of the PTX checks)."""
    ctx = Context.initialize(context)
    if DEFAULTS:
        ctx.atomic_xchg(flags, 1, peer)
        ctx.atomic_add(flags + 1, 1, peer)
    else:
        ctx.atomic_xchg(flags, 1, peer, sem="release", scope="sys")
        ctx.atomic_add(flags + 1, 1, peer, sem="release", scope="sys")
        ctx.atomic_max(flags + 2, 1, peer, sem="release", scope="sys")
        a = ctx.atomic_add(flags + 3, 0, peer, sem="acquire", scope="sys")
        b = ctx.atomic_cas(flags + 4, 0, 0, peer, sem="acquire", scope="sys")
        gl.store(out, a + b)


@gluon.jit
def _traced_kernel(
    context, src, dst, out, ids, ids_out, counter, n,
    EXCHANGE: gl.constexpr, MARK: gl.constexpr, TRACE: gl.constexpr, BLOCK: gl.constexpr,
):  # fmt: skip
    """test_mem_tracing's traced kernel (:func:`traced_exchange`) in a Gluon layout."""
    ctx = Context.initialize(context, tracing=TRACE)
    right = (ctx.rank + 1) % ctx.world_size
    left = (ctx.rank + ctx.world_size - 1) % ctx.world_size
    pid = gl.program_id(0)
    traced_exchange(
        ctx, src, dst, out, ids, ids_out, counter, _lanes(BLOCK), n, right, left, pid, EXCHANGE, MARK
    )


# --------------------------------------------------------------------------- compile (child side)


def _compile(fn, signature: dict, constexprs: dict, aligned=(), num_warps: int = 1):
    """Compile the Gluon kernel ``fn`` for sm_90 (``aligned`` pointers 16-byte aligned)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(fn.arg_names)
    sig = {name: signature.get(name, "constexpr") for name in names}
    attrs = {(names.index(a),): ALIGNED for a in aligned}
    src = GluonASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", TARGET_ARCH, 32), options={"num_warps": num_warps})


def _attempt(fails: list, what: str, fn, *args, **kwargs):
    try:
        kernel = _compile(fn, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - reported with the variant
        fails.append(f"{what}: {type(e).__name__}: {e}"[:3000])
        return None
    if not kernel.asm.get("cubin"):
        fails.append(f"{what}: no cubin")
    return kernel


def _child_rma(fails: list, debug: bool) -> None:
    variants = [(name, hint) for name in TYPES for hint in (None, 16)]
    if debug:  # the bounds check makes every translation slower to compile: fewer variants
        variants = [("fp32", 16), ("bf16", None)]
    for name, hint in variants:
        ty = "*" + TYPES[name]
        what = f"gluon rma {name} hint={hint} debug={debug}"
        consts = {"BLOCK": BLOCK, "OTHER": -5, "HINT": hint}
        sig = {k: ty for k in ("src", "put_src", "store_vals", "load_out", "store_dst", "get_dst", "put_dst")}
        sig.update(context="*i64", n="i32", peer="i32")
        if (k := _attempt(fails, what, _rma_kernel, sig, consts, aligned=tuple(sig)[:7])) is not None:
            _check_debug_code(fails, what, k.asm["ptx"], debug)
        sig = dict(context="*i64", src=ty, dst=ty, n="i32", from_rank="i32", to_rank="i32")
        _attempt(fails, f"gluon copy {name} hint={hint}", _copy_kernel, sig, consts, aligned=("src", "dst"))
        if hint is not None:
            continue
        # Once per dtype: the kernels without a HINT parameter.
        sig = dict(context="*i64", src=ty, dst=ty, out=ty, stride="i32", m="i32", n="i32", peer="i32")
        what = f"gluon 2-D tiles {name} debug={debug}"
        consts = {"TILE_M": TILE_M, "TILE_N": TILE_N}
        if (k := _attempt(fails, what, _tile_kernel, sig, consts, num_warps=2)) is not None:
            _check_debug_code(fails, what, k.asm["ptx"], debug)
        if not debug:
            sig = dict(context="*i64", src=ty, dst=ty, peer="i32")
            _attempt(fails, f"gluon cache modifiers {name}", _cache_kernel, sig, {"BLOCK": BLOCK})
    if not debug:
        _attempt(fails, "gluon identity", _identity_kernel, dict(context="*i64", buf="*fp32", out="*i64"), {})


def _child_atomics(fails: list, debug: bool) -> None:
    for name in ATOMIC_SUPPORT:
        ty = "*" + TYPES[name]
        sig = dict(context="*i64", targets=ty, vals=ty, cmps=ty, olds=ty, n="i32", peer="i32")
        consts = {"BLOCK": BLOCK, "ROWS": rows_mask(name)}
        what = f"gluon atomics {name} debug={debug}"
        if (k := _attempt(fails, what, _atomics_kernel, sig, consts)) is not None:
            _check_debug_code(fails, what, k.asm["ptx"], debug)
        if debug:
            return
        k = _attempt(fails, f"gluon atomics {name} every (sem, scope)", _atomic_orders_kernel, sig, consts)
        if k is None:
            continue
        atoms = _atom_lines(k.asm["ptx"])
        if len(atoms) < len(ORDERS) * len(supported_rows(name)):
            fails.append(f"gluon atomics {name}: {len(atoms)} atom instructions for {len(ORDERS)} orders")
        for sem, scope in ORDERS[1:]:
            if not any(f".{sem}" in a and f".{scope}" in a for a in atoms):
                fails.append(f"gluon atomics {name}: no atom with .{sem}, .{scope}: {sorted(set(atoms))[:6]}")
    sig = {"context": "*i64", "c32": "*i32", "c64": "*i64", "cf32": "*fp32", "log": "*i32"}
    _attempt(fails, "gluon contention", _contention_kernel, sig, {"ITERS": 4}, num_warps=4)
    sig = {"context": "*i64", "data": "*i32", "flag": "*i32", "ack": "*i32", "errors": "*i32"}
    sig.update(rounds="i32", budget="i32")
    k = _attempt(fails, "gluon message passing", _message_passing_kernel, sig, {"BLOCK": BLOCK})
    if k is not None:
        ptx = k.asm["ptx"]
        if not any(".sys" in a and ".release" in a for a in _atom_lines(ptx)):
            fails.append(f"gluon message passing: no release/sys flag store: {_atom_lines(ptx)}")
        if not any(".sys" in a for a in _acquire_lines(ptx)):
            fails.append(f"gluon message passing: no acquire/sys poll: {_acquire_lines(ptx)}")


def _child_flags(fails: list) -> None:
    """Every atomic of the flag kernel is .sys with .release/.acquire; the defaults are
    .gpu/.acq_rel (negative control)."""
    sig = {"context": "*i64", "flags": "*i32", "out": "*i32", "peer": "i32"}
    k = _attempt(fails, "gluon flags", _flags_kernel, sig, {"DEFAULTS": False})
    if k is not None:
        ptx = k.asm["ptx"]
        releases = [a for a in _atom_lines(ptx) if ".release" in a]
        acquires = _acquire_lines(ptx)
        if len(releases) < 3 or len(acquires) < 2:
            fails.append(
                f"gluon flags: expected 3 release and 2 acquire atomics: {_atom_lines(ptx)} {acquires}"
            )
        for line in releases + acquires:
            if ".sys" not in line:
                fails.append(f"gluon flag atomic without .sys: {line}")
        if any(".gpu" in a or ".acq_rel" in a for a in _atom_lines(ptx)):
            fails.append(f"gluon flags: a flag atomic lost its sem/scope: {_atom_lines(ptx)}")
    k = _attempt(fails, "gluon flags (defaults)", _flags_kernel, sig, {"DEFAULTS": True})
    if k is not None:
        atoms = _atom_lines(k.asm["ptx"])
        if not atoms or not all(".gpu" in a and ".acq_rel" in a for a in atoms):
            fails.append(f"gluon default-sem atomics: expected .gpu and .acq_rel only, got {atoms}")


def _child_vector(fails: list, report: dict) -> None:
    """hint=16 gives 16-byte remote loads and stores in every dtype; no hint gives none
    (the negative control: without it the translated pointer's alignment is unknown)."""
    for name in TYPES:
        ty = "*" + TYPES[name]
        spt = 16 // {"fp32": 4, "fp16": 2, "bf16": 2, "int32": 4, "int64": 8}[name]
        for hint in (16, None):
            consts = {"BLOCK": spt * 32 * 4, "HINT": hint}
            sig = {"context": "*i64", "src": ty, "dst": ty, "peer": "i32"}
            k = _attempt(fails, f"gluon vector {name}", _vector_kernel, sig, consts, ("src", "dst"), 4)
            if k is None:
                continue
            ptx = k.asm["ptx"]
            # 64-bit loads of the heap bases aside, the rest are the data.
            loads = [ld for ld in _global_loads(ptx) if not re.search(r"\bld\.global\.b64\b", ld)]
            stores = [ln.strip() for ln in ptx.splitlines() if "st.global" in ln]
            vector = re.compile(r"\.v4\.b32|\.v2\.b64")
            v_ld, v_st = any(vector.search(x) for x in loads), any(vector.search(x) for x in stores)
            report[f"{name} hint={hint}"] = [v_ld, v_st]
            if hint == 16 and not (v_ld and v_st):
                fails.append(
                    f"gluon vector {name}: hint=16 without 16-byte loads/stores: {loads[:3]} {stores[:3]}"
                )
            if hint is None and (v_ld or v_st):
                fails.append(f"gluon vector {name}: vectorised without a hint, so the check proves nothing")


def _child_tracing(fails: list, report: dict) -> None:
    """tracing=True reads the GPU clock and SM id around every operation; False compiles
    every recording away (the negative control: the traced kernel is longer)."""
    sig = dict(context="*i64", src="*fp16", dst="*fp16", out="*fp16", ids="*i64", ids_out="*i64")
    sig.update(counter="*i32", n="i32")
    lines = {}
    for trace in (True, False):
        consts = {"EXCHANGE": 4096, "MARK": 4097, "TRACE": trace, "BLOCK": 32}
        k = _attempt(fails, f"gluon traced kernel TRACE={trace}", _traced_kernel, sig, consts)
        if k is None:
            return
        ptx = k.asm["ptx"]
        lines[trace] = len(ptx.splitlines())
        reads = "%globaltimer" in ptx and "%smid" in ptx
        if reads != trace:
            fails.append(f"gluon traced kernel TRACE={trace}: reads %globaltimer/%smid: {reads}")
    report["tracing_lines"] = lines


def _child_example(fails: list) -> None:
    """examples/07_gluon_all_gather.py's kernel (the example only runs on GPUs): 16-byte
    vector stores to peers, release/acquire flags at system scope."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "07_gluon_all_gather.py"
    if not path.exists():  # an sdist has no examples folder
        return
    spec = importlib.util.spec_from_file_location("gluon_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    sig = dict(context="*i64", src="*fp32", gathered="*fp32", flags="*i32", failures="*i32")
    sig.update(n="i32", epoch="i32", budget="i32")
    k = _attempt(fails, "example 07", example.all_gather_kernel, sig, {"BLOCK": 1024},
                 aligned=("src", "gathered", "n"), num_warps=4)  # fmt: skip
    if k is not None:
        ptx = k.asm["ptx"]
        if "st.global.v4.b32" not in ptx:
            fails.append("example 07: no 16-byte vector store to the peers")
        if not any(".sys" in a and ".release" in a for a in _atom_lines(ptx)):
            fails.append(f"example 07: no release/sys flag: {_atom_lines(ptx)}")
        if not any(".sys" in a for a in _acquire_lines(ptx)):
            fails.append(f"example 07: no acquire/sys poll: {_acquire_lines(ptx)}")


def child_main(group: str) -> dict:
    """Entry point of the compiling child (see ``test_mem_compile.run_child``)."""
    missing = toolchain_missing()
    if missing:
        return {"skip": missing}
    import iris.mem.settings as env

    if not hasattr(_rma_kernel, "is_gluon") or env.interpreted():
        return {"failures": ["the child runs with TRITON_INTERPRET: nothing was compiled"]}
    fails: list[str] = []
    report: dict = {"debug": env.debug()}
    if group == "rma":
        _child_rma(fails, env.debug())
        _child_vector(fails, report)
        _child_tracing(fails, report)
        _child_example(fails)
    elif group == "atomics":
        _child_atomics(fails, env.debug())
        _child_flags(fails)
    elif group == "debug":
        _child_rma(fails, True)
        _child_atomics(fails, True)
    else:
        fails.append(f"unknown group {group}")
    return {"failures": fails, "report": report}


# --------------------------------------------------------------------------- compile (pytest side)


def _assert_compiled(group: str, debug: bool = False) -> dict:
    result = run_child(group, debug=debug, module="test_mem_gluon")
    assert result["failures"] == [], "\n".join(result["failures"][:30])
    return result


def test_gluon_rma_and_tracing_compile_for_hopper_with_16_byte_vectors():
    report = _assert_compiled("rma")["report"]
    assert report["fp32 hint=16"] == [True, True] and report["fp32 hint=None"] == [False, False]
    lines = report["tracing_lines"]
    assert lines["true"] > lines["false"], lines


def test_gluon_atomics_compile_under_every_sem_and_scope():
    _assert_compiled("atomics")


def test_gluon_kernels_compile_the_iris_debug_bounds_check():
    assert _assert_compiled("debug", debug=True)["report"]["debug"] is True


def test_gluon_context_has_every_method_of_the_triton_context():
    """Same API in both dialects: every public method of iris.mem.triton.Context (and of its
    recorder) exists on the Gluon classes, as the same shared function."""
    import iris.mem.gluon as gluon_mem
    import iris.mem.triton as triton_mem

    for gluon_cls, triton_cls in (
        (gluon_mem.Context, triton_mem.Context),
        (gluon_mem.Tracing, triton_mem.Tracing),
    ):
        names = [n for n in vars(triton_cls) if not n.startswith("__") and n != "initialize"]
        names = [n for n in names if callable(getattr(triton_cls, n))]
        assert names, f"no methods found on {triton_cls}"
        for name in names:
            assert hasattr(gluon_cls, name), f"iris.mem.gluon.{gluon_cls.__name__} lacks {name}"
