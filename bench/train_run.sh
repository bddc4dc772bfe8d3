#!/usr/bin/env bash
# Training throughput per config and precision preset, each case in its own process (so the
# peak RSS is the case's own), with the GEMM-bound rate measured in the same process.
# Usage: bash bench/train_run.sh [build-dir]   -> a table, and $build/train_bench.json
set -euo pipefail
build="${1:-build}"
bin="$build/bin/train_bench"
[[ -x "$bin" ]] || { echo "bench/train_run.sh: $bin not found; build first" >&2; exit 2; }
out="$build/train_bench.json"
parts=()
for config in 0 1; do
  for preset in 0 1 2 3 4 5; do
    part="$build/train_bench.$config.$preset.json"
    "$bin" --benchmark_filter="^BM_gemm_bound/$config/|^BM_train_step/config:$config/preset:$preset/" \
      --benchmark_format=json --benchmark_out="$part" --benchmark_out_format=json >/dev/null
    parts+=("$part")
  done
done
python3 - "$out" "${parts[@]}" <<'PY'
import json, sys
rows, merged = [], None
for path in sys.argv[2:]:
    report = json.load(open(path))
    merged = merged or {"context": report["context"], "benchmarks": []}
    merged["benchmarks"] += report["benchmarks"]
    bound = next(b for b in report["benchmarks"] if b["name"].startswith("BM_gemm_bound"))
    step = next(b for b in report["benchmarks"] if b["name"].startswith("BM_train_step"))
    rows.append((step["label"], step["tokens_per_s"], step["real_time"],
                 bound["tokens_per_s"], step["ratio_to_gemm_bound"], step["peak_rss_MiB"]))
json.dump(merged, open(sys.argv[1], "w"), indent=1)
fp32 = {label.split("/")[0]: tps for label, tps, *_ in rows if label.endswith("/fp32")}
print(f"{'config/preset':<20} {'tokens/s':>9} {'step ms':>9} {'vs fp32 time':>12} {'GEMM-bound tok/s':>17} {'ratio':>6} {'peak RSS MiB':>12}")
for label, tps, step_ms, bound, ratio, rss in rows:
    base = fp32[label.split("/")[0]]
    print(f"{label:<20} {tps:>9.0f} {step_ms:>9.0f} {base / tps:>11.2f}x {bound:>17.0f} {ratio:>6.0%} {rss:>12.0f}")
PY
