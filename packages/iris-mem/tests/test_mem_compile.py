"""Every device function compiles for NVIDIA Hopper (sm_90), without a GPU.

The CPU tier runs kernels in Triton's interpreter, which never lowers them; this file
proves the same code also goes through Triton's real NVIDIA pipeline (TTIR -> TTGIR ->
LLVM -> PTX -> ptxas -> cubin) for ``GPUTarget("cuda", 90, 32)``. Each test starts a
fresh Python (``sys.executable``) with ``IRIS_BACKEND=cuda`` and no ``TRITON_INTERPRET``,
so this module's kernels are compiled ``JITFunction`` objects there; the child compiles
them with ``triton.compile(ASTSource(...))``, checks the PTX, and reports failures as JSON.

The kernels live in this module (the child imports it by name); in the pytest process
they are interpreted functions that nobody launches.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
import triton
import triton.language as tl

import iris.mem.triton as imt
from iris.mem.testing import unordered_counter_updates
from iris.mem.triton import Context

pytestmark = pytest.mark.timeout(300)

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_ARCH = 90


# --------------------------------------------------------------------------- kernels


@triton.jit
def _rma_kernel(
    context, heap_bases, src, dst, out, n, peer, peer2,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr, HINT: tl.constexpr,
):  # fmt: skip
    """Every RMA method and functional form, with cache modifiers, volatile and hints."""
    ctx = Context.initialize(context, RANK, WORLD)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t = ctx.translate(src + offs, peer, hint=HINT)
    tl.store(out + offs, tl.load(t))
    if MASKED:
        mask = offs < n
        a = ctx.load(src + offs, peer, mask=mask, other=0, hint=HINT)
        b = ctx.load(src + offs, peer, mask=mask, other=1, volatile=True, hint=HINT)
        b += ctx.load(src + offs, peer, mask=mask, other=1, cache_modifier=".cg", hint=HINT)
        c = imt.load(src + offs, RANK, peer, heap_bases, mask=mask, other=2, cache_modifier=".ca", hint=HINT)
        d = imt.load(src + offs, RANK, peer, heap_bases, mask, 3, ".cv", False, HINT)
        d += imt.load(src + offs, RANK, peer, heap_bases, mask, 3, None, True, HINT)
        ctx.store(dst + offs, a + b, peer, mask=mask, cache_modifier=".wb", hint=HINT)
        imt.store(dst + offs, c + d, RANK, peer, heap_bases, mask=mask, hint=HINT, cache_modifier=".cs")
        ctx.get(src + offs, out + offs, peer, mask=mask, other=0, load_cache_modifier=".cg", hint=HINT)
        imt.get(
            src + offs, out + offs, peer, RANK, heap_bases, mask=mask, other=0, store_cache_modifier=".wt"
        )
        ctx.put(src + offs, dst + offs, peer, mask=mask, other=0, store_cache_modifier=".cs", hint=HINT)
        imt.put(src + offs, dst + offs, RANK, peer, heap_bases, mask=mask, other=0, load_cache_modifier=".ca")
        # copy: remote->local, local->remote, remote->remote
        ctx.copy(src + offs, dst + offs, peer, RANK, mask=mask, other=0, hint=HINT)
        ctx.copy(src + offs, dst + offs, RANK, peer, mask=mask, load_cache_modifier=".cg", hint=HINT)
        imt.copy(src + offs, dst + offs, peer, peer2, RANK, heap_bases, mask=mask, other=0,
                 store_cache_modifier=".wb", hint=HINT)  # fmt: skip
    else:
        a = ctx.load(src + offs, peer, hint=HINT)
        b = ctx.load(src + offs, peer, volatile=True, hint=HINT)
        b += ctx.load(src + offs, peer, cache_modifier=".cg", hint=HINT)
        c = imt.load(src + offs, RANK, peer, heap_bases, hint=HINT)
        ctx.store(dst + offs, a + b, peer, cache_modifier=".wt", hint=HINT)
        imt.store(dst + offs, c, RANK, peer, heap_bases, hint=HINT)
        ctx.get(src + offs, out + offs, peer, hint=HINT)
        imt.get(src + offs, out + offs, peer, RANK, heap_bases, hint=HINT)
        ctx.put(src + offs, dst + offs, peer, hint=HINT)
        imt.put(src + offs, dst + offs, RANK, peer, heap_bases, hint=HINT)
        ctx.copy(src + offs, dst + offs, peer, peer2, hint=HINT)
        imt.copy(src + offs, dst + offs, RANK, peer, RANK, heap_bases, hint=HINT)


@triton.jit
def _atomics_once(
    context, heap_bases, p, v, c, mask, peer, acc,
    RANK: tl.constexpr, WORLD: tl.constexpr, SEM: tl.constexpr, SCOPE: tl.constexpr, HINT: tl.constexpr,
    ARITH: tl.constexpr, XCHG: tl.constexpr, BITWISE: tl.constexpr, MINMAX: tl.constexpr, CAS: tl.constexpr,
):  # fmt: skip
    """Every atomic the dtype supports, Context and functional, with one (sem, scope)."""
    ctx = Context.initialize(context, RANK, WORLD)
    if ARITH:
        acc += ctx.atomic_add(p, v, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += ctx.atomic_sub(p, v, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_add(p, v, RANK, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_sub(p, v, RANK, peer, heap_bases, mask, SEM, SCOPE, HINT)
    if XCHG:
        acc += ctx.atomic_xchg(p, v, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_xchg(p, v, RANK, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
    if BITWISE:
        acc += ctx.atomic_xor(p, v, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += ctx.atomic_and(p, v, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += ctx.atomic_or(p, v, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_xor(p, v, RANK, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_and(p, v, RANK, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_or(p, v, RANK, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
    if MINMAX:
        acc += ctx.atomic_min(p, v, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += ctx.atomic_max(p, v, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_min(p, v, RANK, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_max(p, v, RANK, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
    if CAS:
        acc += ctx.atomic_cas(p, c, v, peer, sem=SEM, scope=SCOPE, hint=HINT)
        acc += imt.atomic_cas(p, c, v, RANK, peer, heap_bases, sem=SEM, scope=SCOPE, hint=HINT)
    return acc


@triton.jit
def _atomics_kernel(
    context, heap_bases, target, vals, cmps, out, scalar, n, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, HINT: tl.constexpr,
    ARITH: tl.constexpr, XCHG: tl.constexpr, BITWISE: tl.constexpr, MINMAX: tl.constexpr, CAS: tl.constexpr,
):  # fmt: skip
    """Block atomics under every sem and every scope (and the defaults), plus scalar
    atomics on one word (a lock: acquire CAS, release exchange)."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    p = target + offs
    v = tl.load(vals + offs)
    c = tl.load(cmps + offs)
    acc = tl.zeros([BLOCK], dtype=v.dtype)
    acc = _atomics_once(context, heap_bases, p, v, c, mask, peer, acc, RANK, WORLD, None, None, HINT,
                        ARITH, XCHG, BITWISE, MINMAX, CAS)  # fmt: skip
    acc = _atomics_once(context, heap_bases, p, v, c, mask, peer, acc, RANK, WORLD, "acquire", "cta", HINT,
                        ARITH, XCHG, BITWISE, MINMAX, CAS)  # fmt: skip
    acc = _atomics_once(context, heap_bases, p, v, c, mask, peer, acc, RANK, WORLD, "release", "gpu", HINT,
                        ARITH, XCHG, BITWISE, MINMAX, CAS)  # fmt: skip
    acc = _atomics_once(context, heap_bases, p, v, c, mask, peer, acc, RANK, WORLD, "acq_rel", "sys", HINT,
                        ARITH, XCHG, BITWISE, MINMAX, CAS)  # fmt: skip
    acc = _atomics_once(context, heap_bases, p, v, c, mask, peer, acc, RANK, WORLD, "relaxed", "gpu", HINT,
                        ARITH, XCHG, BITWISE, MINMAX, CAS)  # fmt: skip
    acc = _atomics_once(context, heap_bases, p, v, c, mask, peer, acc, RANK, WORLD, "release", "sys", HINT,
                        ARITH, XCHG, BITWISE, MINMAX, CAS)  # fmt: skip
    tl.store(out + offs, acc, mask=mask)
    if CAS and XCHG:
        ctx = Context.initialize(context, RANK, WORLD)
        zero = tl.load(scalar + 1)
        one = tl.load(scalar + 2)
        old = ctx.atomic_cas(scalar, zero, one, peer, sem="acquire", scope="sys")
        old += imt.atomic_cas(scalar, zero, one, RANK, peer, heap_bases, sem="acquire", scope="sys")
        old += ctx.atomic_xchg(scalar, zero, peer, sem="release", scope="sys")
        old += imt.atomic_xchg(scalar, zero, RANK, peer, heap_bases, sem="release", scope="sys")
        tl.store(scalar + 3, old)


@triton.jit
def _release_sys_kernel(context, heap_bases, flags, peer, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Only release/sys atomics: every atom instruction must say so."""
    ctx = Context.initialize(context, RANK, WORLD)
    ctx.atomic_xchg(flags, 1, peer, sem="release", scope="sys")
    imt.atomic_xchg(flags + 1, 1, RANK, peer, heap_bases, sem="release", scope="sys")
    ctx.atomic_add(flags + 2, 1, peer, sem="release", scope="sys")
    imt.atomic_cas(flags + 3, 0, 1, RANK, peer, heap_bases, sem="release", scope="sys")


@triton.jit
def _acquire_sys_kernel(context, heap_bases, flags, out, peer, RANK: tl.constexpr, WORLD: tl.constexpr):
    ctx = Context.initialize(context, RANK, WORLD)
    a = ctx.atomic_add(flags, 0, peer, sem="acquire", scope="sys")
    b = imt.atomic_cas(flags + 1, 0, 0, RANK, peer, heap_bases, sem="acquire", scope="sys")
    tl.store(out, a + b)


@triton.jit
def _default_sem_kernel(context, heap_bases, flags, peer, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Defaults (acq_rel, gpu): the negative control of the PTX checks."""
    ctx = Context.initialize(context, RANK, WORLD)
    ctx.atomic_xchg(flags, 1, peer)
    imt.atomic_add(flags + 1, 1, RANK, peer, heap_bases)


@triton.jit
def _vector_load_kernel(
    context, heap_bases, src, out, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, HINT: tl.constexpr,
    FUNCTIONAL: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if FUNCTIONAL:
        v = imt.load(src + offs, RANK, peer, heap_bases, hint=HINT)
    else:
        ctx = Context.initialize(context, RANK, WORLD)
        v = ctx.load(src + offs, peer, hint=HINT)
    tl.store(out + offs, v)


@triton.jit
def _tile_kernel(
    context, heap_bases, src, dst, stride, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr,
):  # fmt: skip
    """2-D [16, 32] tiles with hint=(1, 32)."""
    ctx = Context.initialize(context, RANK, WORLD)
    rm = tl.program_id(0) * TILE_M + tl.arange(0, TILE_M)
    rn = tl.program_id(1) * TILE_N + tl.arange(0, TILE_N)
    offs = rm[:, None] * stride + rn[None, :]
    v = ctx.load(src + offs, peer, hint=(1, TILE_N))
    ctx.store(dst + offs, v, peer, hint=(1, TILE_N))
    w = imt.load(src + offs, RANK, peer, heap_bases, hint=(1, TILE_N))
    imt.store(dst + offs, w, RANK, peer, heap_bases, hint=(1, TILE_N))


# --------------------------------------------------------------------------- child side

TYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "int32": "i32", "int64": "i64"}
#: Atomic op groups Triton supports per dtype on sm_90 (ARITH, XCHG, BITWISE, MINMAX, CAS).
ATOMIC_SUPPORT = {
    "int32": (True, True, True, True, True),
    "int64": (True, True, True, True, True),
    "fp32": (True, True, False, True, True),
    "fp16": (True, False, False, False, False),
    "bf16": (True, False, False, False, False),
}
ALIGNED = [["tt.divisibility", 16]]


def _compile(fn, signature: dict, constexprs: dict, aligned: tuple = ()):
    """Compile ``fn`` for sm_90; ``aligned`` names pointer arguments to specialise as
    16-byte aligned (what launching with aligned tensors would do)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    sig = {name: signature.get(name, "constexpr") for name in names}
    attrs = {(names.index(a),): ALIGNED for a in aligned}
    src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", TARGET_ARCH, 32))


def _ctx_sig(**extra) -> dict:
    return {"context": "*i64", "heap_bases": "*i64", **extra}


def _atom_lines(ptx: str) -> list[str]:
    # atom.* returns the old value; newer Triton emits red.* when the result is unused.
    return [line.strip() for line in ptx.splitlines() if re.search(r"\b(atom|red)\.", line)]


def _acquire_lines(ptx: str) -> list[str]:
    """Atomics and loads with acquire semantics: Triton lowers ``atomic_add(p, 0)`` with
    ``sem="acquire"`` to an acquire load (``ld.global.sys.acquire``), which is as good."""
    return [
        ln.strip() for ln in ptx.splitlines() if re.search(r"\b(atom|ld)\.global\.", ln) and ".acquire" in ln
    ]


def _global_loads(ptx: str) -> list[str]:
    return [line.strip() for line in ptx.splitlines() if "ld.global" in line]


def _child_barrier(fails: list, worlds=(1, 2, 8)) -> None:
    from iris.mem import sync

    names = ("context", "members", "flags", "epochs", "status", "budget")
    sig = dict(zip(names, ("*i64", "*i32", "*i32", "*i32", "*i64", "i64")))
    for world in worlds:
        consts = {"RANK": world - 1, "WORLD": world, "GROUP": world, "ME": world - 1}
        k = _compile(sync.device_barrier_kernel, sig, consts)
        atoms = _atom_lines(k.asm["ptx"])
        if world == 1:  # nobody to wait for: the barrier of one compiles to nothing
            if atoms:
                fails.append(f"barrier world=1: atomics in the PTX of a barrier of one: {atoms[:4]}")
            continue
        if not any(".sys" in a and ".release" in a and ".max" in a for a in atoms):
            fails.append(f"barrier world={world}: no release/sys atomic max in PTX: {atoms[:4]}")
        acquires = _acquire_lines(k.asm["ptx"])
        if not any(".sys" in a for a in acquires):
            fails.append(
                f"barrier world={world}: no acquire/sys atomic or load in PTX: {atoms[:4]} {acquires[:4]}"
            )
        if not k.asm.get("cubin"):
            fails.append(f"barrier world={world}: no cubin")
        fails += [f"barrier world={world}: {p}" for p in unordered_counter_updates(k.asm["ptx"])]


def _child_rma(fails: list, debug: bool) -> None:
    # The debug build is slow to compile (a bounds check per translation): fewer variants.
    variants = [(n, m, h) for n in TYPES for m in (True, False) for h in (None, 16)]
    if debug:
        variants = [("fp32", True, 16), ("bf16", False, None)]
    for name, masked, hint in variants:
        ty = "*" + TYPES[name]
        sig = _ctx_sig(src=ty, dst=ty, out=ty, n="i32", peer="i32", peer2="i32")
        what = f"rma {name} masked={masked} hint={hint} debug={debug}"
        try:
            k = _compile(
                _rma_kernel, sig,
                {"RANK": 1, "WORLD": 4, "BLOCK": 256, "MASKED": masked, "HINT": hint},
                aligned=("src", "dst", "out"),
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - reported with the variant
            fails.append(f"{what}: {type(e).__name__}: {e}"[:2000])
            continue
        _check_debug_code(fails, what, k.asm["ptx"], debug)
    sig = _ctx_sig(src="*fp32", dst="*fp32", stride="i32", peer="i32")
    try:
        k = _compile(
            _tile_kernel, sig, {"RANK": 0, "WORLD": 2, "TILE_M": 16, "TILE_N": 32}, aligned=("src", "dst")
        )
        _check_debug_code(fails, f"2-D tiles debug={debug}", k.asm["ptx"], debug)
    except Exception as e:  # noqa: BLE001
        fails.append(f"2-D tiles debug={debug}: {type(e).__name__}: {e}"[:2000])


def _check_debug_code(fails: list, what: str, ptx: str, debug: bool) -> None:
    """IRIS_DEBUG compiles in the heap-bounds check (printf + trap); otherwise none."""
    has_trap = bool(re.search(r"\btrap;", ptx))
    has_print = "vprintf" in ptx
    if debug and not (has_trap and has_print):
        fails.append(
            f"{what}: IRIS_DEBUG kernel lacks the bounds check (trap={has_trap}, vprintf={has_print})"
        )
    if not debug and (has_trap or has_print):
        fails.append(
            f"{what}: kernel without IRIS_DEBUG contains debug code (trap={has_trap}, vprintf={has_print})"
        )


def _child_atomics(fails: list, debug: bool) -> None:
    variants = [(n, h) for n in ATOMIC_SUPPORT for h in (None, 16)]
    if debug:
        variants = [("int32", 16)]
    for name, hint in variants:
        arith, xchg, bitwise, minmax, cas = ATOMIC_SUPPORT[name]
        ty = "*" + TYPES[name]
        sig = _ctx_sig(target=ty, vals=ty, cmps=ty, out=ty, scalar=ty, n="i32", peer="i32")
        what = f"atomics {name} hint={hint} debug={debug}"
        consts = dict(RANK=2, WORLD=3, BLOCK=128, HINT=hint, ARITH=arith, XCHG=xchg, BITWISE=bitwise,
                      MINMAX=minmax, CAS=cas)  # fmt: skip
        try:
            k = _compile(_atomics_kernel, sig, consts)
        except Exception as e:  # noqa: BLE001
            fails.append(f"{what}: {type(e).__name__}: {e}"[:2000])
            continue
        ptx = k.asm["ptx"]
        _check_debug_code(fails, what, ptx, debug)
        atoms = _atom_lines(ptx)
        if not atoms:
            fails.append(f"{what}: no atom instructions in PTX")
        for sem, scope in (
            ("acquire", "cta"),
            ("release", "gpu"),
            ("acq_rel", "sys"),
            ("relaxed", "gpu"),
            ("release", "sys"),
        ):
            if not any(f".{sem}" in a and f".{scope}" in a for a in atoms):
                fails.append(f"{what}: no atom with .{sem} and .{scope}: {sorted(set(atoms))[:6]}")


def _child_ptx_semantics(fails: list) -> None:
    sig = _ctx_sig(flags="*i32", peer="i32")
    atoms = _atom_lines(_compile(_release_sys_kernel, sig, {"RANK": 0, "WORLD": 2}).asm["ptx"])
    if len(atoms) < 4:
        fails.append(f"release/sys kernel: expected 4 atom instructions, got {atoms}")
    for a in atoms:
        if ".sys" not in a or ".release" not in a:
            fails.append(f"release/sys atomic lowered without .sys/.release: {a}")
    sig = _ctx_sig(flags="*i32", out="*i32", peer="i32")
    ptx = _compile(_acquire_sys_kernel, sig, {"RANK": 0, "WORLD": 2}).asm["ptx"]
    atoms = _atom_lines(ptx)
    if not atoms or len(_acquire_lines(ptx)) < 2:
        fails.append(
            f"acquire/sys kernel: expected a CAS and an acquire load or atomic, got {_acquire_lines(ptx)}"
        )
    for a in atoms + _acquire_lines(ptx):
        if ".sys" not in a or ".acquire" not in a:
            fails.append(f"acquire/sys atomic lowered without .sys/.acquire: {a}")
    # Negative control: the defaults are acq_rel at gpu scope, so the same check fails.
    sig = _ctx_sig(flags="*i32", peer="i32")
    atoms = _atom_lines(_compile(_default_sem_kernel, sig, {"RANK": 0, "WORLD": 2}).asm["ptx"])
    if not atoms or any(".sys" in a or ".release" in a for a in atoms):
        fails.append(f"default-sem atomics: expected .gpu/.acq_rel only, got {atoms}")
    if not all(".gpu" in a and ".acq_rel" in a for a in atoms):
        fails.append(f"default-sem atomics: expected .gpu and .acq_rel, got {atoms}")


def _child_vector(fails: list, report: dict) -> None:
    sig = _ctx_sig(src="*fp32", out="*fp32", peer="i32")
    for functional in (False, True):
        for hint in (16, None):
            k = _compile(
                _vector_load_kernel, sig,
                {"RANK": 0, "WORLD": 2, "BLOCK": 1024, "HINT": hint, "FUNCTIONAL": functional},
                aligned=("src", "out"),
            )  # fmt: skip
            # 64-bit loads are the heap bases; the rest are the data block.
            data_loads = [ld for ld in _global_loads(k.asm["ptx"]) if not re.search(r"\.[bus]64\b", ld)]
            key = f"functional={functional} hint={hint}"
            report[key] = sorted({re.sub(r"\s.*", "", ld.split(" ", 1)[-1] if ld.startswith("@") else ld)
                                  for ld in data_loads})  # fmt: skip
            v4 = any("ld.global" in ld and ".v4" in ld for ld in data_loads)
            if hint == 16 and not v4:
                fails.append(f"vector load {key}: no ld.global.v4 in PTX; loads: {data_loads[:6]}")
            if hint is None and v4:
                # Negative control: without the hint the translated pointer's alignment is
                # unknown to Triton 3.6, so the load stays scalar; the hint is what helps.
                fails.append(f"vector load {key}: vectorised without a hint, so the check proves nothing")


def toolchain_missing() -> str | None:
    """Why this Python cannot compile for sm_90 (no NVIDIA backend, no ptxas), or None."""
    try:
        from triton.backends import backends

        if "nvidia" not in backends:
            return "Triton's NVIDIA backend is not installed"
        ptxas = triton.knobs.nvidia.ptxas.path
        subprocess.run([ptxas, "--version"], check=True, capture_output=True, timeout=60)
    except (ImportError, OSError, RuntimeError, subprocess.SubprocessError) as e:
        return f"ptxas for sm_{TARGET_ARCH} is unavailable: {e}"
    return None


def child_main(group: str) -> dict:
    """Entry point of the child process: returns {"skip": reason} or {"failures": [...]}."""
    missing = toolchain_missing()
    if missing:
        return {"skip": missing}
    import iris.mem.settings as env

    fails: list[str] = []
    report: dict = {"interpreted": env.interpreted(), "debug": env.debug()}
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(_rma_kernel, InterpretedFunction):
        return {"failures": ["kernels are interpreted in the child: TRITON_INTERPRET leaked in"]}
    debug = env.debug()
    if group == "barrier":
        _child_barrier(fails)
    elif group == "rma":
        _child_rma(fails, debug)
    elif group == "atomics":
        _child_atomics(fails, debug)
        _child_ptx_semantics(fails)
    elif group == "vector":
        _child_vector(fails, report)
    elif group == "debug":
        _child_barrier(fails, worlds=(4,))
        _child_rma(fails, debug)
        _child_atomics(fails, debug)
    else:
        fails.append(f"unknown group {group}")
    return {"failures": fails, "report": report}


# --------------------------------------------------------------------------- pytest side


def run_child(group: str, debug: bool = False, timeout: float = 240, module: str = "test_mem_compile"):
    """Run ``<module>.child_main(group)`` in a fresh compiling Python (a test module of this
    folder) and return its JSON result; skips when the NVIDIA toolchain is missing."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["IRIS_BACKEND"] = "cuda"
    env["IRIS_DEBUG"] = "1" if debug else "0"
    with tempfile.TemporaryDirectory(prefix="iris-compile-") as cache:
        env["TRITON_CACHE_DIR"] = cache  # compile for real, never from an earlier cache
        code = (
            "import json, sys\n"
            f"sys.path.insert(0, {HERE!r})\n"
            f"import {module} as m\n"
            f"print('@@RESULT@@' + json.dumps(m.child_main({group!r})))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, cwd=HERE
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@")]
    assert proc.returncode == 0 and lines, (
        f"compile child failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    result = json.loads(lines[-1][len("@@RESULT@@") :])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


def _assert_no_failures(result: dict) -> None:
    failures = result["failures"]
    assert failures == [], "\n".join(failures[:30])


def test_compile_device_barrier():
    """Release/acquire at system scope, a cubin, and the generation read by every thread
    before one thread stores the next (checked in the child)."""
    _assert_no_failures(run_child("barrier"))


def test_compile_rma_every_method_and_dtype():
    _assert_no_failures(run_child("rma"))


def test_compile_atomics_every_op_sem_scope():
    _assert_no_failures(run_child("atomics"))


def test_compile_hint_vectorises_remote_load():
    result = run_child("vector")
    _assert_no_failures(result)
    assert result["report"]["interpreted"] is False


def test_compile_with_iris_debug():
    result = run_child("debug", debug=True)
    assert result["report"]["debug"] is True
    _assert_no_failures(result)
