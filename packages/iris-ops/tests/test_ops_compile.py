"""Every iris.ops kernel compiles for NVIDIA Hopper (sm_90), without a GPU, onto the fast path.

The CPU tier interprets the ops' kernels and never lowers them. Here a fresh Python
(``IRIS_BACKEND=cuda``, no ``TRITON_INTERPRET``) imports every module under ``iris.ops``,
finds every module-level ``@triton.jit`` function named ``*_kernel``, and compiles it with
``triton.compile(ASTSource(...))`` for ``GPUTarget("cuda", 90, 32)`` under the profiles the
config table picks on an H200 (bf16 prefill, fp16 decode, fp32 via tf32), with arguments
specialised the way a launch specialises them (unit strides become constants, other
integers and pointers 16-divisible). Each compiled kernel must use Hopper's tensor cores
(``wgmma``; with float8 operands, ``wgmma`` on e4m3/e5m2 operands), pipeline its K loop
(``cp.async`` into several shared-memory stages) and signal peers with release/acquire at
system scope.

The kernels of ``all_reduce_rmsnorm`` are not GEMMs: they compile under profiles of their
own (``NORM_PROFILES``: decode and prefill sizes, 2-4 ranks, rows in one piece or several,
with and without programmatic dependent launch) and must move their data in 16-byte
vectors, poll with volatile loads (``ll``) or signal with release/acquire at system scope
(``rs_ag``), and wait for the previous launch before touching memory under PDL.

A parameter name the tables below do not know fails the test, naming the kernel; no
kernel is skipped silently.
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
SMS = 132  # an H200's SMs, for the config table

FIXED = {
    "context": "*i64",
    "members": "*i32",
    "sync_flags": "*i32",
    "epochs": "*i32",
    "status": "*i64",
    "budget": "i64",
    "state": "*i32",
    "ready": "*i32",
    "exits": "*i32",
}
#: Data pointers: A's and B's dtype (the operands; ``ws`` holds A's shards in all_gather_matmul)
#: and the output's (``ws`` holds partial products in the reducing kernels).
OPERANDS = {"a": 0, "b": 1}
OUTPUTS = {"bias", "out", "stage"}
WS_OF_SHARDS = "iris.ops.all_gather_matmul._all_gather_matmul_kernel"
#: Float8 scales and the gathered row scales (fp32), and the scales' strides (0 for one scale,
#: so never assumed 16-divisible).
SCALE_POINTERS = {"scale_a", "scale_b", "scales"}
SCALE_STRIDES = {"stride_sa", "stride_sb"}
#: Integer arguments: sizes and strides a real launch passes as 16-divisible values.
SCALARS = {
    "M",
    "N",
    "K",
    "CM",
    "CN",
    "MS",
    "KS",
    "stride_am",
    "stride_bk",
    "stride_om",
    "out_chunk_step",
    "pushers",
}
#: Strides of contiguous operands: a launch specialises the value 1 into a constant.
UNIT_STRIDES = {"stride_ak", "stride_bn", "stride_on"}


def _flags(even_k: bool, bias: bool, split_n: bool, gather_k: bool, tma: bool = False) -> dict:
    return {"EVEN_K": even_k, "HAS_BIAS": bias, "SPLIT_N": split_n, "GATHER_K": gather_k, "TMA": tma}


def dtypes_of(profile_dtype: str) -> tuple[str, str, str]:
    """``(A's, B's, the output's)`` Triton dtype of a profile's dtype: ``"bf16"``, or float8
    operands and their output, ``"fp8e4nv->bf16"`` / ``"fp8e4nv*fp8e5->fp32"``."""
    operands, _, out = profile_dtype.partition("->")
    a, _, b = operands.partition("*")
    return a, b or a, out or a


_SCALED = {"SCALE_A": True, "SCALE_B": True}


#: Shared memory a program may use on sm_90 (227 KiB, with the opt-in Triton requests).
MAX_SHARED = 232448
#: Operands read through tensor descriptors when a profile turns TMA on: (name, block dims).
DESCRIPTORS = {"a_desc": ("block_m", "block_k"), "b_desc": ("block_k", "block_n")}
#: (name, dtype, rows, cols of the output tiles, flags[, wide]) per profile.
PROFILES = [
    ("bf16 prefill", "bf16", 8192, 8192, _flags(True, True, False, False)),
    (
        "fp16 decode",
        "fp16",
        64,
        8192,
        {**_flags(True, False, True, True), "ALL_REDUCE": False, "STREAM_OUT": False},
    ),
    ("fp32 tf32", "fp32", 1024, 4096, {**_flags(False, True, False, True), "SPREAD": True}),
    ("bf16 TMA", "bf16", 8192, 8192, {**_flags(False, False, True, False, tma=True), "STREAM": False}),
    ("bf16 decode gathered", "bf16", 16, 8192, {**_flags(True, True, False, False), "COMBINED": True}),
    # Up to 16 rows: 16-row tiles (mma.sync rather than wgmma), here read through TMA.
    ("bf16 decode TMA", "bf16", 1, 8192, _flags(False, False, True, False, tma=True)),
    # Few tiles per SM with wide=True (all_gather_matmul and the reduce ops): 128x256x64,
    # 4 stages, the largest shared-memory footprint of the table, with the partials streamed;
    # then the same in the "spread" tile order.
    ("bf16 TMA wide stream", "bf16", 512, 8192, _flags(False, False, True, False, tma=True), True),
    # matmul_reduce_scatter (exit flags instead of a start barrier).
    (
        "bf16 TMA wide",
        "bf16",
        512,
        8192,
        {
            **_flags(False, False, True, False, tma=True),
            "SPREAD": True,
            "ALL_REDUCE": False,
            "STREAM_OUT": False,
        },
        True,
    ),
    # Float8 operands with scales (row and column, or one of them), through TMA.
    ("e4m3 prefill", "fp8e4nv->bf16", 8192, 8192, {**_flags(True, True, False, False, tma=True), **_SCALED}),
    (
        "e4m3 x e5m2 decode",
        "fp8e4nv*fp8e5->fp32",
        1,
        8192,
        {
            **_flags(False, False, True, True, tma=True),
            "SCALE_A": True,
            "ALL_REDUCE": False,
            "STREAM_OUT": False,
        },
    ),
    (
        "e5m2 wide stream",
        "fp8e5->bf16",
        512,
        8192,
        {**_flags(False, True, True, False, tma=True), **_SCALED},
        True,
    ),
]
#: Profiles compiled for one kernel only, on top of PROFILES: all_gather_matmul reading the
#: gathered A through one tensor descriptor over its workspace, along K and in the decode
#: layout where the whole gathered A is one tile row (``COMBINED``).
KERNEL_PROFILES = {
    "iris.ops.all_gather_matmul._all_gather_matmul_kernel": [
        ("bf16 TMA along K", "bf16", 8192, 8192, _flags(True, False, False, True, tma=True), True),
        (
            "bf16 gathered TMA",
            "bf16",
            128,
            8192,
            {**_flags(True, True, False, False, tma=True), "COMBINED": True},
        ),
        # float8 shards and their row scales gathered: along K (each slice scaled), decode
        (
            "e4m3 TMA along K",
            "fp8e4nv->bf16",
            8192,
            8192,
            {**_flags(True, False, False, True, tma=True), **_SCALED},
        ),
        (
            "e5m2 gathered TMA",
            "fp8e5->fp32",
            64,
            8192,
            {**_flags(True, True, False, False, tma=True), "COMBINED": True, **_SCALED},
        ),
    ],
}
COMMON = {
    "RANK": 1,
    "WORLD": 2,
    "GROUP": 2,
    "ME": 1,
    "ALL_REDUCE": True,
    "ALIGNED": True,
    "WS_ALIGNED": True,
    "PUSH_K": 128,
    "STREAM": True,
    "STREAM_ROWS": 2,
    "STREAM_OUT": True,
    "STREAM_ALIGNED": True,
}


#: The MoE kernels (iris.ops._moe_kernels), compiled by test_ops_moe_compile.py.
MOE_PREFIX = "iris.ops._moe_kernels."
#: all_reduce_rmsnorm's kernels and the form each implements.
NORM_KERNELS = {
    "iris.ops._rmsnorm_kernels._ll_rmsnorm_kernel": "ll",
    "iris.ops._rmsnorm_kernels._rs_rmsnorm_kernel": "rs_ag",
}
#: Their parameters besides FIXED's: element pointers (the profile's dtype), other types.
NORM_DATA = {"inp", "residual", "weight", "out", "residual_out", "gout", "gres", "partials"}
NORM_TYPES = {
    "launches": "*i64", "boxes": "*i64", "rs_flags": "*i32", "ag_flags": "*i32", "eps": "fp32",
    "scales": "*fp32", "gscales": "*fp32",
}  # fmt: skip
#: The outputs a float8 profile writes in its float8 dtype (the others stay in the input's).
NORM_FP8_DATA = {"out", "gout"}
NORM_SCALARS = {
    "T", "H", "stride_i", "stride_r", "stride_o", "stride_ro", "row_lines", "box_stride", "share",
    "part_stride", "stride_go", "stride_gr",
}  # fmt: skip
#: (name, dtype, tokens, hidden, constexprs[, float8 out dtype]) per form; BLOCK and num_warps
#: come from the op's own choice for the size on an H200, SINGLE from whether a row fits in
#: BLOCK. ``QUANT``: 1 a static scale, 2 per-row scales (iris.ops._rmsnorm_kernels).
_NORM_ALL = {"HAS_RES": True, "HAS_RES_OUT": True, "PDL": True}
_THREE = {"GROUP": 3, "ME": 2, "RANK": 2, "WORLD": 3}
_FOUR = {"GROUP": 4, "ME": 3, "RANK": 3, "WORLD": 4}
_VIA_WORKSPACE = {"OUT_IN_PLACE": False, "RES_IN_PLACE": False}
NORM_PROFILES = {
    "ll": [
        ("bf16 decode", "bf16", 1, 8192, {**_NORM_ALL, "SPREAD": True}),
        (
            "fp16 3 ranks, two passes",
            "fp16",
            8,
            20000,
            {**_NORM_ALL, **_THREE, "SPREAD": False},
        ),
        ("fp32 4 ranks, no PDL", "fp32", 16, 4096, {**_NORM_ALL, **_FOUR, "SPREAD": True, "PDL": False}),
        ("bf16 -> e4m3, row scales", "bf16", 4, 8192, {**_NORM_ALL, "SPREAD": True, "QUANT": 2}, "fp8e4nv"),
        (
            "fp16 -> e5m2, static scale, two passes",
            "fp16",
            8,
            20000,
            {**_NORM_ALL, **_THREE, "SPREAD": False, "QUANT": 1},
            "fp8e5",
        ),
    ],
    "rs_ag": [
        ("bf16 prefill", "bf16", 8192, 8192, {**_NORM_ALL, "OUT_IN_PLACE": True, "RES_IN_PLACE": True}),
        ("fp16 3 ranks, two passes", "fp16", 1000, 20000, {**_NORM_ALL, **_THREE, **_VIA_WORKSPACE}),
        ("fp32 4 ranks, no PDL", "fp32", 4096, 4096, {**_NORM_ALL, **_FOUR, **_VIA_WORKSPACE, "PDL": False}),
        (
            "bf16 -> e4m3, per-row scales, two passes",
            "bf16",
            1000,
            20000,
            {**_NORM_ALL, **_THREE, **_VIA_WORKSPACE, "QUANT": 2},
            "fp8e4nv",
        ),
        (
            "bf16 -> e5m2, static scale",
            "bf16",
            8192,
            8192,
            {**_NORM_ALL, "OUT_IN_PLACE": True, "RES_IN_PLACE": True, "QUANT": 1},
            "fp8e5",
        ),
    ],
}


@triton.jit
def _unmappable_kernel(context, members, mystery_ptr, M, RANK: tl.constexpr, SECRET: tl.constexpr):
    """Negative control of the parameter tables: two names no table knows."""
    tl.store(mystery_ptr + M, RANK + SECRET)


# --------------------------------------------------------------------------- child side


def signature_for(fn, dtype: str, constexprs: dict, cfg=None, qualname: str = "") -> tuple:
    """(signature, constexpr values, 16-divisible argument names, unknown names) of ``fn``
    for a profile of ``dtype`` (see :func:`dtypes_of`); with ``constexprs["TMA"]``
    descriptors (blocks from ``cfg``) replace A and B pointers."""
    sig, values, divisible, unknown = {}, {}, [], []
    types = dtypes_of(dtype)
    tma = constexprs.get("TMA", False)
    constexprs = {**constexprs, "TMA_A": tma, "TMA_B": tma}
    for p in fn.params:
        name = p.name
        operand = types[0 if name == "a_desc" else 1]
        if name in DESCRIPTORS and tma:
            rows, cols = (getattr(cfg, f) for f in DESCRIPTORS[name])
            sig[name] = f"tensordesc<{operand}[{rows}, {cols}]>"
            continue
        if name in DESCRIPTORS:  # TMA off: the launcher passes the tensor itself
            sig[name] = "*" + operand
            divisible.append(name)
            continue
        if name in SCALE_STRIDES:
            sig[name] = "i32"
            continue
        if p.is_constexpr or name in UNIT_STRIDES:
            sig[name] = "constexpr"
            if name in UNIT_STRIDES:
                values[name] = 1
            elif name in constexprs:
                values[name] = constexprs[name]
            elif p.has_default:
                values[name] = p.default
            else:
                unknown.append(name)
            continue
        if name in FIXED:
            sig[name] = FIXED[name]
        elif name in OPERANDS or (name == "ws" and qualname == WS_OF_SHARDS):
            sig[name] = "*" + types[OPERANDS.get(name, 0)]
        elif name in OUTPUTS or name == "ws":
            sig[name] = "*" + types[2]
        elif name in SCALE_POINTERS:
            sig[name] = "*fp32"
        elif name in SCALARS:
            sig[name] = "i32"
        else:
            unknown.append(name)
            continue
        divisible.append(name)
    return sig, values, divisible, unknown


def discover() -> tuple[list[tuple[str, object]], list[str]]:
    """(qualified name, JITFunction) of every module-level ``*_kernel`` under iris.ops, and
    the import errors."""
    import importlib
    import pkgutil
    import traceback

    from triton.runtime.jit import JITFunction

    import iris.ops

    kernels, errors = {}, []
    names = ["iris.ops"] + [m.name for m in pkgutil.walk_packages(iris.ops.__path__, "iris.ops.")]
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported as a failure
            errors.append(f"import {name} failed:\n{traceback.format_exc()[-1500:]}")
            continue
        for attr, obj in vars(module).items():
            if isinstance(obj, JITFunction) and attr.endswith("_kernel"):
                kernels.setdefault(f"{obj.fn.__module__}.{obj.fn.__name__}", obj)
    return sorted(kernels.items()), errors


def ptx_problems(ptx: str, block_m: int = 64, fp8: bool = False) -> list[str]:
    """What keeps a compiled fused-op kernel off the fast path, from its PTX. Tiles of fewer
    than 64 rows (a warpgroup's MMA) run on ``mma.sync`` tensor-core instructions instead;
    float8 operands (``fp8``) must reach ``wgmma`` as e4m3/e5m2 (not converted to 16 bits)."""
    problems = []
    if block_m >= 64 and "wgmma.mma_async" not in ptx:
        problems.append("no wgmma.mma_async: the GEMM does not use Hopper's tensor cores")
    if fp8 and not re.search(r"\bwgmma\.mma_async\S*\.(e4m3|e5m2)\.(e4m3|e5m2)\b", ptx):
        problems.append(
            "no wgmma.mma_async on e4m3/e5m2 operands: the float8 GEMM is not on float8 tensor cores"
        )
    if block_m < 64 and "mma.sync.aligned" not in ptx:
        problems.append("no mma.sync: the GEMM does not use tensor cores")
    if "cp.async" not in ptx:
        problems.append("no cp.async: the K loop is not software-pipelined")
    atoms = [ln for ln in ptx.splitlines() if re.search(r"\b(atom|red)\.global\.", ln)]
    if not any(".sys" in a and ".release" in a for a in atoms):
        problems.append("no release atomic at system scope (peers would not see the data before the flag)")
    if not re.search(r"\bld\.global\.[a-z.]*sys[a-z.]*acquire|\batom\.global\.[a-z.]*sys[a-z.]*acquire", ptx):
        problems.append("no acquire load or atomic at system scope")
    scalar = len(re.findall(r"\b(st|ld)\.global(\.[a-z]+)*\.b16\b", ptx))
    if scalar > 4:  # a bias element or two may be loaded alone; whole tiles must move in vectors
        problems.append(f"{scalar} scalar 16-bit global accesses: a tile moves one element at a time")
    return problems + unordered_counter_updates(ptx)  # counters every thread reads in order


def descriptors_without_tma_loads(ptx: str, descriptors: list[str]) -> list[str]:
    """The names in ``descriptors`` (the kernel's tensor-descriptor parameters, in order)
    that no ``cp.async.bulk.tensor`` load reads: each descriptor parameter is a 128-byte
    ``.param`` whose address (``mov.b64``, ``cvta.param``) must reach a TMA load's operand."""
    params = re.findall(r"\.param\s+\.align\s+64\s+\.b8\s+(\w+)\[128\]", ptx)
    if len(params) != len(descriptors):
        return list(descriptors)  # not laid out as expected: none is shown to be read
    aliases = {p: {p} for p in params}
    for _ in range(2):  # mov.b64 %r, param; cvta.param.u64 %r2, %r
        for dst, src in re.findall(r"(?:mov\.b64|cvta\.param\.u64)\s+(%\w+),\s+(%?\w+);", ptx):
            for names in aliases.values():
                if src in names:
                    names.add(dst)
    used = set(re.findall(r"cp\.async\.bulk\.tensor\.[^\[]*\[[^\]]*\],\s*\[(%?\w+)", ptx))
    return [name for name, p in zip(descriptors, params) if not aliases[p] & used]


def norm_signature(fn, dtype: str, constexprs: dict, out_dtype: str | None = None) -> tuple:
    """(signature, constexpr values, 16-divisible argument names, unknown names) of one of
    all_reduce_rmsnorm's kernels (``out_dtype``: a float8 output's)."""
    sig, values, divisible, unknown = {}, {}, [], []
    for p in fn.params:
        name = p.name
        if p.is_constexpr:
            sig[name] = "constexpr"
            if name in constexprs:
                values[name] = constexprs[name]
            elif p.has_default:
                values[name] = p.default
            else:
                unknown.append(name)
            continue
        data = out_dtype if out_dtype and name in NORM_FP8_DATA else dtype
        sig[name] = (
            FIXED.get(name)
            or NORM_TYPES.get(name)
            or ("*" + data if name in NORM_DATA else "i32" if name in NORM_SCALARS else None)
        )
        if sig[name] is None:
            unknown.append(name)
        elif sig[name] != "fp32":
            divisible.append(name)
    return sig, values, divisible, unknown


def norm_ptx_problems(ptx: str, form: str, pdl: bool, fp8: str | None = None) -> list[str]:
    """What keeps a compiled all_reduce_rmsnorm kernel off its fast path, from its PTX; with
    ``fp8`` (Triton's float8 type of ``out``) also what makes its quantization wrong: no
    hardware conversion rounding to nearest with saturation, or an approximate division."""
    problems = []
    if fp8 is not None:
        fmt = {"fp8e4nv": "e4m3", "fp8e5": "e5m2"}[fp8]
        if not re.search(rf"\bcvt\.rn\.satfinite\.{fmt}x2\.f32\b", ptx):
            problems.append(f"no cvt.rn.satfinite.{fmt}x2.f32: out is not rounded to nearest with saturation")
        if not re.search(r"\bdiv\.rn\.f32\b", ptx):
            problems.append("no div.rn.f32: y / scale is not an IEEE division")
    stores = [ln.strip() for ln in ptx.splitlines() if re.search(r"\bst\.global\.", ln)]
    if form == "ll":
        if not any(".v2.b64" in ln for ln in stores):
            problems.append(
                f"no 16-byte store of flagged lines (st.global.v2.b64): {sorted(set(stores))[:6]}"
            )
        if not re.search(r"\bld\.volatile\.global\.", ptx):
            problems.append("no volatile load polling the boxes")
        if re.search(r"fence\.(acq_rel|sc)\.sys|\.acquire", ptx):
            problems.append("a system-scope fence or acquire: the ll form must not wait on a flag")
    else:
        atoms = [ln for ln in ptx.splitlines() if re.search(r"\b(atom|red)\.global\.", ln)]
        if not any(".sys" in a and ".release" in a for a in atoms):
            problems.append(
                "no release atomic at system scope (peers would not see the rows before the flag)"
            )
        if not re.search(
            r"\bld\.global\.[a-z.]*sys[a-z.]*acquire|\batom\.global\.[a-z.]*sys[a-z.]*acquire", ptx
        ):
            problems.append("no acquire load or atomic at system scope")
        if not any(re.search(r"\.v4\.b32|\.v2\.b64", ln) for ln in stores):
            problems.append(f"no 16-byte vector store of rows: {sorted(set(stores))[:6]}")
    scalar = len(re.findall(r"\b(st|ld)\.global(\.[a-z]+)*\.b16\b", ptx))
    if scalar:
        problems.append(f"{scalar} scalar 16-bit global accesses: rows move one element at a time")
    lines = [ln.strip() for ln in ptx.splitlines()]
    wait = next((i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait")), None)
    if pdl:
        if wait is None or not any(ln.startswith("griddepcontrol.launch_dependents") for ln in lines):
            problems.append("PDL=True but no griddepcontrol.wait / launch_dependents")
        else:
            memory = re.compile(r"(ld|st|atom|red)(?!\S*\.(param|shared)\b)\.")
            early = [ln for ln in lines[:wait] if memory.match(ln)]
            if early:
                problems.append(f"memory accesses before griddepcontrol.wait: {early[:3]}")
    return problems + unordered_counter_updates(ptx)


def compile_norm(qualname: str, fn) -> list[str]:
    """Compile one of all_reduce_rmsnorm's kernels under its form's profiles; the failures."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from iris.ops.all_reduce_rmsnorm import piece_elements, resolve

    form = NORM_KERNELS[qualname]
    failures = []
    for label, dtype, tokens, hidden, extra, *fp8 in NORM_PROFILES[form]:
        out_dtype = fp8[0] if fp8 else None
        itemsize = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
        cfg = resolve(None, tokens, hidden, itemsize, extra.get("GROUP", COMMON["GROUP"]), False)
        constexprs = {
            **COMMON, "HINT": 16, **extra, "BLOCK": cfg.block, "SINGLE": hidden <= cfg.block,
            "PIECE": piece_elements(cfg, itemsize),
        }  # fmt: skip
        sig, values, divisible, unknown = norm_signature(fn, dtype, constexprs, out_dtype)
        if unknown:
            return [f"{qualname}: parameters {unknown} are not in test_ops_compile's NORM_ tables"]
        names = list(fn.arg_names)
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in divisible}
        what = f"{qualname} ({label}, block {cfg.block}, {cfg.num_warps} warps)"
        if out_dtype:
            what = what[:-1] + f", out {out_dtype})"
        try:
            k = triton.compile(
                ASTSource(fn, sig, constexprs=values, attrs=attrs),
                target=GPUTarget("cuda", TARGET_ARCH, 32),
                options={"num_warps": cfg.num_warps},
            )
        except Exception as e:  # noqa: BLE001 - reported with the kernel
            failures.append(f"{what}: {type(e).__name__}: {e}"[:3000])
            continue
        if not k.asm.get("cubin"):
            failures.append(f"{what}: no cubin")
        problems = norm_ptx_problems(k.asm["ptx"], form, values.get("PDL", False), out_dtype)
        failures += [f"{what}: {p}" for p in problems]
        if k.metadata.shared > MAX_SHARED:
            failures.append(f"{what}: {k.metadata.shared} bytes of shared memory, over {MAX_SHARED}")
    return failures


def child_main() -> dict:
    """{"skip": reason} or {"failures", "kernels", "compiled", "control"}."""
    try:
        from triton.backends import backends

        if "nvidia" not in backends:
            return {"skip": "Triton's NVIDIA backend is not installed"}
        subprocess.run(
            [triton.knobs.nvidia.ptxas.path, "--version"], check=True, capture_output=True, timeout=60
        )
    except (ImportError, OSError, RuntimeError, subprocess.SubprocessError) as e:
        return {"skip": f"ptxas for sm_{TARGET_ARCH} is unavailable: {e}"}
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from iris.ops.config import select

    dtypes = {
        "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8e4nv": torch.float8_e4m3fn,
        "fp8e5": torch.float8_e5m2,
    }  # fmt: skip
    kernels, failures = discover()
    compiled: dict[str, int] = {}
    for qualname, fn in kernels:
        if qualname.startswith(MOE_PREFIX):
            continue  # not GEMMs: test_ops_moe_compile.py compiles them
        if qualname in NORM_KERNELS:
            failures += compile_norm(qualname, fn)
            compiled[qualname] = len(NORM_PROFILES[NORM_KERNELS[qualname]])
            continue
        for label, dtype, rows, cols, extra, *wide in PROFILES + KERNEL_PROFILES.get(qualname, []):
            a_type = dtypes_of(dtype)[0]
            cfg = select(rows, cols, dtypes[a_type], SMS, False, None, wide=bool(wide))
            constexprs = {
                **COMMON, **extra, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                "GROUP_M": cfg.group_m,
            }  # fmt: skip
            sig, values, divisible, unknown = signature_for(fn, dtype, constexprs, cfg, qualname)
            if unknown:
                failures.append(f"{qualname}: parameters {unknown} are not in test_ops_compile's tables")
                break
            names = list(fn.arg_names)
            attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in divisible}
            what = f"{qualname} ({label}, {cfg.block_m}x{cfg.block_n}x{cfg.block_k}, {cfg.num_warps} warps)"
            tma = extra["TMA"]
            try:
                k = triton.compile(
                    ASTSource(fn, sig, constexprs=values, attrs=attrs),
                    target=GPUTarget("cuda", TARGET_ARCH, 32),
                    options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                )
            except Exception as e:  # noqa: BLE001 - reported with the kernel
                failures.append(f"{what}: {type(e).__name__}: {e}"[:3000])
                continue
            if not k.asm.get("cubin"):
                failures.append(f"{what}: no cubin")
            fp8 = a_type.startswith("fp8")
            failures += [f"{what}: {p}" for p in ptx_problems(k.asm["ptx"], cfg.block_m, fp8)]
            if tma and "cp.async.bulk.tensor" not in k.asm["ptx"]:
                failures.append(f"{what}: no cp.async.bulk.tensor although operands are tensor descriptors")
            descriptors = [name for name, kind in sig.items() if kind.startswith("tensordesc")]
            for name in descriptors_without_tma_loads(k.asm["ptx"], descriptors):
                failures.append(f"{what}: {name} is a tensor descriptor but no cp.async.bulk.tensor reads it")
            itemsize = {"fp32": 4, "fp8e4nv": 1, "fp8e5": 1}.get(a_type, 2)
            stage = (cfg.block_m + cfg.block_n) * cfg.block_k * itemsize
            if k.metadata.shared < 2 * stage:
                failures.append(
                    f"{what}: {k.metadata.shared} bytes of shared memory, fewer than 2 stages of {stage}"
                )
            if k.metadata.shared > MAX_SHARED:  # compiles, but cannot launch on Hopper
                failures.append(f"{what}: {k.metadata.shared} bytes of shared memory, over {MAX_SHARED}")
            compiled[qualname] = compiled.get(qualname, 0) + 1
    control = sorted(signature_for(_unmappable_kernel, "fp32", COMMON)[3])
    return {
        "failures": failures,
        "kernels": [q for q, _ in kernels],
        "compiled": compiled,
        "control": control,
    }


# --------------------------------------------------------------------------- pytest side

_RESULT: dict = {}


def _result() -> dict:
    """One child per session: compiling every kernel is the slow part."""
    if _RESULT:
        return _RESULT
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_DEBUG")}
    env["IRIS_BACKEND"] = "cuda"
    with tempfile.TemporaryDirectory(prefix="iris-ops-compile-") as cache:
        env["TRITON_CACHE_DIR"] = cache  # compile for real, never from an earlier cache
        code = (
            f"import json, sys\nsys.path.insert(0, {HERE!r})\nimport test_ops_compile as m\n"
            "print('@@RESULT@@' + json.dumps(m.child_main()))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=540, cwd=HERE
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@")]
    assert proc.returncode == 0 and lines, f"compile child failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    _RESULT.update(json.loads(lines[-1][len("@@RESULT@@") :]))
    if "skip" in _RESULT:
        pytest.skip(_RESULT["skip"])
    return _RESULT


def test_every_ops_kernel_compiles_for_hopper_on_the_fast_path():
    result = _result()
    assert result["failures"] == [], f"{len(result['failures'])} failures:\n" + "\n\n".join(
        result["failures"]
    )
    for name in ("_matmul_reduce_kernel", "_matmul_all_gather_kernel", "_all_gather_matmul_kernel"):
        assert any(k.endswith("." + name) for k in result["kernels"]), (
            f"{name} not discovered: {result['kernels']}"
        )
    assert set(NORM_KERNELS) <= set(result["kernels"]), f"not discovered: {set(NORM_KERNELS)}"
    for name in result["kernels"]:
        if name.startswith(MOE_PREFIX):
            continue
        expected = (
            len(NORM_PROFILES[NORM_KERNELS[name]])
            if name in NORM_KERNELS
            else len(PROFILES) + len(KERNEL_PROFILES.get(name, []))
        )
        assert result["compiled"].get(name) == expected, (
            f"{name} compiled {result['compiled'].get(name)} times"
        )


def test_unknown_parameters_are_reported():
    """Negative control: a kernel with names the tables do not know is reported by name."""
    assert _result()["control"] == ["SECRET", "mystery_ptr"]


def test_ptx_checks_catch_a_slow_kernel():
    """Negative control of the PTX checks: FMA-only, unpipelined, gpu-scope PTX storing a
    tile one element at a time fails all five."""
    slow = [
        "fma.rn.f32 %f1, %f2, %f3;",
        "ld.global.b32 %r1, [%rd1];",
        "atom.global.gpu.acq_rel.max.s32 %r2, [%rd2], 1;",
    ] + ["st.global.b16 [%rd3], %rs1;"] * 8
    assert len(ptx_problems("\n".join(slow))) == 5
    assert len(ptx_problems("\n".join(slow), block_m=16)) == 5
    good = [
        "wgmma.mma_async.sync",
        "cp.async.cg.shared.global",
        "atom.global.sys.release.max",
        "ld.global.sys.acquire",
    ]
    assert ptx_problems("\n".join(good)) == []
    small = ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"] + good[1:]
    assert ptx_problems("\n".join(small), block_m=16) == []
    assert len(ptx_problems("\n".join(small))) == 1  # 64-row tiles must use wgmma
    # float8 operands converted to 16 bits before a bf16 wgmma: not on float8 tensor cores
    assert len(ptx_problems("\n".join(good), fp8=True)) == 1
    fp8 = ["wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2"] + good[1:]
    assert ptx_problems("\n".join(fp8), fp8=True) == []


def test_descriptor_check_catches_an_operand_read_with_pointers():
    """Negative control of the TMA check: of two descriptor parameters, the one whose address
    never reaches a ``cp.async.bulk.tensor`` is reported; both reaching one pass."""
    head = [
        ".param .align 64 .b8 k_param_13[128],",
        ".param .align 64 .b8 k_param_18[128],",
        "mov.b64 %rd41, k_param_18;",
        "cvta.param.u64 %rd156, %rd41;",
        "mov.b64 %rd42, k_param_13;",
        "cvta.param.u64 %rd155, %rd42;",
    ]
    load = "@%p1 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
    load += " [%r1], [{}, {{%r2, %r3}}], [%r4];"
    only_b = "\n".join(head + [load.format("%rd156")])
    assert descriptors_without_tma_loads(only_b, ["a_desc", "b_desc"]) == ["a_desc"]
    both = only_b + "\n" + load.format("%rd155")
    assert descriptors_without_tma_loads(both, ["a_desc", "b_desc"]) == []
    assert descriptors_without_tma_loads(both, ["b_desc"]) == ["b_desc"]  # a parameter unaccounted for


def test_norm_ptx_checks_catch_a_slow_kernel():
    """Negative control of all_reduce_rmsnorm's PTX checks: 8-byte unflagged stores, no
    polling and an acquire fail the ll form's; no system-scope release/acquire and scalar
    16-bit stores fail the rs_ag form's; memory touched before griddepcontrol.wait fails
    PDL's."""
    slow = [
        "ld.global.b64 %rd1, [%rd2];",
        "st.global.b64 [%rd3], %rd1;",
        "atom.global.gpu.acquire.add.u32 %r1, [%rd4], 0;",
    ]
    assert len(norm_ptx_problems("\n".join(slow), "ll", False)) == 3
    assert len(norm_ptx_problems("\n".join(slow + ["st.global.b16 [%rd5], %rs1;"]), "rs_ag", False)) == 4
    early = ["ld.global.b32 %r1, [%rd1];", "griddepcontrol.wait;", "griddepcontrol.launch_dependents;"]
    good_ll = ["st.global.v2.b64 [%rd1], {%rd2, %rd3};", "ld.volatile.global.b64 %rd4, [%rd5];"]
    assert norm_ptx_problems("\n".join(good_ll), "ll", False) == []
    assert len(norm_ptx_problems("\n".join(early + good_ll), "ll", True)) == 1
    # a float8 out without the saturating conversion or with an approximate division
    assert len(norm_ptx_problems("\n".join(good_ll), "ll", False, "fp8e4nv")) == 2
    quantized = good_ll + ["cvt.rn.satfinite.e4m3x2.f32 %rs1, %f2, %f1;", "div.rn.f32 %f3, %f4, %f5;"]
    assert norm_ptx_problems("\n".join(quantized), "ll", False, "fp8e4nv") == []
    assert len(norm_ptx_problems("\n".join(quantized), "ll", False, "fp8e5")) == 1
