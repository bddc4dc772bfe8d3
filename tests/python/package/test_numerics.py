"""concord.numerics against the C++: the C ABI (encode_ref/decode_ref/quantize_ref and the fast
quantize, through ctypes), the CLI `concord codec`, and ml-dtypes where the formats overlap.

Every comparison is bit for bit (fp32 results compared as uint32 patterns, NaN payloads
included). Both paths of the package are checked: the default fast (SIMD) path and
reference=True. Inputs are fixed-seed random fp32 bit patterns plus each format's own values,
midpoints (ties) and specials, so the rounding boundaries are hit on purpose.
"""

import ml_dtypes
import numpy as np
import pytest

from concord import numerics as cn
from concord_capi import Format, Overflow, Rounding

FORMATS = [f.name for f in Format]
ROUNDINGS = {"rne": Rounding.rne, "rtz": Rounding.rtz, "sr": Rounding.stochastic}
OVERFLOWS = {"saturate": Overflow.saturate, "ieee": Overflow.ieee}
CODE_DTYPE = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def bits32(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def code_dtype(fmt):
    bits = cn.format_info(fmt)["bits"]
    return np.uint8 if bits <= 8 else np.uint16 if bits == 16 else np.uint32


def probe_inputs(capi, fmt, n_random=1 << 14):
    """Values of the format, midpoints between neighbours (ties), +-1 ulp around them, specials,
    and random fp32 bit patterns (seed 21)."""
    rng = np.random.default_rng(21)
    if fmt == "f32":
        values = np.array([], np.float64)
    else:
        codes = np.arange(1 << capi.format_bits(Format[fmt]), dtype=np.uint32)
        v = capi.decode(Format[fmt], codes).astype(np.float64)
        values = np.unique(v[np.isfinite(v)])
    mids = (values[1:] + values[:-1]) / 2
    probe = np.concatenate([values, mids]).astype(np.float32)
    near = np.concatenate([np.nextafter(probe, np.float32(np.inf)),
                           np.nextafter(probe, np.float32(-np.inf))])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 3e38],
                        np.float32)
    random = rng.integers(0, 1 << 32, n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        x = np.concatenate([probe, -probe, near, specials, random, random * 1e-30,
                            random * 1e30])
    return np.ascontiguousarray(x, np.float32)


def test_names_match_the_cpp_table(capi):
    assert cn.formats() == [capi.format_name(f) for f in Format]
    for f in Format:
        assert cn.format_info(f.name)["bits"] == capi.format_bits(f)
    assert cn.rounding_modes() == ["rne", "rtz", "sr"]
    assert cn.overflow_modes() == ["saturate", "ieee"]
    assert cn.scale_rules() == ["floor", "ceil", "even", "rceil"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_every_code(capi, fmt):
    bits = capi.format_bits(Format[fmt])
    if bits > 16:
        codes = np.random.default_rng(3).integers(0, 1 << 32, 1 << 16, dtype=np.uint64)
        codes = codes.astype(np.uint32)
    else:
        codes = np.arange(1 << bits, dtype=np.uint32)
    want = bits32(capi.decode(Format[fmt], codes))
    typed = codes.astype(code_dtype(fmt))
    for reference in (False, True):
        got = cn.decode(typed, fmt, reference=reference)
        assert got.dtype == np.float32 and got.shape == codes.shape
        np.testing.assert_array_equal(bits32(got), want, err_msg=f"{fmt} reference={reference}")


@pytest.mark.parametrize("fmt", ["e2m3", "e3m2", "e2m1", "int4"])
def test_decode_ignores_bits_above_the_width(capi, fmt):
    codes = np.arange(256, dtype=np.uint8)
    mask = (1 << capi.format_bits(Format[fmt])) - 1
    want = bits32(capi.decode(Format[fmt], (codes & mask).astype(np.uint32)))
    for reference in (False, True):
        np.testing.assert_array_equal(bits32(cn.decode(codes, fmt, reference=reference)), want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rounding", ["rne", "rtz", "sr"])
@pytest.mark.parametrize("overflow", ["saturate", "ieee"])
def test_encode_matches_encode_ref(capi, fmt, rounding, overflow):
    x = probe_inputs(capi, fmt, 1 << 12)
    seed, stream, first = 0x1234_5678_9ABC, 7, 4093  # first index not a multiple of 4
    want = capi.encode(Format[fmt], x, ROUNDINGS[rounding], OVERFLOWS[overflow], seed=seed,
                       stream=stream, first_index=first)
    for reference in (False, True):
        got = cn.encode(x, fmt, rounding=rounding, overflow=overflow, seed=seed, stream=stream,
                        first_index=first, reference=reference)
        assert got.dtype == code_dtype(fmt) and got.shape == x.shape
        np.testing.assert_array_equal(got.astype(np.uint32), want,
                                      err_msg=f"{fmt} {rounding} {overflow} ref={reference}")


def test_encode_keeps_shape_and_writes_out(capi):
    x = np.random.default_rng(5).standard_normal((3, 5, 7)).astype(np.float32)
    out = np.zeros((3, 5, 7), np.uint16)
    got = cn.encode(x, "bf16", out=out)
    assert got is out
    np.testing.assert_array_equal(out.astype(np.uint32), capi.encode(Format.bf16, x))
    back = np.empty_like(x)
    assert cn.decode(out, "bf16", out=back) is back


def test_stochastic_rounding_is_keyed_by_seed_stream_and_index(capi):
    x = np.full(4096, 1.0 + 2.0 ** -5, np.float32)  # a quarter of an e4m3 ulp (2^-3) above 1
    a = cn.encode(x, "e4m3", rounding="sr", seed=1)
    assert np.array_equal(a, cn.encode(x, "e4m3", rounding="sr", seed=1))
    assert not np.array_equal(a, cn.encode(x, "e4m3", rounding="sr", seed=2))
    assert not np.array_equal(a, cn.encode(x, "e4m3", rounding="sr", seed=1, stream=1))
    # element i draws word first_index + i: a shifted window is the same draw
    np.testing.assert_array_equal(cn.encode(x[100:], "e4m3", rounding="sr", seed=1,
                                            first_index=100), a[100:])
    # P(up) = 1/4 exactly (the fraction of the ulp); 4096 draws: mean 1024, sd 27.7; the
    # bound of 6 sd fails with probability below 1e-8
    ups = int(np.count_nonzero(a != cn.encode(x, "e4m3", rounding="rtz")))
    assert abs(ups - 1024) < 6 * 27.7


# ---- ml-dtypes where the formats overlap (RNE; ml-dtypes is IEEE-style on overflow) ----

ML_DTYPES = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
}


@pytest.mark.parametrize("fmt", list(ML_DTYPES))
def test_against_ml_dtypes(capi, fmt):
    dtype = ML_DTYPES[fmt]
    storage = code_dtype(fmt)
    bits = capi.format_bits(Format[fmt])
    codes = np.arange(1 << bits, dtype=np.uint32).astype(storage)
    with np.errstate(all="ignore"):
        want = codes.view(dtype).astype(np.float32) if bits >= 8 else None
    got = cn.decode(codes, fmt)
    if want is not None:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(bits32(got)[ok], bits32(want)[ok])
    else:  # sub-byte formats: ml-dtypes keeps one code per byte, right-aligned
        with np.errstate(all="ignore"):
            want = codes.astype(np.uint8).view(dtype).astype(np.float32)
        np.testing.assert_array_equal(bits32(got), bits32(want))
    # encode: NaN excluded (the named differences of tests/python/test_ml_dtypes.py: NaN into
    # NaN-free formats, fp16 NaN payloads)
    x = probe_inputs(capi, fmt, 1 << 14)
    x = x[~np.isnan(x)]
    if fmt == "e8m0":  # ml-dtypes' e8m0 has no sign and no zero: compare on its domain
        x = x[(x > 0) & (x < 1.7e38) & (x > 5.9e-39)]
    with np.errstate(all="ignore"):
        want = x.astype(dtype).view(np.uint8 if storage == np.uint8 else storage)
    got = cn.encode(x, fmt, overflow="ieee")
    np.testing.assert_array_equal(got, want.astype(storage))


# ---- the CLI ----

def test_cli_codec_encode_and_decode(capi, concord_cli):
    x = probe_inputs(capi, "e4m3", 256)
    text = "\n".join(f"{b:08X}" for b in bits32(x)) + "\n"
    for rounding in ("rne", "sr"):
        out = concord_cli("codec", "encode", "--format", "e4m3", "--round", rounding, "--seed",
                          "99", "--bits", stdin=text)
        cli_codes = np.array([int(t, 16) for t in out.split()], np.uint8)
        # the CLI's codec encode defaults to IEEE overflow and stream 0
        got = cn.encode(x, "e4m3", rounding=rounding, overflow="ieee", seed=99)
        np.testing.assert_array_equal(got, cli_codes)
    out = concord_cli("codec", "decode", "--format", "e2m1",
                      stdin="\n".join(str(c) for c in range(16)) + "\n")
    cli_bits = np.array([int(line.split()[0], 16) for line in out.splitlines()], np.uint32)
    np.testing.assert_array_equal(bits32(cn.decode(np.arange(16, dtype=np.uint8), "e2m1")),
                                  cli_bits)


@pytest.mark.parametrize("name", ["mxfp8-e4m3", "mxfp4", "nvfp4"])
def test_cli_codec_quantize(concord_cli, name):
    rng = np.random.default_rng(8)
    block = 16 if name == "nvfp4" else 32
    x = (rng.standard_normal((4, block)) * 3).astype(np.float32)
    text = "\n".join(" ".join(f"{b:08X}" for b in bits32(row)) for row in x) + "\n"
    out = concord_cli("codec", "quantize", "--format", name, "--round", "sr", "--seed", "5",
                      "--bits", stdin=text)
    for line_no, (row, line) in enumerate(zip(x, out.splitlines())):
        fields = [int(t, 16) for t in line.split()]
        # each CLI line is its own 1-row tensor with SR stream = line index
        q = cn.quantize(row, name, rounding="sr", seed=5, stream=line_no)
        if name == "nvfp4":
            assert int(np.float32(q.tensor_scale).view(np.uint32)) == fields.pop(0)
        assert int(q.scales.ravel()[0]) == fields[0]
        np.testing.assert_array_equal(q.codes.ravel(), fields[1:])


# ---- block quantization against the C ABI ----

PRESETS = ["mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4", "nvfp4",
           "nvfp4-2d", "fp8-tensor", "bf16", "e4m3", "int8"]


def block_input(rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-20, 20, (rows, 1)))
    x[0, :5] = [0.0, -0.0, 1e-40, 448.0, -6.0]
    if rows > 1:
        x[1, :] = 0.0  # an all-zero row of blocks
    return x.astype(np.float32)


def test_desc_text_matches_the_cpp(capi):
    for name in PRESETS:
        d = cn.QuantDesc(name)
        assert d.to_string() == capi.desc_from_name(name)
        assert cn.QuantDesc(d.to_string()) == d
    d = cn.QuantDesc("mxfp8-e4m3", scale_rule="rceil", rounding="sr")
    assert (d.element, d.block, d.scale, d.scale_rule, d.rounding) == (
        "e4m3", (1, 32), "e8m0", "rceil", "sr")
    assert str(d) == "element=e4m3;block=1x32;scale=e8m0;rule=rceil;axis=1;rounding=sr;overflow=saturate"
    assert cn.QuantDesc("bf16").scale is None
    assert cn.QuantDesc("nvfp4-2d").block == (16, 16)
    assert cn.block_formats() == PRESETS[:8]


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("rounding", ["rne", "rtz", "sr"])
def test_quantize_matches_the_cpp(capi, name, rounding):
    rules = cn.scale_rules() if name.startswith("mx") else [None]
    x = block_input(40, 72, seed=len(name))  # partial blocks on both axes
    for rule in rules:
        desc = cn.QuantDesc(name, scale_rule=rule, rounding=rounding)
        text = desc.to_string()
        want = capi.quantize(text, x, fast=False, seed=11, stream=3)
        for reference in (False, True):
            q = cn.quantize(x, desc, seed=11, stream=3, reference=reference)
            tag = f"{text} reference={reference}"
            assert q.desc == desc and q.shape == [40, 72]
            np.testing.assert_array_equal(q.codes.astype(np.uint32), want["codes"], err_msg=tag)
            np.testing.assert_array_equal(q.packed, want["packed"], err_msg=tag)
            np.testing.assert_array_equal(q.scales.ravel(), want["scales"], err_msg=tag)
            assert bits32(q.tensor_scale) == bits32(want["tensor_scale"]), tag
            deq = capi.dequantize(text, 40, 72, want["packed"], want["scales"],
                                  want["tensor_scale"])
            np.testing.assert_array_equal(bits32(cn.dequantize(q, reference=reference)),
                                          bits32(deq), err_msg=tag)
            np.testing.assert_array_equal(
                bits32(cn.fake_quantize(x, desc, seed=11, stream=3, reference=reference)),
                bits32(deq), err_msg=tag)


def test_quantize_string_overrides_and_one_dimensional_input(capi):
    x = block_input(1, 100, seed=4)[0].copy()
    q = cn.quantize(x, "mxfp8-e4m3", scale_rule="even", rounding="rtz")
    assert q.shape == [100] and q.codes.shape == (100,) and q.scales.shape == (1, 4)
    want = capi.quantize("element=e4m3;block=1x32;scale=e8m0;rule=even;axis=1;rounding=rtz;"
                         "overflow=saturate", x[None, :])
    np.testing.assert_array_equal(q.packed, want["packed"])
    assert cn.dequantize(q).shape == (100,)


def test_axis_zero_blocks_run_down_columns(capi):
    x = block_input(64, 8, seed=9)
    q = cn.quantize(x, "mxfp8-e4m3", axis=0)
    assert q.scales.shape == (2, 8)
    want = capi.quantize(q.desc.to_string(), x, fast=False)
    np.testing.assert_array_equal(q.packed, want["packed"])
    np.testing.assert_array_equal(q.scales.ravel(), want["scales"])


def test_quantized_array_round_trip_and_views():
    x = block_input(16, 64, seed=2)
    q = cn.quantize(x, "mxfp4")
    assert q.packed.shape == (16 * 64 // 2,) and not q.packed.flags.writeable
    assert q.codes.dtype == np.uint8 and q.codes.max() <= 15
    r = cn.QuantizedArray.from_arrays(q.desc, [16, 64], q.packed, q.scales, q.tensor_scale)
    np.testing.assert_array_equal(bits32(r.dequantize()), bits32(q.dequantize()))
    q8 = cn.quantize(x, "mxfp8-e5m2")
    assert np.shares_memory(q8.codes, q8.packed)  # 8-bit codes are a view of the C++ buffer
    out = np.empty((16, 64), np.float32)
    assert cn.dequantize(q8, out=out) is out
    with pytest.raises(ValueError, match="packed holds 3 bytes"):
        cn.QuantizedArray.from_arrays("mxfp4", [16, 64], np.zeros(3, np.uint8), q.scales)


def test_bad_names_raise_input_error():
    import concord
    x = np.ones(4, np.float32)
    with pytest.raises(concord.InputError, match=r"\[numerics.encode\] unknown format 'e9m9'"):
        cn.encode(x, "e9m9")
    with pytest.raises(ValueError, match="unknown rounding 'nearest'.*rne, rtz, sr"):
        cn.encode(x, "bf16", rounding="nearest")
    with pytest.raises(ValueError, match="unknown overflow 'wrap'"):
        cn.encode(x, "bf16", overflow="wrap")
    with pytest.raises(ValueError, match="unknown scale rule 'round'"):
        cn.quantize(np.ones((1, 32), np.float32), "mxfp4", scale_rule="round")
    with pytest.raises(ValueError, match="unknown quantization descriptor 'mxfp9'"):
        cn.quantize(np.ones((1, 32), np.float32), "mxfp9")
