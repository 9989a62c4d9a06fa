"""float8 (``float8_e4m3fn``, ``float8_e5m2``) in every iris.ccl collective.

The contract (docs/collectives.md, "Float8"): the moving collectives copy the bytes, so
results are compared byte for byte; the reductions convert every rank's float8 input to
fp32, reduce in member (rank) order in fp32, divide AVG once, and round once to the format,
to nearest even, saturating to the finite range (infinities too), NaN staying NaN. The
reference here is exactly that, computed by each rank from every rank's input (the inputs
are a function of the rank, so each rank makes all of them): fp32 in rank order, then
``clamp(-max, max).to(fp8)`` (torch's rounding is to nearest even). Results must match it
bit for bit (NaN as NaN; MAX and MIN leave the sign of a zero result open).

The inputs hold what the contract is about: random values, sums that saturate, one rank's
NaN, e5m2 infinities (one rank's, and +inf against -inf), and elements whose e5m2 sum
depends on the order of the fp32 additions (``16384 + 2**-16 - 16384``): the variants that
add in rank order must get the rank-order result there; ``ring`` (ring order) and
``atomic``/``spinlock`` (arrival order) are documented not to, and are compared elsewhere
only (e4m3 sums of a few ranks are exact in fp32, so every variant matches everywhere).

Default tier: the conversion kernel on its own, a world of 3 with every variant at least
once per format (reductions and moves, plain and heap tensors), and a world of 2 with the
custom ops and ``auto`` choosing by bytes. ``full``: every variant x op x format x size at
worlds 1-4.
"""

import io
import json
import math

import pytest
import torch
import triton
import triton.language as tl
from ccl_testutils import device, dtype_name, require_world, setup_rank

from iris.ccl.triton import convert
from iris.mem.testing import run_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
OPS = ("SUM", "AVG", "MAX", "MIN")
ALL_REDUCE = (
    "ll",
    "boxed",
    "one_shot",
    "two_shot",
    "two_shot_push",
    "copy_engine",
    "ring",
    "atomic",
    "spinlock",
)
REDUCE_SCATTER = ("ll", "boxed", "push", "pull")
MOVES = ("ll", "boxed", "push", "pull", "copy_engine")
SUM_AVG_ONLY = ("atomic", "spinlock")
#: all_reduce variants whose fp32 additions are not in rank order (module docstring).
UNORDERED = ("ring", "atomic", "spinlock")
#: Variants that need the caller's tensors on a heap (else another variant runs).
HEAP_ONLY = ("copy_engine",)
#: Per rank, values whose e5m2 sum in fp32 depends on the order: in rank order
#: 16384 + 2**-16 rounds to 16384 and the sum is 0; another order keeps 2**-16.
ORDER_VALUES = {
    torch.float8_e4m3fn: (256.0, 2.0**-9, -256.0),
    torch.float8_e5m2: (16384.0, 2.0**-16, -16384.0),
}
WORLD_TIMEOUT = 500.0


# --------------------------------------------------------------------------- data and reference


def fp8_input(n: int, dtype: torch.dtype, rank: int, world: int, salt: int) -> torch.Tensor:
    """Rank ``rank``'s float8 input of ``n`` elements (module docstring), on the CPU."""
    g = torch.Generator().manual_seed(7919 * salt + 31 * rank + 1)
    big = torch.finfo(dtype).max
    x = torch.randn(n, generator=g) * 4
    i = torch.arange(n)
    x = torch.where(i % 7 == 1, 0.7 * big, x)  # sums of two or more saturate
    x = torch.where(i % 7 == 2, -0.7 * big, x)
    x = torch.where((i % 11 == 3) & ((i // 11) % world == rank), math.nan, x)  # one rank's NaN
    order = ORDER_VALUES[dtype]
    x = torch.where(i % 17 == 9, order[rank] if rank < len(order) else 0.0, x)
    if dtype == torch.float8_e5m2:
        x = torch.where((i % 13 == 5) & ((i // 13) % world == rank), math.inf, x)  # one rank's +inf
        x = torch.where((i % 13 == 6) & (rank == 0), math.inf, x)  # +inf and -inf: NaN
        x = torch.where((i % 13 == 6) & (rank == world - 1) & (world > 1), -math.inf, x)
    return x.to(dtype)


def order_positions(n: int) -> torch.Tensor:
    return torch.arange(n) % 17 == 9


def round_once(acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``acc`` rounded to ``dtype`` as the contract says."""
    big = torch.finfo(dtype).max
    return acc.clamp(-big, big).to(dtype)


def reduced(inputs: list[torch.Tensor], op: str, order=None) -> torch.Tensor:
    """The contract's result over ``inputs`` (float8, one per rank): fp32 in rank order
    (``order``: another order, for the negative control), rounded once."""
    order = range(len(inputs)) if order is None else order
    fold = {"MAX": torch.maximum, "MIN": torch.minimum}.get(op, torch.add)
    acc = None
    for r in order:
        x = inputs[r].float()
        acc = x if acc is None else fold(acc, x)
    if op == "AVG":
        acc = acc / len(inputs)
    return round_once(acc, inputs[0].dtype)


def bit_mismatches(got: torch.Tensor, want: torch.Tensor, op: str = "SUM", skip=None) -> str | None:
    """None when float8 ``got`` has ``want``'s bytes (NaN matching any NaN; MAX and MIN:
    either zero); else the first differences. ``skip``: positions not compared."""
    got, want = got.detach().cpu().reshape(-1), want.detach().cpu().reshape(-1)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype} {list(got.shape)} != {want.dtype} {list(want.shape)}"
    g, w = got.float(), want.float()
    same = (got.view(torch.uint8) == want.view(torch.uint8)) | (g.isnan() & w.isnan())
    if op in ("MAX", "MIN"):
        same |= (g == 0) & (w == 0)
    if skip is not None:
        same |= skip
    if bool(same.all()):
        return None
    idx = (~same).nonzero().reshape(-1)[:5]
    return (
        f"{int((~same).sum())} of {got.numel()} differ; at {idx.tolist()} got "
        f"{[hex(b) for b in got.view(torch.uint8)[idx].tolist()]} {g[idx].tolist()} want "
        f"{[hex(b) for b in want.view(torch.uint8)[idx].tolist()]} {w[idx].tolist()}"
    )


def bytes_differ(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when ``got`` holds exactly ``want``'s bytes (moved data)."""
    got, want = got.detach().cpu().contiguous(), want.detach().cpu().contiguous()
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype} {list(got.shape)} != {want.dtype} {list(want.shape)}"
    a, b = got.view(torch.uint8).reshape(-1), want.view(torch.uint8).reshape(-1)
    if torch.equal(a, b):
        return None
    first = (a != b).nonzero()[:3].reshape(-1).tolist()
    return f"{int((a != b).sum())} of {a.numel()} bytes differ, first at {first}"


# --------------------------------------------------------------------------- the conversion kernel


@triton.jit
def _convert_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, convert(tl.load(src + offs, mask=mask), dst.dtype.element_ty), mask=mask)


@triton.jit
def _plain_cast_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask).to(dst.dtype.element_ty), mask=mask)


def _launch(kernel, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    kernel[(triton.cdiv(src.numel(), 1024),)](src, dst, src.numel(), BLOCK=1024)
    return dst


def _hard_values(dtype: torch.dtype) -> torch.Tensor:
    """fp32 values that exercise the rounding: every finite float8 value, the midpoints
    between neighbours (ties) and the fp32 values next to them, values across every binade
    (subnormals included), beyond the finite range, infinities, NaN and signed zeros."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    grid = codes[codes.isfinite()].unique()
    mids = (grid[:-1].double() + grid[1:].double()).div(2).float()
    g = torch.Generator().manual_seed(5)
    spread = torch.randn(20000, generator=g) * torch.exp2(
        torch.randint(-24, 18, (20000,), generator=g).float()
    )
    big = torch.finfo(dtype).max
    special = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, big, -big, big * 1.05, 1e30, -1e-30, 1e-45]
    )
    up, down = mids.nextafter(torch.tensor(math.inf)), mids.nextafter(torch.tensor(-math.inf))
    return torch.cat([grid, mids, up, down, spread, special]).contiguous()


@pytest.mark.parametrize("dtype", FP8, ids=dtype_name)
def test_convert_rounds_like_the_contract(dtype):
    """``iris.ccl.triton.convert`` (interpreted here; compiled, the hardware's conversions:
    test_ccl_compile) widens every float8 code exactly and rounds fp32 to float8 to nearest
    even with saturation, bit for bit as torch's ``clamp(-max, max).to(fp8)``; float8 to
    the other format rounds the same way, to fp16/bf16 exactly. Negative control: Triton's
    own conversion in the interpreter gets NaN codes and ties wrong."""
    if device().type != "cpu":
        pytest.skip("the conversion is checked interpreted here (compiled: test_ccl_compile)")
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    wide = _launch(_convert_kernel, codes, torch.empty(256))
    want = codes.float()
    assert bool(((wide.view(torch.int32) == want.view(torch.int32)) | (wide.isnan() & want.isnan())).all())
    assert torch.equal(wide.isnan(), want.isnan()) and torch.equal(wide.signbit(), want.signbit())
    values = _hard_values(dtype)
    narrow = _launch(_convert_kernel, values, torch.empty(values.numel(), dtype=dtype))
    assert (m := bit_mismatches(narrow, round_once(values, dtype))) is None, m
    assert bool((narrow.float().isnan() == values.isnan()).all())
    plain = _launch(_plain_cast_kernel, values, torch.empty(values.numel(), dtype=dtype))
    assert bit_mismatches(plain, round_once(values, dtype)) is not None, "the negative control passed"
    # from float8 to the other format (rounded, saturating) and to the half types (exact)
    other = FP8[1 - FP8.index(dtype)]
    assert (
        m := bit_mismatches(
            _launch(_convert_kernel, codes, torch.empty(256, dtype=other)), round_once(want, other)
        )
    ) is None, m
    for half in (torch.float16, torch.bfloat16):
        got = _launch(_convert_kernel, codes, torch.empty(256, dtype=half)).float()
        assert bool(((got == want) | (got.isnan() & want.isnan())).all()), half


def test_rank_order_reference_is_order_sensitive_for_e5m2():
    """The order elements make the check able to fail: summed in another order their e5m2
    result differs from the rank-order one (for e4m3 the fp32 sums are exact in any order)."""
    for dtype, differs in ((torch.float8_e5m2, True), (torch.float8_e4m3fn, False)):
        inputs = [fp8_input(1001, dtype, r, 3, 1) for r in range(3)]
        other = reduced(inputs, "SUM", order=(0, 2, 1))
        found = bit_mismatches(other, reduced(inputs, "SUM"), skip=~order_positions(1001)) is not None
        assert found == differs, dtype


# --------------------------------------------------------------------------- the collectives (in ranks)


class Checker:
    """One rank's cases: the heap for in-place variants, the mismatches found, a count."""

    def __init__(self, rank: int, world: int, heap):
        self.rank, self.world, self.heap = rank, world, heap
        self.bad: list[str] = []
        self.cases = 0
        self.salt = 0

    def inputs(self, n: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Every rank's input of this case (the next salt)."""
        self.salt += 1
        return [fp8_input(n, dtype, r, self.world, self.salt) for r in range(self.world)]

    def tensor(self, x: torch.Tensor, on_heap: bool) -> torch.Tensor:
        """``x`` on this rank's device, on the heap (allocated now, freed with the heap) or not."""
        if not on_heap:
            return x.to(device())
        t = self.heap.empty(tuple(x.shape), dtype=x.dtype)
        t.copy_(x.to(device()))
        return t

    def report(self, what: str, problem: str | None) -> None:
        self.cases += 1
        if problem is not None:
            self.bad.append(f"world={self.world} {what}: {problem}")


def reduction_cases(c: Checker, collective: str, variant: str, dtype, ops, n: int, on_heap: bool) -> None:
    import iris.ccl as ccl

    w, me = c.world, c.rank
    cfg = ccl.Config(variant=variant) if collective != "reduce" else None
    on_heap = on_heap or variant in HEAP_ONLY
    for op in ops:
        what = f"{collective} {variant} {op} {dtype_name(dtype)} n={n}{' heap' if on_heap else ''}"
        skip = order_positions(n) if variant in UNORDERED and dtype == torch.float8_e5m2 else None
        if collective == "all_reduce":
            inputs = c.inputs(n, dtype)
            inp = c.tensor(inputs[me], on_heap)
            out = c.tensor(torch.full((n,), 7.0, dtype=dtype), on_heap)
            ccl.all_reduce(out, inp, op=op, config=cfg)
            c.report(what, bit_mismatches(out, reduced(inputs, op), op, skip))
            if not torch.equal(inp.cpu().view(torch.uint8), inputs[me].view(torch.uint8)):
                c.report(what, "the input was modified")
        elif collective == "reduce_scatter":
            inputs = c.inputs(w * n, dtype)
            out = c.tensor(torch.zeros(n, dtype=dtype), on_heap)
            ccl.reduce_scatter(out, c.tensor(inputs[me], on_heap), op=op, config=cfg)
            want = reduced(inputs, op)[me * n : (me + 1) * n]
            c.report(
                what, bit_mismatches(out, want, op, None if skip is None else skip[me * n : (me + 1) * n])
            )
        else:  # reduce, to a root that moves with the case
            inputs = c.inputs(n, dtype)
            root = c.salt % w
            out = c.tensor(torch.full((n,), 7.0, dtype=dtype), False)
            ccl.reduce(out, c.tensor(inputs[me], on_heap), root, op=op)
            want = reduced(inputs, op) if me == root else torch.full((n,), 7.0, dtype=dtype)
            c.report(what, bit_mismatches(out, want, op))


def in_place_case(c: Checker, variant: str, dtype, n: int) -> None:
    """all_reduce with ``out is inp`` on the heap (the variants' in-place paths)."""
    import iris.ccl as ccl

    inputs = c.inputs(n, dtype)
    t = c.tensor(inputs[c.rank], True)
    ccl.all_reduce(t, t, config=ccl.Config(variant=variant))
    skip = order_positions(n) if variant in UNORDERED and dtype == torch.float8_e5m2 else None
    c.report(
        f"all_reduce {variant} in place {dtype_name(dtype)} n={n}",
        bit_mismatches(t, reduced(inputs, "SUM"), "SUM", skip),
    )


def move_cases(c: Checker, collective: str, variant: str, dtype, n: int, on_heap: bool) -> None:
    """One call of a moving collective; the result compared byte for byte."""
    import iris.ccl as ccl

    w, me = c.world, c.rank
    cfg = ccl.Config(variant=variant)
    what = f"{collective} {variant} {dtype_name(dtype)} n={n}{' heap' if on_heap else ''}"
    if collective == "all_gather":
        inputs = c.inputs(n, dtype)
        out = c.tensor(torch.zeros(w * n, dtype=dtype), on_heap)
        ccl.all_gather(out, c.tensor(inputs[me], on_heap), config=cfg)
        c.report(what, bytes_differ(out, torch.cat(inputs)))
    elif collective == "all_to_all":
        inputs = c.inputs(w * n, dtype)
        out = c.tensor(torch.zeros(w * n, dtype=dtype), on_heap)
        ccl.all_to_all(out, c.tensor(inputs[me], on_heap), config=cfg)
        c.report(what, bytes_differ(out, torch.cat([x[me * n : (me + 1) * n] for x in inputs])))
    else:  # all_to_all with split sizes: rank r sends (r + j) % 3 + 1 rows of 3 to rank j
        rows = [[(r + j) % 3 + 1 for j in range(w)] for r in range(w)]
        inputs = [x.view(-1, 3) for x in c.inputs(3 * max(sum(r) for r in rows), dtype)]
        sent = [x[: sum(rows[r])] for r, x in enumerate(inputs)]
        received = [rows[r][me] for r in range(w)]
        out = c.tensor(torch.zeros(sum(received), 3, dtype=dtype), on_heap)
        ccl.all_to_all(out, c.tensor(sent[me], on_heap), received, rows[me], config=cfg)
        want = torch.cat([sent[r][sum(rows[r][:me]) : sum(rows[r][: me + 1])] for r in range(w)])
        c.report(f"uneven {what}", bytes_differ(out, want))


def rooted_moves(c: Checker, dtype, n: int) -> None:
    """broadcast, gather, scatter and send/recv around the ring, byte for byte."""
    import iris.ccl as ccl

    w, me = c.world, c.rank
    inputs = c.inputs(n, dtype)
    root = c.salt % w
    t = inputs[me].to(device()) if me == root else torch.zeros(n, dtype=dtype, device=device())
    ccl.broadcast(t, root)
    c.report(f"broadcast {dtype_name(dtype)} root={root}", bytes_differ(t, inputs[root]))
    out = torch.zeros(w * n, dtype=dtype, device=device()) if me == root else None
    ccl.gather(out, inputs[me].to(device()), root)
    if me == root:
        c.report(f"gather {dtype_name(dtype)} root={root}", bytes_differ(out, torch.cat(inputs)))
    big = c.inputs(w * n, dtype)
    out = torch.zeros(n, dtype=dtype, device=device())
    ccl.scatter(out, big[root].to(device()) if me == root else None, root)
    c.report(f"scatter {dtype_name(dtype)} root={root}", bytes_differ(out, big[root][me * n : (me + 1) * n]))
    if w > 1:
        nxt, prv = (me + 1) % w, (me - 1) % w
        got = torch.zeros(n, dtype=dtype, device=device())
        if me % 2 == 0:
            ccl.send(inputs[me].to(device()), nxt)
            ccl.recv(got, prv)
        else:
            ccl.recv(got, prv)
            ccl.send(inputs[me].to(device()), nxt)
        c.report(f"send/recv {dtype_name(dtype)}", bytes_differ(got, inputs[prv]))


def collectives_body(rank, world, full):
    """Default: every variant of every collective with each format (reductions: one op per
    variant and format, rotating; moves: each variant in one format, alternating), plain and
    heap tensors alternating; ``full``: every variant x op x format x size."""
    setup_rank()
    import iris.mem

    with iris.mem.init(1 << 24) as heap:
        c = Checker(rank, world, heap)
        sizes = (7, 2053) if full else (1001,)
        k = 0
        for dtype in FP8:
            for collective, names in (
                ("all_reduce", ALL_REDUCE),
                ("reduce_scatter", REDUCE_SCATTER),
                ("reduce", ("",)),
            ):
                for variant in names:
                    ops = [op for op in OPS if variant not in SUM_AVG_ONLY or op in ("SUM", "AVG")]
                    for n in sizes:
                        k += 1
                        chosen = ops if full else [ops[k % len(ops)]]
                        reduction_cases(c, collective, variant, dtype, chosen, n, on_heap=(k % 2 == 0))
            for variant in ("one_shot", "two_shot", "ring", "ll") if full else ("one_shot", "ring"):
                in_place_case(c, variant, dtype, 1001)
            rooted_moves(c, dtype, 1001 if full else 37)
        moves = [(m, v) for m in ("all_gather", "all_to_all", "uneven") for v in MOVES + ("auto",)]
        for j, (collective, variant) in enumerate(moves):
            for dtype in FP8 if full else (FP8[j % 2],):
                for n in sizes if full else ((1001, 7)[j // 2 % 2],):
                    k += 1
                    on_heap = k % 2 == 0 or variant in HEAP_ONLY
                    move_cases(c, collective, variant, dtype, n, on_heap)
        heap.barrier()
        return {"bad": c.bad, "cases": c.cases}


def _assert_clean(results, min_cases: int) -> None:
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    for r, res in enumerate(results):
        assert res["cases"] >= min_cases, f"rank {r} checked only {res['cases']} cases (< {min_cases})"


def test_fp8_collectives_match_the_contract():
    """A world of 3 (odd): every reduction variant with both formats, SUM and a rotating
    op, plain and heap tensors, in place; every moving variant; the rooted collectives and
    send/recv."""
    require_world(3)
    results = run_world(collectives_body, 3, False, timeout=WORLD_TIMEOUT)
    _assert_clean(results, min_cases=50)


@pytest.mark.full
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_fp8_collectives_every_combination(world_size):
    """Every variant x op x format x size (7, and 2053: three tiles of the interpreter), plain and
    heap tensors."""
    require_world(world_size)
    results = run_world(collectives_body, world_size, True, timeout=WORLD_TIMEOUT)
    _assert_clean(results, min_cases=290)


# --------------------------------------------------------------------------- custom ops and auto


def ops_and_auto_body(rank, world):
    """``torch.ops.iris`` functional and mutating ops on float8; ``auto`` choosing by the
    message's bytes (the table in IRIS_CCL_TABLE switches at 1024 bytes), seen in the log."""
    setup_rank()
    import iris.ccl as ccl
    from iris.mem import log

    bad: list[str] = []
    for dtype in FP8:
        inputs = [fp8_input(1001, dtype, r, world, 3) for r in range(world)]
        x = inputs[rank].to(device())
        if (
            m := bit_mismatches(torch.ops.iris.all_reduce(x, "sum", "", ""), reduced(inputs, "SUM"))
        ) is not None:
            bad.append(f"torch.ops.iris.all_reduce {dtype_name(dtype)}: {m}")
        out = torch.empty_like(x)
        torch.ops.iris.all_reduce_(out, x, "avg", "", "")
        if (m := bit_mismatches(out, reduced(inputs, "AVG"))) is not None:
            bad.append(f"torch.ops.iris.all_reduce_ avg {dtype_name(dtype)}: {m}")
        rs = torch.ops.iris.reduce_scatter(torch.cat([x] * world), "max", "", "")
        want = reduced([torch.cat([i] * world) for i in inputs], "MAX")[rank * 1001 : (rank + 1) * 1001]
        if (m := bit_mismatches(rs, want, "MAX")) is not None:
            bad.append(f"torch.ops.iris.reduce_scatter max {dtype_name(dtype)}: {m}")
        if (m := bytes_differ(torch.ops.iris.all_gather(x, "", ""), torch.cat(inputs))) is not None:
            bad.append(f"torch.ops.iris.all_gather {dtype_name(dtype)}: {m}")
        if (m := bytes_differ(torch.ops.iris.broadcast(x, 1, "", ""), inputs[1])) is not None:
            bad.append(f"torch.ops.iris.broadcast {dtype_name(dtype)}: {m}")
    stream = io.StringIO()
    log.configure("DEBUG", stream=stream)
    for dtype, n in ((torch.float8_e4m3fn, 1000), (torch.bfloat16, 1000), (torch.float8_e5m2, 2000)):
        x = torch.ones(n, dtype=dtype, device=device())
        ccl.all_reduce(x, x)
    log.configure("WARNING")
    return {"bad": bad, "log": stream.getvalue()}


def test_fp8_custom_ops_and_auto_by_bytes(tmp_path):
    """torch.ops.iris takes float8 (reductions rounded as the contract says, moves exact),
    and ``auto`` picks by bytes: 1000 float8 elements are 1000 bytes (the table's first
    rule), 1000 bf16 or 2000 float8 elements are not."""
    table = tmp_path / "table.json"
    rules = {"all_reduce": [[1024, "one_shot"], [None, "two_shot"]]}
    table.write_text(json.dumps({"world_sizes": {"2": rules}, "default": rules}))
    require_world(2)
    results = run_world(ops_and_auto_body, 2, timeout=WORLD_TIMEOUT, env={"IRIS_CCL_TABLE": str(table)})
    problems = [f"rank {r}: {m}" for r, res in enumerate(results) for m in res["bad"]]
    assert not problems, "\n".join(problems)
    for res in results:
        calls = [ln for ln in res["log"].splitlines() if "iris.ccl._host: all_reduce:" in ln]
        picked = [
            (ln.split("all_reduce: ")[1].split(" bytes")[0], ln.split("variant='")[1].split("'")[0])
            for ln in calls
        ]
        assert picked == [("1000", "one_shot"), ("2000", "two_shot"), ("2000", "two_shot")], picked
