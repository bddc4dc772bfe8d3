#!/usr/bin/env python3
"""llama.cpp's speed on a GGUF (default: SmolLM2-135M-Instruct Q4_1), measured as llama-bench
defines it, for the side-by-side table in bench/README.md (issue 15).

  tools/.llamacpp-venv/bin/python tools/bench_llamacpp.py --out bench-llamacpp.json
  tools/.llamacpp-venv/bin/python tools/bench_llamacpp.py --threads 1,2 --repeats 5 --out F

For each thread count, in a fresh child process (so peak RSS is that configuration's alone):
  pp512  one 512-token batch (n_batch = n_ubatch = 512) of random tokens into an empty KV cache,
         one llama_decode, logits of the last token only (llama-bench's test_prompt); tokens/s.
  tg128  after a short prompt (untimed), 128 single-token llama_decode calls, each token random
         as in llama-bench's test_gen; tokens/s. llama-bench starts tg from an empty cache; the
         short prompt (the TTFT chat prompt, ~37 tokens) changes attention cost by < 1%.
  ttft   time to first token of --prompt rendered with the model's chat template: tokenize,
         prefill in one llama_decode, argmax of the last logits (model loaded and warm).
  load   llama_model_load_from_file + llama_init_from_model, seconds (mmap'd weights).
  rss    VmHWM (peak resident set) of the child at the end, and its VmRSS before the model was
         loaded (Python + numpy + the llama.cpp libraries), so rss_model_mib is llama.cpp's own.
Derived: pp_linear_gflop_s = pp512 x 2 x (parameters - the tied head's) and tg_weight_gb_s =
tg128 x the model's tensor bytes (llama_model_size: each decode step reads every weight once).
One warm-up run of each test precedes the timed repeats; the figures are medians (mean and
min/max kept too). Python overhead: the time inside the llama_decode C calls themselves is
summed apart from each test's wall time; python_overhead_max is 1 - (C time / wall time), the share
of the timed loop spent in Python (filling the llama_batch, the loop, the ctypes call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_PROMPT = "What is the capital of France?"


def proc_status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return -1


def stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "mean": statistics.fmean(values),
            "min": min(values), "max": max(values), "n": len(values)}


def worker(args) -> dict:
    import llama_cpp
    from llamacpp_lib import Engine, chat_template, render_chatml

    rss_before = proc_status("VmRSS")
    hwm_before = proc_status("VmHWM")
    template = chat_template(args.model)
    t0 = time.perf_counter()
    eng = Engine(args.model, n_threads=args.threads, n_ctx=args.n_prompt + args.n_gen + 64,
                 n_batch=args.n_prompt, n_ubatch=args.n_prompt)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    sync = getattr(llama_cpp, "llama_synchronize", None)

    def timed_decode(tokens):
        eng.decode(tokens, logits="last")
        if sync is not None:
            sync(eng.ctx)

    def pp_once() -> tuple[float, float]:
        toks = [int(t) for t in rng.integers(0, eng.n_vocab, args.n_prompt)]
        eng.clear()
        eng.decode_seconds = 0.0
        a = time.perf_counter()
        timed_decode(toks)
        wall = time.perf_counter() - a
        return args.n_prompt / wall, eng.decode_seconds / wall

    prompt_text = render_chatml(template, [{"role": "user", "content": args.prompt}])
    prompt_ids = eng.tokenize(prompt_text)

    def tg_once() -> tuple[float, float]:
        eng.clear()
        eng.decode(prompt_ids, logits="last")
        toks = [int(t) for t in rng.integers(0, eng.n_vocab, args.n_gen)]
        eng.decode_seconds = 0.0
        a = time.perf_counter()
        for t in toks:
            timed_decode([t])
        wall = time.perf_counter() - a
        return args.n_gen / wall, eng.decode_seconds / wall

    def ttft_once() -> float:
        eng.clear()
        a = time.perf_counter()
        ids = eng.tokenize(prompt_text)
        eng.decode(ids, logits="last")
        int(np.argmax(eng.logits()))
        return time.perf_counter() - a

    result = {"threads": args.threads, "load_s": load_s, "n_prompt": args.n_prompt,
              "n_gen": args.n_gen, "ttft_prompt_tokens": len(prompt_ids)}
    for name, fn in (("pp", pp_once), ("tg", tg_once)):
        fn()  # warm-up
        runs = [fn() for _ in range(args.repeats)]
        result[f"{name}{args.n_prompt if name == 'pp' else args.n_gen}_tok_s"] = stats(
            [r[0] for r in runs])
        result[f"{name}_python_overhead_max"] = 1.0 - min(r[1] for r in runs)
    ttft_once()
    result["ttft_s"] = stats([ttft_once() for _ in range(args.repeats)])
    # Derived: prefill GFLOP/s of the layers' matrices (2 x their parameters per token; the tied
    # head runs once per batch, attention adds ~8% at 512 and is not counted) and decode weight
    # streaming (every tensor byte is read once per token: the layers and the tied Q8_0 head).
    n_params = llama_cpp.llama_model_n_params(eng.model)
    head = eng.n_vocab * llama_cpp.llama_model_n_embd(eng.model)
    size = llama_cpp.llama_model_size(eng.model)
    pp = result[f"pp{args.n_prompt}_tok_s"]["median"]
    tg = result[f"tg{args.n_gen}_tok_s"]["median"]
    result["model_params"] = n_params
    result["model_tensor_bytes"] = size
    result["pp_linear_gflop_s"] = pp * 2 * (n_params - head) / 1e9
    result["tg_weight_gb_s"] = tg * size / 1e9
    result["loadavg_end"] = os.getloadavg()
    result["rss_before_model_mib"] = rss_before / 2**20
    result["peak_rss_mib"] = proc_status("VmHWM") / 2**20
    result["rss_model_mib"] = (proc_status("VmHWM") - max(rss_before, 0)) / 2**20
    result["hwm_before_model_mib"] = hwm_before / 2**20
    eng.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from llamacpp_lib import DEFAULT_MODEL
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="chat prompt for time-to-first-token")
    ap.add_argument("--out", help="JSON output file (required unless --worker)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        args.threads = int(args.threads)
        print(json.dumps(worker(args)))
        return 0
    if not args.out:
        ap.error("--out FILE is required")
    from llamacpp_lib import cpu_name, versions

    runs = []
    for t in [int(x) for x in args.threads.split(",")]:
        cmd = [sys.executable, __file__, "--worker", "--threads", str(t), "--model", args.model,
               "--repeats", str(args.repeats), "--n-prompt", str(args.n_prompt),
               "--n-gen", str(args.n_gen), "--prompt", args.prompt]
        load0 = os.getloadavg()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        r["loadavg_start"] = load0
        runs.append(r)
        pp = r[f"pp{args.n_prompt}_tok_s"]["median"]
        tg = r[f"tg{args.n_gen}_tok_s"]["median"]
        print(f"threads {t}: pp{args.n_prompt} {pp:.1f} tok/s, tg{args.n_gen} {tg:.1f} tok/s, "
              f"ttft {r['ttft_s']['median'] * 1e3:.1f} ms ({r['ttft_prompt_tokens']} tokens), "
              f"load {r['load_s']:.3f} s, peak RSS {r['peak_rss_mib']:.1f} MiB "
              f"({r['rss_model_mib']:.1f} above Python's {r['rss_before_model_mib']:.1f}), "
              f"python overhead pp {r['pp_python_overhead_max']:.2%} tg {r['tg_python_overhead_max']:.2%}",
              file=sys.stderr)
    doc = {"engine": "llama.cpp", **versions(), "cpu": cpu_name(),
           "model": Path(args.model).name, "repeats": args.repeats,
           "command": " ".join([Path(sys.executable).name, "tools/bench_llamacpp.py"] + sys.argv[1:]),
           "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
