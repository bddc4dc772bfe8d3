#!/usr/bin/env python3
"""Load test of `concord serve` (issue 17): C concurrent clients, each sending R streaming
requests one after another, on loopback, bounded in count (C x R) and time (--wall-cap).

Request k (k = 0, 1, ...) has its own prompt and seed (request_body below): even k greedy, odd k
seeded sampling (T 0.8, top-p 0.95, seed 1000 + k). Checks, per concurrency level:
  - every request k answered exactly once: HTTP 200, one completion id never seen before, a
    `data: [DONE]` end, no error event;
  - its tokens (return_tokens_as_token_ids), text and finish_reason identical to the same
    request sent alone (the reference pass: every request one at a time, C = 1);
and measures aggregate generated tokens/s (all tokens / wall time of the level), p50/p99
time-to-first-token (request sent -> first token event) and inter-token latency (between token
events of a request, a request's first token excluded).

The HTTP client is raw asyncio streams (HTTP/1.1, one connection per request), so that nothing
between the socket and the clock buffers or reorders events.

  serve_load.py --server-bin build/bin/concord --model M.gguf --levels 1,8,32,128 ...   (starts
      `concord serve --port 0` itself, stops it with SIGTERM at the end, checks exit status 0)
  serve_load.py --url http://127.0.0.1:8000 ...   (an already running server)
Exit status 1 when any check fails; --out FILE.json gets every figure.
"""

import argparse
import asyncio
import http.client
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/python"))

TOPICS = ["the sea", "a city at night", "mountains", "the moon", "a library", "rain", "coffee",
          "trains", "a garden", "winter", "music", "the desert", "bread", "rivers", "clocks",
          "birds"]


def prompt_of(k):
    """Request k's prompt (bench/real_model_bench.cpp's BM_EngineServeWorkload builds the same)."""
    return f"Request {k}: three facts about {TOPICS[k % len(TOPICS)]}:"


def request_body(k, max_tokens):
    body = {"prompt": prompt_of(k), "max_tokens": max_tokens, "stream": True, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    if k % 2 == 0:
        body["temperature"] = 0
    else:
        body.update(temperature=0.8, top_p=0.95, seed=1000 + k)
    return body


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))]


async def read_chunked(reader):
    """Yields the decoded pieces of a chunked body as they arrive."""
    while True:
        size_line = await reader.readline()
        if not size_line:
            raise ConnectionError("connection closed inside a chunked body")
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            await reader.readline()
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def stream_request(host, port, k, body, headers, timeout):
    """POST body (stream: true); returns a dict with status, id, tokens, text, finish, times."""
    out = {"k": k, "status": None, "ids": set(), "tokens": [], "text": "", "finish": None,
           "done": False, "error": None, "t_send": None, "token_times": []}
    payload = json.dumps(body).encode()
    extra = "".join(f"{a}: {b}\r\n" for a, b in headers.items())
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(payload)}\r\n{extra}Connection: close\r\n\r\n")

    async def run():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            out["t_send"] = time.perf_counter()
            writer.write(head.encode() + payload)
            await writer.drain()
            status = await reader.readline()
            out["status"] = int(status.split()[1])
            hdrs = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                a, _, b = line.decode().partition(":")
                hdrs[a.strip().lower()] = b.strip()
            if hdrs.get("transfer-encoding", "").lower() == "chunked":
                pieces = read_chunked(reader)
            else:
                async def until_eof():
                    while True:
                        data = await reader.read(65536)
                        if not data:
                            return
                        yield data
                pieces = until_eof()
            buf = b""
            async for data in pieces:
                now = time.perf_counter()
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.rstrip(b"\r")
                    if not line.startswith(b"data: "):
                        continue
                    if line == b"data: [DONE]":
                        out["done"] = True
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        out["error"] = event["error"]
                        continue
                    out["ids"].add(event["id"])
                    for c in event["choices"]:
                        out["text"] += c["text"]
                        if c.get("logprobs"):
                            toks = c["logprobs"]["tokens"]
                            out["tokens"] += [int(t.split(":", 1)[1]) for t in toks]
                            out["token_times"] += [now] * len(toks)
                        out["finish"] = c.get("finish_reason") or out["finish"]
            if out["status"] != 200 and out["error"] is None:
                out["error"] = buf.decode("utf-8", "replace")[:300]
        finally:
            writer.close()

    try:
        await asyncio.wait_for(run(), timeout)
    except Exception as e:  # counted as an error of this request
        out["error"] = f"{type(e).__name__}: {e}"
    out["t_end"] = time.perf_counter()
    return out


async def run_level(host, port, clients, requests_per_client, max_tokens, headers, wall_cap):
    results = []
    start = time.perf_counter()

    async def client(c):
        for r in range(requests_per_client):
            if time.perf_counter() - start > wall_cap:
                return
            k = c * requests_per_client + r
            left = wall_cap - (time.perf_counter() - start)
            results.append(await stream_request(host, port, k, request_body(k, max_tokens),
                                                headers, max(left, 1.0)))

    await asyncio.gather(*(client(c) for c in range(clients)))
    return results, time.perf_counter() - start


def summarize(results, wall, clients, requests_per_client, reference):
    expected = clients * requests_per_client
    seen_ids, problems = {}, []
    answered = {}
    for res in results:
        answered[res["k"]] = answered.get(res["k"], 0) + 1
        if res["error"] or res["status"] != 200 or not res["done"]:
            problems.append(f"request {res['k']}: status {res['status']}, done {res['done']}, "
                            f"error {res['error']}")
            continue
        if len(res["ids"]) != 1:
            problems.append(f"request {res['k']}: completion ids {sorted(res['ids'])}")
        for i in res["ids"]:
            if i in seen_ids:
                problems.append(f"request {res['k']}: id {i} also answered request {seen_ids[i]}")
            seen_ids[i] = res["k"]
        if reference is not None:
            ref = reference.get(res["k"])
            if ref is None:
                problems.append(f"request {res['k']}: no reference")
            elif (res["tokens"], res["text"], res["finish"]) != (ref["tokens"], ref["text"], ref["finish"]):
                problems.append(f"request {res['k']}: output differs from the request sent alone "
                                f"({len(res['tokens'])} vs {len(ref['tokens'])} tokens)")
    missing = [k for k in range(expected) if answered.get(k, 0) == 0]
    dup = [k for k, n in answered.items() if n > 1]
    if missing:
        problems.append(f"{len(missing)} of {expected} requests not sent or not answered "
                        f"(wall cap?): first {missing[:5]}")
    if dup:
        problems.append(f"requests answered more than once: {dup[:5]}")
    ok = [r for r in results if r["status"] == 200 and r["token_times"]]
    ttft = [r["token_times"][0] - r["t_send"] for r in ok]
    itl = [b - a for r in ok for a, b in zip(r["token_times"], r["token_times"][1:])]
    tokens = sum(len(r["tokens"]) for r in ok)
    ms = lambda v: None if v is None else round(1e3 * v, 2)  # noqa: E731
    return {
        "clients": clients, "requests_per_client": requests_per_client, "requests": expected,
        "answered": len(results), "generated_tokens": tokens, "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "ttft_ms_p50": ms(percentile(ttft, 0.5)), "ttft_ms_p99": ms(percentile(ttft, 0.99)),
        "itl_ms_p50": ms(percentile(itl, 0.5)), "itl_ms_p99": ms(percentile(itl, 0.99)),
        "problems": problems,
    }


def parse_levels(text):
    levels = []
    for part in text.split(","):
        c, _, r = part.partition("x")
        levels.append((int(c), int(r) if r else None))
    return levels


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def scrape_metrics(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            if key.startswith(("concord_requests_total", "concord_generated_tokens_total",
                               "concord_prompt_tokens_total")) or key.endswith(("_sum", "_count")):
                out[key] = float(value)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (else one is started: --server-bin, --model)")
    ap.add_argument("--server-bin", default=os.environ.get("CONCORD_BIN", "build/bin/concord"))
    ap.add_argument("--model", help="model for the started server (default: scripts/smollm2-path)")
    ap.add_argument("--max-sequences", type=int, default=8)
    ap.add_argument("--server-arg", action="append", default=[], help="extra flag for concord serve")
    ap.add_argument("--levels", default="1,8,32,128",
                    help="concurrency levels, each CLIENTS or CLIENTSxREQUESTS (default R: --requests)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client (default 2)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--wall-cap", type=float, default=300.0, help="seconds per level at most")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the one-at-a-time pass (no output check)")
    ap.add_argument("--save-reference", help="write the one-at-a-time outputs to this JSON file")
    ap.add_argument("--load-reference",
                    help="check against these outputs (a --save-reference file) instead of a new pass")
    ap.add_argument("--out", help="JSON file for every figure")
    args = ap.parse_args()

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    server = None
    if args.url:
        hostport = args.url.split("//", 1)[-1].rstrip("/")
        host, port = hostport.rsplit(":", 1)
        port = int(port)
    else:
        from serve_fixture import Server, smollm2_path
        model = args.model or smollm2_path()
        server = Server(args.server_bin, model, "--max-sequences", args.max_sequences,
                        *args.server_arg)
        host, port = server.host, server.port
        print(f"server: {' '.join(server.args)} -> {server.base_url}", file=sys.stderr)

    levels = [(c, r or args.requests) for c, r in parse_levels(args.levels)]
    report = {"cpu": cpu_model(), "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": " ".join([sys.executable, *sys.argv]), "max_tokens": args.max_tokens,
              "max_sequences": args.max_sequences if server else None, "levels": []}
    failed = False
    try:
        reference = None
        if args.load_reference:
            saved = json.loads(Path(args.load_reference).read_text())
            if saved["max_tokens"] != args.max_tokens:
                sys.exit(f"{args.load_reference}: made with max_tokens {saved['max_tokens']}")
            reference = {int(k): v for k, v in saved["outputs"].items()}
            report["reference"] = saved["summary"]
        elif not args.no_reference:
            n = max(c * r for c, r in levels)
            print(f"reference: {n} requests one at a time", file=sys.stderr)
            results, wall = asyncio.run(run_level(host, port, 1, n, args.max_tokens, headers,
                                                  args.wall_cap * 4))
            ref_summary = summarize(results, wall, 1, n, None)
            report["reference"] = ref_summary
            if ref_summary["problems"]:
                failed = True
            reference = {r["k"]: {"tokens": r["tokens"], "text": r["text"], "finish": r["finish"]}
                         for r in results if r["status"] == 200 and r["done"] and not r["error"]}
            if args.save_reference:
                Path(args.save_reference).write_text(json.dumps(
                    {"max_tokens": args.max_tokens, "summary": ref_summary, "outputs": reference}))
        for clients, per_client in levels:
            results, wall = asyncio.run(run_level(host, port, clients, per_client, args.max_tokens,
                                                  headers, args.wall_cap))
            s = summarize(results, wall, clients, per_client, reference)
            report["levels"].append(s)
            failed |= bool(s["problems"])
            print(f"C={clients:4d} R={per_client:3d}: {s['answered']}/{s['requests']} answered, "
                  f"{s['generated_tokens']} tokens in {s['wall_s']:.2f} s = {s['tokens_per_s']} tok/s; "
                  f"TTFT p50/p99 {s['ttft_ms_p50']}/{s['ttft_ms_p99']} ms; ITL p50/p99 "
                  f"{s['itl_ms_p50']}/{s['itl_ms_p99']} ms; "
                  f"{'OK' if not s['problems'] else 'PROBLEMS: ' + '; '.join(s['problems'][:5])}")
        base = next((s for s in report["levels"] if s["clients"] == 1), report.get("reference"))
        for s in report["levels"]:
            if base and base["tokens_per_s"]:
                s["vs_one_stream"] = round(s["tokens_per_s"] / base["tokens_per_s"], 2)
        report["metrics"] = scrape_metrics(host, port)
    finally:
        if server is not None:
            rc = server.stop()
            report["server_exit_status"] = rc
            if rc != 0:
                failed = True
                print(f"server exited with {rc}:\n{server.log()[-3000:]}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
