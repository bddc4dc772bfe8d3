"""concord's MX and NVFP4 quantizers (quantize_ref and the fast quantize()) against torchao.

The golden file tests/golden/torchao_mx_nvfp4.npz holds torchao's outputs (scales, element
codes, packed FP4 bytes, dequantized values) on seeded inputs; tools/make_torchao_golden.py
wrote it (torch/torchao versions in its `meta`). Every block and element is compared; where
torchao's definition differs from concord's, the test names the difference, *reproduces
torchao's value* from torchao's rule using concord's own element codec, and asserts that —
so a difference is never merely tolerated, it is explained value by value:

MX (to_mx, 32-element blocks):
  A. Inf in a block. concord: scale NaN (0xFF), as block.h documents (a block holding Inf
     cannot be represented). torchao FLOOR/CEIL/EVEN read the exponent field of amax=Inf (255)
     and produce the finite scale 2^(128 - emax_elem); its RCEIL fallback gives 0xFE.
  B. Scale code 0x00 (2^-127: zero, fp32-subnormal and tiny blocks). concord scales the
     elements by 2^127. torchao FLOOR/CEIL/EVEN clamp the fp32 scale to 2^-126 (a workaround
     for Triton flushing subnormals, torchao's comment) so elements are scaled by 2^126; its
     RCEIL multiplies by 1.0 (Transformer Engine's exp2f_rcp special case for code 0). Element
     codes then differ though the scale code is the same.
  C. RCEIL when amax/max_elem is just above a power of two. torchao's eager RCEIL computes
     ceil(log2(amax / max_elem)) with fp32 log2, which rounds log2(2^k (1 + 2^-23)) to k and
     so picks the scale one binade too small (its elements then clip at max). concord takes
     the exponent from the bits (cuBLAS's cvt.rp.satfinite.ue8m0 semantics), as docs/design.md
     requires. The test checks that the exact ceil_log2 of torchao's own fp32 ratio equals
     concord's exponent in each such block.
  D. NaN in a block: both give scale 0xFF; element codes are meaningless there (torchao
     divides by the scale's Inf bit pattern and its FP6/FP4 converter maps NaN to arbitrary
     codes); only the scale and the all-NaN dequantization are compared.

NVFP4 (nvfp4_quantize, 1x16 blocks), with the per-tensor scale passed as Transformer
Engine defines it ("te": 1/min(2688/amax, FLT_MAX)), which is concord's tensor_scale:
  E. torchao clamps every block scale to at least 2^-6 (E4M3_EPS = finfo(e4m3fn).tiny, the
     smallest *normal* e4m3); TE and concord let it go subnormal or to 0 (all-zero block:
     scale 0). In those blocks the element codes differ too: the test reproduces torchao's
     codes from its clamped scale and concord's from TE's multiplier min(1/(s*pts), FLT_MAX)
     (a zero scale saturates concord's elements; they dequantize to 0 all the same).
  F. Reciprocal overflow: torchao's element multiplier (1/pts)/s overflows to Inf when pts is
     an fp32 subnormal (here: a tensor of fp32 subnormals, where TE's S_enc clamps at FLT_MAX
     and pts = 1/FLT_MAX), saturating every element; concord clamps the multiplier at FLT_MAX
     (block_ref.cpp, as TE does).
  G. Dequantization order: torchao computes v * (pts * s), concord (v * s) * pts; v * s is
     exact, so concord's value is the correctly rounded product and torchao's can be 1 ulp
     off. The test reproduces both orders.
  H. torchao's own per-tensor convention (pts = amax/2688, per_tensor_amax_to_scale) differs
     from TE's 1/(2688/amax) by at most 1 fp32 ulp for normal amax; concord follows TE. Where
     the two are equal, torchao's results must equal the TE-convention ones; elsewhere scales
     and codes are compared as in E; for fp32-subnormal tensors the conventions diverge
     entirely (2688/amax overflows) and only case "te" is compared.
"""

import json
import os

import numpy as np
import pytest

from concord_capi import Format, Overflow, Rounding

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden", "torchao_mx_nvfp4.npz")

MX = {  # element -> (concord preset, Format, max_elem, emax_elem)
    "e4m3": ("mxfp8-e4m3", Format.e4m3, 448.0, 8),
    "e5m2": ("mxfp8-e5m2", Format.e5m2, 57344.0, 15),
    "e2m3": ("mxfp6-e2m3", Format.e2m3, 7.5, 2),
    "e3m2": ("mxfp6-e3m2", Format.e3m2, 28.0, 4),
    "e2m1": ("mxfp4", Format.e2m1, 6.0, 2),
}
RULES = ["floor", "ceil", "even", "rceil"]


@pytest.fixture(scope="module")
def golden():
    g = np.load(GOLDEN)
    meta = json.loads(str(g["meta"]))
    assert meta["torchao"] and meta["torch"]
    return g, meta


def mx_desc(capi, element, rule):
    desc = capi.desc_from_name(MX[element][0])
    assert ";rule=floor;" in desc
    return desc.replace(";rule=floor;", f";rule={rule};")


def ceil_log2_exact(v):
    """Exact ceil(log2(v)) for positive finite fp32 v, from the bits."""
    b = np.asarray(v, np.float32).view(np.uint32).astype(np.int64)
    field, mant = b >> 23, b & 0x7FFFFF
    normal = field > 0
    bl = np.array([int(m).bit_length() for m in mant])
    sub_floor = bl - 1 - 149
    sub_pow2 = (mant & (mant - 1)) == 0
    return np.where(normal, field - 127 + (mant != 0), sub_floor + ~sub_pow2)


def same_f32(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def torchao_mx_multiplier(code, rule):
    """What torchao multiplies a block's elements by for scale code `code` (differences B, A)."""
    code = int(code)
    if code == 0:
        return np.float32(1.0) if rule == "rceil" else np.float32(2.0 ** 126)
    if rule == "rceil" and code == 254:
        return np.float32(2.0 ** -127)
    return np.float32(2.0 ** (127 - code))


@pytest.mark.parametrize("fast", [False, True], ids=["ref", "fast"])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("element", list(MX))
def test_mx_against_torchao(capi, golden, element, rule, fast):
    g, _ = golden
    x = g["mx_x"]
    _, fmt, max_elem, emax = MX[element]
    t_scales = g[f"mx_{element}_{rule}_scales"]
    t_codes = g[f"mx_{element}_{rule}_codes"].astype(np.uint32)
    t_deq = g[f"mx_{element}_{rule}_deq"]
    desc = mx_desc(capi, element, rule)
    q = capi.quantize(desc, x, fast=fast)
    scales, codes = q["scales"], q["codes"]
    amax = np.max(np.abs(x), axis=1)  # NaN-propagating
    has_nan = np.isnan(amax)
    has_inf = np.isinf(amax)
    counts = {"rows": x.shape[0]}

    # Scales: equal except A (Inf) and C (RCEIL log2 rounding).
    assert np.all(scales[has_nan] == 0xFF) and np.all(t_scales[has_nan] == 0xFF)  # D
    assert np.all(scales[has_inf] == 0xFF)  # A, concord
    expected_inf = 254 if rule == "rceil" else 255 - emax
    assert np.all(t_scales[has_inf] == expected_inf)  # A, torchao
    finite = ~has_nan & ~has_inf
    differ = finite & (scales != t_scales)
    if rule == "rceil":
        descale = (amax[differ] / np.float32(max_elem)).astype(np.float32)  # torchao's ratio
        assert np.all(t_scales[differ].astype(int) == scales[differ].astype(int) - 1), "C"
        assert np.array_equal(ceil_log2_exact(descale) + 127, scales[differ].astype(int)), "C"
        counts["C_rceil_log2"] = int(differ.sum())
        # Everywhere else, concord's RCEIL is the exact ceil_log2 of the fp32 ratio amax/max.
        positive = finite & (amax > 0)
        exact = np.clip(ceil_log2_exact((amax[positive] / np.float32(max_elem)).astype(
            np.float32)), -127, 127) + 127
        assert np.array_equal(exact, scales[positive].astype(int))
    else:
        assert not np.any(differ), f"scale differs at rows {np.flatnonzero(differ)}"
    counts["A_inf"] = int(has_inf.sum())

    # Elements: torchao's codes reproduced from torchao's scale through concord's codec.
    for r in np.flatnonzero(~has_nan):
        mult = torchao_mx_multiplier(t_scales[r], rule)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = (x[r] * mult).astype(np.float32)
        expect = capi.encode(fmt, scaled, Rounding.rne, Overflow.saturate)
        assert np.array_equal(expect, t_codes[r]), f"row {r}: torchao's element codes"
        if scales[r] == t_scales[r] and (scales[r] != 0 or np.all(x[r] == 0)):
            assert np.array_equal(codes[r], t_codes[r]), f"row {r}: element codes differ"
    counts["B_code0"] = int(np.sum((scales == 0) & np.any(x != 0, axis=1)))

    # Packed FP4: torchao's pack_uint4 layout is concord's (element 2k in the low nibble).
    if element == "e2m1":
        same_rows = (scales == t_scales) & ~has_nan & (scales != 0)
        packed = q["packed"].reshape(x.shape[0], -1)
        assert np.array_equal(packed[same_rows], g["mx_e2m1_" + rule + "_packed"][same_rows])

    # Dequantize torchao's own (codes, scales) with concord: equal to torchao's to_dtype().
    rows_ok = ~has_nan
    t_packed = pack(fmt, t_codes[rows_ok])
    deq = capi.dequantize(desc, int(rows_ok.sum()), x.shape[1], t_packed, t_scales[rows_ok],
                          1.0, fast=fast)
    assert np.all(same_f32(deq, t_deq[rows_ok]))
    assert np.all(np.isnan(t_deq[has_nan]))
    nan_deq = capi.dequantize(desc, x.shape[0], x.shape[1], q["packed"], scales, 1.0, fast=fast)
    assert np.all(np.isnan(nan_deq[has_nan]))  # D
    # The named cases are present in the golden file (so each branch above ran).
    assert counts["A_inf"] >= 2 and counts["B_code0"] >= 2
    if rule == "rceil":
        assert counts["C_rceil_log2"] >= 1


def pack(fmt, codes):
    """concord's packed layout of a (rows, cols) code array."""
    flat = np.asarray(codes, np.uint32).reshape(-1)
    if fmt in (Format.e2m1, Format.int4):
        return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    return flat.astype(np.uint8)


def nvfp4_cases(meta):
    return meta["nvfp4_cases"]


def torchao_nvfp4_codes(capi, x, pts, t_scales):
    """Difference E/F: torchao's element codes from its own block scales and formula."""
    s = capi.decode(Format.ue4m3, t_scales.reshape(-1).astype(np.uint32)).astype(np.float32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        recip = ((np.float32(1.0) / np.float32(pts)) / s).astype(np.float32)
        scaled = (x.reshape(-1, 16) * recip[:, None]).astype(np.float32)
    scaled = np.clip(scaled, -6, 6).reshape(x.shape)
    return capi.encode(Format.e2m1, scaled, Rounding.rne, Overflow.saturate)


@pytest.mark.parametrize("fast", [False, True], ids=["ref", "fast"])
def test_nvfp4_against_torchao_te_convention(capi, golden, fast):
    g, meta = golden
    desc = capi.desc_from_name("nvfp4")
    seen = {"E_clamp": 0, "F_overflow": 0, "G_order": 0, "codes": 0}
    for case in nvfp4_cases(meta):
        x = g[f"nvfp4_{case}_x"]
        key = f"nvfp4_{case}_te"
        pts = g[key + "_pts"][0]
        t_scales = g[key + "_scales"].reshape(-1)
        t_codes = g[key + "_codes"].astype(np.uint32)
        q = capi.quantize(desc, x, fast=fast)
        assert q["tensor_scale"] == pts, f"{case}: per-tensor scale (TE convention)"
        # E: torchao's block scale = max(concord's, 2^-6) (code 0x08).
        s = q["scales"]
        assert np.array_equal(t_scales, np.maximum(s, 0x08)), f"{case}: block scales"
        seen["E_clamp"] += int(np.sum(s < 0x08))
        # Elements: torchao's codes from torchao's formula; concord's equal them except F.
        expect = torchao_nvfp4_codes(capi, x, pts, t_scales)
        assert np.array_equal(expect, t_codes), f"{case}: torchao's formula reproduced"
        with np.errstate(divide="ignore", over="ignore"):
            overflow = np.isinf(np.float32(1.0) / np.float32(pts))
        clamped = np.repeat((s < 0x08).reshape(x.shape[0], -1), 16, axis=1)
        if overflow:  # F
            assert np.all(np.isin(t_codes, [0x7, 0xF, 0x0, 0x8]))
            seen["F_overflow"] += int(np.sum(q["codes"] != t_codes))
        else:
            assert np.array_equal(q["codes"][~clamped], t_codes[~clamped]), f"{case}: codes"
            if not clamped.any():
                assert np.array_equal(q["packed"], g[key + "_packed"].reshape(-1)), case
        # E, in concord's blocks below 2^-6: TE's multiplier min(1/(s * pts), FLT_MAX) (so a
        # zero scale saturates the elements, which still dequantize to 0).
        sd = capi.decode(Format.ue4m3, s.astype(np.uint32)).astype(np.float32)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            mult = np.minimum(np.float32(1) / (sd * np.float32(pts)).astype(np.float32),
                              np.finfo(np.float32).max).astype(np.float32)
            te_scaled = (x.reshape(-1, 16) * mult[:, None]).astype(np.float32).reshape(x.shape)
        te_codes = capi.encode(Format.e2m1, te_scaled, Rounding.rne, Overflow.saturate)
        assert np.array_equal(q["codes"][clamped], te_codes[clamped]), f"{case}: E blocks"
        seen["codes"] += t_codes.size
        # G: dequantize torchao's own codes and scales with concord: (v*s)*pts; torchao's is
        # v*(pts*s). Both reproduced exactly.
        t_packed = g[key + "_packed"].reshape(-1)
        deq = capi.dequantize(desc, x.shape[0], x.shape[1], t_packed, t_scales, pts, fast=fast)
        v = capi.decode(Format.e2m1, t_codes).reshape(-1, 16)
        sd = capi.decode(Format.ue4m3, t_scales.astype(np.uint32))[:, None]
        concord_order = ((v * sd).astype(np.float32) * np.float32(pts)).astype(np.float32)
        torchao_order = (v * (np.float32(pts) * sd).astype(np.float32)).astype(np.float32)
        assert np.all(same_f32(deq.reshape(-1, 16), concord_order)), f"{case}: dequantize"
        assert np.all(same_f32(g[key + "_deq"].reshape(-1, 16), torchao_order)), case
        seen["G_order"] += int(np.sum(~same_f32(concord_order, torchao_order)))
    # Each named difference occurs in the golden data, and most values are compared exactly.
    assert seen["E_clamp"] > 0 and seen["F_overflow"] > 0 and seen["G_order"] > 0
    assert seen["codes"] > 4000


def test_nvfp4_torchao_convention(capi, golden):
    """H: torchao's per-tensor scale amax/2688 against TE's 1/(2688/amax)."""
    g, meta = golden
    desc = capi.desc_from_name("nvfp4")
    compared = 0
    for case in nvfp4_cases(meta):
        key = f"nvfp4_{case}_torchao"
        if key + "_pts" not in g:
            continue
        x = g[f"nvfp4_{case}_x"]
        pts = g[key + "_pts"][0]
        te = g[f"nvfp4_{case}_te_pts"][0]
        q = capi.quantize(desc, x)
        if case == "fp32_subnormal":  # 2688/amax overflows: TE clamps S_enc, torchao does not
            amax = np.max(np.abs(x))
            assert pts == np.float32(amax / np.float32(2688.0))
            assert te == np.float32(1) / np.finfo(np.float32).max and pts < te / 100
            continue
        gap = abs(int(np.float32(pts).view(np.int32)) - int(np.float32(te).view(np.int32)))
        assert gap <= 1, f"{case}: conventions differ by {gap} ulp"
        t_scales = g[key + "_scales"].reshape(-1)
        assert np.array_equal(t_scales, np.maximum(q["scales"], 0x08)), case
        assert np.array_equal(torchao_nvfp4_codes(capi, x, pts, t_scales),
                              g[key + "_codes"]), case
        clamped = np.repeat((q["scales"] < 0x08).reshape(x.shape[0], -1), 16, axis=1)
        assert np.array_equal(g[key + "_codes"][~clamped], q["codes"][~clamped]), case
        if gap == 0:
            assert np.array_equal(g[key + "_deq"], g[f"nvfp4_{case}_te_deq"]), case
        compared += x.size
    assert compared > 4000


def test_nvfp4_scale_helpers(capi, golden):
    """concord's exposed NVFP4 helpers give the block scales quantize() stores."""
    g, meta = golden
    for case in nvfp4_cases(meta):
        x = g[f"nvfp4_{case}_x"]
        amax = np.max(np.abs(x))
        s_enc = capi.nvfp4_global_encode_scale(amax)
        assert np.float32(1) / s_enc == g[f"nvfp4_{case}_te_pts"][0]
        block_amax = np.max(np.abs(x.reshape(-1, 16)), axis=1)
        codes = capi.nvfp4_block_scale_code(block_amax, s_enc)
        t = g[f"nvfp4_{case}_te_scales"].reshape(-1)
        assert np.array_equal(np.maximum(codes, 0x08), t), case


def test_mx_scale_helper_matches_quantize(capi, golden):
    g, _ = golden
    x = g["mx_x"]
    amax = np.max(np.abs(x), axis=1)
    for element, (_, fmt, _, _) in MX.items():
        for i, rule in enumerate(RULES):
            codes, exps = capi.mx_scale(amax, fmt, i)
            q = capi.quantize(mx_desc(capi, element, rule), x)
            assert np.array_equal(codes, q["scales"])
            assert np.array_equal(np.where(codes == 0xFF, 128, codes.astype(int) - 127), exps)


def test_capi_reports_errors(capi):
    """The C ABI turns bad input into an error with a message, not a crash."""
    from concord_capi import ConcordError
    with pytest.raises(ConcordError, match="cannot parse descriptor"):
        capi.quantize("element=nope", np.zeros((1, 32), np.float32))
    with pytest.raises(ConcordError, match="needs e2m1 elements"):
        capi.quantize("element=e4m3;block=1x16;scale=ue4m3;axis=1;rounding=rne;overflow=saturate",
                      np.zeros((1, 16), np.float32))
    with pytest.raises(ConcordError, match="format id 99"):
        capi.encode(99, np.zeros(1, np.float32))
    with pytest.raises(ConcordError, match="unknown quantization name"):
        capi.desc_from_name("mxfp9")
