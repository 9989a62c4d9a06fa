"""The MoE kernels (``iris.ops._moe_kernels``) compile for NVIDIA Hopper (sm_90) without a GPU.

A fresh Python (``IRIS_BACKEND=cuda``, no ``TRITON_INTERPRET``) compiles the dispatch, the
combine (also as the gradient of dispatch) and the gradient of combine with
``triton.compile(ASTSource(...))`` for ``GPUTarget("cuda", 90, 32)`` under DeepSeek-V3-like
profiles (256 experts, top-8, bf16 rows of 7168 at 2 ranks; fp32, 8 ranks, 64 experts; float8
rows with their scales; bf16 and fp32 rows quantized to e4m3 / e5m2 in the kernel) and checks
the PTX: rows leave as 16-byte vector stores, counters are raised with release atomics at
system scope and waited for with acquire, the counts are polled with volatile loads, and the
quantizing dispatch converts with ``cvt.rn.satfinite`` to the float8 format.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.timeout(600)
HERE = os.path.dirname(os.path.abspath(__file__))

FIXED = {
    "context": "*i64", "members": "*i32", "sync_flags": "*i32", "epochs": "*i32", "status": "*i64",
    "budget": "i64", "state": "*i32", "idx": "*i64", "positions": "*i32", "counts": "*i64",
    "offsets": "*i64", "origin": "*i32", "source": "*i64", "boxes": "*i64", "hist": "*i32", "ready": "*i32",
    "bad": "*i64", "arrive": "*i64", "meta": "*i64", "errors": "*i64", "weights": "*fp32", "enter": "*i64",
    "done": "*i64", "short": "*i32", "x_scales": "*fp32", "scales": "*fp32", "T": "i32", "H": "i32",
    "stride_x": "i32", "stride_s": "i32", "capacity": "i32", "n_out": "i32", "stride_e": "i32",
    "stride_y": "i32", "stride_g": "i32", "stride_o": "i32",
}  # fmt: skip
#: Row pointers: the profile's dtype (``rows``: the row dtype of the kernel's workspace).
DATA = {"x", "tokens", "expert_out", "y", "back", "grad_y", "rows", "out"}
STRIDES = ("H", "stride_x", "stride_s", "stride_e", "stride_y", "stride_g", "stride_o")
_DS = {"RANK": 1, "WORLD": 2, "GROUP": 2, "ME": 1, "E": 256, "K": 8, "EP": 256, "KP": 8, "BLOCK_S": 32}
_EIGHT = {"RANK": 5, "WORLD": 8, "GROUP": 8, "ME": 5, "E": 64, "K": 6, "EP": 64, "KP": 8, "BLOCK_S": 128}
_ROWS = {"SCALES": 0, "SP": 1, "QDTYPE": "fp8e4nv", "ACC": "fp32", "ENTER": False}
#: (label, kernel, row dtype, hidden, constexprs, pointer dtypes besides DATA's, what the PTX
#: must show): the first three run by default, the rest in ``tests_full``.
PROFILES = [
    ("bf16, 2 ranks, 256 experts, top-8", "_moe_dispatch_kernel", "bf16", 7168, {**_DS, **_ROWS}, {}, ()),
    ("bf16, 2 ranks, 256 experts, top-8", "_moe_combine_kernel", "bf16", 7168, {**_DS, **_ROWS}, {}, ()),
    (
        "bf16 quantized to e4m3 in the kernel",
        "_moe_dispatch_kernel",
        "u8",
        7168,
        {**_DS, **_ROWS, "SCALES": 2, "SP": 64},
        {"x": "*bf16"},
        ("cvt.rn.satfinite.e4m3x2.f32",),
    ),
    (
        "e4m3 rows with their scales",
        "_moe_dispatch_kernel",
        "u8",
        7168,
        {**_DS, **_ROWS, "SCALES": 1, "SP": 64},
        {},
        (),
    ),
    (
        "bf16 quantized to e5m2, 8 ranks",
        "_moe_dispatch_kernel",
        "u8",
        4096,
        {**_EIGHT, **_ROWS, "SCALES": 2, "SP": 32, "QDTYPE": "fp8e5"},
        {"x": "*fp32"},
        ("cvt.rn.satfinite.e5m2x2.f32",),
    ),
    ("fp32, 8 ranks, 64 experts, top-6", "_moe_dispatch_kernel", "fp32", 4096, {**_EIGHT, **_ROWS}, {}, ()),
    ("fp32, 8 ranks, 64 experts, top-6", "_moe_combine_kernel", "fp32", 4096, {**_EIGHT, **_ROWS}, {}, ()),
    (
        "gradient of dispatch, bf16",
        "_moe_combine_kernel",
        "bf16",
        7168,
        {**_DS, **_ROWS, "ENTER": True},
        {},
        (),
    ),
    ("gradient of combine, bf16", "_moe_scatter_kernel", "bf16", 7168, {**_DS, **_ROWS}, {}, ()),
]
#: Profiles compiled by default.
DEFAULT = 3


def _constexpr(value):
    """A profile's constexpr as Triton takes it (type names become Triton types)."""
    import triton.language as tl

    names = {"fp8e4nv": tl.float8e4nv, "fp8e5": tl.float8e5, "fp32": tl.float32}
    return names.get(value, value) if isinstance(value, str) else value


def child_main(count: int) -> dict:
    try:
        import triton
        from triton.backends import backends

        if "nvidia" not in backends:
            return {"skip": "Triton's NVIDIA backend is not installed"}
        subprocess.run(
            [triton.knobs.nvidia.ptxas.path, "--version"], check=True, capture_output=True, timeout=60
        )
    except (ImportError, OSError, RuntimeError, subprocess.SubprocessError) as e:
        return {"skip": f"ptxas for sm_90 is unavailable: {e}"}
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from iris.ops import _moe_kernels, moe

    failures, compiled = [], 0
    for label, name, dtype, hidden, extra, pointers, must in PROFILES[:count]:
        fn = getattr(_moe_kernels, name)
        cfg = moe.resolve(None, hidden, _Caps(), extra["SCALES"] == 2, 1 if dtype == "u8" else 2)
        constexprs = {k: _constexpr(v) for k, v in {**extra, "BLOCK_H": cfg.block, "HINT": 16}.items()}
        sig, values, divisible = {}, {}, []
        for p in fn.params:
            if p.is_constexpr:
                sig[p.name] = "constexpr"
                values[p.name] = constexprs[p.name] if p.name in constexprs else p.default
                continue
            sig[p.name] = (
                pointers.get(p.name) or FIXED.get(p.name) or ("*" + dtype if p.name in DATA else None)
            )
            if sig[p.name] is None:
                failures.append(f"{name}: parameter {p.name} unknown to test_ops_moe_compile")
                sig[p.name] = "i32"
            if sig[p.name].startswith("*") or p.name in STRIDES:
                divisible.append(p.name)
        names = list(fn.arg_names)
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in divisible}
        what = f"{name} ({label}, block {cfg.block}, {cfg.num_warps} warps)"
        try:
            k = triton.compile(
                ASTSource(fn, sig, constexprs=values, attrs=attrs),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": cfg.num_warps},
            )
        except Exception as e:  # noqa: BLE001 - reported
            failures.append(f"{what}: {type(e).__name__}: {e}"[:3000])
            continue
        failures += [f"{what}: {p}" for p in ptx_problems(k.asm["ptx"], name, extra["K"])]
        failures += [f"{what}: no {m} in the PTX" for m in must if m not in k.asm["ptx"]]
        compiled += 1
    return {"failures": failures, "compiled": compiled}


class _Caps:
    interpreted = False
    sm_count = 132
    resident_programs = 132


def ptx_problems(ptx: str, name: str, slots: int = 1) -> list[str]:
    """What keeps a MoE kernel of top-``slots`` routing off the fast path, from its PTX. Rows
    leave in 16-byte vectors: one store per slot that may carry a row plus the local copy
    (dispatch: the replicated rows; the gradient of combine: the rows copied out), at least
    the row sent back and the sum stored (combine)."""
    problems = []
    stores = [ln.strip() for ln in ptx.splitlines() if re.search(r"\bst\.global\.", ln)]
    vectors = sum(1 for ln in stores if re.search(r"\.v4\.(b32|f32)", ln))
    wanted = 2 if "combine" in name else slots + 1
    if vectors < wanted:
        problems.append(
            f"{vectors} 16-byte vector stores of rows, expected {wanted}: {sorted(set(stores))[:6]}"
        )
    atoms = [ln for ln in ptx.splitlines() if re.search(r"\b(atom|red)\.global\.", ln)]
    if not any(".sys" in a and ".release" in a for a in atoms):
        problems.append("no release atomic at system scope (peers would not see rows before the counter)")
    if not re.search(r"\bld\.global\.[a-z.]*sys[a-z.]*acquire|\batom\.global\.[a-z.]*sys[a-z.]*acquire", ptx):
        problems.append("no acquire load or atomic at system scope")
    if "dispatch" in name and not re.search(r"\bld\.volatile\.global\.", ptx):
        problems.append("no volatile load polling the counts")
    return problems


_RESULTS: dict = {}


def _result(count: int) -> dict:
    """Compile the first ``count`` profiles in a child (once per session and count)."""
    if count in _RESULTS:
        return _RESULTS[count]
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_DEBUG")}
    env["IRIS_BACKEND"] = "cuda"
    with tempfile.TemporaryDirectory(prefix="iris-moe-compile-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        code = (
            f"import json, sys\nsys.path.insert(0, {HERE!r})\nimport test_ops_moe_compile as m\n"
            f"print('@@RESULT@@' + json.dumps(m.child_main({count})))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=540, cwd=HERE
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@")]
    assert proc.returncode == 0 and lines, f"compile child failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    result = _RESULTS[count] = json.loads(lines[-1][len("@@RESULT@@") :])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


def test_moe_kernels_compile_for_hopper():
    """The DeepSeek-V3-like bf16 dispatch and combine, and the dispatch quantizing bf16 rows
    to e4m3 (the other profiles in ``tests_full``)."""
    result = _result(DEFAULT)
    assert result["failures"] == [], "\n\n".join(result["failures"])
    assert result["compiled"] == DEFAULT


@pytest.mark.full
def test_moe_kernels_compile_for_hopper_every_profile():
    result = _result(len(PROFILES))
    assert result["failures"] == [], "\n\n".join(result["failures"])
    assert result["compiled"] == len(PROFILES)


def test_ptx_checks_catch_a_slow_kernel():
    """Negative control: scalar stores, gpu-scope atomics and no polling fail every check."""
    slow = ["st.global.b16 [%rd3], %rs1;", "atom.global.gpu.acq_rel.add.s64 %rd1, [%rd2], 1;"]
    assert len(ptx_problems("\n".join(slow), "_moe_dispatch_kernel")) == 4
    # 8-byte row stores (float8 rows with too many threads per block) fail the row check
    half = ["st.global.v2.b32 [%rd1], {%r1, %r2};"] * 9 + ["st.global.v4.b32 [%rd2], {%r1, %r2, %r3, %r4};"]
    assert any("16-byte" in p for p in ptx_problems("\n".join(half), "_moe_dispatch_kernel", 8))
