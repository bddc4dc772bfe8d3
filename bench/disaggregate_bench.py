#!/usr/bin/env python3
"""What `concord serve --disaggregate` buys a running request when a long prompt arrives, on
SmolLM2-135M-Instruct, side by side in one run.

    .venv/bin/python bench/disaggregate_bench.py [--verses Gen1:1-Gen2:25] [--json F]

Two servers on the same GGUF (--policy native), one prefilling on its engine, one with the
prefill worker. Against each: request A (the opening line of a story, 160 tokens streamed, greedy) starts; once
A has streamed 20 chunks, request B (a few chapters of the King James Bible, `bible -f VERSES`, and
a question; 8 tokens) arrives. Reported: the largest and the 99th-percentile gap between A's
streamed chunks while B is prefilled, A's tokens per second over its whole run, and B's time to
first token. The texts of both servers must be identical (temperature 0, the same bits by
construction). Waits for a quiet machine first (machine.py; FORCE=1 skips the wait).
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_name, wait_quiet  # noqa: E402
from serve_fixture import Server, concord_bin, smollm2_path, sse_events  # noqa: E402


def stream(server, prompt, max_tokens, times, texts, started=None, after=0):
    """Streams a greedy completion; appends each text chunk's arrival time (perf_counter) to
    `times`, its text to `texts`; sets `started` once `after` chunks arrived."""
    conn = server.connection(timeout=900)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    for event in sse_events(conn.getresponse()):
        for c in event.get("choices", []):
            if c.get("text"):
                times.append(time.perf_counter())
                texts.append(c["text"])
                if started is not None and len(times) == after:
                    started.set()
    conn.close()


A_PROMPT = "Chapter 1\n\nThe lighthouse keeper climbed the stairs"


def run(server, long_prompt):
    a_times, a_texts, b_times, b_texts = [], [], [], []
    started = threading.Event()
    t0 = time.perf_counter()
    a = threading.Thread(target=stream, args=(server, A_PROMPT, 160, a_times, a_texts, started, 20))
    a.start()
    while not started.wait(0.05):
        if not a.is_alive():
            raise SystemExit(f"request A ended after {len(a_times)} chunks, before B was to be sent")
    b_sent = time.perf_counter()
    stream(server, long_prompt, 8, b_times, b_texts)
    b_done = time.perf_counter()
    a.join()
    during = [t for t in a_times if b_sent <= t <= b_done]
    gaps = sorted(y - x for x, y in zip(a_times, a_times[1:]) if y >= b_sent and x <= b_done)
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else 0.0
    return {
        "a_max_gap_s": max(gaps) if gaps else 0.0,
        "a_p99_gap_s": p99,
        "a_chunks_during_b": len(during),
        "a_tokens_per_s": (len(a_times) - 1) / (a_times[-1] - a_times[0]) if len(a_times) > 1 else 0.0,
        "b_ttft_s": b_times[0] - b_sent if b_times else None,
        "a_text": "".join(a_texts),
        "b_text": "".join(b_texts),
        "wall_s": time.perf_counter() - t0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verses", default="Gen1:1-Gen2:25")
    ap.add_argument("--json")
    args = ap.parse_args()
    wait_quiet("bench/disaggregate_bench.py")
    text = subprocess.run(["bible", "-f", args.verses], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, check=True).stdout
    long_prompt = text + "\nQuestion: Who was the first man?\nAnswer:"
    gguf = smollm2_path()
    rows = {}
    for label, flags in (("engine prefill", []), ("--disaggregate", ["--disaggregate"])):
        with Server(concord_bin(), gguf, *flags) as server:
            r = run(server, long_prompt)
            rows[label] = r
            print(f"{label:15} A: largest gap {r['a_max_gap_s'] * 1e3:7.1f} ms, p99 {r['a_p99_gap_s'] * 1e3:7.1f} ms, "
                  f"{r['a_chunks_during_b']} chunks during B, {r['a_tokens_per_s']:.1f} tok/s; "
                  f"B: time to first token {r['b_ttft_s']:.2f} s", flush=True)
            if label == "--disaggregate":
                m = server.metrics()
                print(f"                hand-overs {m.get('concord_disaggregated_prefills_total', 0):.0f}, "
                      f"{m.get('concord_handover_bytes_total', 0) / 2**20:.1f} MiB")
    same = (rows["engine prefill"]["a_text"] == rows["--disaggregate"]["a_text"]
            and rows["engine prefill"]["b_text"] == rows["--disaggregate"]["b_text"])
    print(f"texts identical: {same}; lscpu model name: {cpu_name()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "verses": args.verses, "rows": rows, "identical": same}, f, indent=1)
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
