"""concord.sync on pairs of state dicts against the RL loop's checks (rl/sync.h):

* content hashes equal, bit for bit, the ones the C++ learner publishes (Model.content_hashes:
  the model's own prepared GEMM operands, hashed by the function WeightPublisher calls) for
  every quantized preset, whether the Python side quantizes a float tensor with the plan's
  format or is handed the codes (numerics.quantize);
* each fault the RL loop injects, staged on state dicts, is caught by the same check with the
  same message text — the strings tests/rl/sync_test.cpp expects of WeightReceiver where the
  fault is the same (the sampler's tensor without a learner tensor, a dtype that differs, a
  weight kept in high precision by one side only);
* clean pairs pass every check; verify() raises SyncError (a ValueError) with the message.
"""

import ml_dtypes
import numpy as np
import pytest

import concord
import tiny_model
from concord import numerics as cn
from concord import sync as cs
from concord.model import Model

UP = "model.layers.0.mlp.up_proj.weight"
GATE = "model.layers.0.mlp.gate_proj.weight"
DOWN = "model.layers.1.mlp.down_proj.weight"
V_PROJ = "model.layers.0.self_attn.v_proj.weight"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_model.write(str(tmp_path_factory.mktemp("sync") / "tiny"))


@pytest.fixture()
def learner():
    return tiny_model.tensors(0)


@pytest.mark.parametrize("preset", ["mxfp8", "nvfp4", "fp8-tensor", "mxfp4", "bf16", "fp32"])
def test_content_hashes_equal_the_learners_published_hashes(folder, preset):
    values = Model.load(folder, "fp32")
    plan = values.precision_plan(preset)
    served = Model.load(folder, preset)  # the same values, its kernels reading them per the preset
    assert served.precision_plan() == plan
    want = served.content_hashes()  # the C++ learner's concord.sync.content
    state = values.state_dict()
    got = cs.content_hashes(state, plan)
    assert list(want) == [w["name"] for w in plan["weights"]]
    assert {k: got[k] for k in want} == want
    # handed the codes instead: numerics.quantize with the plan's format gives the same hashes
    for w in plan["weights"]:
        if w["b"] != "f32":
            q = cn.quantize(state[w["name"]], w["b"])
            assert cs.content_hash(q) == want[w["name"]], w["name"]


def test_content_hash_definition_unquantized(learner):
    # an unquantized tensor: XXH3-64 of its float32 values; bf16 values widened first (exact)
    w = learner[UP]
    b = w.astype(ml_dtypes.bfloat16)
    assert cs.content_hash(b) == cs.content_hash(b.astype(np.float32))
    assert cs.content_hash(w) != cs.content_hash(b)
    flipped = w.copy()
    flipped.view(np.uint32)[5, 7] ^= 1  # one bit of one value
    assert cs.content_hash(flipped) != cs.content_hash(w)
    assert cs.content_hash(np.arange(6, dtype=np.int64)) != cs.content_hash(np.arange(6, dtype=np.int32))


def test_clean_pairs_pass_every_check(folder, learner):
    plan = Model.load(folder, "fp32").precision_plan("mxfp8")
    results = cs.verify(learner, dict(learner), plan=plan)
    assert [(r.check, r.id, r.ok, r.message) for r in results] == [
        ("manifest", 2, True, ""), ("precision_plan", 3, True, ""), ("scale_sanity", 6, True, ""),
        ("content", 4, True, "")]
    # a sampler holding the weights quantized as planned (the codes its kernels read)
    sampler = dict(learner)
    for w in plan["weights"]:
        sampler[w["name"]] = cn.quantize(learner[w["name"]], w["b"])
    learner_sent = dict(learner)
    for w in plan["weights"]:
        learner_sent[w["name"]] = cn.quantize(learner[w["name"]], w["b"])
    assert all(cs.check(learner_sent, sampler, plan=plan))
    # a float learner against the quantized sampler: hashed as the plan quantizes it
    assert cs.check_content(learner, sampler, plan=plan).ok
    assert cs.check_scales(sampler, learner).ok


def message(result):
    assert not result.ok
    return result.message


def test_manifest_faults(learner):
    sampler = dict(learner)
    del sampler[UP]  # dropped_tensor
    assert message(cs.check_manifest(learner, sampler)) == (
        f"[sync] check 2 manifest: {UP}: the sampler has no tensor of that name")
    # the sampler's tensor without a learner tensor (sync_test.cpp: ManifestNamesASamplerTensor...)
    assert message(cs.check_manifest(sampler, learner)) == (
        f"[sync] check 2 manifest: {UP}: the sampler's tensor has no learner tensor")
    # transposed (not square): the shapes
    sampler = dict(learner, **{UP: learner[UP].T.copy()})
    assert message(cs.check_manifest(learner, sampler)) == (
        f"[sync] check 2 manifest: {UP}: learner shape [128, 64] != sampler shape [64, 128]")
    # a dtype that differs (sync_test.cpp's text for the embedding served in BF16)
    sampler = dict(learner, **{"model.embed_tokens.weight": learner["model.embed_tokens.weight"].astype(ml_dtypes.bfloat16)})
    assert message(cs.check_manifest(learner, sampler)) == (
        "[sync] check 2 manifest: model.embed_tokens.weight: learner dtype F32 != the sampler's served dtype BF16")
    assert cs.manifest({"w": learner[UP]}) == [{"name": "w", "shape": [128, 64], "dtype": "F32"}]
    q = cn.quantize(learner[UP], "mxfp8-e4m3")  # listed as the values it was quantized from
    assert cs.manifest({"w": q}) == [{"name": "w", "shape": [128, 64], "dtype": "F32"}]


def test_content_faults(folder, learner):
    # swapped_tensors: two same-shape tensors exchanged; the manifest cannot see it
    sampler = dict(learner, **{GATE: learner[UP], UP: learner[GATE]})
    assert cs.check_manifest(learner, sampler).ok
    got = message(cs.check_content(learner, sampler))
    assert got == (f"[sync] check 4 content: {GATE} values hash {cs.content_hash(learner[UP])} "
                   f"!= learner {cs.content_hash(learner[GATE])}")
    # flipped_bit: the sign of v_proj's largest weight
    flipped = learner[V_PROJ].copy()
    flipped.reshape(-1)[np.argmax(np.abs(flipped))] *= -1
    sampler = dict(learner, **{V_PROJ: flipped})
    assert message(cs.check_content(learner, sampler)).startswith(f"[sync] check 4 content: {V_PROJ} values hash 0x")
    # wrong_rounding: the sampler's quantizer rounds toward zero, not as the plan declares
    plan = Model.load(folder, "fp32").precision_plan("mxfp8")
    b = next(w["b"] for w in plan["weights"] if w["name"] == DOWN)
    sampler = dict(learner, **{DOWN: cn.quantize(learner[DOWN], b, rounding="rtz")})
    assert cs.check_precision_plan(plan, cs.sampler_plan(plan, sampler)).ok is False  # its desc differs
    results = cs.check(learner, sampler, plan=plan, sampler_plan=plan)  # told the plan is the same
    assert [r.check for r in results] == ["manifest", "precision_plan", "scale_sanity", "content"]
    assert message(results[-1]).startswith(f"[sync] check 4 content: {DOWN} codes/scales hash 0x")
    # a sampler that hashes fewer tensors than the learner sent
    assert message(cs.check_content(learner, {k: v for k, v in learner.items() if k != UP})) == (
        "[sync] check 4 content: the learner hashed 21 weights, the sampler's kernels read 20")


def test_scale_faults(learner):
    q = cn.quantize(learner[DOWN], "mxfp8-e4m3")
    scales = q.scales.copy()
    scales[0, 0] = 0  # zeroed_scales: the e8m0 placeholder 2^-127 on a block with values
    zeroed = cn.QuantizedArray.from_arrays(q.desc, q.shape, q.packed, scales.reshape(-1), q.tensor_scale)
    assert message(cs.check_scales({DOWN: zeroed})) == (
        f"[sync] check 6 scale_sanity: {DOWN} ({q.desc.to_string()}): block (0, 0) has a placeholder "
        "2^-127 scale but nonzero elements")
    scales[0, 0] = 0xFF
    nan = cn.QuantizedArray.from_arrays(q.desc, q.shape, q.packed, scales.reshape(-1), q.tensor_scale)
    assert "block (0, 0) has the invalid scale code 0xff (NaN)" in message(cs.check_scales({DOWN: nan}))
    # wrong_tensor_scale: NVFP4's tensor scale doubled; only the values' amax reveals it
    n = cn.quantize(learner[DOWN], "nvfp4")
    doubled = cn.QuantizedArray.from_arrays(n.desc, n.shape, n.packed, n.scales.reshape(-1), 2 * n.tensor_scale)
    assert cs.check_scales({DOWN: doubled}).ok  # positive and finite: fine without the values
    got = message(cs.check_scales({DOWN: doubled}, learner))
    assert got.startswith(f"[sync] check 6 scale_sanity: {DOWN} ({n.desc.to_string()}): tensor scale ")
    assert ", the one the staged values' amax " in got
    f8 = cn.quantize(learner[DOWN], "fp8-tensor")
    zero = cn.QuantizedArray.from_arrays(f8.desc, f8.shape, f8.packed, f8.scales.reshape(-1), 0.0)
    assert message(cs.check_scales({DOWN: zero})).endswith("tensor scale 0 is not a positive finite number")
    for desc in ("mxfp8-e4m3", "mxfp4", "nvfp4", "fp8-tensor"):
        assert cs.check_scales({DOWN: cn.quantize(learner[DOWN], desc)}, learner).ok, desc


def test_precision_plan_faults(folder, learner):
    m = Model.load(folder, "fp32")
    plan = m.precision_plan("mxfp8")
    assert cs.check_precision_plan(plan, m.precision_plan("mxfp8")).ok
    # a weight the learner keeps in high precision, the sampler not (sync_test.cpp's wording)
    high = m.precision_plan("fp32")
    got = message(cs.check_precision_plan(high, plan))
    assert got.startswith("[sync] check 3 precision_plan: model.layers.0.self_attn.q_proj.weight: the "
                          "learner keeps it in high precision")
    # the sampler holds a weight in another format than planned
    sampler = dict(learner, **{DOWN: cn.quantize(learner[DOWN], "mxfp4")})
    results = cs.check(learner, sampler, plan=plan)
    assert results[-1].check == "precision_plan"
    assert message(results[-1]).startswith(f"[sync] check 3 precision_plan: {DOWN}: forward formats differ: ")
    # norms served in bf16 where the plan keeps them in f32
    sampler = dict(learner, **{"model.norm.weight": learner["model.norm.weight"].astype(ml_dtypes.bfloat16)})
    derived = cs.sampler_plan(plan, sampler)
    assert message(cs.check_precision_plan(plan, derived)) == (
        "[sync] check 3 precision_plan: norms: learner f32, sampler bf16")
    # a router the plan keeps in f32 (added by the user), served in bf16
    router = "model.layers.0.mlp.router.weight"
    with_router = dict(plan, weights=plan["weights"] + [{"name": router, "a": "f32", "b": "f32", "high": True}])
    sampler = {router: np.zeros((4, 64), ml_dtypes.bfloat16)}
    assert message(cs.check_precision_plan(with_router, cs.sampler_plan(with_router, sampler))) == (
        f"[sync] check 3 precision_plan: {router}: forward formats differ: learner a f32, b f32; "
        "sampler a f32, b bf16")
    assert cs.check_precision_plan(with_router, cs.sampler_plan(with_router, {router: np.zeros((4, 64), np.float32)})).ok
    with pytest.raises(concord.InputError, match=r"\[sync\] learner plan: not a precision plan"):
        cs.check_precision_plan({"norms": "f32"}, plan)


def test_verify_raises_with_the_message(learner):
    sampler = dict(learner)
    del sampler[UP]
    with pytest.raises(cs.SyncError) as e:
        cs.verify(learner, sampler)
    assert isinstance(e.value, ValueError)
    assert str(e.value) == f"[sync] check 2 manifest: {UP}: the sampler has no tensor of that name"
    assert e.value.result.check == "manifest" and [r.check for r in e.value.results] == ["manifest"]


def test_errors(learner):
    with pytest.raises(TypeError, match="dtype complex64 has no safetensors name"):
        cs.manifest({"w": np.zeros(3, np.complex64)})
    with pytest.raises(ValueError, match="expected a C-contiguous array"):
        cs.content_hash(learner[UP].T)
    with pytest.raises(concord.InputError):
        cs.content_hash(learner[UP], "no-such-format")


def test_torch_tensors_where_torch_is_installed(learner):
    torch = pytest.importorskip("torch")
    as_torch = {k: torch.from_numpy(v) for k, v in learner.items()}
    assert cs.content_hashes(as_torch) == cs.content_hashes(learner)
    bf16 = {k: v.to(torch.bfloat16) for k, v in as_torch.items()}
    assert cs.manifest(bf16)[0]["dtype"] == "BF16"
    assert cs.verify(bf16, dict(bf16))


def test_docs_example_export_and_verify(capsys):
    """docs/python.md's PyTorch loop, run as written with NumPy arrays for the torch tensors: the
    sampler's copy is corrupted once (a bit flipped in transit at step 2), verify() names it with
    the RL loop's message, the re-sent copy passes."""
    rng = np.random.default_rng(4)
    master = tiny_model.tensors(1)

    class Model:
        def state_dict(self):
            return master

    def train_step(model):  # an optimizer step: small updates, most below half a bf16 ulp
        for v in master.values():
            v += (1e-4 * rng.standard_normal(v.shape)).astype(np.float32)

    sampler, pulls = {}, []

    def push_to_sampler(served):
        sampler.clear()
        sampler.update({k: v.copy() for k, v in served.items()})

    def pull_from_sampler():
        pulls.append(1)
        held = dict(sampler)
        if len(pulls) == 3:  # step 2's first pull: one flipped bit
            bad = held[V_PROJ].copy()
            bad.view(np.uint32)[0, 0] ^= 1 << 20
            held[V_PROJ] = bad
        return held

    import concord as concord_module
    namespace = {"steps": 4, "model": Model(), "train_step": train_step, "push_to_sampler": push_to_sampler,
                 "pull_from_sampler": pull_from_sampler, "concord": concord_module}
    exec(tiny_model.docs_example("export-verify"), namespace)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"step 2: [sync] check 4 content: {V_PROJ} values hash 0x"), out
    assert len(pulls) == 4
    # the last served copy is on the bf16 grid and what the sampler holds
    served = namespace["served"]
    w = served[UP]
    np.testing.assert_array_equal(w, w.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert cs.verify(served, sampler)
