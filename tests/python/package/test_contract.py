"""concord.contract against `concord contract` on the same logits: measure() on arrays,
measure_dumps() and the CLI's measurement.json agree number for number (JSON doubles compared
exactly), fit() equals the CLI's contract.json, check() its check.json (passing and failing);
dumps written from Python read back bit for bit; one row's divergence against an fp64 NumPy
reference; the bounds against their formulas; bad input raises concord's own messages."""

import json
import math
import os
import subprocess

import numpy as np
import pytest

import concord
from concord import contract as cc


def logits_pair(rows=60, vocab=40, seed=0, noise=1e-3):
    """Reference logits and a candidate with a small perturbation (its osc grows with position,
    so late positions are the worst), plus the rows' identities: 3 sequences of 20 positions."""
    rng = np.random.default_rng(seed)
    ref = (3.0 * rng.standard_normal((rows, vocab))).astype(np.float32)
    position = np.tile(np.arange(20), rows // 20)
    scale = noise * (1 + position[:, None] / 4.0)
    cand = (ref + scale * rng.standard_normal((rows, vocab))).astype(np.float32)
    fields = {
        "sequence": np.repeat(np.arange(rows // 20), 20),
        "position": position,
        "prompt_length": np.repeat([5, 12, 30], 20)[:rows],
        "token": rng.integers(0, vocab, rows),
        "next": rng.integers(0, vocab, rows),
        "task": ["add"] * 20 + [""] * (rows - 20),
        "label": ["x"] * 10 + [""] * (rows - 10),
    }
    return ref, cand, fields


def cli(*args, expect_rc=0):
    binary = os.environ["CONCORD_BIN"]
    r = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == expect_rc, r.stdout + r.stderr
    return r


def read_json(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("ext", [".npy", ".safetensors"])
def test_measure_fit_check_equal_the_cli(tmp_path, ext):
    ref, cand, fields = logits_pair()
    a, b = str(tmp_path / f"ref{ext}"), str(tmp_path / f"cand{ext}")
    cc.save_dump(a, ref, **fields)
    cc.save_dump(b, cand, **fields)

    cli("contract", "measure", "--ref", a, "--cand", b, "--position-edges", "8,16", "--out", tmp_path / "m")
    slices = {"position_edges": [8, 16]}
    from_arrays = cc.measure(ref, cand, slices=slices, ref=a, cand=b, **fields)
    from_dumps = cc.measure_dumps(a, b, slices=slices)
    want = read_json(tmp_path / "m" / "measurement.json")
    assert from_arrays.to_dict() == want
    assert from_dumps.to_dict() == want
    assert {"all", "position:[16,inf)", "task:add", "label:x", "prompt_len:[16,64)"} <= set(from_arrays.slices)
    assert from_arrays.rows == ref.shape[0] and from_arrays.vocab == ref.shape[1]
    assert from_arrays["all"] == want["slices"][0]
    osc = from_arrays.osc("all")
    assert osc.dtype == np.float64 and osc.shape == (ref.shape[0],) and np.all(np.diff(osc) >= 0)
    assert osc[-1] == want["slices"][0]["osc"]["max"]

    contract = cc.fit(from_arrays)
    assert contract.to_dict() == read_json(tmp_path / "m" / "contract.json")

    # the same candidate passes its fitted contract; a candidate 10x further off fails it
    verdict = cc.check(str(tmp_path / "m" / "contract.json"), from_arrays)
    assert verdict.passed and bool(verdict) and verdict.violations == []
    worse = (ref + 10 * (cand - ref)).astype(np.float32)
    c = str(tmp_path / f"worse{ext}")
    cc.save_dump(c, worse, **fields)
    r = cli("contract", "check", "--contract", tmp_path / "m" / "contract.json", "--ref", a, "--cand", c,
            "--position-edges", "8,16", "--out", tmp_path / "c", expect_rc=1)
    assert "FAIL" in r.stdout
    worse_m = cc.measure(ref, worse, slices=slices, ref=a, cand=c, **fields)
    bad = cc.check(contract, worse_m)
    assert not bad.passed and bad.violations
    got, want = bad.to_dict(), read_json(tmp_path / "c" / "check.json")  # the CLI adds its inputs
    assert got == {k: want[k] for k in got}
    assert want["measurement"] == worse_m.to_dict()
    # the contract given as its dict, or as a Contract loaded back, gives the same verdict
    assert cc.check(contract.to_dict(), from_arrays).to_dict() == verdict.to_dict()
    saved = str(tmp_path / "again.json")
    contract.save(saved)
    assert cc.Contract.load(saved).to_dict() == contract.to_dict()


def test_dump_round_trip_and_defaults(tmp_path):
    ref, _, fields = logits_pair(rows=20, vocab=7)
    path = str(tmp_path / "d.safetensors")
    cc.save_dump(path, ref, **fields)
    logits, rows = cc.load_dump(path)
    assert logits.dtype == np.float32
    np.testing.assert_array_equal(logits.view(np.uint32), ref.view(np.uint32))
    for k in ("sequence", "position", "prompt_length", "token", "next"):
        np.testing.assert_array_equal(rows[k], fields[k])
    assert rows["task"] == fields["task"] and rows["label"] == fields["label"]
    # without row fields: the dump defaults (sequence = row index, position 0, no tokens)
    plain = str(tmp_path / "p.npy")
    cc.save_dump(plain, ref)
    _, rows = cc.load_dump(plain)
    np.testing.assert_array_equal(rows["sequence"], np.arange(20))
    assert set(rows["position"]) == {0} and set(rows["next"]) == {-1}


def test_float64_logits_are_compared_in_fp64():
    ref, cand, _ = logits_pair(rows=20, vocab=16)
    m64 = cc.measure(ref.astype(np.float64), cand.astype(np.float64))
    m32 = cc.measure(ref, cand)
    # fp32 inputs are widened exactly, so both paths see the same differences
    assert m64["all"]["osc"]["max"] == m32["all"]["osc"]["max"]


def test_row_divergence_against_numpy_fp64():
    rng = np.random.default_rng(5)
    ref = rng.standard_normal(50).astype(np.float32)
    cand = (ref + 0.01 * rng.standard_normal(50)).astype(np.float32)
    d = cc.row_divergence(ref, cand, token=7)
    delta = ref.astype(np.float64) - cand.astype(np.float64)
    assert d["osc"] == delta.max() - delta.min()  # differences of fp32 values are exact in fp64
    assert d["linf"] == np.abs(delta).max()
    lp_a = ref - np.log(np.sum(np.exp(ref.astype(np.float64) - ref.max()))) - ref.max()
    lp_b = cand - np.log(np.sum(np.exp(cand.astype(np.float64) - cand.max()))) - cand.max()
    pa, pb = np.exp(lp_a), np.exp(lp_b)
    assert d["tv"] == pytest.approx(0.5 * np.abs(pa - pb).sum(), rel=1e-9)
    assert d["kl"] == pytest.approx(np.sum(pa * (lp_a - lp_b)), rel=1e-7)
    assert d["dlogp_token"] == pytest.approx(lp_a[7] - lp_b[7], rel=1e-9)
    assert d["top_ref"] == int(np.argmax(ref)) and d["top_cand"] == int(np.argmax(cand))
    # the guarantees hold on this row
    assert d["max_abs_dlogp"] <= cc.logp_bound(d["osc"])
    assert d["tv"] <= cc.tv_bound(d["osc"]) and d["kl"] <= cc.kl_bound(d["osc"])


def test_bounds_are_their_formulas():
    for eps in (0.0, 1e-4, 0.3, 2.0):
        assert cc.tv_bound(eps) == pytest.approx(math.tanh(eps / 4), rel=1e-15, abs=0)
        assert cc.kl_bound(eps) == pytest.approx(min(eps * eps / 8, eps * math.tanh(eps / 4)), rel=1e-15, abs=0)
        assert cc.logp_bound(eps) == eps
        lo, hi = cc.ratio_bounds(eps)
        assert lo == pytest.approx(math.exp(-eps)) and hi == pytest.approx(math.exp(eps))
        assert cc.tis_safe_truncation(eps) == pytest.approx(math.exp(eps))
    eps = np.array([0.1, 0.2, 0.05])
    assert cc.sequence_tv_bound(eps) == pytest.approx(1 - np.prod(1 - np.tanh(eps / 4)), rel=1e-12)
    assert cc.reward_drift_bound(0.0, 2.0, 0.1) == pytest.approx(0.2)
    assert cc.policy_gradient_bias_bound(3.0, 0.1) == pytest.approx(0.6)
    assert cc.greedy_stable(0.5, 0.1) and not cc.greedy_stable(0.1, 0.5)


def test_errors_name_the_problem(tmp_path):
    ref, cand, _ = logits_pair(rows=20, vocab=8)
    with pytest.raises(ValueError, match=r"ref_logits has shape \(20, 8\) but cand_logits \(20, 7\)"):
        cc.measure(ref, cand[:, :7].copy())
    with pytest.raises(TypeError, match=r"argument 'ref_logits': expected a float32 or float64 array, got float16"):
        cc.measure(ref.astype(np.float16), cand.astype(np.float16))
    with pytest.raises(TypeError, match=r"argument 'cand_logits': expected a float32 array, got float64"):
        cc.measure(ref, cand.astype(np.float64))
    with pytest.raises(ValueError, match=r"expected a C-contiguous array"):
        cc.measure(ref, np.asfortranarray(cand))
    with pytest.raises(ValueError, match=r"argument 'next': 3 entries for 20 rows"):
        cc.measure(ref, cand, next=[1, 2, 3])
    with pytest.raises(ValueError, match=r"slices: unknown key 'edges'"):
        cc.measure(ref, cand, slices={"edges": [1]})
    nan = cand.copy()
    nan[3, 2] = np.nan
    with pytest.raises(concord.InputError, match=r"\[audit\] row_divergence: the candidate row holds nan"):
        cc.measure(ref, nan)
    # a missing dump: the CLI's own message (without its "concord: " prefix)
    missing = str(tmp_path / "missing.npy")
    cc.save_dump(str(tmp_path / "b.npy"), cand)
    r = cli("contract", "measure", "--ref", missing, "--cand", tmp_path / "b.npy", "--out", tmp_path / "o",
            expect_rc=2)
    with pytest.raises(concord.InputError) as e:
        cc.measure_dumps(missing, str(tmp_path / "b.npy"))
    assert "concord: " + str(e.value) == r.stderr.strip()
    with pytest.raises(concord.InputError):
        cc.Contract.load(str(tmp_path / "nothing.json"))
    with pytest.raises(TypeError, match="expected a Contract"):
        cc.check(3, cc.measure(ref, cand))


def test_docs_example_contract_check(tmp_path, monkeypatch, capsys):
    """docs/python.md's contract check on logits from another engine, run as written: the
    reference dumped by `concord contract dump` (fp32) from a tiny model, "another engine" the
    same model under the bf16 policy teacher-forced on the dump's tokens; its fitted contract
    passes it and fails a candidate 8x further off, naming the slices."""
    import tiny_model
    from concord.model import Model

    folder = tiny_model.write(str(tmp_path / "tiny"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.txt").write_text("Q: 12+30=\nAnd it came to pass\nthe king went up\n")
    cli("contract", "dump", "--model", folder, "--kernel", "fp32", "--prompts", "prompts.txt", "--max-new", "24",
        "--quiet", "--out", "reference.npy")
    other = Model.load(folder, "bf16")

    def other_engine_logits(rows):
        out = []
        for s in sorted(set(rows["sequence"])):
            at = np.where(rows["sequence"] == s)[0]
            tokens = np.append(rows["token"][at], rows["next"][at[-1]]).astype(np.int32)
            out.append(other.forward(tokens)[:-1])
        return np.concatenate(out)

    ref, rows = cc.load_dump("reference.npy")
    cc.fit(cc.measure(ref, other_engine_logits(rows), **rows)).save("contract.json")
    code = tiny_model.docs_example("contract-check")
    exec(code, {"other_engine_logits": other_engine_logits})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and float(out[0].split()[0]) > 0  # osc max of bf16 vs fp32, within its contract

    def worse_engine(rows):
        cand = other_engine_logits(rows)
        return (ref + 8 * (cand - ref)).astype(np.float32)

    exec(code, {"other_engine_logits": worse_engine})
    out = capsys.readouterr().out.splitlines()
    assert len(out) >= 2 and any(line.startswith("all: osc") for line in out[1:]), out
