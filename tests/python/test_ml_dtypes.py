"""concord's scalar codec (decode_ref / encode_ref) against ml_dtypes, the JAX/XLA codecs.

Reference: ml_dtypes (PyPI) for bfloat16, float8_e4m3fn, float8_e5m2, float6_e2m3fn,
float6_e3m2fn, float4_e2m1fn, float8_e8m0fnu and int4; NumPy itself for float16 and int8.
ml_dtypes has no UE4M3; it is checked against float8_e4m3fn on its domain (x >= 0).

What is compared, per format:
  decode  every code; fp32 results equal bit for bit, NaN codes decode to NaN of the same sign.
  encode  RNE with Overflow::ieee against ml_dtypes' astype() (ml_dtypes is IEEE-style: finite
          overflow goes to Inf, else NaN, else saturates) on: every code's value, every midpoint
          between neighbouring codes (the ties, including the overflow boundary half an ulp above
          max), each midpoint +-1 fp32 ulp, fp32 subnormals, +-0, +-Inf, NaN, and 2^21 random
          fp32 bit patterns per format.
  saturate  Overflow::saturate against ml_dtypes after clipping the input to [-max, max]: that
          is exactly what saturation means (finite overflow and +-Inf -> +-max, NaN stays NaN),
          so on every non-NaN input the codes must be identical.

Named, intended differences (each asserted below, not skipped):
  1. NaN into a format without NaN (e2m3, e3m2, e2m1): ml_dtypes returns the zero of the
     *opposite* sign (+NaN -> -0, code 0x20/0x20/0x8; -NaN -> +0). concord returns the zero
     with the NaN's own sign bit (+NaN -> +0), as rounding.h documents: the sign is carried
     through every conversion, and flipping it for NaN alone has no justification.
  2. NaN payloads into float16: NumPy's float32 -> float16 cast keeps the top 10 payload bits
     of the NaN; concord always produces the canonical quiet NaN 0x7E00 (sign kept). Both are
     NaN of the same sign; only the payload differs. concord canonicalizes because NaN payloads
     carry no meaning in ML tensors and a canonical code makes results comparable bitwise.
  3. UE4M3 (not in ml_dtypes): matches float8_e4m3fn for x >= 0 (codes 0x00-0x7F); negative
     inputs and codes with the sign bit set are NaN in concord (unsigned format; format.h).
  4. int8/int4 encode: NumPy/ml_dtypes integer casts truncate and wrap, which is not a
     quantizer; concord's integer encode is compared with np.clip(np.rint(x)) instead (RNE,
     saturating), and a NaN input gives 0 in concord (no NaN code).
"""

import ml_dtypes
import numpy as np
import pytest

from concord_capi import Format, Overflow, Rounding

RANDOM_PATTERNS = 1 << 21

# format -> (reference dtype, storage dtype for its raw bits)
FLOAT_FORMATS = {
    Format.bf16: (ml_dtypes.bfloat16, np.uint16),
    Format.fp16: (np.float16, np.uint16),
    Format.e4m3: (ml_dtypes.float8_e4m3fn, np.uint8),
    Format.e5m2: (ml_dtypes.float8_e5m2, np.uint8),
    Format.e2m3: (ml_dtypes.float6_e2m3fn, np.uint8),
    Format.e3m2: (ml_dtypes.float6_e3m2fn, np.uint8),
    Format.e2m1: (ml_dtypes.float4_e2m1fn, np.uint8),
    Format.e8m0: (ml_dtypes.float8_e8m0fnu, np.uint8),
}
NAN_FREE = {Format.e2m3, Format.e3m2, Format.e2m1}
INT_FORMATS = {Format.int8: (np.int8, -128, 127), Format.int4: (ml_dtypes.int4, -8, 7)}


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bits32(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def ml_encode(fmt, x):
    dtype, storage = FLOAT_FORMATS[fmt]
    with np.errstate(all="ignore"):
        return np.asarray(x, np.float32).astype(dtype).view(storage).astype(np.uint32)


def all_codes(capi, fmt):
    return np.arange(1 << capi.format_bits(fmt), dtype=np.uint32)


def finite_values(capi, fmt):
    """Sorted distinct finite values of the format (fp64), -0 and +0 folded into 0."""
    v = capi.decode(fmt, all_codes(capi, fmt)).astype(np.float64)
    return np.unique(v[np.isfinite(v)])


def ties(capi, fmt):
    """Midpoints between neighbouring positive values (fp32), including the one between 0 and
    the smallest value; the overflow boundary (half an ulp above max) is the last one."""
    values = finite_values(capi, fmt)
    top = values[-1]
    # The top binade is evenly spaced, except for e8m0 whose neighbours are powers of two.
    beyond = top * 2 if fmt == Format.e8m0 else top + (values[-1] - values[-2])
    positive = values[values > 0]
    neighbours = np.concatenate([[0.0], positive, [beyond]])
    mids = (neighbours[:-1] + neighbours[1:]) / 2  # exact in fp64
    mids32 = mids.astype(np.float32)
    assert np.array_equal(mids32.astype(np.float64), mids), "a midpoint is not an fp32 value"
    return mids32


def special_inputs(capi, fmt):
    """Every code's value, ties, tie +-1 ulp, subnormals, zeros, infinities, NaN; both signs."""
    values = finite_values(capi, fmt).astype(np.float32)
    mids = ties(capi, fmt)
    up = np.nextafter(mids, np.float32(np.inf))
    down = np.nextafter(mids, np.float32(0))
    rng = np.random.default_rng(1000 + int(fmt))
    fp32_subnormals = f32(rng.integers(1, 1 << 23, 4096, dtype=np.uint32))
    named = np.array([0.0, np.inf, np.nan, np.finfo(np.float32).max,
                      np.finfo(np.float32).tiny, np.float32(2.0) ** -149], np.float32)
    magnitudes = np.concatenate([values[values >= 0], mids, up, down, fp32_subnormals, named])
    return np.concatenate([magnitudes, -magnitudes])


def random_patterns(fmt):
    rng = np.random.default_rng(2000 + int(fmt))
    return f32(rng.integers(0, 1 << 32, RANDOM_PATTERNS, dtype=np.uint64).astype(np.uint32))


def assert_codes_equal(x, mine, ref, what):
    bad = np.flatnonzero(mine != ref)
    if bad.size:
        lines = [f"  x=0x{bits32(x[i]):08x} ({x[i]!r}) concord=0x{mine[i]:x} reference=0x{ref[i]:x}"
                 for i in bad[:12]]
        pytest.fail(f"{what}: {bad.size} of {x.size} codes differ\n" + "\n".join(lines))


def canonical_nan_fp16(x, codes):
    """Difference 2: replace NumPy's payload-keeping float16 NaN codes by concord's canonical
    quiet NaN of the same sign, after checking they are NaN codes."""
    nan_in = np.isnan(x)
    assert np.all((codes[nan_in] & 0x7C00) == 0x7C00) and np.all(codes[nan_in] & 0x3FF)
    out = codes.copy()
    out[nan_in] = (codes[nan_in] & 0x8000) | 0x7E00
    return out


def reference_ieee(fmt, x):
    ref = ml_encode(fmt, x)
    if fmt == Format.fp16:
        ref = canonical_nan_fp16(x, ref)
    return ref


@pytest.mark.parametrize("fmt", list(FLOAT_FORMATS), ids=lambda f: f.name)
def test_decode_every_code(capi, fmt):
    dtype, storage = FLOAT_FORMATS[fmt]
    codes = all_codes(capi, fmt)
    ref = codes.astype(storage).view(dtype).astype(np.float32)
    mine = capi.decode(fmt, codes)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(mine), nan), "NaN codes differ"
    assert np.array_equal(np.signbit(mine[nan]), np.signbit(ref[nan])), "NaN sign differs"
    assert np.array_equal(bits32(mine[~nan]), bits32(ref[~nan]))
    assert codes.size == 1 << capi.format_bits(fmt)


def test_decode_ue4m3_is_e4m3fn_without_sign(capi):
    codes = np.arange(256, dtype=np.uint32)
    mine = capi.decode(Format.ue4m3, codes)
    ref = codes[:128].astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(mine[:128]), nan) and nan.sum() == 1  # 0x7F
    assert np.array_equal(bits32(mine[:128][~nan]), bits32(ref[~nan]))
    assert np.all(np.isnan(mine[128:])), "difference 3: sign-bit codes are NaN in UE4M3"


@pytest.mark.parametrize("fmt", list(INT_FORMATS), ids=lambda f: f.name)
def test_decode_integers(capi, fmt):
    dtype, lo, hi = INT_FORMATS[fmt]
    codes = all_codes(capi, fmt)
    bits = capi.format_bits(fmt)
    signed = np.where(codes >= 1 << (bits - 1), codes.astype(np.int64) - (1 << bits), codes)
    ref = signed.astype(dtype).astype(np.float32)
    assert np.array_equal(capi.decode(fmt, codes), ref)
    assert ref.min() == lo and ref.max() == hi


@pytest.mark.parametrize("fmt", list(FLOAT_FORMATS), ids=lambda f: f.name)
def test_encode_rne_ieee_special_values(capi, fmt):
    x = special_inputs(capi, fmt)
    if fmt in NAN_FREE:
        x = x[~np.isnan(x)]  # difference 1, asserted in test_nan_into_formats_without_nan
    mine = capi.encode(fmt, x, Rounding.rne, Overflow.ieee)
    assert_codes_equal(x, mine, reference_ieee(fmt, x), f"{fmt.name} rne/ieee special values")
    # The ties are really in the set: each midpoint below the overflow boundary goes to the
    # even code, and one fp32 ulp either side leaves it. e8m0 (no mantissa bits) rounds the
    # integer significand 1.5 to 2, i.e. every tie goes to the larger power of two, in
    # ml_dtypes as in concord (gfloat differs: test_gfloat.py names it).
    mids = ties(capi, fmt)[:-1]
    at = capi.encode(fmt, mids, Rounding.rne, Overflow.ieee)
    if fmt == Format.e8m0:
        assert np.array_equal(at, np.arange(mids.size))  # 0x00 absorbs 2^-128 (no zero)
    else:
        assert np.all(at % 2 == 0)
    below = capi.encode(fmt, np.nextafter(mids, np.float32(0)), Rounding.rne, Overflow.ieee)
    above = capi.encode(fmt, np.nextafter(mids, np.float32(np.inf)), Rounding.rne, Overflow.ieee)
    straddles = above != below
    assert np.all(straddles[1:] if fmt == Format.e8m0 else straddles) and mids.size >= 7


@pytest.mark.parametrize("fmt", list(FLOAT_FORMATS), ids=lambda f: f.name)
def test_encode_rne_ieee_random_patterns(capi, fmt):
    x = random_patterns(fmt)
    if fmt in NAN_FREE:
        x = x[~np.isnan(x)]
    mine = capi.encode(fmt, x, Rounding.rne, Overflow.ieee)
    assert_codes_equal(x, mine, reference_ieee(fmt, x), f"{fmt.name} rne/ieee random patterns")


def clip_to_max(fmt, x, max_finite):
    """Saturation as ml_dtypes can express it: clip to [-max, max] first (NaN kept)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(x), x, np.clip(x, -max_finite, max_finite)).astype(np.float32)


@pytest.mark.parametrize("fmt", list(FLOAT_FORMATS), ids=lambda f: f.name)
def test_encode_rne_saturate_equals_clipped_reference(capi, fmt):
    x = np.concatenate([special_inputs(capi, fmt), random_patterns(fmt)[: RANDOM_PATTERNS // 2]])
    if fmt in NAN_FREE:
        x = x[~np.isnan(x)]
    max_finite = np.float32(finite_values(capi, fmt)[-1])
    mine = capi.encode(fmt, x, Rounding.rne, Overflow.saturate)
    ref = reference_ieee(fmt, clip_to_max(fmt, x, max_finite))
    assert_codes_equal(x, mine, ref, f"{fmt.name} rne/saturate vs clip + ml_dtypes")
    # Saturation really happened on this input set (the test could fail).
    overflowing = np.abs(x) > max_finite
    assert np.count_nonzero(overflowing) > 20


def test_nan_into_formats_without_nan(capi):
    """Difference 1: ml_dtypes flips the sign of NaN going into e2m3/e3m2/e2m1; concord keeps it."""
    nans = np.array([np.nan, -np.nan], np.float32)
    assert not np.signbit(nans[0]) and np.signbit(nans[1])
    for fmt in sorted(NAN_FREE):
        negative_zero = 1 << (capi.format_bits(fmt) - 1)
        assert list(ml_encode(fmt, nans)) == [negative_zero, 0], fmt.name
        for overflow in Overflow:
            assert list(capi.encode(fmt, nans, Rounding.rne, overflow)) == [0, negative_zero]


def test_fp16_nan_payload(capi):
    """Difference 2: NumPy keeps a NaN's payload going to float16, concord canonicalizes."""
    x = f32([0x7FC00000, 0xFFC00000, 0x7F812345, 0xFFA00001, 0x7F800001])
    numpy_codes = ml_encode(Format.fp16, x)
    assert list(numpy_codes) == [0x7E00, 0xFE00, 0x7C09, 0xFD00, 0x7C01]
    assert list(capi.encode(Format.fp16, x, Rounding.rne, Overflow.ieee)) == [
        0x7E00, 0xFE00, 0x7E00, 0xFE00, 0x7E00]


def test_encode_ue4m3_against_e4m3fn(capi):
    """Difference 3: UE4M3 = E4M3FN on x >= 0; negative inputs are NaN (0x7F)."""
    x = special_inputs(capi, Format.e4m3)
    x = np.concatenate([x, random_patterns(Format.ue4m3)])
    positive = (~np.signbit(x)) & ~np.isnan(x)
    for overflow in Overflow:
        mine = capi.encode(Format.ue4m3, x, Rounding.rne, overflow)
        xp = x[positive]
        if overflow == Overflow.saturate:
            xp = clip_to_max(Format.e4m3, xp, np.float32(448))
        assert_codes_equal(x[positive], mine[positive], ml_encode(Format.e4m3, xp),
                           f"ue4m3/{overflow.name} on x >= 0")
        negative = np.signbit(x) & (x != 0)
        assert np.all(mine[negative | np.isnan(x)] == 0x7F)
        assert np.all(mine[x == 0] == 0)


@pytest.mark.parametrize("fmt", list(INT_FORMATS), ids=lambda f: f.name)
def test_encode_integers_rne_saturating(capi, fmt):
    """Difference 4: compared with clip(rint(x)), since integer casts truncate and wrap."""
    _, lo, hi = INT_FORMATS[fmt]
    bits = capi.format_bits(fmt)
    halves = np.arange(2 * lo - 4, 2 * hi + 5, dtype=np.float32) / 2  # every tie, beyond range
    ties = np.concatenate([halves, np.nextafter(halves, np.float32(np.inf)),
                           np.nextafter(halves, np.float32(-np.inf))])
    x = np.concatenate([ties, random_patterns(fmt)[:1 << 18], np.float32([np.inf, -np.inf, 0, -0.0])])
    finite_or_inf = ~np.isnan(x)
    for overflow in Overflow:
        mine = capi.encode(fmt, x, Rounding.rne, overflow)
        xs = x[finite_or_inf]
        with np.errstate(invalid="ignore"):
            expected = np.clip(np.rint(xs.astype(np.float64)), lo, hi).astype(np.int64)
        expected_codes = (expected & ((1 << bits) - 1)).astype(np.uint32)
        assert_codes_equal(xs, mine[finite_or_inf], expected_codes, f"{fmt.name}/{overflow.name}")
        assert np.all(mine[np.isnan(x)] == 0)
        # Round trip through ml_dtypes' own integer type.
        dtype = INT_FORMATS[fmt][0]
        assert np.array_equal(capi.decode(fmt, mine[finite_or_inf]),
                              expected.astype(dtype).astype(np.float32))
