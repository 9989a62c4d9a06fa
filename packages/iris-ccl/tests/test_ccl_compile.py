"""Every iris.ccl kernel compiles for NVIDIA Hopper (sm_90), without a GPU.

The CPU tier interprets the collectives' kernels and never lowers them. Here a fresh
Python (``IRIS_BACKEND=cuda``, no ``TRITON_INTERPRET``) imports every module under
``iris.ccl``, finds every module-level ``@triton.jit`` function whose name ends with
``_kernel``, builds a signature for it from its parameter names, and compiles it with
``triton.compile(ASTSource(...))`` for ``GPUTarget("cuda", 90, 32)`` (TTIR -> PTX -> ptxas
-> cubin) under a few profiles (dtype, group size, op, ...). Gluon kernels (``@gluon.jit``,
which never run without a GPU) go through ``GluonASTSource`` the same way, and their PTX is
checked for 16-byte vector stores and system-scope release/acquire flags.

Discovery is generic, so collectives added later are compiled too. A parameter name the
tables below do not know FAILS the test with the kernel and the names (add them to the
tables); no kernel is ever skipped silently.
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

from iris.mem.testing import unordered_counter_updates

pytestmark = pytest.mark.timeout(600)

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_ARCH = 90

# --------------------------------------------------------------------------- parameter tables

#: Leading arguments of every collective kernel (Communicator.kernel_args) and other
#: fixed-type pointers and scalars.
FIXED = {
    "context": "*i64",
    "heap_bases": "*i64",
    "members": "*i32",
    "flags": "*i32",
    "epochs": "*i32",
    "status": "*i64",
    "budget": "i64",
    "SIG": "i32",  # the call signature barriers and ll flags carry
    "locks": "*i32",
    "launches": "*i32",
    # point-to-point mailbox (bytes) and its per-tile counters
    "box": "*u8",
    "seq": "*i32",
    "ack": "*i32",
    "sent": "*i32",
    "received": "*i32",
}
#: Per-kernel types that differ from the tables (send/recv move raw bytes).
KERNEL_TYPES = {
    "iris.ccl.p2p._transfer_kernel": {"data": "*u8", "count": "*i32"},
    "iris.ccl._ll._ll_kernel": {"boxes": "*i64", "launches": "*i64"},
    # uneven all_to_all: the ll buffer's words and counter, the boxed counter, split tables
    "iris.ccl._uneven._uneven_kernel": {
        "boxes": "*i64", "launches": "*i64", "counter": "*i32", "user_context": "*i64", "table": "*i64",
        "row": "i64", "ll_limit": "i64",
    },
}  # fmt: skip
#: The float8 formats, as Triton names them in signatures, and as PTX names them.
FP8_FORMATS = {"fp8e4nv": "e4m3", "fp8e5": "e5m2"}
#: Kernels that reduce, each compiled for float8 too (one profile each, the formats and
#: ops alternating): the PTX must convert float8 to fp32 and back with the hardware's
#: conversions (see _check_fp8_conversions). The atomic all-reduce only widens (its fp32
#: accumulator is rounded on the host).
FP8_REDUCTIONS = {
    "iris.ccl.all_reduce._one_shot_kernel": {"dtype": "fp8e4nv", "OP": "sum"},
    "iris.ccl.all_reduce._two_shot_kernel": {"dtype": "fp8e5", "OP": "avg"},
    "iris.ccl.all_reduce._two_shot_push_kernel": {
        "dtype": "fp8e4nv", "OP": "max", "GROUP": 3, "ME": 2, "RANK": 3,
    },
    "iris.ccl.all_reduce._ring_kernel": {"dtype": "fp8e5", "OP": "sum", "GROUP": 3, "ME": 0, "RANK": 0},
    "iris.ccl.all_reduce._atomic_kernel": {"dtype": "fp8e5", "LOCKED": True},
    "iris.ccl._boxed._boxed_kernel": {"dtype": "fp8e5", "OP": "min"},
    "iris.ccl._ll._ll_kernel": {"dtype": "fp8e5", "OP": "avg", "GROUP": 3, "ME": 2, "RANK": 3},
    "iris.ccl._copy_engine._reduce_kernel": {"dtype": "fp8e4nv", "OP": "avg"},
    "iris.ccl.reduce_scatter._pull_kernel": {"dtype": "fp8e5", "OP": "max", "MODE": "reduce_scatter"},
    "iris.ccl.reduce_scatter._push_kernel": {"dtype": "fp8e4nv", "OP": "sum", "MODE": "reduce_scatter"},
    "iris.ccl._rooted._rooted_kernel": {"dtype": "fp8e4nv", "KIND": "reduce", "OP": "min"},
}  # fmt: skip
#: Kernels compiled for more element types than the profiles' (profile 0 with these
#: changes): ll packs elements of 1, 2, 4 and 8 bytes into words, in every mode (float8
#: reduced in FP8_REDUCTIONS).
EXTRA_PROFILES = {
    "iris.ccl._ll._ll_kernel": (
        {"dtype": "fp16"}, {"dtype": "i64"}, {"dtype": "fp8e4nv", "MODE": "all_gather"},
        {"dtype": "i64", "MODE": "reduce_scatter"}, {"dtype": "fp8e4nv", "MODE": "all_to_all"},
        {"dtype": "fp32", "GROUP": 3, "ME": 2, "RANK": 3, "OP": "max"},
    ),
    # the rooted collectives' kernel: the tile collective the profiles do not pick
    "iris.ccl._rooted._rooted_kernel": (
        {"KIND": "gather"}, {"dtype": "i64", "KIND": "reduce", "OP": "min", "ACC_FP32": False},
    ),
    # uneven all_to_all: direct pull with aligned remote loads, the rounds path, elements of
    # 1, 2 and 8 bytes in the ll words
    "iris.ccl._uneven._uneven_kernel": (
        {"PUSH": False}, {"DIRECT": False, "dtype": "i64"}, {"dtype": "fp8e4nv", "LL_BLOCK": 1024},
        {"dtype": "fp16", "GROUP": 3, "ME": 2, "RANK": 3, "PUSH": False, "DIRECT": False},
    ),
}  # fmt: skip
#: Pointers to the collective's data: the profile's dtype.
DATA_POINTERS = {
    "src", "dst", "inp", "out", "buf", "tmp", "scratch", "staging", "send", "recv", "ws", "boxes", "own",
    "slots",
}  # fmt: skip
#: Pointers to accumulators: fp32 for floating profiles, else the profile's dtype.
ACC_POINTERS = {"acc", "part"}
#: Runtime integer scalars.
SCALARS = {
    "n", "numel", "count", "length", "offset", "start", "stride", "root", "peer", "nbytes",
    "n_per_rank", "src_per_rank", "dst_per_rank", "box_stride", "src_stride", "dst_stride", "chunk",
    "slot",
}  # fmt: skip
#: Profiles: the dtype of data pointers and the value of every known constexpr. GROUP is
#: 2 or 3 (ME < GROUP, RANK < WORLD); roots are valid member indices.
PROFILES = [
    {
        "dtype": "fp32",
        "RANK": 1, "WORLD": 4, "GROUP": 2, "ME": 1, "BLOCK": 1024, "OP": "sum", "ACC_FP32": True,
        "LOCKED": False, "ROOT": 1, "SRC": 0, "DST": 1,
        "HINT": 16, "ALIASED": False, "MODE": "all_reduce", "PDL": True, "KIND": "broadcast",
        "PUSH": True, "SEND": True, "LL_BLOCK": 256, "DIRECT": True,
    },
    {
        "dtype": "bf16",
        "RANK": 3, "WORLD": 4, "GROUP": 3, "ME": 2, "BLOCK": 512, "OP": "avg", "ACC_FP32": True,
        "LOCKED": True, "ROOT": 2, "SRC": 1, "DST": 0,
        "HINT": None, "ALIASED": True, "MODE": "all_to_all", "PDL": False, "KIND": "reduce",
        "PUSH": False, "SEND": False, "LL_BLOCK": 512, "DIRECT": True,
    },
    {
        "dtype": "fp32",
        "RANK": 0, "WORLD": 3, "GROUP": 3, "ME": 0, "BLOCK": 256, "OP": "max", "ACC_FP32": True,
        "LOCKED": True, "ROOT": 0, "SRC": 2, "DST": 2,
        "HINT": 16, "ALIASED": False, "MODE": "reduce_scatter", "PDL": True, "KIND": "scatter",
        "PUSH": True, "SEND": False, "LL_BLOCK": 1024, "DIRECT": False,
    },
]  # fmt: skip
ALIGNED = [["tt.divisibility", 16]]


@triton.jit
def _unmappable_kernel(context, members, mystery_ptr, n, RANK: tl.constexpr, SECRET: tl.constexpr):
    """Negative control of the parameter tables: two names no table knows."""
    tl.store(mystery_ptr + n, RANK + SECRET)


# --------------------------------------------------------------------------- child side


def signature_for(
    fn, profile: dict, overrides: dict | None = None
) -> tuple[dict, dict, list[str], list[str]]:
    """(signature, constexprs, aligned pointer names, unknown parameter names) of ``fn``."""
    overrides = overrides or {}
    dtype = profile["dtype"]
    acc = "fp32" if dtype in ("fp32", "fp16", "bf16", *FP8_FORMATS) else dtype
    sig: dict = {}
    constexprs: dict = {}
    aligned: list[str] = []
    unknown: list[str] = []
    for p in fn.params:
        name = p.name
        if p.is_constexpr:
            sig[name] = "constexpr"
            if name in profile and name != "dtype":
                constexprs[name] = profile[name]
            elif p.has_default:
                constexprs[name] = p.default
            else:
                unknown.append(name)
        elif name in overrides:
            sig[name] = overrides[name]
        elif name in FIXED:
            sig[name] = FIXED[name]
        elif name in DATA_POINTERS:
            sig[name] = "*" + dtype
        elif name in ACC_POINTERS:
            sig[name] = "*" + acc
        elif name in SCALARS:
            sig[name] = "i32"
        else:
            unknown.append(name)
        if sig.get(name, "").startswith("*"):
            aligned.append(name)
    return sig, constexprs, aligned, unknown


def discover() -> tuple[list[tuple[str, object]], list[str]]:
    """(qualified name, JITFunction) of every module-level ``*_kernel`` under iris.ccl, and
    the modules that failed to import."""
    import importlib
    import pkgutil
    import traceback

    from triton.runtime.jit import JITFunction

    import iris.ccl

    kernels: dict[str, object] = {}
    errors: list[str] = []
    names = ["iris.ccl"] + [
        m.name for m in pkgutil.walk_packages(iris.ccl.__path__, "iris.ccl.", onerror=errors.append)
    ]
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported as a failure
            errors.append(f"import {name} failed:\n{traceback.format_exc()[-1500:]}")
            continue
        for attr, obj in vars(module).items():
            if isinstance(obj, JITFunction) and attr.endswith("_kernel"):
                # the wrapped function's module: a Gluon JITFunction's own __module__ is
                # Triton's runtime module in Triton 3.9
                home = getattr(obj.fn, "__module__", None) or name
                kernels.setdefault(f"{home}.{obj.fn.__name__}", obj)
    return sorted(kernels.items()), errors


def _compile(fn, sig: dict, constexprs: dict, aligned: list[str]):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(fn.arg_names)
    attrs = {(names.index(a),): ALIGNED for a in aligned}
    src = (GluonASTSource if fn.is_gluon() else ASTSource)(fn, sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", TARGET_ARCH, 32))


def _atoms(ptx: str) -> list[str]:
    # atom.* returns the old value; newer Triton emits red.* when the result is unused.
    return [ln.strip() for ln in ptx.splitlines() if re.search(r"\b(atom|red)\.", ln)]


def _acquires(ptx: str) -> list[str]:
    """Acquire atomics and loads (Triton lowers ``atomic_add(p, 0, sem="acquire")`` to
    ``ld.global.sys.acquire``, which is as good)."""
    return [
        ln.strip() for ln in ptx.splitlines() if re.search(r"\b(atom|ld)\.global\.", ln) and ".acquire" in ln
    ]


def _check_sys_ordering(ptx: str) -> list[str]:
    """Problems with the cross-GPU flag accesses of a collective kernel's PTX."""
    problems = []
    atoms = _atoms(ptx)
    if not any(".release" in a and ".sys" in a for a in atoms):
        problems.append(f"no release atomic at .sys scope: {sorted(set(atoms))[:6]}")
    if not any(".sys" in a for a in _acquires(ptx)):
        problems.append(f"no acquire atomic or load at .sys scope: {sorted(set(_acquires(ptx)))[:6]}")
    return problems


def _thread_bytes(profile: dict, num_warps: int = 4) -> int:
    """Bytes of a BLOCK tile per thread (triton.compile's default of 4 warps): a Gluon
    kernel can give each thread a 16-byte vector only when the tile holds that many."""
    itemsize = {"fp32": 4, "bf16": 2, "fp16": 2, "int32": 4}[profile["dtype"]]
    return profile["BLOCK"] * itemsize // (32 * num_warps)


def _check_vector_stores(ptx: str) -> list[str]:
    """Problems with a Gluon all-gather's data path: it must store 16-byte vectors."""
    stores = [ln.strip() for ln in ptx.splitlines() if re.search(r"\bst\.global\.", ln)]
    if not any(re.search(r"\.v4\.b32|\.v2\.b64", ln) for ln in stores):
        return [f"no 16-byte vector store (st.global.v4.b32 / .v2.b64): {sorted(set(stores))[:6]}"]
    return []


def _check_pdl(ptx: str) -> list[str]:
    """Problems with a kernel compiled for programmatic dependent launch: it must wait for
    the previous launch (griddepcontrol.wait) before its first memory access, and let the
    next one start (griddepcontrol.launch_dependents)."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    wait = next((i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait")), None)
    if wait is None or not any(ln.startswith("griddepcontrol.launch_dependents") for ln in lines):
        return ["PDL=True but no griddepcontrol.wait / launch_dependents"]
    memory = re.compile(r"(ld|st|atom|red)(?!\S*\.(param|shared)\b)\.")
    early = [ln for ln in lines[:wait] if memory.match(ln)]
    return [f"memory accesses before griddepcontrol.wait: {early[:3]}"] if early else []


def _check_ll(ptx: str) -> list[str]:
    """Problems with the ll kernel's PTX: its flagged words must cross the link as 16-byte
    stores (two 8-byte words, each data and flag together) and be polled with volatile
    loads, and nothing may wait on a barrier (no system-scope fence or acquire)."""
    problems = []
    stores = [ln.strip() for ln in ptx.splitlines() if re.search(r"\bst\.global\.", ln)]
    if not any(".v2.b64" in ln for ln in stores):
        problems.append(f"no 16-byte store of flagged words (st.global.v2.b64): {sorted(set(stores))[:6]}")
    if not re.search(r"\bld\.volatile\.global\.", ptx):
        problems.append("no volatile load polling the boxes")
    if re.search(r"fence\.(acq_rel|sc)\.sys|\.acquire", ptx):
        problems.append("a system-scope fence or acquire: ll must not wait on a barrier")
    return problems


def _check_uneven(ptx: str, profile: dict) -> list[str]:
    """Problems with the uneven all_to_all's PTX: with 16-byte aligned remote buffers
    (``HINT``) its whole bulk tiles must cross the link as 16-byte vectors (stores when it
    pushes, directly or in rounds; loads when it pulls directly), where a tile gives each
    thread that many bytes."""
    if profile.get("HINT") != 16 or profile["dtype"] not in ("fp32", "bf16", "fp16"):
        return []
    if _thread_bytes(profile) < 16:
        return []
    pulls = profile["DIRECT"] and not profile["PUSH"]
    wanted = r"\bld\.global\.v4\.b32" if pulls else r"\bst\.global\.v4\.b32"
    if not re.search(wanted, ptx):
        return [f"no 16-byte vector {'load' if pulls else 'store'} on the bulk path ({wanted})"]
    return []


def _check_fp8_conversions(ptx: str, dtype: str, narrows: bool = True) -> list[str]:
    """Problems with a float8 reduction kernel's PTX: it must widen float8 to fp32 with the
    hardware's conversion (``cvt.rn.f16x2.e4m3x2``, then to fp32) and, where it stores the
    result (``narrows``), round fp32 to float8 with the saturating one
    (``cvt.rn.satfinite.e4m3x2.f32``); the e5m2 forms for ``fp8e5``."""
    fmt = FP8_FORMATS[dtype]
    wanted = [rf"\bcvt\.rn\.f16x2\.{fmt}x2\b"] + (
        [rf"\bcvt\.rn\.satfinite\.{fmt}x2\.f32\b"] if narrows else []
    )
    return [f"no {w} (float8 {fmt} conversion)" for w in wanted if not re.search(w, ptx)]


def _conversions(ptx: str) -> list[str]:
    """The float8 conversion instructions of ``ptx`` (for the report)."""
    return sorted({m.group(0) for m in re.finditer(r"\bcvt\.\S*(e4m3|e5m2)\S*", ptx)})


def child_main() -> dict:
    """Entry point of the child: {"skip": reason} or {"failures", "kernels", "control"}."""
    try:
        from triton.backends import backends

        if "nvidia" not in backends:
            return {"skip": "Triton's NVIDIA backend is not installed"}
        ptxas = triton.knobs.nvidia.ptxas.path
        subprocess.run([ptxas, "--version"], check=True, capture_output=True, timeout=60)
    except (ImportError, OSError, RuntimeError, subprocess.SubprocessError) as e:
        return {"skip": f"ptxas for sm_{TARGET_ARCH} is unavailable: {e}"}
    from triton.runtime.jit import JITFunction

    failures: list[str] = []
    if not isinstance(_unmappable_kernel, JITFunction):
        return {
            "failures": [f"kernels are not compiled JITFunctions in the child: {type(_unmappable_kernel)}"]
        }
    kernels, errors = discover()
    failures += errors
    compiled: dict[str, int] = {}
    fp8: dict[str, list[str]] = {}
    for qualname, fn in kernels:
        unknown_all: set[str] = set()
        changes_list = EXTRA_PROFILES.get(qualname, ()) + (
            (dict(FP8_REDUCTIONS[qualname], FP8_REDUCTION=True),) if qualname in FP8_REDUCTIONS else ()
        )
        extra = [dict(PROFILES[0], **changes) for changes in changes_list]
        for i, profile in enumerate(PROFILES + extra):
            sig, constexprs, aligned, unknown = signature_for(fn, profile, KERNEL_TYPES.get(qualname))
            if unknown:
                unknown_all.update(unknown)
                continue
            what = (
                f"{qualname} profile {i} ({profile['dtype']}, GROUP={profile['GROUP']}, OP={profile['OP']})"
            )
            try:
                k = _compile(fn, sig, constexprs, aligned)
            except Exception as e:  # noqa: BLE001 - reported with the kernel
                failures.append(f"{what}: {type(e).__name__}: {e}"[:3000])
                continue
            if not k.asm.get("cubin"):
                failures.append(f"{what}: no cubin")
            if qualname.startswith("iris.ccl.all_reduce.") or fn.is_gluon():
                failures += [f"{what}: {p}" for p in _check_sys_ordering(k.asm["ptx"])]
            failures += [f"{what}: {p}" for p in unordered_counter_updates(k.asm["ptx"])]
            if qualname == "iris.ccl._ll._ll_kernel":
                failures += [f"{what}: {p}" for p in _check_ll(k.asm["ptx"])]
            if qualname == "iris.ccl._uneven._uneven_kernel":
                failures += [f"{what}: {p}" for p in _check_uneven(k.asm["ptx"], profile)]
            if profile.get("FP8_REDUCTION"):
                narrows = qualname != "iris.ccl.all_reduce._atomic_kernel"
                failures += [
                    f"{what}: {p}" for p in _check_fp8_conversions(k.asm["ptx"], profile["dtype"], narrows)
                ]
                fp8[qualname] = _conversions(k.asm["ptx"])
            if constexprs.get("PDL"):
                failures += [f"{what}: {p}" for p in _check_pdl(k.asm["ptx"])]
            if fn.is_gluon() and profile.get("HINT") == 16 and _thread_bytes(profile) >= 16:
                failures += [f"{what}: {p}" for p in _check_vector_stores(k.asm["ptx"])]
            compiled[qualname] = compiled.get(qualname, 0) + 1
        if unknown_all:
            failures.append(
                f"{qualname}: parameters {sorted(unknown_all)} are not in test_ccl_compile's tables "
                "(FIXED, KERNEL_TYPES, DATA_POINTERS, ACC_POINTERS, SCALARS, PROFILES): "
                "add them so the kernel is compiled"
            )
    control = sorted(signature_for(_unmappable_kernel, PROFILES[0])[3])
    return {
        "failures": failures,
        "kernels": [q for q, _ in kernels],
        "gluon": [q for q, fn in kernels if fn.is_gluon()],
        "compiled": compiled,
        "fp8": fp8,
        "control": control,
    }


# --------------------------------------------------------------------------- pytest side


def _run_child(timeout: float = 540) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["IRIS_BACKEND"] = "cuda"
    env.pop("IRIS_DEBUG", None)
    with tempfile.TemporaryDirectory(prefix="iris-ccl-compile-") as cache:
        env["TRITON_CACHE_DIR"] = cache  # compile for real, never from an earlier cache
        code = (
            "import json, sys\n"
            f"sys.path.insert(0, {HERE!r})\n"
            "import test_ccl_compile as m\n"
            "print('@@RESULT@@' + json.dumps(m.child_main()))\n"
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


_RESULT: dict = {}


def _result() -> dict:
    """One child per session: compiling every kernel is the slow part."""
    if not _RESULT:
        _RESULT.update(_run_child())
    return _RESULT


def test_every_ccl_kernel_compiles_for_hopper():
    result = _result()
    failures = result["failures"]
    assert failures == [], f"{len(failures)} failures:\n" + "\n\n".join(failures[:30])
    kernels = result["kernels"]
    for name in ("_one_shot_kernel", "_two_shot_kernel", "_ring_kernel", "_atomic_kernel"):
        assert f"iris.ccl.all_reduce.{name}" in kernels, f"{name} was not discovered; found {kernels}"
    assert "iris.ccl._ll._ll_kernel" in kernels, kernels
    for name in kernels:
        profiles = len(PROFILES) + len(EXTRA_PROFILES.get(name, ())) + (name in FP8_REDUCTIONS)
        assert result["compiled"].get(name) == profiles, (
            f"{name} compiled {result['compiled'].get(name)} times"
        )


def test_all_reduce_kernels_use_sys_scope_release_acquire():
    """Checked for every profile inside the child (see _check_sys_ordering); here: the
    all_reduce kernels were among those checked and none reported a problem."""
    result = _result()
    ordering = [f for f in result["failures"] if "scope" in f and "iris.ccl.all_reduce." in f]
    assert ordering == [], "\n".join(ordering)
    assert sum(1 for k in result["compiled"] if k.startswith("iris.ccl.all_reduce.")) >= 4


def test_gluon_all_gather_compiles_with_vector_stores_and_sys_flags():
    """The Gluon all-gather went through Gluon's pipeline for every profile, with 16-byte
    vector stores and release/acquire flags at system scope (checked in the child)."""
    result = _result()
    assert "iris.ccl.gluon.all_gather._push_kernel" in result["gluon"], result["gluon"]
    gluon = [f for f in result["failures"] if any(f.startswith(q) for q in result["gluon"])]
    assert gluon == [], "\n".join(gluon)


def test_vector_store_check_catches_scalar_stores():
    """Negative control of the vector check: scalar stores only fail it."""
    assert len(_check_vector_stores("@%p1 st.global.b32 [ %rd1 + 0 ], { %r1 };")) == 1
    assert _check_vector_stores("@%p1 st.global.v4.b32 [ %rd1 + 0 ], { %r1, %r2, %r3, %r4 };") == []


def test_ll_check_catches_narrow_stores_and_barriers():
    """Negative control of the ll check: 8-byte stores, no volatile poll, an acquire."""
    ptx = "st.global.b64 [%rd1], %rd2;\nld.global.sys.acquire.b32 %r3, [%rd2];"
    assert len(_check_ll(ptx)) == 3
    ptx = "st.global.v2.b64 [%rd1], {%rd2, %rd3};\nld.volatile.global.v2.b64 {%rd4, %rd5}, [%rd6];"
    assert _check_ll(ptx) == []


def test_pdl_check_catches_accesses_before_the_wait():
    """Negative control of the PDL check: a global load before griddepcontrol.wait, and a
    kernel without the wait; parameter and shared-memory accesses before it are fine."""
    wait = "griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n"
    assert _check_pdl("ld.global.b32 %r1, [%rd1];\n" + wait) != []
    assert _check_pdl("ld.param.b64 %rd1, [p];\nld.global.b32 %r1, [%rd1];") != []
    assert (
        _check_pdl(
            "ld.param.b64 %rd1, [p];\nst.shared.b32 [%r2], %r1;\n" + wait + "ld.global.b32 %r1, [%rd1];"
        )
        == []
    )


def test_sync_generations_are_read_before_they_are_stored():
    """Every kernel was scanned in the child for a counter read by all threads and rewritten
    by one without a CTA barrier between (the generation race of group_sync, which on
    H200 made some warps wait out IRIS_WAIT_TIMEOUT without recording it); negative
    control: the old order of group_sync is caught."""
    result = _result()
    racy = [f for f in result["failures"] if "no bar.sync between" in f]
    assert racy == [], "\n".join(racy)
    old = (
        "bar.sync 0;\nld.volatile.global.b32 { %r2 }, [ %rd2 + 0 ];\nadd.s32 %r3, %r2, 1;\n"
        "@%p15 st.global.b32 [ %rd2 + 0 ], { %r3 };"
    )
    assert len(unordered_counter_updates(old)) == 1
    fixed = old.replace("add.s32", "bar.sync 0;\nadd.s32")
    assert unordered_counter_updates(fixed) == []


def test_unknown_parameters_are_reported():
    """Negative control: a kernel with names the tables do not know is reported (by name),
    not skipped, so a new collective's kernel cannot escape this test."""
    assert _result()["control"] == ["SECRET", "mystery_ptr"]


def test_ptx_checks_catch_gpu_scope():
    """Negative control of the .sys checks: PTX with only gpu-scope/relaxed accesses fails."""
    ptx = "atom.global.gpu.acq_rel.max.s32 %r1, [%rd1], %r2;\nld.global.gpu.relaxed.b32 %r3, [%rd2];"
    assert len(_check_sys_ordering(ptx)) == 2
    ptx = "atom.global.sys.release.max.s32 %r1, [%rd1], %r2;\nld.global.sys.acquire.b32 %r3, [%rd2];"
    assert _check_sys_ordering(ptx) == []


def test_fp8_reductions_compile_with_hardware_conversions():
    """Every reducing kernel compiled for a float8 format (both formats among them) and its
    PTX converts with the hardware's instructions: float8 -> f16x2 -> fp32 on load and
    ``cvt.rn.satfinite`` (round to nearest even, saturating) on store (checked in the child)."""
    result = _result()
    fp8 = [f for f in result["failures"] if "float8" in f]
    assert fp8 == [], "\n".join(fp8)
    assert sorted(result["fp8"]) == sorted(FP8_REDUCTIONS), result["fp8"]
    seen = {c for conversions in result["fp8"].values() for c in conversions}
    for fmt in FP8_FORMATS.values():
        assert f"cvt.rn.satfinite.{fmt}x2.f32" in seen and f"cvt.rn.f16x2.{fmt}x2" in seen, sorted(seen)


def test_fp8_check_catches_missing_conversions():
    """Negative control of the float8 check: PTX that widens but stores without the
    saturating conversion (or converts the other format) fails it."""
    widen = "cvt.rn.f16x2.e4m3x2 %r1, %rs1;\ncvt.f32.f16 %r2, %rs2;\n"
    narrow = "cvt.rn.satfinite.e4m3x2.f32 %rs3, %r4, %r5;\n"
    assert _check_fp8_conversions(widen + narrow, "fp8e4nv") == []
    assert len(_check_fp8_conversions(widen, "fp8e4nv")) == 1
    assert _check_fp8_conversions(widen, "fp8e4nv", narrows=False) == []
    assert len(_check_fp8_conversions(widen + narrow, "fp8e5")) == 2
