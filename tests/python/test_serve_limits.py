"""`concord serve` under bad input and at its limits (issue 17, "Limits and failure", "Bad input"):
every bad request gets the right 4xx as OpenAI-style JSON ({"error": {"message", "type", "param",
"code"}}) WHILE a long streaming request runs, and that stream still completes with exactly the
tokens `concord generate --json` gives for it (and was still running when the bad request was
answered). Also: 429 + Retry-After past --max-queue, 401 without / with a wrong bearer token,
prompt + max_tokens over the context (400), a 100 MB body (413, sent from a generator), slowloris
sockets (the server keeps serving; the read timeout closes them), more sockets trickling header
bytes than there are HTTP threads (--receive-timeout cuts them; others are still served), a
client that disconnects mid-stream frees its slot at once, --request-timeout (504, or an error
event in a stream), SIGTERM drains (the running stream completes, new requests get 503, exit
status 0). SmolLM2-135M-Instruct with small --max-sequences and short timeouts.
"""

import json
import socket
import threading
import time
from contextlib import contextmanager

import pytest

from serve_fixture import Server, concord_bin, generate_json, smollm2_path, sse_events

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
COUNT = "1, 2, 3, 4, 5,"  # greedy: counts on, never an eos within a few hundred tokens
READ_TIMEOUT = 1          # the servers' --read-timeout, seconds
CONTEXT = 8192            # SmolLM2's max_position_embeddings
LONG = 192                # tokens of the long stream every check runs beside (one reference run)


@pytest.fixture(scope="module")
def model():
    return smollm2_path()


@pytest.fixture(scope="module")
def server(model):
    """Two slots, one queued request at most, auth on, short read timeout."""
    srv = Server(concord_bin(), model, "--max-sequences", "2", "--max-queue", "1",
                 "--api-key", KEY, "--read-timeout", READ_TIMEOUT)
    yield srv
    assert srv.stop() == 0, srv.log()


_refs = {}


def reference(model, max_tokens, prompt=COUNT):
    key = (prompt, max_tokens)
    if key not in _refs:
        _refs[key] = generate_json(concord_bin(), model, prompt, max_tokens=max_tokens)
    return _refs[key]


class Stream(threading.Thread):
    """A streaming greedy completion read on its own thread: tokens, text, finish, times."""

    def __init__(self, srv, max_tokens, prompt=COUNT, headers=AUTH):
        super().__init__(daemon=True)
        self.srv, self.prompt, self.max_tokens, self.headers = srv, prompt, max_tokens, headers
        self.tokens, self.text, self.finish, self.error = [], "", None, None
        self.first = threading.Event()
        self.token_times = []
        self.t_done = None
        self.conn = None

    def run(self):
        try:
            self.conn = self.srv.connection()
            self.conn.request("POST", "/v1/completions", body=json.dumps(
                {"prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                 "stream": True, "logprobs": 0, "return_tokens_as_token_ids": True}),
                headers={"Content-Type": "application/json", **self.headers})
            resp = self.conn.getresponse()
            if resp.status != 200:
                raise AssertionError(f"stream: HTTP {resp.status}: {resp.read()[:500]!r}")
            for event in sse_events(resp):
                for c in event["choices"]:
                    self.text += c["text"]
                    if c.get("logprobs"):
                        self.tokens += [int(t.split(":")[1]) for t in c["logprobs"]["tokens"]]
                        self.token_times += [time.monotonic()] * len(c["logprobs"]["tokens"])
                        self.first.set()
                    self.finish = c.get("finish_reason") or self.finish
            self.t_done = time.monotonic()
        except Exception as e:  # reported by check()
            self.error = e
        finally:
            self.first.set()
            if self.conn is not None:
                self.conn.close()  # no idle keep-alive connection left behind

    def check(self, model, what):
        self.join(180)
        assert not self.is_alive(), f"{what}: the stream did not finish"
        assert self.error is None, f"{what}: the stream failed: {self.error!r}\n{self.srv.log()[-3000:]}"
        want = reference(model, self.max_tokens, self.prompt)
        assert self.tokens == want["tokens"], f"{what}: the stream's tokens differ from generate's"
        assert self.text == want["text"] and self.finish == want["finish_reason"], what


@contextmanager
def while_streaming(srv, model, what, max_tokens=None):
    """Runs the body while a long stream is in flight; the stream must then complete exactly as
    generate --json says, and must not have finished before the body did."""
    max_tokens = max_tokens or LONG
    s = Stream(srv, max_tokens)
    s.start()
    assert s.first.wait(120) and s.error is None, f"{what}: the stream did not start: {s.error!r}"
    yield s
    body_done = time.monotonic()
    s.check(model, what)
    assert s.t_done > body_done, (f"{what}: the stream ended before the bad input was answered "
                                  f"(make it longer than {max_tokens} tokens)")


def assert_error(status, headers, body, code, what, param=None):
    assert status == code, f"{what}: HTTP {status} (expected {code}): {body[:300]!r}"
    assert headers.get("content-type", "").startswith("application/json"), what
    err = json.loads(body)["error"]
    assert {"message", "type", "param", "code"} <= set(err), f"{what}: {err}"
    assert isinstance(err["message"], str) and err["message"], what
    if param is not None:
        assert err["param"] == param or param in err["message"], f"{what}: {err}"
    return err


BAD_BODIES = [
    # (what, body bytes, param named in the error or None)
    ("truncated JSON", b'{"prompt": "hi", "max_tokens": 4', None),
    ("not JSON", b"{prompt: hi}", None),
    ("empty body", b"", None),
    ("trailing garbage", b'{"prompt": "hi"} x', None),
    ("JSON array body", b"[1, 2]", None),
    ("JSON null body", b"null", None),
    ("invalid UTF-8 in a string", b'{"prompt": "caf\xe9", "max_tokens": 4}', None),
    ("overlong UTF-8", b'{"prompt": "\xc0\xaf", "max_tokens": 4}', None),
    ("UTF-8 surrogate", b'{"prompt": "\xed\xa0\x80", "max_tokens": 4}', None),
    ("prompt of the wrong type", b'{"prompt": {"text": "hi"}, "max_tokens": 4}', "prompt"),
    ("max_tokens as a string", b'{"prompt": "hi", "max_tokens": "4"}', "max_tokens"),
    ("max_tokens fractional", b'{"prompt": "hi", "max_tokens": 4.5}', "max_tokens"),
    ("temperature as a string", b'{"prompt": "hi", "temperature": "hot"}', "temperature"),
    ("stream as a string", b'{"prompt": "hi", "stream": "yes"}', "stream"),
    ("stop as a number", b'{"prompt": "hi", "stop": 5}', "stop"),
    ("echo as a number", b'{"prompt": "hi", "echo": 1}', "echo"),
    ("several prompts", b'{"prompt": ["a", "b"], "max_tokens": 2}', "prompt"),
    ("penalties", b'{"prompt": "hi", "presence_penalty": 0.5}', "presence_penalty"),
    ("echo + stream + logprobs", b'{"prompt": "hi", "echo": true, "stream": true, "logprobs": 1}', None),
    ("missing prompt", b'{"max_tokens": 4}', "prompt"),
    ("negative max_tokens", b'{"prompt": "hi", "max_tokens": -1}', "max_tokens"),
    ("huge max_tokens", b'{"prompt": "hi", "max_tokens": 1000000000000}', "max_tokens"),
    ("max_tokens 1e400", b'{"prompt": "hi", "max_tokens": 1e400}', None),
    ("negative temperature", b'{"prompt": "hi", "temperature": -1}', "temperature"),
    ("top_p above 1", b'{"prompt": "hi", "top_p": 2}', "top_p"),
    ("top_k below -1", b'{"prompt": "hi", "top_k": -2}', "top_k"),
    ("n zero", b'{"prompt": "hi", "n": 0}', "n"),
    ("huge n", b'{"prompt": "hi", "n": 100000}', "n"),
    ("negative seed", b'{"prompt": "hi", "seed": -1}', "seed"),
    ("seed past 2^64", b'{"prompt": "hi", "seed": 18446744073709551616}', "seed"),
    ("logprobs 21", b'{"prompt": "hi", "logprobs": 21}', "logprobs"),
    ("out-of-vocabulary prompt token", b'{"prompt": [1, 99999999], "max_tokens": 2}', "prompt"),
    ("empty stop string", b'{"prompt": "hi", "stop": [""]}', "stop"),
]

BAD_CHAT = [
    ("messages not a list", {"messages": "hi"}, "messages"),
    ("message without content", {"messages": [{"role": "user"}]}, "messages"),
    ("unknown role", {"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("a system message not first", {"messages": [{"role": "user", "content": "hi"},
                                                 {"role": "system", "content": "x"}]}, "messages"),
    ("tools", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
     "tools"),
    ("top_logprobs 21", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                         "top_logprobs": 21}, "top_logprobs"),
]


def test_bad_input_while_streaming(server, model):
    failures = []  # every case is tried; the test lists all that failed
    with while_streaming(server, model, "bad input"):
        for path, cases in (("/v1/completions", BAD_BODIES), ("/v1/chat/completions", BAD_CHAT)):
            for what, body, param in cases:
                if isinstance(body, dict):
                    body = {"max_tokens": 4, **body}
                status, headers, data = server.request("POST", path, body, AUTH)
                try:
                    assert_error(status, headers, data, 400, what, param)
                except AssertionError as e:
                    failures.append(str(e).split("\n")[0])
        # prompt + max_tokens over the context, and a prompt alone over it.
        status, headers, data = server.request(
            "POST", "/v1/completions", {"prompt": "hi", "max_tokens": CONTEXT}, AUTH)
        assert_error(status, headers, data, 400, "prompt + max_tokens over the context")
        status, headers, data = server.request(
            "POST", "/v1/completions", {"prompt": " a" * (CONTEXT + 100), "max_tokens": 1}, AUTH)
        assert_error(status, headers, data, 400, "prompt over the context")
        # Unknown fields are ignored (docs/serve.md): the request succeeds as without them.
        status, _, data = server.request(
            "POST", "/v1/completions",
            {"prompt": COUNT, "max_tokens": 4, "temperature": 0, "frobnicate": {"x": [1]}}, AUTH)
        assert status == 200, data
        assert json.loads(data)["choices"][0]["text"] == reference(model, 4)["text"]
        # Unknown paths and methods.
        status, headers, data = server.request("GET", "/v1/nothing-here", None, AUTH)
        assert status == 404, data
        status, headers, data = server.request("GET", "/v1/completions", None, AUTH)
        assert status in (404, 405), data
    assert not failures, "\n".join(failures)


def test_auth(server, model):
    with while_streaming(server, model, "auth"):
        body = {"prompt": "hi", "max_tokens": 2}
        for what, headers in (("no bearer token", {}),
                              ("wrong bearer token", {"Authorization": "Bearer nope"}),
                              ("not a bearer", {"Authorization": KEY})):
            for path in ("/v1/completions", "/v1/chat/completions"):
                status, h, data = server.request("POST", path, body, headers)
                assert_error(status, h, data, 401, f"{what} on {path}")
            status, h, data = server.request("GET", "/v1/models", None, headers)
            assert_error(status, h, data, 401, f"{what} on /v1/models")
        status, _, data = server.request("GET", "/v1/models", None, AUTH)
        assert status == 200, data


def test_100mb_body_gets_413(server, model):
    """100 MB of body, sent from a generator (1 MiB at a time, never held whole)."""
    total, chunk = 100 * 1000 * 1000, b"a" * (1 << 20)
    head, tail = b'{"prompt": "', b'", "max_tokens": 1}'

    def body():
        yield head
        left = total - len(head) - len(tail)
        while left > 0:
            yield chunk[:min(left, len(chunk))]
            left -= len(chunk)
        yield tail

    with while_streaming(server, model, "100 MB body"):
        conn = server.connection(timeout=60)
        conn.putrequest("POST", "/v1/completions")
        for k, v in {"Content-Type": "application/json", "Content-Length": str(total), **AUTH}.items():
            conn.putheader(k, v)
        conn.endheaders()
        try:
            for piece in body():
                conn.send(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before the whole body is sent
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        assert_error(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, 413,
                     "100 MB body")
        # ... and the server still serves a normal request.
        status, _, data = server.request("POST", "/v1/completions",
                                         {"prompt": COUNT, "max_tokens": 3, "temperature": 0}, AUTH)
        assert status == 200 and json.loads(data)["choices"][0]["text"] == reference(model, 3)["text"]


def test_slowloris(server, model):
    """Sockets that send half a request and go quiet hold no server capacity for long: a normal
    request is served meanwhile, and each of them is closed by the read timeout."""
    sockets = []
    half = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl"
    with while_streaming(server, model, "slowloris"):
        for _ in range(16):
            s = socket.create_connection((server.host, server.port), timeout=10)
            sockets.append(s)
        t0 = time.monotonic()
        for i in range(0, len(half), 16):  # the half request, slowly
            for s in sockets:
                s.sendall(half[i:i + 16])
            time.sleep(0.05)
        status, _, data = server.request("POST", "/v1/completions",
                                         {"prompt": COUNT, "max_tokens": 3, "temperature": 0}, AUTH)
        assert status == 200 and json.loads(data)["choices"][0]["text"] == reference(model, 3)["text"]
        served = time.monotonic() - t0
    for s in sockets:  # closed by the server: EOF (maybe after an error response), or a reset
        s.settimeout(READ_TIMEOUT + 10)
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
        except socket.timeout:
            pytest.fail(f"a slowloris socket was still open {READ_TIMEOUT + 10} s after going quiet")
    closed = time.monotonic() - t0
    for s in sockets:
        s.close()
    assert served < closed, "the normal request waited for the slowloris sockets to be closed"


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def test_queue_full_gets_429_with_retry_after(server, model):
    with while_streaming(server, model, "429") as s:
        second, queued = Stream(server, 96), Stream(server, 96)
        second.start()
        wait_for(lambda: server.metrics().get("concord_running_sequences") == 2, 60, "2 running")
        queued.start()
        wait_for(lambda: server.metrics().get("concord_queue_length") == 1, 60, "1 queued")
        assert s.is_alive()
        status, headers, data = server.request("POST", "/v1/completions",
                                               {"prompt": "hi", "max_tokens": 2}, AUTH)
        assert_error(status, headers, data, 429, "past --max-queue")
        assert int(headers["retry-after"]) >= 1, headers
        status, headers, data = server.request(
            "POST", "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, AUTH)
        assert_error(status, headers, data, 429, "chat past --max-queue")
    second.check(model, "the running request beside the 429")
    queued.check(model, "the queued request beside the 429")


@pytest.fixture()
def one_slot(model):
    srv = Server(concord_bin(), model, "--max-sequences", "1", "--max-queue", "4")
    yield srv
    assert srv.stop() == 0, srv.log()


def test_disconnect_mid_stream_frees_the_slot(one_slot, model):
    srv = one_slot
    a = Stream(srv, 2000, headers={})
    a.start()
    assert a.first.wait(120) and a.error is None, a.error
    b = Stream(srv, 8, headers={})
    b.start()
    wait_for(lambda: srv.metrics().get("concord_queue_length") == 1, 60, "b queued behind a")
    time.sleep(0.3)
    n = len(a.tokens)
    rate = (n - 1) / max(a.token_times[-1] - a.token_times[0], 1e-3)
    assert n < 1000, "a is still far from its end"
    # Client a goes away mid-stream: close its socket under the reading thread.
    t_close = time.monotonic()
    a.conn.sock.shutdown(socket.SHUT_RDWR)
    b.check(model, "the queued request after a disconnect")
    b_wait = b.token_times[0] - t_close
    # a still had (2000 - n) tokens to go, many seconds at its rate; b started at once.
    assert b_wait < 0.25 * (2000 - n) / rate, f"b waited {b_wait:.2f} s after the disconnect"
    wait_for(lambda: srv.metrics().get("concord_running_sequences") == 0
             and srv.metrics().get("concord_queue_length") == 0, 10, "an idle engine")


def test_sigterm_drains(model):
    srv = Server(concord_bin(), model, "--max-sequences", "2")
    try:
        s = Stream(srv, LONG, headers={})
        s.start()
        assert s.first.wait(120) and s.error is None, s.error
        srv.terminate()
        time.sleep(0.2)
        # New requests are refused with 503 (docs/serve.md), /health says draining.
        status, headers, data = srv.request("POST", "/v1/completions",
                                            {"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert_error(status, headers, data, 503, "a request during the drain")
        status, _, data = srv.request("GET", "/health", timeout=10)
        assert status == 503 and json.loads(data)["status"] == "draining", data
        assert s.is_alive(), "the stream ended before the drain could be observed"
        s.check(model, "the stream running at SIGTERM")
        srv.proc.wait(30)
        assert srv.proc.returncode == 0, srv.log()
    finally:
        srv.kill()


def test_request_timeout(model):
    """--request-timeout 1: a non-streaming request past it gets 504, a streaming one ends with
    an error event and [DONE]; both free their slot (the next request is served at once)."""
    srv = Server(concord_bin(), model, "--max-sequences", "1", "--request-timeout", "1")
    try:
        body = {"prompt": COUNT, "max_tokens": 4000, "temperature": 0}
        t0 = time.monotonic()
        status, headers, data = srv.request("POST", "/v1/completions", body)
        assert_error(status, headers, data, 504, "past --request-timeout")
        assert time.monotonic() - t0 < 10
        conn = srv.connection()
        conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        events = list(sse_events(resp))  # ends with [DONE] (sse_events checks)
        conn.close()
        assert "error" in events[-1] and events[-1]["error"]["code"] == "request_timeout", events[-1]
        assert all("choices" in e for e in events[:-1]) and len(events) > 1
        status, _, data = srv.request("POST", "/v1/completions",
                                      {"prompt": COUNT, "max_tokens": 3, "temperature": 0})
        assert status == 200 and json.loads(data)["choices"][0]["text"] == reference(model, 3)["text"]
        assert srv.metrics()["concord_running_sequences"] == 0
        assert srv.stop() == 0, srv.log()
    finally:
        srv.kill()


def test_slowloris_trickling_past_the_http_threads(model):
    """More trickling sockets than HTTP threads, each sending a header byte every 0.2 s (never
    silent for --read-timeout): --receive-timeout cuts each one a thread holds, so a normal
    request is still served within a few receive timeouts, while they keep trickling."""
    threads, receive = 6, 1.0
    srv = Server(concord_bin(), model, "--max-sequences", "2", "--http-threads", threads,
                 "--read-timeout", 5, "--receive-timeout", receive)
    sockets, stop = [], threading.Event()
    line = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 400
    try:
        for _ in range(2 * threads):
            sockets.append(socket.create_connection((srv.host, srv.port), timeout=10))

        def trickle():
            for i in range(len(line)):
                if stop.is_set():
                    return
                for s in sockets:
                    try:
                        s.sendall(line[i:i + 1])
                    except OSError:
                        pass  # cut by the server
                time.sleep(0.2)

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        status, _, data = srv.request("POST", "/v1/completions",
                                      {"prompt": COUNT, "max_tokens": 3, "temperature": 0}, timeout=30)
        waited = time.monotonic() - t0
        assert t.is_alive(), "the tricklers stopped before the request was served"
        assert status == 200 and json.loads(data)["choices"][0]["text"] == reference(model, 3)["text"]
        # Two waves of tricklers (2 x threads sockets) cut after `receive` s each, and slack.
        assert waited < 4 * receive + 3, f"the request waited {waited:.1f} s behind the tricklers"
        stop.set()
        t.join(5)
        assert srv.stop() == 0, srv.log()
    finally:
        stop.set()
        for s in sockets:
            s.close()
        srv.kill()
