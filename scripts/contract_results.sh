#!/bin/bash
# Reproduces the kernel-contract results in docs/results.md: trains the tiny KJV model (if
# absent), then measures every kernel variant against the fp64 reference on KJV prompts and on
# task prompts, fits a contract on the in-contract fp32 variants and checks the out-of-contract
# kernel against it.
#   bash scripts/contract_results.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-runs/contract-results}
CONCORD="$BUILD/bin/concord"
mkdir -p "$OUT"

if [ ! -f "$OUT/tiny/final/model.safetensors" ]; then
  "$CONCORD" train --config configs/tiny.json --out "$OUT/tiny" --quiet
fi
MODEL="$OUT/tiny/final"

# Prompts: the first 8 to 100 bytes of 120 verses of the Gospels (one prompt per line, labelled
# by book), so prompt lengths span the three prompt_len slices.
: > "$OUT/prompts.jsonl"
for book in Matt Mark Luke John; do
  bible -f "${book}5:1-30" | python3 -c '
import json, sys
book = sys.argv[1]
for i, line in enumerate(sys.stdin):
    text = line.split(" ", 1)[1].rstrip("\n")
    cut = [8, 20, 40, 70, 100][i % 5]
    print(json.dumps({"prompt": text[:cut], "label": book}))
' "$book" >> "$OUT/prompts.jsonl"
done

for cand in fp32 fp32-reversed fp32-blocked fp32-batch-split bf16 mxfp8 fp8-tensor mxfp4 nvfp4; do
  "$CONCORD" contract measure --model "$MODEL" --ref fp64 --cand "$cand" \
    --prompts "$OUT/prompts.jsonl" --max-new 48 --batch 8 --out "$OUT/fp64-vs-$cand" \
    > "$OUT/fp64-vs-$cand.txt"
  "$CONCORD" contract measure --model "$MODEL" --ref fp64 --cand "$cand" \
    --task mixed --count 60 --difficulty 3 --max-new 16 --batch 8 \
    --out "$OUT/task-fp64-vs-$cand" > "$OUT/task-fp64-vs-$cand.txt"
done

# A contract for fp32-class kernels: fitted on fp64 vs fp32-blocked (the widest in-contract
# reduction order), checked against fp32-reversed (passes) and fp32-drop-late (fails on
# position:[64,inf)).
cp "$OUT/fp64-vs-fp32-blocked/contract.json" "$OUT/fp32-class-contract.json"
for cand in fp32-reversed fp32-drop-late; do
  set +e
  "$CONCORD" contract check --contract "$OUT/fp32-class-contract.json" --model "$MODEL" \
    --ref fp64 --cand "$cand" --prompts "$OUT/prompts.jsonl" --max-new 48 --batch 8 \
    --out "$OUT/check-$cand" > "$OUT/check-$cand.txt"
  echo "check $cand: exit $?" >> "$OUT/check-status.txt"
  set -e
done
echo "results in $OUT"
