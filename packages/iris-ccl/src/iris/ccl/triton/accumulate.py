"""The accumulator of a reduction: conversions into and out of it, and AVG's division.

Reductions accumulate floating types in fp32 (``ACC_FP32``) and round once, when they store
the result in the element type. :func:`convert` is that conversion, written so that a
kernel gives the same bits compiled for a GPU and in Triton's interpreter (the ``cpu``
backend), the float8 types included:

* ``float8_e4m3fn`` / ``float8_e5m2`` -> fp32 is exact, NaN (and e5m2's infinities) kept;
* fp32 -> float8 rounds to nearest, ties to even, saturating to the format's finite range
  (``+-448`` for e4m3fn, ``+-57344`` for e5m2; infinities too), NaN staying NaN: what
  ``cvt.rn.satfinite`` does on NVIDIA GPUs, and ``x.clamp(-max, max).to(fp8)`` in torch;
* other conversions from or to float8 go through fp32 the same way.

Compiled, the conversions are the hardware's (``cvt.rn.f16x2.e4m3x2`` and
``cvt.rn.satfinite.e4m3x2.f32``, and the e5m2 forms). Triton's interpreter converts
float8 bit by bit and gets NaN, infinities and rounding wrong (it turns the NaN codes into
finite numbers and rounds half-way cases up, not to even); so every value is first rounded
to the float8 grid in fp32 here (with integer operations, which both run identically), the
conversion then being exact, and the special codes are set explicitly. On a GPU that costs
a few integer and fp32 operations per element, next to a reduction's loads.
"""

import triton
import triton.language as tl


@triton.jit
def convert(x, DTYPE: tl.constexpr):
    """``x`` as ``DTYPE``: ``x.to(DTYPE)``, but conversions from a float8 type go through
    fp32 exactly and conversions to one are rounded to nearest even with saturation, the
    same way compiled and interpreted (module docstring)."""
    if x.dtype == DTYPE:
        return x
    if x.dtype == tl.float8e4nv:
        x = _widen_fp8(x, 0x7F)  # e4m3fn: S.1111.111 is NaN, no infinities
    elif x.dtype == tl.float8e5:
        x = _widen_fp8(x, 0x7C)  # e5m2: S.11111.00 is infinity, S.11111.xx NaN
    if DTYPE == tl.float8e4nv:
        return _narrow_to_fp8(x.to(tl.float32), DTYPE, 3, -6, 448.0)
    elif DTYPE == tl.float8e5:
        return _narrow_to_fp8(x.to(tl.float32), DTYPE, 2, -14, 57344.0)
    else:
        return x.to(DTYPE)


@triton.jit
def average(acc, n):
    """AVG's division of the fp32 sum ``acc`` by the member count ``n``, rounded to nearest
    (IEEE division; a plain ``/`` compiles to an approximate division on NVIDIA GPUs, which
    could round a result differently from the interpreter)."""
    if acc.dtype == tl.float32:
        return tl.div_rn(acc, tl.full(acc.shape, n, tl.float32))
    else:
        return acc / n


@triton.jit
def _widen_fp8(x, SPECIAL: tl.constexpr):
    """float8 ``x`` as fp32. Codes whose magnitude bits are ``SPECIAL`` or above (NaN, and
    e5m2's infinity at ``SPECIAL`` itself) are rebuilt as fp32 infinity or quiet NaN with
    the same sign: the interpreter would give finite numbers for them."""
    wide = x.to(tl.float32)
    code = x.to(tl.uint8, bitcast=True).to(tl.int32)
    magnitude = code & 0x7F
    sign = (code & 0x80) << 24
    if SPECIAL == 0x7F:
        special = sign | 0x7FC00000  # a quiet NaN
    else:
        special = sign | tl.where(magnitude == SPECIAL, 0x7F800000, 0x7FC00000)  # infinity, quiet NaN
    return tl.where(magnitude >= SPECIAL, special.to(tl.float32, bitcast=True), wide)


@triton.jit
def _narrow_to_fp8(x, DTYPE: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, MAX: tl.constexpr):
    """fp32 ``x`` as the float8 type ``DTYPE`` (``MANTISSA`` stored bits, smallest normal
    ``2**MIN_EXP``, largest finite ``MAX``): saturated to ``+-MAX``, rounded to nearest even
    in fp32, then converted (exactly); NaN gives the NaN code ``0x7F``."""
    bits = x.to(tl.int32, bitcast=True)
    magnitude = tl.minimum(tl.abs(x), MAX)  # saturate (+-inf too); NaN is set at the end
    # Normal range: round the fp32 significand to MANTISSA bits, to nearest, ties to even,
    # on the bit pattern (a carry out of the significand moves into the exponent, as it must;
    # the pattern stays below MAX's, which is on the grid, so nothing reaches infinity).
    DROP: tl.constexpr = 23 - MANTISSA
    pattern = magnitude.to(tl.int32, bitcast=True)
    pattern = (pattern + ((1 << (DROP - 1)) - 1) + ((pattern >> DROP) & 1)) & -(1 << DROP)
    normal = pattern.to(tl.float32, bitcast=True)
    # Subnormal range (below 2**MIN_EXP): multiples of 2**(MIN_EXP - MANTISSA). Scaled by
    # its inverse (exact: a power of two) the value is below 2**MANTISSA, and adding then
    # subtracting 2**23 rounds it to an integer, to nearest even, in fp32 arithmetic.
    STEP: tl.constexpr = 2.0 ** (MIN_EXP - MANTISSA)
    subnormal = ((magnitude * (1.0 / STEP) + 8388608.0) - 8388608.0) * STEP
    rounded = tl.where(magnitude < 2.0**MIN_EXP, subnormal, normal)
    # the sign of x (-0.0 stays -0.0): its bit 31, kept by an arithmetic shift there and back
    signed = rounded.to(tl.int32, bitcast=True) | ((bits >> 31) << 31)
    code = signed.to(tl.float32, bitcast=True).to(DTYPE).to(tl.int8, bitcast=True)
    return tl.where(x != x, 0x7F, code).to(tl.int8).to(DTYPE, bitcast=True)
