#!/usr/bin/env bash
# SmolLM2-135M-Instruct (its Q4_1 GGUF) served by concord and by llama.cpp in one sitting, on the
# same file and thread counts (issue 15; the table goes into bench/README.md, "SmolLM2 vs llama.cpp"):
#   concord   bench/real_model_bench.cpp: pp512 / tg128 at 1 and 2 threads, native (W4A8 on the
#             stored blocks) and fp32 (dequantized), memcpy of the native weight bytes as baseline;
#             then each policy alone in its own process for its peak RSS; then `concord generate
#             --chat` on PROMPT for load time and time to first token (median of REPEATS runs).
#   llama.cpp tools/bench_llamacpp.py (llama-bench's pp512 / tg128, TTFT of the same chat prompt,
#             load, peak RSS), in tools/.llamacpp-venv (tools/llamacpp_env.sh builds it).
# Usage: bash bench/smollm2_run.sh [build-dir]   -> BUILD/smollm2/{real_model_bench*.json,
#        bench_llamacpp.json, generate_ttft.json} and the table on stdout.
# It waits (up to WAIT_MAX s, default 1800) for a quiet machine (see quiet() below: no compiler,
# and load < 1.0 or 90% idle CPUs over 10 s); FORCE=1 skips the wait. REPEATS (default 5) for TTFT and llama.cpp.
# LLAMACPP_VENV picks another llama.cpp build (default tools/.llamacpp-venv); with CONCORD_ISA=avx2
# and an AVX2-only build (tools/llamacpp_env.sh with LLAMACPP_VENV=tools/.llamacpp-avx2-venv and
# CMAKE_ARGS turning GGML_NATIVE, GGML_AVX512 and GGML_AVX_VNNI off) both sides run AVX2 kernels
# on an AVX-512 machine (bench/README.md, "SmolLM2 on the AVX2 paths").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${1:-build}"
bin="$build/bin/real_model_bench" concord="$build/bin/concord" lpy="${LLAMACPP_VENV:-tools/.llamacpp-venv}/bin/python"
for f in "$bin" "$concord"; do
  [[ -x "$f" ]] || { echo "bench/smollm2_run.sh: $f not found (build it: cmake --build build --target $(basename "$f"))" >&2; exit 2; }
done
[[ -x "$lpy" ]] || { echo "bench/smollm2_run.sh: $lpy not found (build llama.cpp once: tools/llamacpp_env.sh)" >&2; exit 2; }
model="$(scripts/smollm2-path)"
[[ -f "$model" ]] || { echo "bench/smollm2_run.sh: $model: no model file (run scripts/setup)" >&2; exit 2; }
export CONCORD_SMOLLM2="$model"
out="${OUT:-$build/smollm2}"  # OUT: another folder for the results (e.g. an AVX2 sitting)
mkdir -p "$out"
repeats="${REPEATS:-5}" prompt="${PROMPT:-What is the capital of France?}"

# Quiet: no compiler or linker running, and either the 1-minute load average below 1.0 or the
# two CPUs at least 90% idle over the last 10 s (the load average lags a just-finished job by ~1 min).
idle_share() {
  local a b
  read -r _ a1 a2 a3 a4 a5 _ < /proc/stat; a=$((a1 + a2 + a3 + a4 + a5)); local ai=$((a4 + a5))
  sleep 10
  read -r _ b1 b2 b3 b4 b5 _ < /proc/stat; b=$((b1 + b2 + b3 + b4 + b5)); local bi=$((b4 + b5))
  echo $(( 100 * (bi - ai) / (b - a > 0 ? b - a : 1) ))
}
quiet() {
  { pgrep -x cc1plus || pgrep '^clang' || pgrep -x ld; } >/dev/null && return 1
  local load; load="$(cut -d' ' -f1 /proc/loadavg)"
  awk -v l="$load" 'BEGIN { exit !(l < 1.0) }' && return 0
  (( $(idle_share) >= 90 ))
}
wait_quiet() {
  [[ -n "${FORCE:-}" ]] && return 0
  local waited=0
  until quiet; do
    if (( waited >= ${WAIT_MAX:-1800} )); then
      echo "bench/smollm2_run.sh: the machine stayed busy for ${waited} s (load $(cut -d' ' -f1-3 /proc/loadavg)); rerun later or FORCE=1" >&2
      exit 3
    fi
    (( waited % 60 == 0 )) && echo "bench/smollm2_run.sh: waiting for a quiet machine (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    sleep 5; waited=$((waited + 15))
  done
}

wait_quiet
echo "== concord: $bin (all) -> $out/real_model_bench.json" >&2
"$bin" --benchmark_format=json --benchmark_out="$out/real_model_bench.json" --benchmark_out_format=json >/dev/null
for p in 0 1; do  # each policy alone, for its own peak RSS
  "$bin" --benchmark_filter="policy:$p/" --benchmark_format=json \
    --benchmark_out="$out/real_model_bench_policy$p.json" --benchmark_out_format=json >/dev/null
done

echo "== concord generate --chat (TTFT, load), $repeats runs per thread count" >&2
ttft_log="$out/generate_ttft.log"
: > "$ttft_log"
for t in 1 2; do
  for ((i = 0; i < repeats; i++)); do
    printf 'threads %s ' "$t" >> "$ttft_log"
    OMP_NUM_THREADS="$t" "$concord" generate --model "$model" --chat --prompt "$prompt" --temp 0 \
      --max-tokens 8 2>&1 >/dev/null | tail -n 1 >> "$ttft_log"
  done
done

echo "== llama.cpp: tools/bench_llamacpp.py -> $out/bench_llamacpp.json" >&2
"$lpy" tools/bench_llamacpp.py --model "$model" --threads 1,2 --repeats "$repeats" \
  --prompt "$prompt" --out "$out/bench_llamacpp.json"

python3 - "$out" "$model" <<'PY'
import json, os, re, statistics, sys
from pathlib import Path
out, model = Path(sys.argv[1]), sys.argv[2]

def args(name):
    return dict(p.split(":") for p in name.split("/")[1:] if ":" in p)

def bench(path):
    return [b for b in json.load(open(path))["benchmarks"] if b.get("run_type", "iteration") == "iteration"]

speed, memcpy, wbytes = {}, None, None
for b in bench(out / "real_model_bench.json"):
    kind, a = b["name"].split("/")[0], args(b["name"])
    if kind == "BM_Memcpy":
        memcpy = b["bytes_per_s"]
        continue
    pol = "native" if a["policy"] == "0" else "fp32"
    speed[(kind, pol, int(a["threads"]))] = b["tokens_per_s"]
    if kind == "BM_Decode128" and pol == "native":
        wbytes = b["weight_bytes"]
rss = {("native", "fp32")[p]: max(b["peak_rss_mb"] for b in bench(out / f"real_model_bench_policy{p}.json"))
       for p in (0, 1)}

ttft = {}
for line in open(out / "generate_ttft.log"):
    m = re.match(r"threads (\d+) load: ([\d.]+) s, prompt tokens: (\d+), .*time to first token: ([\d.]+) ms", line)
    if m:
        ttft.setdefault(int(m[1]), []).append((float(m[2]), int(m[3]), float(m[4])))
json.dump({str(t): {"load_s": statistics.median(r[0] for r in v), "prompt_tokens": v[0][1],
                    "ttft_ms": statistics.median(r[2] for r in v), "runs": len(v)}
           for t, v in ttft.items()}, open(out / "generate_ttft.json", "w"), indent=1)

lc = json.load(open(out / "bench_llamacpp.json"))
lcr = {r["threads"]: r for r in lc["runs"]}
mbytes = os.path.getsize(model)
cpu = lc.get("cpu", "?")
print(f"SmolLM2-135M-Instruct {Path(model).name}; CPU {cpu}; load {os.getloadavg()[0]:.2f} at the end")
print(f"llama.cpp: llama-cpp-python {lc.get('llama_cpp_python')}; {lc.get('system_info', '')[:160]}")
print(f"concord: CONCORD_ISA={os.environ.get('CONCORD_ISA', '(unset: the best this CPU runs)')}")
print()
print(f"{'test':<6} {'thr':>3} {'concord native':>14} {'concord fp32':>12} {'llama.cpp':>9} {'native/llama':>12} {'goal':>5}")
for kind, key, test, goal in (("BM_Prefill512", "pp512_tok_s", "pp512", 3.0),
                              ("BM_Decode128", "tg128_tok_s", "tg128", 2.0)):
    for t in (1, 2):
        n, f, l = speed[(kind, "native", t)], speed[(kind, "fp32", t)], lcr[t][key]["median"]
        print(f"{test:<6} {t:>3} {n:>14.1f} {f:>12.1f} {l:>9.1f} {n / l:>11.2f}x {goal:>4.0f}x")
print()
print(f"memcpy (native weight bytes, {wbytes / 1e6:.1f} MB, 1 thread): {memcpy / 1e9:.2f} GB/s copied")
for t in (1, 2):
    n = speed[("BM_Decode128", "native", t)] * wbytes
    l = lcr[t]["tg128_tok_s"]["median"] * mbytes
    print(f"decode weight stream, {t} thr: concord native {n / 1e9:.2f} GB/s ({n / memcpy:.0%} of memcpy); "
          f"llama.cpp {l / 1e9:.2f} GB/s ({l / memcpy:.0%}; file bytes x tg128)")
print()
for t in (1, 2):
    r = lcr[t]
    print(f"peak RSS, {t} thr: llama.cpp {r['peak_rss_mib']:.1f} MiB (process, with Python's "
          f"{r['rss_before_model_mib']:.1f}) = {r['rss_model_mib']:.1f} MiB above Python")
for pol in ("native", "fp32"):
    print(f"peak RSS: concord {pol} {rss[pol]:.1f} MiB (whole process, pp512 + tg128 at 1 and 2 threads)")
lm = max(r["rss_model_mib"] for r in lc["runs"])
print(f"concord native / llama.cpp (above Python): {rss['native'] / lm:.2f} (goal <= 1.20)")
print()
for t in (1, 2):
    g, r = ttft.get(t), lcr[t]
    if not g:
        continue
    gm = statistics.median(x[2] for x in g)
    print(f"TTFT (chat prompt), {t} thr: concord generate {gm:.1f} ms ({g[0][1]} tokens; load "
          f"{statistics.median(x[0] for x in g):.2f} s) vs llama.cpp {r['ttft_s']['median'] * 1e3:.1f} ms "
          f"({r['ttft_prompt_tokens']} tokens; load {r['load_s']:.2f} s)")
PY
