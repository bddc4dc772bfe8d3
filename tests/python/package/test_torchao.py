"""concord.numerics against torchao directly, where the two definitions overlap.

tests/golden/torchao_mx_nvfp4.npz holds torchao's own MX outputs (tools/make_torchao_golden.py;
tests/python/test_torchao_golden.py explains every block where torchao's definition differs from
concord's: Inf/NaN blocks, scale code 0, RCEIL's fp32 log2). On every other block — finite, a
nonzero scale code, and (RCEIL) not one of its log2-rounding rows, i.e. where both sides choose
the same scale — the package's quantize must give torchao's scale code and element codes bit
for bit, and dequantize torchao's (codes, scales) to torchao's values.
"""

import os

import numpy as np
import pytest

import concord.numerics as cn

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "golden", "torchao_mx_nvfp4.npz")
MX = {"e4m3": "mxfp8-e4m3", "e5m2": "mxfp8-e5m2", "e2m3": "mxfp6-e2m3", "e3m2": "mxfp6-e3m2",
      "e2m1": "mxfp4"}


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "ref"])
@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("element", list(MX))
def test_mx_equals_torchao_where_the_definitions_overlap(golden, element, rule, reference):
    x = golden["mx_x"]
    t_scales = golden[f"mx_{element}_{rule}_scales"]
    t_codes = golden[f"mx_{element}_{rule}_codes"]
    t_deq = golden[f"mx_{element}_{rule}_deq"]
    q = cn.quantize(x, MX[element], scale_rule=rule, reference=reference)
    scales = np.asarray(q.scales).reshape(-1)
    codes = np.asarray(q.codes).reshape(x.shape)
    finite = np.all(np.isfinite(x), axis=1)
    overlap = finite & (t_scales != 0) & (scales == t_scales)
    # Rows outside the overlap are the documented differences; they must stay a minority.
    assert overlap.sum() >= 0.8 * x.shape[0], f"only {overlap.sum()} of {x.shape[0]} rows overlap"
    if rule != "rceil":  # FLOOR/CEIL/EVEN: the same scale on every finite block
        assert np.array_equal(scales[finite], t_scales[finite])
    np.testing.assert_array_equal(codes[overlap], t_codes[overlap].astype(codes.dtype))
    # torchao's own (codes, scales) through concord's dequantizer: torchao's values.
    rows = np.flatnonzero(overlap)
    theirs = cn.QuantizedArray.from_arrays(
        MX[element] if rule == "floor" else cn.QuantDesc(MX[element], scale_rule=rule),
        [len(rows), x.shape[1]], pack(element, t_codes[rows]), t_scales[rows])
    deq = cn.dequantize(theirs, reference=reference)
    assert np.array_equal(deq.view(np.uint32), t_deq[rows].view(np.uint32))


def pack(element, codes):
    flat = np.asarray(codes, np.uint8).reshape(-1)
    if element == "e2m1":
        return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    return flat
