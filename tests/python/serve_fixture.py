"""A `concord serve` subprocess for the end-to-end tests (test_serve_*.py) and bench/serve_load.py.

Server(binary, model, *flags) starts `concord serve --model MODEL --port 0 FLAGS`, reads its
stderr on a thread until the ready line
    [serve] listening on http://HOST:PORT (model NAME, policy P, max-sequences N)
and parses the port from it. stop() sends SIGTERM (the server drains and exits 0) and kills it if
it outlives the grace period; log() is everything it printed, for failure messages. Also: plain
HTTP helpers on the standard library (request(), sse_events()), so that a test controls exactly
what goes over the socket, and `generate_json()`, the `concord generate --json` reference every
served result is compared with.
"""

import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"\[serve\] listening on http://([^:\s]+):(\d+) \(model (.*), policy (\S+), "
                   r"max-sequences (\d+)\)")


def concord_bin():
    """$CONCORD_BIN (ctest sets it), else build/bin/concord of this checkout."""
    path = os.environ.get("CONCORD_BIN") or str(ROOT / "build/bin/concord")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path}: no concord binary (build it: cmake --build build --target concord, "
                           "or set CONCORD_BIN)")
    return path


def smollm2_path():
    """The SmolLM2-135M-Instruct Q4_1 GGUF (scripts/smollm2-path); an error when not installed."""
    r = subprocess.run([str(ROOT / "scripts/smollm2-path")], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip() or "scripts/smollm2-path failed")
    return r.stdout.strip()


class Server:
    def __init__(self, binary, model, *flags, ready_timeout=120.0, env=None, launcher=()):
        # launcher: a command the server runs under (mpirun -np R ...); the server then leads a
        # process group of its own, which kill() ends whole.
        self.launcher = list(launcher)
        self.args = [*self.launcher, binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                     *map(str, flags)]
        self._lines = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._terminated = False
        self.host = self.port = self.model_name = self.policy = self.max_sequences = None
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, start_new_session=bool(self.launcher))
        self._readers = [threading.Thread(target=self._read, args=(s, tag), daemon=True)
                         for s, tag in ((self.proc.stderr, ""), (self.proc.stdout, "[stdout] "))]
        for t in self._readers:
            t.start()
        deadline = time.monotonic() + ready_timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with {self.proc.returncode}" if self.proc.poll() is not None
                       else f"not ready after {ready_timeout:.0f} s")
                self.kill()
                raise RuntimeError(f"{' '.join(self.args)}: {why}; its output:\n{self.log()}")

    def _read(self, stream, tag):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self._lines.append(tag + line)
            m = READY.search(line) if not tag else None
            if m and not self._ready.is_set():
                self.host, self.port = m.group(1), int(m.group(2))
                self.model_name, self.policy, self.max_sequences = m.group(3), m.group(4), int(m.group(5))
                self._ready.set()

    @property
    def base_url(self):
        return f"http://{self.host}:{self.port}"

    def log(self):
        with self._lock:
            return "\n".join(self._lines)

    def alive(self):
        return self.proc.poll() is None

    def _rank0(self):
        """Under mpirun: the pid of rank 0's server (a child of mpirun with OMPI_COMM_WORLD_RANK=0)."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.proc.pid:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if b"OMPI_COMM_WORLD_RANK=0\0" in f.read():
                        return int(pid)
            except (OSError, ValueError, IndexError):
                continue
        return None

    def terminate(self):
        """SIGTERM once (the server drains; a second signal would make it exit at once, status 1).
        Under mpirun the signal goes to rank 0, which drains and ends the other ranks (Open MPI's
        mpirun forwards a SIGTERM of its own too, but then exits 1)."""
        if not self._terminated and self.proc.poll() is None:
            self._terminated = True
            rank0 = self._rank0() if self.launcher else None
            if rank0 is not None:
                os.kill(rank0, signal.SIGTERM)
            else:
                self.proc.send_signal(signal.SIGTERM)

    def stop(self, grace=30.0):
        """SIGTERM (unless terminate() sent it), then wait for the drain; returns the exit status
        (kills after `grace` s)."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        for t in self._readers:
            t.join(5)
        return self.proc.returncode

    def kill(self):
        if self.launcher:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher's children too
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    # --- HTTP on the standard library -------------------------------------------------------

    def connection(self, timeout=120.0):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=120.0):
        """One request on a fresh connection: (status, headers as a dict, body bytes).
        `body` may be a dict/list (sent as JSON), str, bytes, or an iterable of bytes (chunked)."""
        conn = self.connection(timeout)
        try:
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            conn.request(method, path, body=body, headers=hdrs,
                         encode_chunked=body is not None and not isinstance(body, bytes))
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def post_json(self, path, body, headers=None, timeout=120.0):
        """POST a JSON body; (status, parsed JSON response)."""
        status, _, data = self.request("POST", path, body, headers, timeout)
        return status, json.loads(data)

    def metrics(self):
        """GET /metrics parsed into {name-with-labels: value}."""
        status, _, data = self.request("GET", "/metrics")
        assert status == 200, data
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out


def sse_events(resp):
    """Yields the `data:` payloads of a server-sent-event response (http.client), parsed, up to
    and excluding `data: [DONE]`; raises if the stream ends without [DONE]."""
    count = 0
    while True:
        line = resp.readline()
        if not line:
            raise AssertionError(f"the event stream ended without data: [DONE] after {count} events")
        line = line.decode("utf-8").rstrip("\r\n")
        if not line or line.startswith(":"):
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        payload = line[len("data: "):]
        if payload == "[DONE]":
            return
        count += 1
        yield json.loads(payload)


def generate_json(binary, model, prompt, *, max_tokens, temperature=0.0, seed=0, top_k=0,
                  top_p=1.0, min_p=0.0, stop=(), top_logprobs=0, echo=False, chat=False,
                  policy="native"):
    """`concord generate --json` on the same settings (serve_spec part 4): the reference."""
    args = [binary, "generate", "--model", model, "--json", "--prompt", prompt,
            "--max-tokens", str(max_tokens), "--temp", repr(float(temperature)), "--seed", str(seed),
            "--top-k", str(top_k), "--top-p", repr(float(top_p)), "--min-p", repr(float(min_p)),
            "--policy", policy]
    for s in stop:
        args += ["--stop", s]
    if top_logprobs:
        args += ["--top-logprobs", str(top_logprobs)]
    if echo:
        args.append("--echo")
    if chat:
        args.append("--chat")
    r = subprocess.run(args, capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: rc {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)
