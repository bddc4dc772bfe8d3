"""concord.sync.Pusher against a real `concord serve` process (POST/GET /v1/weights): a pushed
version serves what a model loaded from the same weights serves (content hashes, greedy text);
shared memory and the request body; a refused update names its check and leaves the old version
serving; sr export across pushes; the example script examples/push_weights.py end to end."""

import os
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

import concord
import tiny_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from serve_fixture import Server, concord_bin, smollm2_path  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.fixture()
def server(tmp_path):
    folder = tiny_model.write(str(tmp_path / "tiny"), seed=0)
    s = Server(concord_bin(), folder, "--policy", "bf16", "--weights-faults")
    yield s
    s.stop()


def complete(server, prompt="hello", max_tokens=16):
    status, body = server.post_json("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert status == 200, body
    return body


def test_a_pushed_version_serves_what_the_same_weights_loaded_serve(server, tmp_path):
    url = f"http://127.0.0.1:{server.port}"
    info = concord.sync.served_weights(url)
    assert info["version"] == 0 and info["policy"] == "bf16"
    pusher = concord.sync.Pusher(url)  # config and policy from the server
    assert pusher.publisher.served_format == "bf16"
    new = tiny_model.tensors(seed=1)
    answer = pusher.push(new, version=1)
    assert answer["applied"] and answer["version"] == 1
    assert [c["check"] for c in answer["report"]["checks"]] == [
        "version", "manifest", "precision_plan", "derived_state", "scale_sanity", "content", "probe"]

    # Independent: the same values (rounded to bf16 as rne exports them) written to a folder and
    # loaded by concord.Model give the hashes the server now reports, and the server's greedy text
    # is what `concord serve` on that folder gives.
    exported = concord.export.Exporter("rne", "bf16").export(new)
    folder = tiny_model.write(str(tmp_path / "reference"), seed=0)
    save_file({k: np.ascontiguousarray(v) for k, v in exported.items()}, os.path.join(folder, "model.safetensors"))
    reference = concord.Model.load(folder, "bf16")
    assert concord.sync.served_weights(url)["content"] == reference.content_hashes()
    served_text = complete(server)
    assert served_text["weights_version"] == 1
    alone = Server(concord_bin(), folder, "--policy", "bf16")
    try:
        assert complete(alone)["choices"][0]["text"] == served_text["choices"][0]["text"]
    finally:
        alone.stop()


def test_body_transport_sr_export_and_refusals(server):
    url = f"http://127.0.0.1:{server.port}"
    shm = concord.sync.Pusher(url, rule="sr", seed=3)
    body = concord.sync.Pusher(url, via="body")
    shm.push(tiny_model.tensors(seed=1), version=1)
    body.push(tiny_model.tensors(seed=2), version=2)
    assert concord.sync.served_weights(url)["version"] == 2
    before = complete(server)["choices"][0]["text"]
    # Not newer: check 1. A sampler-side fault: its check. The old version keeps serving.
    with pytest.raises(concord.sync.PushError) as e:
        body.push(tiny_model.tensors(seed=3), version=2)
    assert e.value.status == 409 and e.value.check == 1
    with pytest.raises(concord.sync.PushError) as e:  # learner side: in the payload
        shm.push(tiny_model.tensors(seed=3), version=3, fault="flipped_bit")
    assert e.value.check == 4 and str(e.value).startswith("[sync] check 4 content: ")
    with pytest.raises(concord.sync.PushError) as e:  # learner side: the probe sees it
        shm.push(tiny_model.tensors(seed=4), version=3, fault="stale_weights")  # seed 3's sent
    assert e.value.check == 7
    with pytest.raises(concord.sync.PushError) as e:  # sampler side: the server applies it
        shm.push(tiny_model.tensors(seed=5), version=3, fault="overwritten_codes")
    assert e.value.check == 4 and "changed after the copy was built" in str(e.value)
    with pytest.raises(concord.sync.PushError) as e:
        body.push(tiny_model.tensors(seed=6), version=3, fault="stale_derived")
    assert e.value.check == 5 and "stale copy" in str(e.value)
    assert concord.sync.served_weights(url)["version"] == 2
    assert complete(server)["choices"][0]["text"] == before


def test_a_state_dict_that_does_not_fit_is_refused_before_sending(server):
    pusher = concord.sync.Pusher(f"http://127.0.0.1:{server.port}")
    t = tiny_model.tensors(seed=1)
    del t["model.norm.weight"]
    with pytest.raises(concord.InputError, match="has no 'model.norm.weight'"):
        pusher.push(t, version=1)
    t = tiny_model.tensors(seed=1)
    t["model.norm.weight"] = np.ones(3, np.float32)
    with pytest.raises(concord.InputError, match="'model.norm.weight': shape"):
        pusher.push(t, version=1)
    t = tiny_model.tensors(seed=1)
    t["extra.weight"] = np.ones(3, np.float32)
    with pytest.raises(concord.InputError, match="'extra.weight' is not a tensor of this model"):
        pusher.push(t, version=1)
    assert concord.sync.served_weights(f"http://127.0.0.1:{server.port}")["version"] == 0


def test_a_gguf_served_native_is_not_updatable():
    with Server(concord_bin(), smollm2_path()) as native:  # --policy native: the file's blocks
        url = f"http://127.0.0.1:{native.port}"
        info = concord.sync.served_weights(url)
        assert info["updatable"] is False and "--policy native" in info["reason"]
        status, body = native.post_json("/v1/weights", {"version": 1, "path": "/nonexistent"})
        assert status == 409 and body["error"]["code"] == "not_updatable", body
