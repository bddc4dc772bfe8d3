"""concord.export (the Fair Cast rules of train/export.h) against the rules' definitions written
out here over the C++ reference codec (encode_ref/decode_ref through the C ABI):

  rne  served = decode(encode_ref(x, rne, saturate))
  sr   the same with stochastic rounding, random words from Philox stream p (the tensor's number
       in state-dict order) of seed ^ (0x9E3779B97F4A7C15 * (step + 1)) mod 2^64
  ef   v = x + e; served = decode(encode_ref(v)); e <- v - served (fp32)
  1-D tensors are served in fp32 (a copy) by every rule.

Bit for bit, over several steps, for bf16 and the narrower served formats.
"""

import ml_dtypes
import numpy as np
import pytest

import concord
from concord import export as ce
from concord_capi import Format, Overflow, Rounding

MASK64 = (1 << 64) - 1


def bits32(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def state_dict(seed):
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "norm.weight": (1 + 0.01 * rng.standard_normal(8)).astype(np.float32),
        "proj.weight": (0.05 * rng.standard_normal((8, 24))).astype(np.float32),
    }


def reference_served(capi, rule, fmt, master, param, step, seed, error):
    if master.ndim < 2:
        return master.copy()
    f = Format[fmt]
    if rule == "ef":
        v = (master + error[param]).astype(np.float32)
        served = capi.decode(f, capi.encode(f, v))
        error[param] = (v - served).astype(np.float32)
        return served
    if rule == "rne":
        return capi.decode(f, capi.encode(f, master))
    mixed = (seed ^ ((0x9E3779B97F4A7C15 * (step + 1)) & MASK64)) & MASK64
    codes = capi.encode(f, master, Rounding.stochastic, Overflow.saturate, seed=mixed,
                        stream=param)
    return capi.decode(f, codes)


@pytest.mark.parametrize("rule", ["rne", "sr", "ef"])
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3", "e2m1"])
def test_rules_match_their_definition(capi, rule, fmt):
    seed = 0xC0FFEE
    exporter = ce.Exporter(rule, fmt, seed=seed)
    assert (exporter.rule, exporter.format, exporter.seed) == (rule, fmt, seed)
    master = state_dict(1)
    rng = np.random.default_rng(2)
    error = {p: np.zeros_like(v) for p, v in enumerate(master.values())}
    for step in range(4):
        served = exporter.export(master)
        assert exporter.next_step == step + 1
        assert list(served) == list(master)
        for p, (name, x) in enumerate(master.items()):
            want = reference_served(capi, rule, fmt, x, p, step, seed, error)
            assert served[name].dtype == np.float32 and served[name].shape == x.shape
            np.testing.assert_array_equal(bits32(served[name]), bits32(want),
                                          err_msg=f"{rule} {fmt} step {step} {name}")
        # a small optimizer step (well below half a served ulp for most weights)
        master = {k: (v + 1e-4 * rng.standard_normal(v.shape)).astype(np.float32)
                  for k, v in master.items()}
    assert exporter.names == list(master)
    if rule == "ef":
        assert exporter.keeps_state
        for p, name in enumerate(master):
            if master[name].ndim == 2:
                np.testing.assert_array_equal(bits32(exporter.error(name)), bits32(error[p]))
            else:
                assert exporter.error(name) is None
        assert set(exporter.state()) == {"embed.weight", "proj.weight"}
    else:
        assert not exporter.keeps_state and exporter.state() == {}


def test_explicit_step_and_codes_output(capi):
    master = state_dict(3)
    a = ce.Exporter("sr", "bf16", seed=9)
    b = ce.Exporter("sr", "bf16", seed=9)
    s5 = a.export(master, step=5)
    assert a.next_step == 6
    codes = b.export(master, step=5, output="codes")
    w = codes["proj.weight"]
    assert w.dtype == np.uint16
    # bf16 codes as ml_dtypes.bfloat16: a view, the same values as the float32 output
    np.testing.assert_array_equal(w.view(ml_dtypes.bfloat16).astype(np.float32),
                                  s5["proj.weight"])
    assert codes["norm.weight"].dtype == np.float32  # 1-D: served in fp32
    e4 = ce.Exporter("rne", "e4m3").export(master, output="codes")["embed.weight"]
    assert e4.dtype == np.uint8
    np.testing.assert_array_equal(
        e4.view(ml_dtypes.float8_e4m3fn).astype(np.float32),
        capi.decode(Format.e4m3, capi.encode(Format.e4m3, master["embed.weight"])))


def test_out_dict_is_written_in_place():
    master = state_dict(4)
    served = {k: np.empty_like(v) for k, v in master.items()}
    result = ce.Exporter("rne", "bf16").export(master, out=served)
    for k in master:
        assert result[k] is served[k]
    np.testing.assert_array_equal(served["norm.weight"], master["norm.weight"])
    with pytest.raises(ValueError, match="out= has no entry 'proj.weight'"):
        ce.Exporter("rne").export(master, out={"embed.weight": served["embed.weight"],
                                               "norm.weight": served["norm.weight"]})


def test_ef_state_restores_bit_identically():
    rng = np.random.default_rng(6)
    steps = [{"w": (0.1 * rng.standard_normal((12, 12))).astype(np.float32)} for _ in range(6)]
    whole = ce.Exporter("ef", "e4m3")
    first = ce.Exporter("ef", "e4m3")
    for s in steps[:3]:
        whole.export(s)
        first.export(s)
    resumed = ce.Exporter("ef", "e4m3")
    resumed.load_state(first.state())
    for s in steps[3:]:
        np.testing.assert_array_equal(bits32(whole.export(s)["w"]),
                                      bits32(resumed.export(s)["w"]))
    with pytest.raises(concord.InputError, match="keeps no state"):
        ce.Exporter("rne").load_state({"w": np.zeros((12, 12), np.float32)})


def test_small_updates_reach_the_served_copy_under_sr_only():
    """Fair Cast's point: an update of 1/8 of a bf16 ulp is invisible to rne (the served copy
    moves only once the master crosses half an ulp) while sr moves each weight with probability
    1/8, so the served copy realizes the update on average. 4096 weights at 1.0 (ulp 2^-7): the
    number moved under sr is binomial(4096, 1/8), mean 512, sd 21.2; the 6-sd bound fails with
    probability below 1e-8."""
    ulp = 2.0 ** -7
    master = np.full((64, 64), 1.0 + ulp / 8, np.float32)
    rne = ce.Exporter("rne", "bf16").export({"w": master})["w"]
    sr = ce.Exporter("sr", "bf16", seed=1).export({"w": master})["w"]
    assert np.all(rne == 1.0)
    moved = int(np.count_nonzero(sr != 1.0))
    assert np.all(sr[sr != 1.0] == np.float32(1.0 + ulp))
    assert abs(moved - 512) < 6 * 21.2


def test_errors():
    with pytest.raises(ValueError, match=r"unknown export rule 'stochastic' \(rne, sr, ef\)"):
        ce.Exporter("stochastic")
    with pytest.raises(ValueError, match="unknown format 'bfloat16'"):
        ce.Exporter("rne", "bfloat16")
    e = ce.Exporter("rne")
    with pytest.raises(TypeError, match=r"argument 'state\['w'\]': expected a float32 array, "
                                        r"got float64"):
        e.export({"w": np.zeros((2, 2))})
    e.export({"w": np.zeros((2, 2), np.float32)})
    with pytest.raises(ValueError, match=r"tensor 'w' has shape \(3, 2\), but was exported "
                                         r"before with shape \(2, 2\)"):
        e.export({"w": np.zeros((3, 2), np.float32)})
    with pytest.raises(ValueError, match="unknown output 'bf16'"):
        e.export({"w": np.zeros((2, 2), np.float32)}, output="bf16")
    with pytest.raises(ValueError, match="no tensor 'v' was exported"):
        e.error("v")
