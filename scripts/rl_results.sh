#!/bin/bash
# Reproduces the RL results in docs/results.md (issue 5):
#   1. every weight-sync fault injected into short runs at three sampler/learner presets: which
#      check caught it (and that the previous version kept serving);
#   2. Fair Cast at a learning rate whose per-step update is far below a bf16 ulp: rne, sr, ef;
#   3. the main job (`concord demo`) on its defaults: the comparison table of every arm.
#   bash scripts/rl_results.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-runs/rl-results}
CONCORD="$BUILD/bin/concord"
mkdir -p "$OUT"
export OMP_WAIT_POLICY=passive

# 1. Faults: one run per (preset, fault), 4 GRPO steps after the (cached) warm-up, the fault
#    injected into the sync of step 3 (after real updates, so a stale copy differs).
: > "$OUT/faults.jsonl"
for preset in bf16 mxfp8 nvfp4; do
  for fault in none stale_version dropped_tensor swapped_tensors transposed_tensor untied_lm_head \
               stale_derived zeroed_scales partial_sync wrong_rounding flipped_bit stale_weights \
               overwritten_codes wrong_tensor_scale; do
    dir="$OUT/faults/$preset-$fault"
    args=(rl --quiet --steps 4 --sampler "$preset" --learner "$preset" --base "$OUT/base" --out "$dir")
    [ "$fault" != none ] && args+=(--fault "$fault@3")
    "$CONCORD" "${args[@]}" > /dev/null
    python3 - "$dir/summary.json" "$preset" "$fault" >> "$OUT/faults.jsonl" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
ev = s.get("sync_events", [])
print(json.dumps({"preset": sys.argv[2], "fault": sys.argv[3], "failures": s["sync_failures"],
                  "by_check": s.get("sync_failures_by_check", {}),
                  "message": ev[0]["message"] if ev else ""}))
PY
  done
done

# 2. Fair Cast: bf16 served copy, learning rate 2e-6, 300 steps, each export rule.
for rule in rne sr ef; do
  "$CONCORD" rl --quiet --sampler bf16 --learner bf16 --export "$rule" --lr 2e-6 --steps 300 \
    --base "$OUT/base" --out "$OUT/faircast-$rule" > "$OUT/faircast-$rule.txt"
done

# 3. The main job.
"$CONCORD" demo --quiet --out "$OUT/demo" > "$OUT/demo.txt"
echo "results in $OUT"
