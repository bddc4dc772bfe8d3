#!/usr/bin/env bash
# `concord serve` under load on SmolLM2-135M-Instruct (issue 17; the table goes into bench/README.md,
# "concord serve"), in one sitting:
#   1. bench/serve_load.py against `concord serve --max-sequences 8` (native policy, loopback):
#      the reference pass (all 128 requests one at a time), then 1 x 16, 8 x 4, 32 x 2 and 128 x 1
#      (clients x requests each) streaming requests of at most MAX_TOKENS (default 32) tokens; every
#      level checks each request answered once and identical to its one-at-a-time output;
#   2. the in-process baseline: bench/real_model_bench.cpp's BM_EngineServeWorkload, the same
#      requests through serve::Engine (1 x 16 at max-sequences 1, 32 at max-sequences 8).
# ROUNDS (default 3) rounds alternate 1 and 2 so that other load hits both alike; the table takes
# the best round of each (contention only slows a run down) and shows the medians.
# Usage: bash bench/serve_run.sh [build-dir]  -> BUILD/serve/{reference,serve_load.R,engine_baseline.R}.json
#        and the table on stdout. Waits (up to WAIT_MAX s, default 600) for no compiler running and
#        load < 1.5; FORCE=1 skips the wait. Exit 1 when a load check failed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${1:-build}"
concord="$build/bin/concord" bench="$build/bin/real_model_bench" py=".venv/bin/python"
for f in "$concord" "$bench"; do
  [[ -x "$f" ]] || { echo "bench/serve_run.sh: $f not found (build it: cmake --build build --target $(basename "$f"))" >&2; exit 2; }
done
model="$(scripts/smollm2-path)"
out="$build/serve"
mkdir -p "$out"
max_tokens="${MAX_TOKENS:-32}" threads="$(nproc)" rounds="${ROUNDS:-3}"

quiet() {
  { pgrep -x cc1plus || pgrep -x ld; } >/dev/null && return 1
  awk -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN { exit !(l < 1.5) }'
}
if [[ -z "${FORCE:-}" ]]; then
  waited=0
  until quiet; do
    if (( waited >= ${WAIT_MAX:-600} )); then
      echo "bench/serve_run.sh: the machine stayed busy for ${waited} s (load $(cut -d' ' -f1-3 /proc/loadavg)); rerun later or FORCE=1" >&2
      exit 3
    fi
    (( waited % 60 == 0 )) && echo "bench/serve_run.sh: waiting for a quiet machine (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    sleep 5; waited=$((waited + 5))
  done
fi
echo "== start $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# The engine runs under the OpenMP wait policy `concord serve` runs under: with neither
# OMP_WAIT_POLICY nor GOMP_SPINCOUNT set, `concord serve` keeps libgomp's default bounded spin
# (src/concord/cli/runtime.cpp), and so does the in-process baseline here (the benchmark binary
# is not re-executed). `OMP_WAIT_POLICY=passive bash bench/serve_run.sh` measures both with the
# passive wait the other concord commands use.
engine_env=()
wait_policy="OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset: the bounded spin of libgomp, the serve default}${GOMP_SPINCOUNT:+, GOMP_SPINCOUNT=$GOMP_SPINCOUNT}"
echo "== OpenMP wait: $wait_policy" >&2
status=0
levels="1x16,8x4,32x2,128x1"
# Round 1 also makes the reference (every request alone); each round then runs every level and
# the in-process engine once, alternating, so that load from other processes hits both alike.
for round in $(seq 1 "$rounds"); do
  ref_flag=(--load-reference "$out/reference.json")
  [[ $round -eq 1 ]] && ref_flag=(--save-reference "$out/reference.json")
  echo "== round $round/$rounds: server ($(date -u +%TZ), load $(cut -d' ' -f1 /proc/loadavg))" >&2
  "$py" bench/serve_load.py --server-bin "$concord" --model "$model" --max-sequences 8 \
    --levels "$levels" --max-tokens "$max_tokens" --wall-cap 300 "${ref_flag[@]}" \
    --out "$out/serve_load.$round.json" || status=1
  echo "== round $round/$rounds: engine ($(date -u +%TZ), load $(cut -d' ' -f1 /proc/loadavg))" >&2
  env "${engine_env[@]}" CONCORD_SMOLLM2="$model" \
    CONCORD_SERVE_WORKLOAD="1,16,$max_tokens,$threads;8,32,$max_tokens,$threads" \
    "$bench" --benchmark_filter=EngineServeWorkload --benchmark_format=json \
    --benchmark_out="$out/engine_baseline.$round.json" --benchmark_out_format=json >/dev/null
done
echo "== end $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

"$py" - "$out" "$rounds" "$wait_policy" <<'PY'
import json, statistics, sys
from pathlib import Path
out, rounds, wait_policy = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
loads = [json.loads((out / f"serve_load.{r}.json").read_text()) for r in range(1, rounds + 1)]
engines = []
for r in range(1, rounds + 1):
    bs = json.loads((out / f"engine_baseline.{r}.json").read_text())["benchmarks"]
    engines.append({int(b["max_sequences"]): b for b in bs if b.get("run_type", "iteration") == "iteration"})
first = loads[0]
ref = first["reference"]
print(f"concord serve, SmolLM2-135M-Instruct Q4_1 (native), max-sequences {first['max_sequences']}, "
      f"max_tokens {first['max_tokens']}, {rounds} rounds; CPU {first['cpu']}; first round {first['utc']}; "
      f"OpenMP wait {wait_policy}")
print(f"reference pass (one at a time): {ref['requests']} requests, {ref['generated_tokens']} tokens, "
      f"{ref['tokens_per_s']} tok/s, TTFT p50 {ref['ttft_ms_p50']} ms")
print()
print("Per round, tok/s (server levels; engine in-process):")
for r, (load, eng) in enumerate(zip(loads, engines), 1):
    cells = ", ".join(f"{s['clients']}x{s['requests_per_client']}: {s['tokens_per_s']}" for s in load["levels"])
    print(f"  round {r} ({load['utc']}): {cells}; engine 1 seq: "
          f"{eng[1]['generated_tokens_per_s']:.1f}, 8 seqs: {eng[8]['generated_tokens_per_s']:.1f}")
print()
best = {}
for load in loads:
    for s in load["levels"]:
        c = s["clients"]
        if c not in best or s["tokens_per_s"] > best[c]["tokens_per_s"]:
            best[c] = s
ok = all(not s["problems"] for load in loads for s in load["levels"])
print(f"Best round per level (all rounds: every request answered once, identical to alone: "
      f"{'yes' if ok else 'NO'}):")
print()
print("| clients x requests | tokens | tok/s (best; median) | vs 1 client | TTFT p50 / p99 ms | ITL p50 / p99 ms |")
print("|---|---:|---:|---:|---:|---:|")
for c, s in sorted(best.items()):
    med = statistics.median(l["tokens_per_s"] for load in loads for l in load["levels"] if l["clients"] == c)
    print(f"| {c} x {s['requests_per_client']} | {s['generated_tokens']} | {s['tokens_per_s']}; {med:.1f} | "
          f"{s['tokens_per_s'] / best[1]['tokens_per_s']:.2f}x | {s['ttft_ms_p50']} / {s['ttft_ms_p99']} | "
          f"{s['itl_ms_p50']} / {s['itl_ms_p99']} |")
print()
for seqs, c in ((1, 1), (8, 8)):
    e = max(eng[seqs]["generated_tokens_per_s"] for eng in engines)
    last = max((eng[seqs] for eng in engines), key=lambda b: b["generated_tokens_per_s"])
    print(f"in-process engine, max-sequences {seqs} (best of {rounds}): {e:.1f} tok/s "
          f"(decode rows/s {last['decode_rows_per_s']:.1f}, prefill {last['prefill_seconds']:.2f} s, "
          f"decode {last['decode_seconds']:.2f} s, {int(last['steps'])} steps); server at {c} "
          f"client(s): {best[c]['tokens_per_s']} tok/s = {best[c]['tokens_per_s'] / e:.1%} of it (goal >= 90%)")
print(f"8 clients / 1 client (best rounds): {best[8]['tokens_per_s'] / best[1]['tokens_per_s']:.2f}x (goal >= 4x); "
      f"engine 8 / 1: {max(e[8]['generated_tokens_per_s'] for e in engines) / max(e[1]['generated_tokens_per_s'] for e in engines):.2f}x")
print(f"server exit status on SIGTERM: {[load.get('server_exit_status') for load in loads]}")
for load in loads:
    for s in load["levels"]:
        for p in s["problems"][:5]:
            print(f"PROBLEM at {s['clients']} clients ({load['utc']}): {p}")
PY
exit $status
