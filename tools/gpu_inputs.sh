#!/usr/bin/env bash
# Makes the GPU contract's inputs here, before a GPU run (docs/cuda.md): SmolLM2-135M-Instruct (its
# GGUF) completes tools/gpu_prompts.txt greedily with concord's fp32 kernel, `concord contract dump
# --hidden` writes every row's logits and lm_head input, tools/gpu_inputs.py keeps 48 rows spread
# over them and the GGUF's Q8_0 token_embd blocks (the tied lm_head), and cuda_gemm verify-inputs
# checks on this CPU that concord's GEMM on those inputs reproduces the dump's logits bit for bit
# (the target the GPU's exact product must then meet).
#   gpu-inputs/  hidden.npy, token_embd.q8_0.npy, cpu-fp32.sums.json   (carried: ~30 MiB)
#   gpu-ref/     cpu-fp32.npy (+ .rows.json): the contract's reference rows, kept here
#
#   bash tools/gpu_inputs.sh [build-dir] [cuda-build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
cuda_build="${2:-build-cuda}"
[[ -x "$build/bin/concord" ]] || { echo "tools/gpu_inputs.sh: $build/bin/concord not found (cmake --build $build --target concord)" >&2; exit 2; }
[[ -x "$cuda_build/bin/cuda_gemm" ]] || { echo "tools/gpu_inputs.sh: $cuda_build/bin/cuda_gemm not found (make cuda)" >&2; exit 2; }
model="$(scripts/smollm2-path)"
mkdir -p gpu-ref
"$build/bin/concord" contract dump --model "$model" --kernel fp32 --prompts tools/gpu_prompts.txt \
  --max-new 16 --out gpu-ref/dump-fp32.npy --hidden gpu-ref/dump-hidden.npy --quiet
.venv/bin/python tools/gpu_inputs.py --dump gpu-ref/dump-fp32.npy --hidden gpu-ref/dump-hidden.npy \
  --model "$model" --rows 48 --out gpu-inputs --ref gpu-ref
"$cuda_build/bin/cuda_gemm" verify-inputs --hidden gpu-inputs/hidden.npy \
  --q8-0 gpu-inputs/token_embd.q8_0.npy --sums gpu-inputs/cpu-fp32.sums.json
du -sh gpu-inputs
