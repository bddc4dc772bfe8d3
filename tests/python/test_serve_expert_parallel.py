"""`concord serve --expert-parallel` under mpirun (issue 23; docs/moe.md): rank 0 serves HTTP and
the other ranks mirror its engine step by step, each computing its share of every MoE layer's
experts. Against a one-process server on the committed tiny Qwen3-MoE GGUF: the same responses bit
for bit (texts, log-probabilities, finish reasons, usage) for concurrent requests — sampled and
greedy, n > 1, streamed, stop strings that cancel mid-batch, echo — at 2 and 3 ranks, each rank
holding only its experts' weights; weight updates are refused; SIGTERM to rank 0 drains it and
every rank exits 0.
"""

import json
import os
import threading

import pytest

from serve_fixture import ROOT, Server, concord_bin, sse_events

MOE = str(ROOT / "tests/golden/moe/tiny_qwen3moe.gguf")
MPIRUN_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "ASAN_OPTIONS": "detect_leaks=0"}


REQUESTS = [
    {"prompt": "And God said", "max_tokens": 12, "seed": 3, "logprobs": 2, "n": 2},
    {"prompt": "In the beginning", "max_tokens": 16, "temperature": 0, "logprobs": 1},
    {"prompt": "Let there be light", "max_tokens": 20, "seed": 9, "stop": ["e"], "n": 3},
    {"prompt": "And the earth was", "max_tokens": 8, "seed": 11, "stream": True},
    {"prompt": "without form, and void", "max_tokens": 4, "seed": 1, "echo": True, "logprobs": 1},
    {"prompt": "darkness", "max_tokens": 24, "seed": 5, "top_p": 0.9, "top_k": 20},
]


def answer(server, body):
    """The response of one request with what varies between servers (ids, times) removed."""
    if body.get("stream"):
        conn = server.connection()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        texts = {}
        reasons = {}
        for event in sse_events(conn.getresponse()):
            for c in event.get("choices", []):
                texts[c["index"]] = texts.get(c["index"], "") + (c.get("text") or "")
                if c.get("finish_reason"):
                    reasons[c["index"]] = c["finish_reason"]
        conn.close()
        return {"texts": texts, "reasons": reasons}
    status, d = server.post_json("/v1/completions", body)
    assert status == 200, d
    return {"choices": d["choices"], "usage": d["usage"]}


def answers_concurrently(server):
    out = [None] * len(REQUESTS)

    def one(i):
        out[i] = answer(server, REQUESTS[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


@pytest.mark.parametrize("ranks", [2, 3])
def test_expert_parallel_server_answers_as_one_process(ranks):
    binary = concord_bin()
    with Server(binary, MOE, "--max-sequences", 4) as plain:
        want = answers_concurrently(plain)
        assert plain.stop() == 0
    launcher = ["mpirun", "-np", str(ranks), "--oversubscribe", "--mca", "btl", "self,vader"]
    with Server(binary, MOE, "--max-sequences", 4, "--expert-parallel", launcher=launcher, env=MPIRUN_ENV) as ep:
        got = answers_concurrently(ep)
        # Once more one by one: other batches, the same bits.
        again = [answer(ep, body) for body in REQUESTS]
        status, data = ep.post_json("/v1/weights", {"version": 1, "path": "/nonexistent"})
        assert status == 409 and "expert-parallel" in json.dumps(data), data
        status, _, info = ep.request("GET", "/v1/weights")
        assert status == 200 and json.loads(info)["updatable"] is False, info
        # Each rank holds only its experts' weights (the tiny model's are fp32 values).
        assert f"expert parallel: {ranks} ranks; expert weights held per rank:" in ep.log(), ep.log()
        assert ep.stop() == 0, ep.log()
    for i, body in enumerate(REQUESTS):
        assert got[i] == want[i], (body, ep.log())
        assert again[i] == want[i], body
