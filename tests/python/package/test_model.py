"""concord.Model / concord.Engine against the CLI on the same model and settings:

* Model.forward's logits equal, bit for bit, the rows `concord contract dump` writes for the same
  sequences (SmolLM2 under 'native', a tiny model under fp32, bf16, mxfp8);
* Engine.generate equals `concord generate` (its streamed text; with --json its tokens and
  log-probs; greedy and sampled with top-k/top-p/min-p and a seed); token_logprobs of prompt + completion equals the logprobs generate reported
  (model/logprob.h's one definition), and the log-softmax of forward's logits to ~1 ulp;
* encode/decode equal `concord tokenize`;
* state_dict() views the model's own memory (data pointers; a write changes the logits);
* errors: a missing file, a token outside the vocabulary, float tokens — concord's messages;
* Model.load and Engine.generate release the GIL.
"""

import json
import os
import subprocess

import numpy as np
import pytest

import concord
import tiny_model
from concord import contract as cc
from concord.model import Engine, Model

PROMPT = "The capital of France is"


def smollm2():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return subprocess.run([os.path.join(root, "scripts", "smollm2-path")], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def smol_path():
    return smollm2()


@pytest.fixture(scope="module")
def smol(smol_path):
    return Model.load(smol_path)  # policy "native", as `concord generate`'s default


def cli(*args, expect_rc=0, stdin=None):
    r = subprocess.run([os.environ["CONCORD_BIN"], *map(str, args)], capture_output=True, text=True,
                       timeout=120, input=stdin)
    assert r.returncode == expect_rc, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_model.write(str(tmp_path_factory.mktemp("model") / "tiny"))


# SmolLM2 as stored (W4A8), and the tiny model under presets (SmolLM2 dequantized to fp32 would
# cost seconds for the same check).
@pytest.mark.parametrize("which,policy", [("smol", "native"), ("tiny", "fp32"), ("tiny", "bf16"),
                                          ("tiny", "mxfp8")])
def test_forward_equals_the_cli_dump(tmp_path, smol_path, tiny_path, which, policy):
    path = smol_path if which == "smol" else tiny_path
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPT + "\nOnce upon a time\n")
    dump = tmp_path / "d.npy"
    cli("contract", "dump", "--model", path, "--kernel", policy, "--complete-with", policy,
        "--prompts", prompts, "--max-new", "5", "--quiet", "--out", dump)
    logits, rows = cc.load_dump(str(dump))
    m = Model.load(path, policy)
    assert m.policy == policy
    for s in sorted(set(rows["sequence"])):
        at = np.where(rows["sequence"] == s)[0]
        tokens = np.append(rows["token"][at], rows["next"][at[-1]]).astype(np.int32)
        z = m.forward(tokens)
        assert z.shape == (len(tokens), m.vocab_size) and z.dtype == np.float32
        np.testing.assert_array_equal(z[:-1].view(np.uint32), logits[at].view(np.uint32))
    # a batch (B, T) gives each row's logits as alone
    both = np.stack([tokens[:4], tokens[1:5]])
    zb = m.forward(both)
    assert zb.shape == (2, 4, m.vocab_size)
    np.testing.assert_array_equal(zb[0].view(np.uint32), m.forward(tokens[:4]).view(np.uint32))


@pytest.mark.parametrize("settings", [
    {"temperature": 0.0},
    {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 3},
    {"temperature": 1.2, "seed": 11},
])
def test_generate_equals_concord_generate(smol, smol_path, settings):
    flags = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p", "seed": "--seed"}
    args = [a for k, v in settings.items() for a in (flags[k], v)]
    out = cli("generate", "--model", smol_path, "--prompt", PROMPT, "--max-tokens", 12, *args).stdout
    engine = Engine(smol, max_sequences=3, max_context=256)
    c = engine.generate(PROMPT, max_tokens=12, **settings)
    assert c.text == out[:-1]  # the streamed text; the CLI ends with a newline
    assert c.prompt == smol.encode(PROMPT)
    # --json: the same tokens and log-probs (JSON doubles round-trip exactly), and --echo's
    # prompt log-probs are token_logprobs' first values
    j = json.loads(cli("generate", "--model", smol_path, "--prompt", PROMPT, "--max-tokens", 12, "--json",
                       "--echo", *args).stdout)
    assert (j["prompt_tokens"], j["tokens"], j["logprobs"], j["text"]) == (c.prompt, c.tokens, c.logprobs, c.text)
    assert j["finish_reason"] == c.finish_reason
    assert len(c.tokens) == len(c.logprobs) and c.finish_reason in ("length", "stop")
    # the same request in a batch of three gives the same completion
    batch = engine.generate([PROMPT, "Once upon a time", c.prompt], max_tokens=12, **settings)
    assert [b.tokens for b in (batch[0], batch[2])] == [c.tokens, c.tokens]
    assert batch[0].logprobs == c.logprobs
    # the log-probs of the sampled tokens: the engine's definition, scoring prompt + completion
    t = settings["temperature"]
    scored = engine.token_logprobs(c.prompt + c.tokens, temperature=t)
    assert scored.dtype == np.float64 and scored.shape == (len(c.prompt) + len(c.tokens) - 1,)
    np.testing.assert_array_equal(scored[len(c.prompt) - 1:], np.array(c.logprobs))
    assert list(scored[:len(c.prompt) - 1]) == j["prompt_logprobs"]
    # and what log_softmax(logits / T) of the forward pass gives, in fp64
    temperature = float(np.float32(t)) if t > 0 else 1.0  # the engine's float temperature, widened
    z = smol.forward(c.prompt + c.tokens).astype(np.float64) / temperature
    zmax = z.max(axis=1, keepdims=True)
    lp = (z - zmax) - np.log(np.exp(z - zmax).sum(axis=1, keepdims=True))
    want = lp[np.arange(len(scored)), np.array(c.prompt + c.tokens)[1:]]
    np.testing.assert_allclose(scored, want, rtol=0, atol=1e-9)


def test_tokenizer_equals_concord_tokenize(smol, smol_path):
    text = "Hello, world! Ünïcödé and <|im_start|> tokens."
    plain = [int(t) for t in cli("tokenize", "--tokenizer", smol_path, stdin=text).stdout.split()]
    assert smol.encode(text, bos=False) == plain
    added = [int(t) for t in cli("tokenize", "--tokenizer", smol_path, "--add-special", stdin=text).stdout.split()]
    assert smol.encode(text) == added
    decoded = cli("tokenize", "--tokenizer", smol_path, "--decode", stdin=" ".join(map(str, plain))).stdout
    assert smol.decode(plain) == decoded
    assert smol.decode(plain, skip_special=True) == text.replace("<|im_start|>", "")
    assert smol.stop_token_ids and smol.vocab_size == smol.config["vocab_size"]


def test_state_dict_views_the_model(tmp_path):
    m = Model.load(tiny_model.write(str(tmp_path / "tiny")), "fp32")
    sd = m.state_dict()
    assert list(sd) == list(tiny_model.tensors(0))
    for name, want in tiny_model.tensors(0).items():
        np.testing.assert_array_equal(sd[name], want)
    again = m.state_dict()
    ptr = lambda a: a.__array_interface__["data"][0]  # noqa: E731
    assert all(ptr(sd[k]) == ptr(again[k]) for k in sd)  # the same memory each time: the model's
    before = m.forward([1, 2, 3])
    sd["model.norm.weight"][:] *= 2  # written in place, seen after weights_changed()
    m.weights_changed()
    after = m.forward([1, 2, 3])
    assert not np.array_equal(before, after)
    z = m.forward([1, 2, 3])
    assert not z.flags.owndata and z.base is not None  # owns the C++ buffer through a capsule


def test_errors_carry_concords_messages(tmp_path, smol):
    missing = str(tmp_path / "none.gguf")
    r = cli("generate", "--model", missing, "--prompt", "x", expect_rc=2)
    with pytest.raises(concord.InputError) as e:
        Model.load(missing)
    assert "concord: " + str(e.value) == r.stderr.strip()
    with pytest.raises(concord.InputError, match=r"token id 49152 outside the vocabulary \[0, 49152\)"):
        smol.forward([1, 49152])
    with pytest.raises(TypeError, match=r"argument 'tokens': expected a int32 or int64 array, got float32"):
        smol.forward(np.array([1.0, 2.0], np.float32))
    engine = Engine(smol)
    with pytest.raises(concord.InputError, match=r"\[sampling\]"):
        engine.generate(PROMPT, max_tokens=2, top_p=1.5)
    with pytest.raises(concord.InputError, match="need at least two tokens"):
        engine.token_logprobs([5])
    with pytest.raises(concord.InputError, match="policy"):
        Model.load(smollm2(), "no-such-policy")


def test_long_calls_release_the_gil(smol, smol_path):
    """While a thread is inside Model.load / Engine.generate, this thread keeps running Python:
    its longest stall stays well under the call's length (a GIL held through the call stalls it
    for all of it; the margin leaves room for the OS descheduling it on a loaded machine)."""
    import threading
    import time

    def stall_while(fn):
        t = threading.Thread(target=fn)
        start = last = time.perf_counter()
        gap = 0.0
        t.start()
        while t.is_alive():
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        t.join()
        return gap, time.perf_counter() - start

    gap, total = stall_while(lambda: Model.load(smol_path, "fp32"))
    assert total > 0.2 and gap < 0.6 * total, (gap, total)
    engine = Engine(smol, max_sequences=1, max_context=256)
    gap, total = stall_while(lambda: engine.generate(PROMPT, max_tokens=96, temperature=0))
    assert total > 0.2 and gap < 0.6 * total, (gap, total)
