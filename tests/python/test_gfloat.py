"""concord's rounding modes against gfloat (Graphcore's reference rounding library).

concord's stochastic rounding is *defined* as gfloat's RoundMode.Stochastic with srnumbits=32
(rounding.h): the discarded fraction is rounded (RNE) to 32 bits, D, and the value rounds away
from zero iff D + word >= 2^32. So with the same 32-bit word the two must agree bit for bit.

What is compared:
  1. SR, explicit words: for bf16, fp16, e4m3, e5m2, e2m3, e3m2, e2m1 and e8m0, 2^17 inputs per
     format (random fp32 patterns in and beyond the format's range, every code's value and
     points between codes) each with a random word, plus the two words at each input's
     threshold (2^32 - D - 1 rounds toward zero, 2^32 - D away), against gfloat.round_ndarray,
     and 2000 of them against the scalar gfloat.round_float; both with sat=True
     (Overflow::saturate) and, where the format has Inf or NaN, sat=False (Overflow::ieee).
  2. RNE (TiesToEven) and RTZ (TowardZero) on the same inputs.
  3. Statistics: with concord's own Philox words (seed fixed), the frequency of rounding away
     over N = 2^16 elements, for each of 64 inputs per format, must match gfloat's probability
     D/2^32 (D found from gfloat itself by bisection on srbits). Bound: Hoeffding,
     P(|k/N - p| >= t) <= 2 exp(-2 N t^2); with t = 0.0135 that is < 1e-10 per input, so over
     the 512 checks the false-failure probability is < 1e-7.

Named, intended differences (asserted):
  a. e8m0 RNE ties: a value exactly between 2^k and 2^(k+1) (1.5 * 2^k). gfloat goes to the
     power of two with the even *code* (it treats the exponent's parity as the "mantissa"
     parity); concord, like ml_dtypes, rounds the significand 1.5 to the even integer 2, i.e.
     always to 2^(k+1). Only exact ties differ; they are compared separately below.
  b. e8m0 range: gfloat has no underflow or sign handling for e8m0 (it would return values
     below 2^-127 or negative ones); inputs are limited to [2^-127, 2^127] there. (concord's
     e8m0 rules: 0 and negatives are NaN, below 2^-127 -> 2^-127; test_ml_dtypes checks them.)
  c. NaN inputs to formats without NaN: gfloat raises; not compared here.
"""

import gfloat
import numpy as np
import pytest
from gfloat import RoundMode
from gfloat.formats import (format_info_bfloat16, format_info_binary16, format_info_ocp_e2m1,
                            format_info_ocp_e2m3, format_info_ocp_e3m2, format_info_ocp_e4m3,
                            format_info_ocp_e5m2, format_info_ocp_e8m0)

from concord_capi import Format, Overflow, Rounding

GFLOAT = {
    Format.bf16: format_info_bfloat16,
    Format.fp16: format_info_binary16,
    Format.e4m3: format_info_ocp_e4m3,
    Format.e5m2: format_info_ocp_e5m2,
    Format.e2m3: format_info_ocp_e2m3,
    Format.e3m2: format_info_ocp_e3m2,
    Format.e2m1: format_info_ocp_e2m1,
    Format.e8m0: format_info_ocp_e8m0,
}
HAS_INF_OR_NAN = {Format.bf16, Format.fp16, Format.e4m3, Format.e5m2, Format.e8m0}
N_INPUTS = 1 << 17
N_SCALAR = 2000
TWO32 = 1 << 32


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def finite_values(capi, fmt):
    codes = np.arange(1 << capi.format_bits(fmt), dtype=np.uint32)
    v = capi.decode(fmt, codes)
    return np.unique(v[np.isfinite(v)])


def inputs(capi, fmt):
    """Finite fp32 inputs: random patterns within ~4 binades beyond the format, code values,
    random points between neighbouring codes. e8m0: within [2^-127, 2^127] (difference b)."""
    rng = np.random.default_rng(3000 + int(fmt))
    values = finite_values(capi, fmt)
    top = float(values.max())
    smallest = float(values[values > 0].min())
    lo_exp = int(np.floor(np.log2(smallest))) - 4
    hi_exp = int(np.floor(np.log2(top))) + 2
    exps = rng.integers(max(lo_exp, -149), min(hi_exp, 127) + 1, N_INPUTS // 2)
    mant = rng.random(N_INPUTS // 2) + 1.0
    rand = np.ldexp(mant, exps).astype(np.float32)
    pos = values[values > 0]
    i = rng.integers(0, pos.size - 1, N_INPUTS // 4)
    frac = rng.random(N_INPUTS // 4)
    between = (pos[i] + (pos[i + 1] - pos[i]) * frac).astype(np.float32)
    x = np.concatenate([rand, between, rng.choice(values, N_INPUTS - rand.size - between.size)])
    x = x.astype(np.float32)
    if fmt == Format.e8m0:
        x = np.abs(x)
        x = x[(x >= np.float32(2.0 ** -127)) & (x <= np.float32(2.0 ** 127))]
    else:
        x = x * np.where(rng.random(x.size) < 0.5, np.float32(-1), np.float32(1))
    return x


def gfloat_round(fmt, x, mode, sat, words=None):
    fi = GFLOAT[fmt]
    kwargs = {}
    if mode == RoundMode.Stochastic:
        kwargs = {"srbits": np.asarray(words, np.int64), "srnumbits": 32}
    out = gfloat.round_ndarray(fi, np.asarray(x, np.float64), mode, sat, **kwargs)
    return np.asarray(out, np.float64)


def concord_values(capi, fmt, x, rounding, overflow, words=None):
    if rounding == Rounding.stochastic:
        codes = capi.encode_words(fmt, x, words, rounding, overflow)
    else:
        codes = capi.encode(fmt, x, rounding, overflow)
    return capi.decode(fmt, codes).astype(np.float64)


def assert_same_values(x, mine, ref, what):
    same = ((mine == ref) & (np.signbit(mine) == np.signbit(ref))) | (np.isnan(mine) & np.isnan(ref))
    bad = np.flatnonzero(~same)
    if bad.size:
        lines = [f"  x={x[i]!r} (0x{np.float32(x[i]).view(np.uint32):08x}) concord={mine[i]!r} "
                 f"gfloat={ref[i]!r}" for i in bad[:12]]
        pytest.fail(f"{what}: {bad.size} of {x.size} differ\n" + "\n".join(lines))


def e8m0_ties(x):
    """Difference a: exact midpoints 1.5 * 2^k."""
    m = np.frexp(np.asarray(x, np.float64))[0]
    return m == 0.75


def overflows(fmt):
    return [Overflow.saturate, Overflow.ieee] if fmt in HAS_INF_OR_NAN else [Overflow.saturate]


@pytest.mark.parametrize("fmt", list(GFLOAT), ids=lambda f: f.name)
def test_stochastic_rounding_bit_exact(capi, fmt):
    x = inputs(capi, fmt)
    rng = np.random.default_rng(4000 + int(fmt))
    words = rng.integers(0, TWO32, x.size, dtype=np.uint64).astype(np.uint32)
    for overflow in overflows(fmt):
        sat = overflow == Overflow.saturate
        mine = concord_values(capi, fmt, x, Rounding.stochastic, overflow, words)
        ref = gfloat_round(fmt, x, RoundMode.Stochastic, sat, words)
        assert_same_values(x, mine, ref, f"{fmt.name} SR sat={sat}")
        # The scalar reference round_float on a subset.
        for i in range(N_SCALAR):
            r = gfloat.round_float(GFLOAT[fmt], float(x[i]), RoundMode.Stochastic, sat=sat,
                                   srbits=int(words[i]), srnumbits=32)
            assert_same_values(x[i:i + 1], mine[i:i + 1], np.array([r]), f"{fmt.name} scalar")
    # Both outcomes occur (the test could fail).
    down = concord_values(capi, fmt, x, Rounding.rtz, Overflow.saturate)
    away = mine != down
    assert 0.2 < np.mean(away[np.isfinite(mine)]) < 0.8


def sr_threshold(fmt, v, sat=True):
    """gfloat's D for input v: the smallest srbits that rounds away is 2^32 - D (bisection)."""
    fi = GFLOAT[fmt]
    toward = gfloat.round_float(fi, v, RoundMode.TowardZero, sat=sat)
    lo, hi = 0, TWO32  # find the smallest w in [0, 2^32] with round(w) != toward
    while lo < hi:
        mid = (lo + hi) // 2
        r = gfloat.round_float(fi, v, RoundMode.Stochastic, sat=sat, srbits=mid, srnumbits=32) \
            if mid < TWO32 else None
        if r is not None and r != toward:
            hi = mid
        else:
            lo = mid + 1
    return TWO32 - lo  # D (0 when nothing rounds away)


@pytest.mark.parametrize("fmt", list(GFLOAT), ids=lambda f: f.name)
def test_stochastic_rounding_threshold_words(capi, fmt):
    """Words 2^32 - D - 1 and 2^32 - D sit on either side of the decision."""
    x = inputs(capi, fmt)
    rng = np.random.default_rng(5000 + int(fmt))
    x = rng.choice(x[np.abs(x) <= finite_values(capi, fmt).max()], 200)
    tested = 0
    for v in x:
        d = sr_threshold(fmt, float(v))
        if d == 0:
            continue
        w = np.array([TWO32 - d - 1, TWO32 - d], np.uint32) if d < TWO32 else None
        if w is None:
            continue
        xs = np.array([v, v], np.float32)
        mine = concord_values(capi, fmt, xs, Rounding.stochastic, Overflow.saturate, w)
        ref = gfloat_round(fmt, xs, RoundMode.Stochastic, True, w)
        assert_same_values(xs, mine, ref, f"{fmt.name} threshold words")
        assert mine[0] != mine[1]
        tested += 1
    assert tested > 100


@pytest.mark.parametrize("fmt", list(GFLOAT), ids=lambda f: f.name)
@pytest.mark.parametrize("mode", ["rne", "rtz"])
def test_rne_rtz(capi, fmt, mode):
    x = inputs(capi, fmt)
    values = finite_values(capi, fmt).astype(np.float64)
    pos = values[values > 0]
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)  # ties (exact in fp32)
    x = np.concatenate([x, mids, -mids if fmt != Format.e8m0 else mids])
    rounding = Rounding.rne if mode == "rne" else Rounding.rtz
    gmode = RoundMode.TiesToEven if mode == "rne" else RoundMode.TowardZero
    for overflow in overflows(fmt):
        sat = overflow == Overflow.saturate
        mine = concord_values(capi, fmt, x, rounding, overflow)
        ref = gfloat_round(fmt, x, gmode, sat)
        if fmt == Format.e8m0 and mode == "rne":
            ties = e8m0_ties(x)
            assert ties.sum() >= 250
            # a: concord always takes the larger power of two; gfloat the even exponent code.
            assert np.all(mine[ties] == 2 * x[ties].astype(np.float64) / 1.5)
            code_lo = np.log2(x[ties].astype(np.float64) / 1.5).astype(int) + 127
            expect_g = np.where(code_lo % 2 == 0, x[ties] / 1.5, 2 * x[ties] / 1.5)
            assert np.array_equal(ref[ties], expect_g)
            assert_same_values(x[~ties], mine[~ties], ref[~ties], f"{fmt.name} rne sat={sat}")
            continue
        assert_same_values(x, mine, ref, f"{fmt.name} {mode} sat={sat}")


@pytest.mark.parametrize("fmt", list(GFLOAT), ids=lambda f: f.name)
def test_stochastic_rounding_frequency_matches_gfloat_probability(capi, fmt):
    n = 1 << 16
    t = 0.0135  # Hoeffding: 2 exp(-2 n t^2) < 1e-10
    assert 2 * np.exp(-2 * n * t * t) < 1e-10
    rng = np.random.default_rng(6000 + int(fmt))
    values = finite_values(capi, fmt).astype(np.float64)
    pos = values[values > 0]
    i = rng.integers(0, pos.size - 1, 64)
    fracs = rng.random(64)
    x = (pos[i] + (pos[i + 1] - pos[i]) * fracs).astype(np.float32)
    checked = 0
    for k, v in enumerate(x):
        p = sr_threshold(fmt, float(v)) / TWO32  # gfloat's probability of rounding away
        down = concord_values(capi, fmt, np.float32([v]), Rounding.rtz, Overflow.saturate)[0]
        codes = capi.encode(fmt, np.full(n, v, np.float32), Rounding.stochastic,
                            Overflow.saturate, seed=0x5EED0000 + int(fmt), stream=k,
                            first_index=0)
        freq = np.mean(capi.decode(fmt, codes).astype(np.float64) != down)
        assert abs(freq - p) < t, f"{fmt.name} x={v!r}: frequency {freq} vs gfloat p={p}"
        checked += 1
    assert checked == 64
