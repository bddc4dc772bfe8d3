#!/usr/bin/env python3
"""What `concord serve --disaggregate` buys a running request when a long prompt arrives, on
SmolLM2-135M-Instruct, side by side in one run.

    .venv/bin/python bench/disaggregate_bench.py [--verses Gen1:1-Gen2:25] [--a-tokens 160] [--json F]

Two servers on the same GGUF (--policy native), one prefilling on its engine, one with the
prefill worker. Against each: request A (the opening line of a story, 160 tokens streamed, greedy;
--a-tokens) starts; once
A has streamed 20 chunks, request B (a few chapters of the King James Bible, `bible -f VERSES`, and
a question, as token ids; 8 tokens) arrives. Each server first runs the scenario once with a twin of
B (its first token changed: no prefix in common), so that the measured run finds the step shapes'
activation plans made, as a server that has run for a while does (--cold: skip it). Reported: the largest and the 99th-percentile gap between A's
streamed chunks while B is prefilled, A's tokens per second over its whole run, and B's time to
first token. The texts of both servers must be identical (temperature 0, the same bits by
construction). Waits for a quiet machine first (machine.py; FORCE=1 skips the wait).

The cost model is checked in the same run: `concord disagg-plan --save-rates` measures the
engine's costs on the same GGUF first (prefill, decode, the hand-over, the two workers on shared
cores), and its predictions for B's prompt (its token count from the server's usage) with A's
remaining tokens are printed beside what each server measured: B's time to first token, A's
largest gap, A's tokens before B's first, and the waiting the split saved. The server's own cost
per step beyond the engine's forward (--step-overhead) is A's pace before B arrived less the
measured decode step: the one figure taken from the servers.
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


def stream(server, prompt, max_tokens, times, texts, started=None, after=0, usage=None):
    """Streams a greedy completion; appends each text chunk's arrival time (perf_counter) to
    `times`, its text to `texts`; sets `started` once `after` chunks arrived; fills `usage` (a
    dict) from the final usage event."""
    conn = server.connection(timeout=900)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    for event in sse_events(conn.getresponse()):
        if usage is not None and event.get("usage"):
            usage.update(event["usage"])
        for c in event.get("choices", []):
            if c.get("text"):
                times.append(time.perf_counter())
                texts.append(c["text"])
                if started is not None and len(times) == after:
                    started.set()
    conn.close()


A_PROMPT = "Chapter 1\n\nThe lighthouse keeper climbed the stairs"


def a_pace(a_times, b_sent):
    """A's own pace: the median gap between its tokens before B arrived."""
    before = [y - x for x, y in zip(a_times, a_times[1:]) if y < b_sent]
    return sorted(before)[len(before) // 2]


def a_delay(a_times, b_sent, b_first):
    """What B's prefill cost A: the time A's tokens between B's arrival and B's first token took,
    less their time at A's own pace."""
    pace = a_pace(a_times, b_sent)
    inside = [t for t in a_times if b_sent <= t <= b_first]
    if not inside:
        return 0.0
    end = b_first if len(inside) < sum(1 for t in a_times if t >= b_sent) else inside[-1]
    return (end - b_sent) - len(inside) * pace


def run(server, long_prompt, a_tokens):
    a_times, a_texts, b_times, b_texts = [], [], [], []
    started = threading.Event()
    t0 = time.perf_counter()
    a = threading.Thread(target=stream, args=(server, A_PROMPT, a_tokens, a_times, a_texts, started, 20))
    a.start()
    while not started.wait(0.05):
        if not a.is_alive():
            raise SystemExit(f"request A ended after {len(a_times)} chunks, before B was to be sent")
    b_sent = time.perf_counter()
    usage = {}
    stream(server, long_prompt, 8, b_times, b_texts, usage=usage)
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
        "b_prompt_tokens": usage.get("prompt_tokens"),
        "a_tokens_left": sum(1 for t in a_times if t >= b_sent),
        "a_tokens_before_b": sum(1 for t in a_times if b_times and b_sent <= t <= b_times[0]),
        "a_delay_s": a_delay(a_times, b_sent, b_times[0]) if b_times else None,
        "a_pace_s": a_pace(a_times, b_sent),
        "a_text": "".join(a_texts),
        "b_text": "".join(b_texts),
        "wall_s": time.perf_counter() - t0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verses", default="Gen1:1-Gen2:25")
    ap.add_argument("--a-tokens", type=int, default=160,
                    help="request A's tokens (160: it ends during B's prefill; 800 outlasts it)")
    ap.add_argument("--cold", action="store_true",
                    help="measure fresh servers (default: each runs the scenario once with a warm-up twin of B first)")
    ap.add_argument("--json")
    args = ap.parse_args()
    wait_quiet("bench/disaggregate_bench.py")
    text = subprocess.run(["bible", "-f", args.verses], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, check=True).stdout
    gguf = smollm2_path()
    # B as token ids (concord's tokenizer of the GGUF), and a warm-up twin of it: the same length,
    # its first token changed (no prefix in common, so the prefix cache does not serve it).
    long_prompt = [int(t) for t in subprocess.run(
        [concord_bin(), "tokenize", "--tokenizer", gguf], input=text + "\nQuestion: Who was the first man?\nAnswer:",
        capture_output=True, text=True, check=True).stdout.split()]
    warm_prompt = [long_prompt[0] + 1] + long_prompt[1:]
    rates = os.path.join(ROOT, "build", "disagg-rates.json")
    print("disagg-plan: measuring the engine's costs ...", flush=True)
    subprocess.run([concord_bin(), "disagg-plan", "--model", gguf, "--save-rates", rates, "--streams", "1",
                    "--prompt-tokens", "2048"], check=True, stdout=subprocess.DEVNULL)
    rows = {}
    for label, flags in (("engine prefill", []), ("--disaggregate", ["--disaggregate"])):
        with Server(concord_bin(), gguf, *flags) as server:
            if not args.cold:  # the same steps once, so that the measured run finds their plans made
                run(server, warm_prompt, args.a_tokens)
            r = run(server, long_prompt, args.a_tokens)
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

    # The cost model's predictions for this workload, beside the measurements.
    # The server's own cost per step beyond the engine's forward (its loop, streaming A, the clients on
    # the same cores): A's pace before B arrived less the measured one-row decode step.
    e, d = rows["engine prefill"], rows["--disaggregate"]
    with open(rates) as f:
        r = json.load(f)["rates"]
    overhead = max(0.0, (e["a_pace_s"] + d["a_pace_s"]) / 2 - (r["decode_step_s"] + r["decode_row_s"]))
    out = subprocess.run([concord_bin(), "disagg-plan", "--rates", rates, "--json", "--streams", "1",
                          "--prompt-tokens", str(e["b_prompt_tokens"]), "--stream-tokens", str(e["a_tokens_left"]),
                          "--step-overhead", f"{overhead:.6f}"],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    plan = json.loads(out[1])
    print(f"disagg-plan ({json.loads(out[0])['source']}): B's {e['b_prompt_tokens']} prompt tokens, "
          f"A with {e['a_tokens_left']} tokens left, a server step {overhead * 1e3:.2f} ms beyond the engine's "
          f"(A's pace {e['a_pace_s'] * 1e3:.2f} / {d['a_pace_s'] * 1e3:.2f} ms); predicted / measured:")
    check = {}
    for label, side, r in (("engine prefill", "engine", e), ("--disaggregate", "disaggregated", d)):
        p = plan[side]
        check[label] = {"predicted": p, "measured": {k: r[k] for k in ("b_ttft_s", "a_max_gap_s", "a_tokens_before_b")}}
        print(f"  {label:15} B's first token {p['ttft_s']:6.2f} / {r['b_ttft_s']:6.2f} s ({p['ttft_s'] / r['b_ttft_s'] - 1:+.0%}); "
              f"A's largest gap {p['max_gap_s'] * 1e3:7.1f} / {r['a_max_gap_s'] * 1e3:7.1f} ms; "
              f"A's tokens before B's first {p['stream_tokens']:6.1f} / {r['a_tokens_before_b']}")
    saved = (e["a_delay_s"] - d["a_delay_s"]) - (d["b_ttft_s"] - e["b_ttft_s"])
    check["saved_request_s"] = {"predicted": plan["saved_request_s"], "measured": saved}
    print(f"  waiting saved by the split (A's delay and B's): {plan['saved_request_s']:+.2f} / {saved:+.2f} request-s "
          f"(A's delay {plan['engine']['stream_delay_s']:.2f} / {e['a_delay_s']:.2f} s without, "
          f"{plan['disaggregated']['stream_delay_s']:.2f} / {d['a_delay_s']:.2f} s with); pays: {plan['pays']} / {saved > 0}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "verses": args.verses, "rows": rows, "identical": same, "plan": plan,
                       "check": check}, f, indent=1)
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
