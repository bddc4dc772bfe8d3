#!/usr/bin/env python3
"""Time to first token of a long prompt on SmolLM2-135M-Instruct with and without `concord serve
--prefix-cache-bytes`, side by side in one run.

    .venv/bin/python bench/prefix_cache_bench.py [--verses Gen1:1-Gen4:26] [--json F]

The prompt: a few chapters of the King James Bible (`bible -f RANGE`, Debian bible-kjv) and a
question. Two servers on the same GGUF (--policy native): one with the prefix cache, one without.
Each is sent, in order: the prompt (cold), the same prompt again (a repeat), and the same text
with another question (a shared prefix). Time to first token is measured from the request to the
first streamed chunk with text. The answers of both servers must be identical (temperature 0 and
the same bits by construction). Waits for a quiet machine first, like the other side-by-side
scripts (machine.py; FORCE=1 skips the wait).
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_name, wait_quiet  # noqa: E402
from serve_fixture import Server, concord_bin, smollm2_path  # noqa: E402


def ttft(server, prompt, max_tokens=16):
    """(seconds to the first streamed text, the whole text, prompt tokens)."""
    conn = server.connection(timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first, text, usage = None, "", None
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.decode()[len("data: "):]
            if data == "[DONE]":
                continue
            j = json.loads(data)
            if j.get("usage"):
                usage = j["usage"]
            for c in j.get("choices", []):
                if c.get("text"):
                    if first is None:
                        first = time.perf_counter() - t0
                    text += c["text"]
    conn.close()
    return first, text, usage["prompt_tokens"] if usage else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verses", default="Gen1:1-Gen4:26")
    ap.add_argument("--json")
    args = ap.parse_args()
    wait_quiet("bench/prefix_cache_bench.py")
    text = subprocess.run(["bible", "-f", args.verses], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, check=True).stdout
    prompts = {"cold": text + "\nQuestion: Who was the first man?\nAnswer:",
               "repeat": text + "\nQuestion: Who was the first man?\nAnswer:",
               "shared prefix": text + "\nQuestion: What did God make on the fourth day?\nAnswer:"}
    gguf = smollm2_path()
    rows = {}
    for label, flags in (("cache", ["--prefix-cache-bytes", str(1 << 30)]), ("no cache", [])):
        with Server(concord_bin(), gguf, *flags) as server:
            for kind, prompt in prompts.items():
                t, answer, n = ttft(server, prompt)
                rows.setdefault(kind, {})[label] = {"ttft_s": t, "text": answer, "prompt_tokens": n}
                print(f"{label:9} {kind:14} {n} prompt tokens: time to first token {t:.3f} s", flush=True)
            metrics = server.metrics()
            if label == "cache":
                reused = metrics.get("concord_prefix_cache_reused_tokens_total", 0)
                print(f"          prefix cache: {metrics.get('concord_prefix_cache_hits_total', 0):.0f} hits, "
                      f"{reused:.0f} tokens reused, {metrics.get('concord_prefix_cache_bytes', 0) / 2**20:.1f} MiB held")
    same = all(r["cache"]["text"] == r["no cache"]["text"] for r in rows.values())
    print(f"answers identical with and without the cache: {same}; lscpu model name: {cpu_name()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "verses": args.verses, "rows": rows, "identical": same}, f, indent=1)
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
