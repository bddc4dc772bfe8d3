"""`concord serve` speaks the OpenAI API (issue 17, "Conformance"): driven by the official
`openai` Python client and by curl, on SmolLM2-135M-Instruct (native policy), every result is
compared token for token with `concord generate --json` on the same settings (serve_spec.md
part 4): prompt tokens, generated tokens, their log-probs (and top log-probs) to 1e-9, text,
finish_reason and usage counts. Completions and chat, streaming and not, echo, stop strings
(across token boundaries), seeds (same seed -> same text, choice i of n uses seed s + i).

Token ids come back through vLLM's `return_tokens_as_token_ids` request field (docs/serve.md):
each token string in `logprobs` reads "token_id:<id>". One server for the whole module.
"""

import json
import subprocess

import openai
import pytest

from serve_fixture import Server, concord_bin, generate_json, smollm2_path, sse_events

PROMPT = "The three primary colors are"
CHAT = "What is 2+2? Answer with just the number."  # greedy: 8 tokens, then <|im_end|> (stop)
IDS = {"return_tokens_as_token_ids": True}
TOL = 1e-9


@pytest.fixture(scope="module")
def model():
    return smollm2_path()


@pytest.fixture(scope="module")
def server(model):
    srv = Server(concord_bin(), model, "--max-sequences", "4", "--policy", "native")
    yield srv
    rc = srv.stop()
    assert rc == 0, f"concord serve exited with {rc} on SIGTERM:\n{srv.log()}"


@pytest.fixture(scope="module")
def name(server):
    """The served model id (the ready line's; a request naming another model gets 404)."""
    return server.model_name


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0,
                      timeout=120)
    yield c
    c.close()  # its idle keep-alive connections would hold the server's exit for their timeout


_refs = {}


@pytest.fixture(scope="module")
def ref(model):
    """generate_json with the module's model, memoized."""

    def get(prompt, **kw):
        key = (prompt, json.dumps(kw, sort_keys=True))
        if key not in _refs:
            _refs[key] = generate_json(concord_bin(), model, prompt, **kw)
        return _refs[key]

    return get


def token_ids(strings):
    out = []
    for s in strings:
        assert s.startswith("token_id:"), f"token {s!r} is not 'token_id:<id>'"
        out.append(int(s[len("token_id:"):]))
    return out


def assert_close(got, want, what):
    assert len(got) == len(want), f"{what}: {len(got)} values, generate has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g is not None and abs(g - w) <= TOL * max(1.0, abs(w)), f"{what}[{i}]: {g!r} != {w!r}"


def assert_top_equal(got_dicts, want_lists, what):
    """Completions' top_logprobs (one {"token_id:N": lp} per token) against generate's
    [[id, lp], ...] lists."""
    assert len(got_dicts) == len(want_lists), what
    for i, (g, w) in enumerate(zip(got_dicts, want_lists)):
        got = sorted((token_ids([k])[0], v) for k, v in g.items())
        want = sorted((t, lp) for t, lp in w)
        assert [t for t, _ in got] == [t for t, _ in want], f"{what}[{i}]: ids {got} != {want}"
        assert_close([v for _, v in got], [v for _, v in want], f"{what}[{i}]")


def assert_completion_matches(choice, want, what, top=0):
    """A completions choice (openai object) with logprobs as token ids against generate --json."""
    lp = choice.logprobs
    assert token_ids(lp.tokens) == want["tokens"], what
    assert_close(lp.token_logprobs, want["logprobs"], what + " logprobs")
    if top:
        assert_top_equal(lp.top_logprobs, want["top_logprobs"], what + " top_logprobs")
    assert choice.text == want["text"], what
    assert choice.finish_reason == want["finish_reason"], what


def test_health_and_models(server, client):
    status, _, body = server.request("GET", "/health")
    assert status == 200, body
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == server.model_name
    assert models[0].object == "model"


def test_completion_greedy_matches_generate(client, ref, name):
    want = ref(PROMPT, max_tokens=12, top_logprobs=3)
    r = client.completions.create(model=name, prompt=PROMPT, max_tokens=12, temperature=0,
                                  logprobs=3, extra_body=IDS)
    assert r.object == "text_completion" and len(r.choices) == 1 and r.choices[0].index == 0
    assert_completion_matches(r.choices[0], want, "greedy completion", top=3)
    assert r.usage.prompt_tokens == len(want["prompt_tokens"])
    assert r.usage.completion_tokens == len(want["tokens"])
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # The same prompt given as token ids.
    r = client.completions.create(model=name, prompt=want["prompt_tokens"], max_tokens=12,
                                  temperature=0, logprobs=3, extra_body=IDS)
    assert_completion_matches(r.choices[0], want, "prompt as token ids", top=3)


def test_completion_default_max_tokens_is_16(client, ref, name):
    want = ref(PROMPT, max_tokens=16)
    r = client.completions.create(model=name, prompt=PROMPT, temperature=0, logprobs=0,
                                  extra_body=IDS)
    assert_completion_matches(r.choices[0], want, "default max_tokens")
    assert want["finish_reason"] == "length" and r.usage.completion_tokens == 16


def test_completion_echo_returns_prompt_logprobs(client, ref, name):
    want = ref(PROMPT, max_tokens=8, echo=True)
    r = client.completions.create(model=name, prompt=PROMPT, max_tokens=8, temperature=0,
                                  echo=True, logprobs=0, extra_body=IDS)
    c = r.choices[0]
    assert token_ids(c.logprobs.tokens) == want["prompt_tokens"] + want["tokens"]
    # OpenAI: the first prompt token has no log-prob (nothing conditions it).
    assert c.logprobs.token_logprobs[0] is None
    assert_close(c.logprobs.token_logprobs[1:], want["prompt_logprobs"] + want["logprobs"],
                 "echo logprobs")
    assert c.text == PROMPT + want["text"]
    assert r.usage.prompt_tokens == len(want["prompt_tokens"])
    assert r.usage.completion_tokens == len(want["tokens"])


def test_echo_scores_a_prompt_without_generating(client, ref, name):
    want = ref(PROMPT, max_tokens=1, echo=True, top_logprobs=2)
    r = client.completions.create(model=name, prompt=PROMPT, max_tokens=0, temperature=0,
                                  echo=True, logprobs=2, extra_body=IDS)
    c = r.choices[0]
    assert token_ids(c.logprobs.tokens) == want["prompt_tokens"] and c.text == PROMPT
    assert c.logprobs.token_logprobs[0] is None
    assert_close(c.logprobs.token_logprobs[1:], want["prompt_logprobs"], "prompt scores")
    assert_top_equal(c.logprobs.top_logprobs[1:], want["prompt_top_logprobs"], "prompt top")
    assert r.usage.completion_tokens == 0


def test_completion_stream_matches_generate(client, ref, name):
    want = ref(PROMPT, max_tokens=12, top_logprobs=2)
    stream = client.completions.create(model=name, prompt=PROMPT, max_tokens=12, temperature=0,
                                       logprobs=2, stream=True, extra_body=IDS,
                                       stream_options={"include_usage": True})
    text, tokens, lps, tops, finish, usage = "", [], [], [], [], []
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == [], "the usage chunk has no choices"
            usage.append(chunk.usage)
        for c in chunk.choices:
            assert c.index == 0
            text += c.text
            if c.logprobs is not None:
                tokens += token_ids(c.logprobs.tokens)
                lps += c.logprobs.token_logprobs
                tops += c.logprobs.top_logprobs
            if c.finish_reason is not None:
                finish.append(c.finish_reason)
    assert tokens == want["tokens"]
    assert_close(lps, want["logprobs"], "streamed logprobs")
    assert_top_equal(tops, want["top_logprobs"], "streamed top_logprobs")
    assert text == want["text"] and finish == [want["finish_reason"]]
    assert len(usage) == 1 and usage[0].completion_tokens == len(want["tokens"])
    assert usage[0].prompt_tokens == len(want["prompt_tokens"])


def test_seeded_sampling_matches_and_reproduces(client, ref, name):
    kw = dict(temperature=0.9, top_p=0.95)
    want = ref(PROMPT, max_tokens=16, seed=7, top_k=40, **kw)
    calls = [client.completions.create(model=name, prompt=PROMPT, max_tokens=16, seed=7,
                                       logprobs=0, extra_body={**IDS, "top_k": 40}, **kw)
             for _ in range(2)]
    for r in calls:
        assert_completion_matches(r.choices[0], want, "seed 7")
    # Different seeds: 4 texts of 16 tokens at T=0.9 are not all equal (the first token alone
    # has several candidates above 5%; a false failure needs every seed to draw the same 16).
    texts = {client.completions.create(model=name, prompt=PROMPT, max_tokens=16, seed=s,
                                       temperature=1.0).choices[0].text for s in range(100, 104)}
    assert len(texts) >= 2, texts


def test_n_choices_use_seed_plus_index(client, ref, name):
    r = client.completions.create(model=name, prompt=PROMPT, max_tokens=10, n=3, seed=11,
                                  temperature=1.0, logprobs=0, extra_body=IDS)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    total = 0
    for c in r.choices:
        want = ref(PROMPT, max_tokens=10, seed=11 + c.index, temperature=1.0)
        assert_completion_matches(c, want, f"choice {c.index}")
        total += len(want["tokens"])
    assert r.usage.completion_tokens == total
    assert r.usage.prompt_tokens == len(ref(PROMPT, max_tokens=10, seed=11, temperature=1.0)["prompt_tokens"])


def test_n_choices_streamed(client, ref, name):
    stream = client.completions.create(model=name, prompt=PROMPT, max_tokens=8, n=2, seed=5,
                                       temperature=1.0, stream=True, logprobs=0, extra_body=IDS)
    text, tokens, finish = ["", ""], [[], []], [[], []]
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.text
            if c.logprobs is not None:
                tokens[c.index] += token_ids(c.logprobs.tokens)
            if c.finish_reason is not None:
                finish[c.index].append(c.finish_reason)
    for i in range(2):
        want = ref(PROMPT, max_tokens=8, seed=5 + i, temperature=1.0)
        assert (tokens[i], text[i], finish[i]) == (want["tokens"], want["text"], [want["finish_reason"]])


def test_stop_strings_across_token_boundaries(client, ref, name):
    full = ref(PROMPT, max_tokens=24)
    # Token strings (no ids) give the boundaries: a stop string made of the last two characters of
    # one token and the first two of the next crosses a boundary by construction.
    r = client.completions.create(model=name, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=0)
    pieces = r.choices[0].logprobs.tokens
    assert "".join(pieces) == full["text"], "ASCII prompt: token strings concatenate to the text"
    stop, offset = None, 0
    for a, b in zip(pieces, pieces[1:]):
        offset += len(a)
        cand = full["text"][offset - 2:offset + 2]
        if len(a) >= 2 and len(b) >= 2 and full["text"].find(cand) == offset - 2 and offset > 4:
            stop = cand
            break
    assert stop is not None, f"no boundary-crossing stop string in {pieces}"
    want = ref(PROMPT, max_tokens=24, stop=[stop])
    assert want["finish_reason"] == "stop" and want["text"] == full["text"][:full["text"].index(stop)]
    assert want["tokens"] == full["tokens"][:len(want["tokens"])]
    for stream in (False, True):
        kw = dict(model=name, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=0,
                  stop=[stop, "never-appears-zz"], extra_body=IDS)
        if not stream:
            assert_completion_matches(client.completions.create(**kw).choices[0], want,
                                      f"stop {stop!r}")
        else:
            text, tokens, finish = "", [], None
            for chunk in client.completions.create(stream=True, **kw):
                for c in chunk.choices:
                    text += c.text
                    tokens += token_ids(c.logprobs.tokens) if c.logprobs else []
                    finish = c.finish_reason or finish
            assert (tokens, text, finish) == (want["tokens"], want["text"], "stop")
    # A stop string that never occurs changes nothing.
    r = client.completions.create(model=name, prompt=PROMPT, max_tokens=24, temperature=0,
                                  logprobs=0, stop="never-appears-zz", extra_body=IDS)
    assert_completion_matches(r.choices[0], full, "absent stop string")


def assert_chat_matches(choice, want, what, top=0):
    content = choice.logprobs.content
    assert token_ids([t.token for t in content]) == want["tokens"], what
    assert_close([t.logprob for t in content], want["logprobs"], what + " logprobs")
    if top:
        for i, t in enumerate(content):
            got = [(token_ids([e.token])[0], e.logprob) for e in t.top_logprobs]
            assert [g[0] for g in got] == [w[0] for w in want["top_logprobs"][i]], f"{what} top[{i}]"
            assert_close([g[1] for g in got], [w[1] for w in want["top_logprobs"][i]], f"{what} top[{i}]")
    assert choice.message.role == "assistant"
    assert choice.message.content == want["text"], what
    assert choice.finish_reason == want["finish_reason"], what


def test_chat_matches_generate_chat(client, ref, name):
    want = ref(CHAT, max_tokens=24, chat=True, top_logprobs=2)
    assert want["finish_reason"] == "stop", "the prompt was chosen to end on the eos token"
    r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": CHAT}],
                                       max_tokens=24, temperature=0, logprobs=True, top_logprobs=2,
                                       extra_body=IDS)
    assert r.object == "chat.completion" and len(r.choices) == 1
    assert_chat_matches(r.choices[0], want, "chat", top=2)
    # The single user message renders exactly as `generate --chat --prompt` renders it.
    assert r.usage.prompt_tokens == len(want["prompt_tokens"])
    assert r.usage.completion_tokens == len(want["tokens"])


def test_chat_length_and_seeded_stream(client, ref, name):
    msg = [{"role": "user", "content": "Write a short poem about the sea."}]
    want = ref(msg[0]["content"], max_tokens=12, chat=True, temperature=0.8, seed=3)
    r = client.chat.completions.create(model=name, messages=msg, max_tokens=12, temperature=0.8,
                                       seed=3, logprobs=True, extra_body=IDS)
    assert_chat_matches(r.choices[0], want, "seeded chat")
    assert want["finish_reason"] == "length"
    text, tokens, finish, roles = "", [], [], []
    for chunk in client.chat.completions.create(model=name, messages=msg, max_tokens=12,
                                                temperature=0.8, seed=3, logprobs=True,
                                                stream=True, extra_body=IDS):
        assert chunk.object == "chat.completion.chunk"
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.delta.role:
                roles.append(c.delta.role)
            if c.logprobs is not None and c.logprobs.content:
                tokens += token_ids([t.token for t in c.logprobs.content])
            if c.finish_reason is not None:
                finish.append(c.finish_reason)
    assert roles == ["assistant"]
    assert (tokens, text, finish) == (want["tokens"], want["text"], ["length"])


def test_chat_n_choices(client, ref, name):
    msg = [{"role": "user", "content": "Name a color."}]
    r = client.chat.completions.create(model=name, messages=msg, max_tokens=8, n=2, seed=21,
                                       temperature=1.0, logprobs=True, extra_body=IDS)
    assert sorted(c.index for c in r.choices) == [0, 1]
    for c in r.choices:
        want = ref(msg[0]["content"], max_tokens=8, chat=True, temperature=1.0, seed=21 + c.index)
        assert_chat_matches(c, want, f"chat choice {c.index}")


def curl(server, path, body, stream=False):
    args = ["curl", "-sS", "--fail-with-body", "--max-time", "120", "-H",
            "Content-Type: application/json", "-d", json.dumps(body), server.base_url + path]
    if stream:
        args.insert(1, "-N")
    r = subprocess.run(args, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, f"curl: rc {r.returncode}: {r.stderr} {r.stdout}"
    return r.stdout


def test_curl_completions_and_chat(server, ref):
    want = ref(PROMPT, max_tokens=10, top_logprobs=1)
    out = json.loads(curl(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10,
                                                      "temperature": 0, "logprobs": 1, **IDS}))
    c = out["choices"][0]
    assert token_ids(c["logprobs"]["tokens"]) == want["tokens"] and c["text"] == want["text"]
    assert_close(c["logprobs"]["token_logprobs"], want["logprobs"], "curl logprobs")
    assert_top_equal(c["logprobs"]["top_logprobs"], want["top_logprobs"], "curl top_logprobs")
    assert out["usage"]["completion_tokens"] == len(want["tokens"])

    chat_want = ref(CHAT, max_tokens=16, chat=True)
    raw = curl(server, "/v1/chat/completions",
               {"messages": [{"role": "user", "content": CHAT}], "max_tokens": 16, "temperature": 0,
                "stream": True, "logprobs": True, **IDS}, stream=True)
    lines = [ln for ln in raw.split("\n") if ln.strip()]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    text, tokens, finish = "", [], None
    for ln in lines[:-1]:
        assert ln.startswith("data: "), ln
        for ch in json.loads(ln[6:])["choices"]:
            text += ch["delta"].get("content") or ""
            if ch.get("logprobs") and ch["logprobs"].get("content"):
                tokens += token_ids([t["token"] for t in ch["logprobs"]["content"]])
            finish = ch.get("finish_reason") or finish
    assert (tokens, text, finish) == (chat_want["tokens"], chat_want["text"], chat_want["finish_reason"])


def test_raw_sse_framing(server, ref):
    """The wire format itself: text/event-stream, `data: {json}` events, `data: [DONE]` last."""
    want = ref(PROMPT, max_tokens=6)
    conn = server.connection()
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True}),
        headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type", "").startswith("text/event-stream")
    text = "".join(c["text"] for e in sse_events(resp) for c in e["choices"])
    conn.close()
    assert text == want["text"]


def test_errors_are_openai_json(client, name):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=name, prompt=PROMPT, max_tokens=4, temperature=-1)
    err = e.value.body
    assert isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err), err
    assert "temperature" in err["message"] or err["param"] == "temperature", err
    # A request naming another model than the served one.
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model=name + "-not-this-one", prompt=PROMPT, max_tokens=2)
    assert e.value.body["code"] == "model_not_found", e.value.body


def test_metrics_count_a_request(server, client, name):
    """/metrics (Prometheus text) counts one request exactly: prompt tokens once, every
    generated token of every choice, one time-to-first-token sample, an inter-token sample per
    token after each choice's first."""
    before = server.metrics()
    r = client.completions.create(model=name, prompt=PROMPT, max_tokens=6, n=2, seed=1,
                                  temperature=1.0, logprobs=0, extra_body=IDS)
    after = server.metrics()
    lengths = [len(c.logprobs.tokens) for c in r.choices]

    def delta(key):
        return after.get(key, 0) - before.get(key, 0)

    assert delta("concord_generated_tokens_total") == sum(lengths) == r.usage.completion_tokens
    assert delta("concord_prompt_tokens_total") == r.usage.prompt_tokens
    assert delta("concord_time_to_first_token_seconds_count") == 1
    assert delta("concord_inter_token_latency_seconds_count") == sum(n - 1 for n in lengths)
    assert delta("concord_request_duration_seconds_count") == 1
    ok = [k for k in after if k.startswith("concord_requests_total{") and 'status="200"' in k
          and "completions" in k and "chat" not in k]
    assert len(ok) == 1 and delta(ok[0]) == 1, ok
    assert after["concord_running_sequences"] == 0 and after["concord_queue_length"] == 0
