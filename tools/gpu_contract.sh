#!/usr/bin/env bash
# After a GPU run (tools/gpu_check.sh) brought back its lm_head logits: the first GPU-vs-CPU kernel
# contracts (docs/cuda.md, docs/results.md), measured here with `concord contract measure` on the
# 48 SmolLM2-135M rows of gpu-ref/ (tools/gpu_inputs.sh):
#   cpu-fp32    vs cublas-bf16       concord's CPU logits against cuBLASLt BF16 (what a BF16 engine serves)
#   exact-bf16  vs cublas-bf16       the same bf16 operands: cuBLASLt's accumulation alone
#   cpu-fp32    vs cublas-fp8        against per-tensor FP8 E4M3 on cuBLASLt
#   exact-fp8   vs cublas-fp8        the same FP8 operands: cuBLASLt's FP8 accumulation alone
#   exact-fp8   vs cublas-fp8-fast   ... with fast accumulation
#   cpu-fp32    vs exact-bf16        the bf16 rounding of X and W alone (an exact product)
#   cpu-fp32    vs exact-fp8         the per-tensor FP8 E4M3 rounding of X and W alone (an exact product)
#
#   bash tools/gpu_contract.sh GPU_OUT_DIR [build-dir]     -> gpu-ref/contract/<case>/, summary on stdout
set -euo pipefail
cd "$(dirname "$0")/.."
gpu_out="${1:?usage: tools/gpu_contract.sh GPU_OUT_DIR [build-dir]}"
build="${2:-build}"
concord="$build/bin/concord"
[[ -x "$concord" ]] || { echo "tools/gpu_contract.sh: $concord not found" >&2; exit 2; }
[[ -f gpu-ref/cpu-fp32.npy ]] || { echo "tools/gpu_contract.sh: gpu-ref/cpu-fp32.npy missing (tools/gpu_inputs.sh)" >&2; exit 2; }
mkdir -p gpu-ref/logits gpu-ref/contract
for f in "$gpu_out"/logits/*.npy; do  # the device's files are read-only: copy, add the rows
  name=$(basename "$f")
  cp "$f" "gpu-ref/logits/$name"
  cp gpu-ref/cpu-fp32.npy.rows.json "gpu-ref/logits/$name.rows.json"
done
side() { [[ $1 == cpu-fp32 ]] && echo gpu-ref/cpu-fp32.npy || echo "gpu-ref/logits/$1.npy"; }
for pair in cpu-fp32:cublas-bf16 exact-bf16:cublas-bf16 cpu-fp32:cublas-fp8 exact-fp8:cublas-fp8 \
            exact-fp8:cublas-fp8-fast cpu-fp32:exact-bf16 cpu-fp32:exact-fp8; do
  ref=${pair%%:*} cand=${pair##*:}
  echo "== $ref vs $cand"
  "$concord" contract measure --ref "$(side "$ref")" --cand "$(side "$cand")" --out "gpu-ref/contract/$ref-vs-$cand"
done
