"""Logit dumps against the formats' own writers and readers (NumPy, safetensors; PyPI).

(1) Dumps written by numpy.save (.npy 1.0, float32), numpy.lib.format.write_array (.npy 2.0,
    float64) and safetensors.numpy.save_file (the documented tensor names and metadata, F32, F64
    and BF16 logits) go through `concord contract measure --ref A --cand B --out DIR`; the "all"
    slice of DIR/measurement.json (and the margin and task slices) must match the same
    statistics computed here in NumPy float64, written from their definitions (bounds.h,
    contract.h): osc, ‖Δ‖∞, max |Δ log p|, TV, KL, greedy flips, nearest-rank osc quantiles.
(2) Dumps written by `concord contract dump` load in NumPy and safetensors with the expected
    layout (byte-identical to what numpy.save and safetensors.numpy.save_file write for the same
    arrays), row fields and values.
$CONCORD_BIN comes from ctest.
"""

import json
import math
import subprocess

import ml_dtypes
import numpy as np
import pytest
from numpy.lib import format as npy_format
from safetensors import safe_open
from safetensors.numpy import load_file, save, save_file

P, V = 48, 1000
TASKS = ["add", "mul"]


# ---- reference statistics, float64 -----------------------------------------------------------

def logsumexp(z):
    m = z.max()
    return m + math.log(np.exp(z - m).sum())


def row_stats(a, b):
    """One row's divergence, from the definitions in bounds.h (A = reference, B = candidate)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    d = a - b  # exact for float32 inputs of comparable magnitude
    la = a - logsumexp(a)
    pa = np.exp(la)
    pb = np.exp(b - logsumexp(b))
    # log p_A − log p_B = Δ − (lse_A − lse_B), and lse_A − lse_B = log Σ p_B e^Δ, computed
    # through log1p/expm1 so that tiny divergences keep their relative accuracy.
    lse_diff = math.log1p(float(np.sum(pb * np.expm1(d - d.max())))) + d.max()
    dlogp = d - lse_diff
    top_ref, top_cand = int(np.argmax(a)), int(np.argmax(b))  # lowest index on ties
    others = np.delete(a, top_ref)
    return {
        "osc": float(d.max() - d.min()),
        "linf": float(np.abs(d).max()),
        "max_abs_dlogp": float(np.abs(dlogp).max()),
        "tv": float(0.5 * np.sum(np.abs(pa * np.expm1(-dlogp)))),  # p_A − p_B = p_A(1 − e^−Δlogp)
        "kl": float(np.sum(pa * dlogp)),
        "flip": top_ref != top_cand,
        "margin": float(a[top_ref] - others.max()) if len(others) else math.inf,
    }


def nearest_rank(sorted_values, q):
    return sorted_values[math.ceil(q * len(sorted_values)) - 1]


def expected_slice(stats):
    osc = sorted(s["osc"] for s in stats)
    return {
        "rows": len(stats),
        "osc": {"p50": nearest_rank(osc, 0.5), "p90": nearest_rank(osc, 0.9),
                "p99": nearest_rank(osc, 0.99), "max": osc[-1]},
        "linf_max": max(s["linf"] for s in stats),
        "max_abs_dlogp": max(s["max_abs_dlogp"] for s in stats),
        "tv": {"mean": float(np.mean([s["tv"] for s in stats])), "max": max(s["tv"] for s in stats)},
        "kl": {"mean": float(np.mean([s["kl"] for s in stats])), "max": max(s["kl"] for s in stats)},
        "flips": sum(s["flip"] for s in stats),
    }


def assert_slice_matches(got, want, name):
    assert got["rows"] == want["rows"], name
    assert got["flips"] == want["flips"], name
    # osc and ‖Δ‖∞ are a max/min of exact differences: one rounding.
    for q in ("p50", "p90", "p99", "max"):
        assert got["osc"][q] == pytest.approx(want["osc"][q], rel=1e-12, abs=0), (name, q)
    assert got["linf_max"] == pytest.approx(want["linf_max"], rel=1e-12, abs=0), name
    # Through exp/log: a few ulp per term, so a relative slack far above that, with an absolute
    # floor for rows whose divergence is at the level of double rounding of log p (~1e-15).
    assert got["max_abs_dlogp"] == pytest.approx(want["max_abs_dlogp"], rel=1e-9, abs=1e-13), name
    for key in ("tv", "kl"):
        for agg in ("mean", "max"):
            assert got[key][agg] == pytest.approx(want[key][agg], rel=1e-7, abs=1e-13), (name, key, agg)


# ---- test data -------------------------------------------------------------------------------

def logits_pair():
    """Reference and candidate logits (P, V), float64: divergences from 0 to large, near-ties
    that flip, and per-row constant shifts (which move ‖Δ‖∞ but not osc)."""
    rng = np.random.default_rng(20260613)
    ref = 3.0 * rng.standard_normal((P, V))
    scales = [0.0, 1e-6, 1e-3, 3e-2, 0.3, 1.0]
    cand = ref.copy()
    for r in range(P):
        if r % 3 == 0:  # a near-tie at the top: small noise can flip the greedy token
            top = int(np.argmax(ref[r]))
            second = (top + 1 + int(rng.integers(V - 1))) % V
            ref[r, second] = ref[r, top] - 10.0 ** -rng.uniform(2, 5)
        cand[r] = ref[r] + scales[r % len(scales)] * rng.standard_normal(V) + rng.uniform(-2, 2)
    return ref, cand


def row_fields():
    rng = np.random.default_rng(7)
    sequence = np.arange(P, dtype=np.int64) // 8
    position = np.arange(P, dtype=np.int32) % 8
    token = rng.integers(0, V, size=P, dtype=np.int32)
    nxt = np.where(position < 7, np.roll(token, -1), -1).astype(np.int32)
    return {
        "sequence": sequence,
        "position": position,
        "prompt_length": np.full(P, 3, dtype=np.int32),
        "token": token,
        "next": nxt,
        "task": (sequence % 2).astype(np.int32),  # indices into TASKS
        "label": np.where(position >= 4, 0, -1).astype(np.int32),  # "late" or none
    }


def write_sidecar(path, fields):
    sidecar = {k: fields[k].tolist() for k in ("sequence", "position", "prompt_length", "token", "next")}
    sidecar["task"] = [TASKS[i] for i in fields["task"]]
    sidecar["label"] = ["late" if i >= 0 else "" for i in fields["label"]]
    with open(str(path) + ".rows.json", "w", encoding="utf-8") as f:
        json.dump(sidecar, f)


def write_npy(path, logits, fields, version=None):
    if version is None:
        np.save(path, logits)
    else:
        with open(path, "wb") as f:
            npy_format.write_array(f, logits, version=version)
    write_sidecar(path, fields)


def write_safetensors(path, logits, fields, i64=("sequence",)):
    tensors = {"logits": logits}
    for k, v in fields.items():
        tensors[k] = v.astype(np.int64 if k in i64 else np.int32)
    save_file(tensors, str(path), metadata={"concord.format": "logit-dump/1",
                                           "concord.tasks": json.dumps(TASKS),
                                           "concord.labels": json.dumps(["late"])})


def measure(concord_bin, ref, cand, out, rows=P, vocab=V):
    """`concord contract measure` on two dumps; its slices by name."""
    result = subprocess.run([concord_bin, "contract", "measure", "--ref", str(ref), "--cand", str(cand),
                             "--out", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with open(out / "measurement.json", encoding="utf-8") as f:
        m = json.load(f)
    assert m["format"] == "concord-measurement/1"
    assert m["vocab"] == vocab and m["rows"] == rows
    return {s["slice"]: s for s in m["slices"]}


CASES = {
    # name: (ref writer, cand writer); each gets (path stem, logits, fields).
    "npy-f4-v1": (("npy", np.float32, None), ("npy", np.float32, None)),
    "npy-f8-v2": (("npy", np.float64, (2, 0)), ("npy", np.float64, (2, 0))),
    "npy-f4-v3": (("npy", np.float32, (3, 0)), ("npy", np.float32, (1, 0))),
    "safetensors-f32": (("safetensors", np.float32, None), ("safetensors", np.float32, None)),
    "safetensors-f64-bf16": (("safetensors", np.float64, None),
                             ("safetensors", ml_dtypes.bfloat16, None)),
    "npy-f8-vs-safetensors-f32": (("npy", np.float64, None), ("safetensors", np.float32, None)),
}


def write_dump(tmp_path, name, spec, logits, fields):
    container, dtype, version = spec
    stored = logits.astype(dtype)
    path = tmp_path / f"{name}.{container}"
    if container == "npy":
        write_npy(path, stored, fields, version)
    else:
        # Row fields in I32 and I64 (both allowed); float64 dumps widen a few more of them.
        wide = ("sequence", "position", "token") if dtype == np.float64 else ("sequence",)
        write_safetensors(path, stored, fields, i64=wide)
    return path, stored.astype(np.float64)  # the values concord reads, exactly


@pytest.mark.parametrize("case", sorted(CASES))
def test_measure_dumps_written_by_numpy_and_safetensors(tmp_path, concord_bin, case):
    ref_logits, cand_logits = logits_pair()
    fields = row_fields()
    ref_spec, cand_spec = CASES[case]
    ref_path, ref_values = write_dump(tmp_path, "ref", ref_spec, ref_logits, fields)
    cand_path, cand_values = write_dump(tmp_path, "cand", cand_spec, cand_logits, fields)
    stats = [row_stats(ref_values[r], cand_values[r]) for r in range(P)]
    assert sum(s["flip"] for s in stats) > 0, "the data should make some greedy tokens flip"
    slices = measure(concord_bin, ref_path, cand_path, tmp_path / "out")
    assert_slice_matches(slices["all"], expected_slice(stats), "all")
    # The margin slices (decided_margin = 1 nat by default) and the task slices, by name.
    undecided = [s for s in stats if s["margin"] <= 1.0]
    decided = [s for s in stats if s["margin"] > 1.0]
    assert undecided and decided
    assert_slice_matches(slices["margin:undecided"], expected_slice(undecided), "margin:undecided")
    assert_slice_matches(slices["margin:decided"], expected_slice(decided), "margin:decided")
    for t, task in enumerate(TASKS):
        rows = [stats[r] for r in range(P) if fields["task"][r] == t]
        assert_slice_matches(slices["task:" + task], expected_slice(rows), "task:" + task)
    late = [stats[r] for r in range(P) if fields["label"][r] == 0]
    assert_slice_matches(slices["label:late"], expected_slice(late), "label:late")
    # Every guarantee held, and the predictor missed no flip.
    for s in slices.values():
        assert s["bound_violations"] == 0 and s["missed_flips"] == 0, s["slice"]


def test_measure_rejects_mismatched_and_corrupt_dumps(tmp_path, concord_bin):
    ref_logits, cand_logits = logits_pair()
    fields = row_fields()
    write_npy(tmp_path / "ref.npy", ref_logits.astype(np.float32), fields)
    np.save(tmp_path / "fortran.npy", np.asfortranarray(cand_logits.astype(np.float32)))
    np.save(tmp_path / "f2.npy", cand_logits.astype(np.float16))
    np.save(tmp_path / "rank3.npy", cand_logits.astype(np.float32).reshape(P, V, 1))
    np.save(tmp_path / "narrow.npy", cand_logits[:, :10].astype(np.float32))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "ref.npy").read_bytes()[:-3])
    cases = {
        "fortran.npy": "Fortran (column-major) order",
        "f2.npy": "dtype '<f2' is not supported",
        "rank3.npy": "a logit dump is 2-D",
        "cut.npy": "file truncated?",
    }
    for name, fragment in cases.items():
        result = subprocess.run([concord_bin, "contract", "measure", "--ref", str(tmp_path / "ref.npy"),
                                 "--cand", str(tmp_path / name), "--out", str(tmp_path / "o")],
                                capture_output=True, text=True)
        assert result.returncode == 2, (name, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0] and name in lines[0], (name, result.stderr)
    result = subprocess.run([concord_bin, "contract", "measure", "--ref", str(tmp_path / "ref.npy"),
                             "--cand", str(tmp_path / "narrow.npy"), "--out", str(tmp_path / "o")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


# ---- dumps written by concord ----------------------------------------------------------------

def split_safetensors(image):
    """(header length, header as JSON, data buffer) of a safetensors image."""
    n = int.from_bytes(image[:8], "little")
    return n, json.loads(image[8:8 + n]), image[8 + n:]


def train_micro_model(concord_bin, tmp_path):
    """A few steps of a one-layer model on a generated corpus (the recipe of tests/cli)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Q: {i}+{2 * i}=\nA: {3 * i}\n" for i in range(400)))
    config = {"name": "dump", "model": {
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 259, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 128},
        "data": {"corpus": str(corpus), "chunk": 256, "validation_fraction": 0.1},
        "train": {"batch_size": 2, "seq_len": 32, "steps": 4, "warmup_steps": 1},
        "eval": {"every": 4, "batches": 1}, "checkpoint": {"every": 4, "keep": 1},
        "out": str(tmp_path / "run")}
    (tmp_path / "train.json").write_text(json.dumps(config))
    result = subprocess.run([concord_bin, "train", "--config", str(tmp_path / "train.json"), "--quiet"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return tmp_path / "run" / "final"


def concord_dump(concord_bin, model, kernel, out):
    result = subprocess.run([concord_bin, "contract", "dump", "--model", str(model), "--kernel", kernel,
                             "--task", "add", "--count", "3", "--max-new", "6", "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_concord_written_dumps_load_in_numpy_and_safetensors(tmp_path, concord_bin):
    probe = subprocess.run([concord_bin, "contract", "dump", "--help"], capture_output=True, text=True)
    if probe.returncode != 0 or "--kernel" not in probe.stdout:
        pytest.skip("`concord contract dump` is not available in this build yet (remove this skip "
                    "once the CLI lands)")
    model = train_micro_model(concord_bin, tmp_path)
    concord_dump(concord_bin, model, "fp32", tmp_path / "fp32.npy")
    concord_dump(concord_bin, model, "fp32", tmp_path / "fp32.safetensors")
    concord_dump(concord_bin, model, "bf16", tmp_path / "bf16.npy")

    # .npy: float32 (P, V) in NumPy's own layout, byte for byte.
    logits = np.load(tmp_path / "fp32.npy")
    assert logits.dtype == np.float32 and logits.ndim == 2 and logits.flags.c_contiguous
    rows, vocab = logits.shape
    assert vocab == 259 and rows > 0 and np.all(np.isfinite(logits))
    with open(tmp_path / "resaved.npy", "wb") as f:
        np.save(f, logits)
    assert (tmp_path / "resaved.npy").read_bytes() == (tmp_path / "fp32.npy").read_bytes()
    with open(str(tmp_path / "fp32.npy") + ".rows.json", encoding="utf-8") as f:
        sidecar = json.load(f)
    assert sorted(sidecar) == sorted(["sequence", "position", "prompt_length", "token", "next",
                                      "task", "label"])
    assert all(len(v) == rows for v in sidecar.values())

    # .safetensors: the documented tensors, dtypes and metadata; the same rows and logits.
    st = load_file(str(tmp_path / "fp32.safetensors"))
    assert st["logits"].dtype == np.float32
    assert np.array_equal(st["logits"].view(np.uint32), logits.view(np.uint32))
    assert st["sequence"].dtype == np.int64
    for k in ("position", "prompt_length", "token", "next", "task", "label"):
        assert st[k].dtype == np.int32 and st[k].shape == (rows,), k
    with safe_open(str(tmp_path / "fp32.safetensors"), framework="np") as f:
        metadata = f.metadata()
    assert metadata["concord.format"] == "logit-dump/1"
    tasks, labels = json.loads(metadata["concord.tasks"]), json.loads(metadata["concord.labels"])
    assert tasks == ["add"] and labels == []
    assert np.all(st["task"] == 0) and np.all(st["label"] == -1)
    # The library's own layout for the same tensors: the same header (its metadata map has no
    # fixed key order, so headers compare as JSON) and the same data buffer, byte for byte.
    ours, theirs = split_safetensors((tmp_path / "fp32.safetensors").read_bytes()), \
        split_safetensors(save(st, metadata=metadata))
    assert ours == theirs
    for k in ("sequence", "position", "prompt_length", "token", "next"):
        assert st[k].tolist() == sidecar[k], k
    assert sidecar["task"] == ["add"] * rows and sidecar["label"] == [""] * rows

    # Row structure: each sequence's rows are positions 0..n-2, next = the following token,
    # and the completion (positions ≥ prompt_length − 1) is the greedy token where the
    # reference's top-1 margin leaves no doubt.
    for seq in np.unique(st["sequence"]):
        idx = np.flatnonzero(st["sequence"] == seq)
        assert st["position"][idx].tolist() == list(range(len(idx)))
        assert np.all(st["next"][idx[:-1]] == st["token"][idx[1:]])
        assert len(set(st["prompt_length"][idx].tolist())) == 1
        assert np.all((st["token"][idx] >= 0) & (st["token"][idx] < vocab))
        for r in idx:
            if st["position"][r] >= st["prompt_length"][r] - 1:
                top2 = np.sort(logits[r].astype(np.float64))[-2:]
                if top2[1] - top2[0] > 1e-3:
                    assert st["next"][r] == int(np.argmax(logits[r])), r

    # concord's own dumps through `contract measure`: identical kernels give osc 0; fp32 vs bf16
    # matches the float64 statistics computed here.
    same = measure(concord_bin, tmp_path / "fp32.npy", tmp_path / "fp32.safetensors",
                           tmp_path / "same", rows, vocab)["all"]
    assert same["osc"]["max"] == 0 and same["flips"] == 0 and same["kl"]["max"] == 0
    bf16 = np.load(tmp_path / "bf16.npy").astype(np.float64)
    stats = [row_stats(logits[r], bf16[r]) for r in range(rows)]
    got = measure(concord_bin, tmp_path / "fp32.npy", tmp_path / "bf16.npy", tmp_path / "cmp",
                          rows, vocab)["all"]
    assert got["osc"]["max"] > 0
    assert_slice_matches(got, expected_slice(stats), "all (fp32 vs bf16)")
