#!/usr/bin/env python3
"""Experts under a memory cap (issue 25): prefill and decode tokens/s of a GGUF MoE whose expert
blocks are held under `concord generate --memory-cap`, from 100% down to 5% of their bytes, in
three modes (LRU only: --no-prefetch; prefetch; prefetch and a pinned hot set from router
statistics of another passage), side by side in one run with the uncapped engine and llama.cpp on
the same file.

    python3 bench/expert_cap_bench.py [--model F.gguf | --config moe-wide] [--caps 100,75,50,25,10,5] [--repeats 3] [--json F]

Default model: the trained configs/tiny-moe-64.json MoE (4 layers, 64 experts of width 32, top-4;
trained into runs/tiny-moe-64 if absent, about a minute) exported as Q4_0. The prompt is 380 bytes
of Genesis (the byte tokenizer: 380 tokens; the model's context is 512), 128 greedy tokens generated; the pinning statistics
come from 380 bytes of Exodus. Every capped run must give the uncapped tokens and log-probs (the
script stops otherwise). Figures are medians over the repeats, the configurations interleaved; peak
RSS is each child's own (wait4). llama.cpp (tools/.llamacpp-venv, tools/llamacpp_env.sh) prefills
the same token ids in one batch and decodes 128 tokens greedily with 2 threads; it has no cap on a
CPU (its --n-cpu-moe keeps experts in host memory instead of a GPU's), so it runs at 100%, its
weights memory-mapped. Then `concord cap-plan` replays the uncapped run's routing trace under every
cap, fitted to the median LRU runs at --calibrate-caps (default 100% and 10%): its reads must equal
each LRU run's (the script stops otherwise), and its predicted tokens/s are printed beside the
measured (75%, 50%, 25% and 5% out of sample).
Waits for a quiet machine first (machine.py; FORCE=1 skips the wait).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_name, wait_quiet  # noqa: E402

CONCORD = os.path.join(ROOT, "build", "bin", "concord")
LLAMACPP_PY = os.path.join(ROOT, "tools", ".llamacpp-venv", "bin", "python")


def bible(verses, size):
    text = subprocess.run(["bible", "-f", verses], capture_output=True, text=True, check=True).stdout
    text = " ".join(text.split())
    if len(text) < size:
        sys.exit(f"expert_cap_bench: bible -f {verses} gave {len(text)} bytes, {size} needed")
    return text[:size]


def default_model(config):
    """configs/CONFIG.json trained into runs/CONFIG (if absent) and exported as Q4_0."""
    out_dir = os.path.join(ROOT, "runs", "expert-cap")
    gguf = os.path.join(out_dir, f"{config}.q4_0.gguf")
    if os.path.exists(gguf):
        return gguf
    run = os.path.join(ROOT, "runs", config)
    if not os.path.isdir(os.path.join(run, "final")):
        print(f"training configs/{config}.json into runs/{config}", file=sys.stderr, flush=True)
        subprocess.run([CONCORD, "train", "--config", os.path.join(ROOT, "configs", f"{config}.json"), "--out", run],
                       check=True, stdout=subprocess.DEVNULL)
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run([CONCORD, "export", "--model", run, "--to", "gguf", "--dtype", "q4_0", "--out", gguf], check=True,
                   stdout=subprocess.DEVNULL)
    return gguf


def run_child(cmd, what):
    """Runs cmd; returns (stdout, stderr, peak RSS in MiB of that child alone, from wait4)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = {}
    readers = [threading.Thread(target=lambda k=k, f=f: got.__setitem__(k, f.read())) for k, f in
               (("out", p.stdout), ("err", p.stderr))]
    for t in readers:
        t.start()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join()
    if p.returncode != 0:
        sys.exit(f"expert_cap_bench: {what} failed ({p.returncode}): {got['err'].strip()[-2000:]}")
    return got["out"], got["err"], usage.ru_maxrss / 1024.0


def concord_run(model, prompt, max_tokens, extra):
    cmd = [CONCORD, "generate", "--model", model, "--prompt", prompt, "--max-tokens", str(max_tokens), "--temp", "0",
           "--json"] + extra
    out, err, rss = run_child(cmd, "concord generate " + " ".join(extra))
    j = json.loads(out)
    line = next(l for l in err.splitlines() if l.startswith("load:"))
    fields = dict(part.strip().split(": ", 1) for part in line.split(", ") if ": " in part)
    prefill = float(fields["prefill"].split()[0])
    decode = float(fields["decode"].split()[0])
    return j, prefill, decode, rss


def llamacpp_worker(args):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from llamacpp_lib import Engine  # noqa: E402
    import numpy as np  # noqa: E402

    tokens = json.loads(args.tokens)
    e = Engine(args.model, n_threads=2, n_ctx=2048, n_batch=len(tokens), n_ubatch=len(tokens))
    results = []
    for _ in range(args.repeats + 1):  # the first is a warm-up
        e.clear()
        t0 = time.perf_counter()
        e.decode(tokens, logits="last")
        t1 = time.perf_counter()
        last = int(np.argmax(e.logits(-1)))
        t2 = time.perf_counter()
        for _ in range(args.max_tokens - 1):
            e.decode([last], logits="last")
            last = int(np.argmax(e.logits(-1)))
        t3 = time.perf_counter()
        results.append({"prefill": len(tokens) / (t1 - t0), "decode": (args.max_tokens - 1) / (t3 - t2)})
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024.0
    print(json.dumps({"runs": results[1:], "rss_mib": hwm}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF MoE with Q4_0/Q4_1/Q8_0 experts (default: --config's, trained and exported)")
    ap.add_argument("--config", default="tiny-moe-64",
                    help="without --model: configs/CONFIG.json, trained into runs/CONFIG if absent (default tiny-moe-64; "
                         "moe-wide: 32 experts of width 512 over 256, 27 MiB of Q4_0 experts)")
    ap.add_argument("--caps", default="100,75,50,25,10,5", help="percent of the expert bytes, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--calibrate-caps", default="100,10",
                    help="the LRU caps (percent) whose median runs cap-plan is fitted to (default 100,10)")
    ap.add_argument("--llamacpp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llamacpp_worker:
        return llamacpp_worker(args)

    wait_quiet("expert_cap_bench.py")
    model = args.model or default_model(args.config)
    prompt = bible("Gen1:1-Gen2:25", 380)
    stats_prompt = bible("Exo1:1-Exo2:25", 380)
    stats = os.path.join(os.path.dirname(os.path.abspath(model)), "expert_cap_stats.json")
    concord_run(model, stats_prompt, args.max_tokens, ["--router-stats", stats])

    trace = os.path.join(os.path.dirname(os.path.abspath(model)), "expert_cap.trace")
    configs = [("uncapped", None, ["--routing-trace", trace])]
    for cap in [c.strip() for c in args.caps.split(",") if c.strip()]:
        configs.append(("LRU", cap, ["--memory-cap", f"{cap}%", "--no-prefetch"]))
        configs.append(("prefetch", cap, ["--memory-cap", f"{cap}%"]))
        configs.append(("prefetch+pins", cap, ["--memory-cap", f"{cap}%", "--pin-loads", stats]))
    runs = {i: [] for i in range(len(configs))}
    want = None
    for r in range(args.repeats):
        for i, (mode, cap, extra) in enumerate(configs):
            j, prefill, decode, rss = concord_run(model, prompt, args.max_tokens, extra)
            got = (j["tokens"], j["logprobs"])
            if want is None:
                want = got
            elif got != want:
                sys.exit(f"expert_cap_bench: {mode} at {cap}% changed the tokens or log-probs")
            runs[i].append({"prefill": prefill, "decode": decode, "rss_mib": rss, "memory_cap": j.get("memory_cap"), "json": j})
            print(f"repeat {r + 1}: {mode} {cap or ''}: prefill {prefill:.0f} tok/s, decode {decode:.0f} tok/s", file=sys.stderr,
                  flush=True)

    llama = None
    if os.path.exists(LLAMACPP_PY):
        tokens = json.dumps(concord_run(model, prompt, 1, [])[0]["prompt_tokens"])
        out, _, _ = run_child([LLAMACPP_PY, os.path.abspath(__file__), "--llamacpp-worker", "--model", model, "--tokens", tokens,
                               "--repeats", str(args.repeats), "--max-tokens", str(args.max_tokens)], "llama.cpp")
        llama = json.loads(out)

    # The cap planner (concord cap-plan): the uncapped run's routing trace replayed under every cap,
    # calibrated from the median LRU run at --calibrate-cap; its reads must be the LRU runs' own.
    plan = {}
    lru = {cap: i for i, (mode, cap, _) in enumerate(configs) if mode == "LRU"}
    fit_caps = [c for c in args.calibrate_caps.split(",") if c in lru]
    if fit_caps:
        calib = []
        for c in fit_caps:
            rs = sorted(runs[lru[c]], key=lambda x: x["decode"])
            calib += ["--calibrate", os.path.join(os.path.dirname(os.path.abspath(model)), f"expert_cap_calibration_{c}.json")]
            with open(calib[-1], "w") as f:
                json.dump(rs[len(rs) // 2]["json"], f)
        out, _, _ = run_child([CONCORD, "cap-plan", "--model", model, "--trace", trace, "--json",
                               "--caps", ",".join(f"{c}%" for c in lru)] + calib, "concord cap-plan")
        for line in out.splitlines():
            p = json.loads(line)
            plan[p["cap"].rstrip("%")] = p

    rows = []
    base = None
    for i, (mode, cap, _) in enumerate(configs):
        rs = runs[i]
        med = {k: statistics.median(x[k] for x in rs) for k in ("prefill", "decode", "rss_mib")}
        mc = rs[-1]["memory_cap"]
        row = {"mode": mode, "cap_percent": cap, **med}
        if mc:
            uses = mc["decode"]["uses"]
            row.update({"cap_bytes": mc["cap_bytes"], "expert_bytes": mc["expert_bytes"],
                        "high_water_bytes": mc["high_water_bytes"], "pinned": mc["pinned"],
                        "decode_resident": mc["decode"]["hits"] / uses if uses else 0.0,
                        "decode_reads_per_token": mc["decode"]["loads"] / max(1, args.max_tokens - 1),
                        "decode_stall_s": mc["decode"]["stall_s"], "decode_load_s": mc["decode"]["load_s"],
                        "prefill_stall_s": mc["prefill"]["stall_s"]})
        if mode == "LRU" and cap in plan:
            p = plan[cap]
            measured = mc["prefill"]["loads"], mc["decode"]["loads"]
            if (p["prefill_reads"], p["decode_reads"]) != measured:
                sys.exit(f"expert_cap_bench: cap-plan's reads at {cap}% {p['prefill_reads'], p['decode_reads']} are not the run's {measured}")
            row["predicted_decode"] = p["predicted_decode_tokens_per_s"]
            row["predicted_prefill"] = p["predicted_prefill_tokens_per_s"]
        if base is None:
            base = med
        row["prefill_vs_uncapped"] = med["prefill"] / base["prefill"]
        row["decode_vs_uncapped"] = med["decode"] / base["decode"]
        rows.append(row)

    print(f"\n{cpu_name()}, {model}, {len(prompt)}-token prompt, {args.max_tokens} tokens, median of {args.repeats}")
    print("| mode | cap | prefill tok/s | decode tok/s | vs uncapped (prefill / decode) | decode: resident, reads/token, stall s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        extra = (f"{100 * row['decode_resident']:.1f}%, {row['decode_reads_per_token']:.2f}, {row['decode_stall_s']:.3f}"
                 if "cap_bytes" in row else "-")
        cap = f"{row['cap_percent']}%" if row["cap_percent"] else "-"
        print(f"| {row['mode']} | {cap} | {row['prefill']:.0f} | {row['decode']:.0f} | "
              f"{row['prefill_vs_uncapped']:.2f} / {row['decode_vs_uncapped']:.2f} | {extra} | {row['rss_mib']:.1f} |")
    if plan:
        print(f"\ncap-plan, fitted to the median LRU runs at {', '.join(c + '%' for c in fit_caps)} (reads: equal to every LRU run's):")
        print("| cap | decode reads/token | predicted decode tok/s | measured (median) | error | predicted prefill tok/s | measured | error |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows:
            if "predicted_decode" not in row:
                continue
            ed = row["predicted_decode"] / row["decode"] - 1
            ep = row["predicted_prefill"] / row["prefill"] - 1
            print(f"| {row['cap_percent']}% | {row['decode_reads_per_token']:.2f} | {row['predicted_decode']:.0f} | {row['decode']:.0f} | "
                  f"{100 * ed:+.1f}% | {row['predicted_prefill']:.0f} | {row['prefill']:.0f} | {100 * ep:+.1f}% |")
    if llama:
        lp = statistics.median(x["prefill"] for x in llama["runs"])
        ld = statistics.median(x["decode"] for x in llama["runs"])
        print(f"| llama.cpp (mmap, no cap) | - | {lp:.0f} | {ld:.0f} | {lp / base['prefill']:.2f} / {ld / base['decode']:.2f} | - | "
              f"{llama['rss_mib']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "model": model, "plan": plan, "prompt_tokens": len(prompt), "max_tokens": args.max_tokens,
                       "repeats": args.repeats, "rows": rows, "llamacpp": llama}, f, indent=1)


if __name__ == "__main__":
    main()
