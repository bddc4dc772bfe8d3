#!/usr/bin/env bash
# The one prepared GPU run of concord's CUDA slice (docs/cuda.md; issue 39). On a GPU machine that
# has nvcc, CMake and a C++ compiler but none of concord's Debian packages, it
#   1. records the machine (date, nvidia-smi name and driver, nvcc, CMake),
#   2. builds src/concord/cuda on its own (numerics and tensor from source, nothing else),
#   3. cuda_check: every GPU quantizer bit-exact against numerics::quantize_ref (and its
#      dequantization against numerics::dequantize),
#   4. cuda_gemm check: the exact-product GEMM bit-exact against tensor::gemm (fp32, bf16, FP8) and
#      tensor::gemm_prepared (MXFP8, MXFP4, NVFP4); cuBLASLt against it,
#   5. cuda_gemm logits (when gpu-inputs/ was carried: tools/gpu_inputs.sh made it here): the GPU's
#      exact fp32 lm_head against concord's CPU logits of SmolLM2-135M, and five GPU variants'
#      logits for `concord contract measure` back here,
#   6. cuda_check --bench: the quantizers' GB/s against a device-to-device copy,
#   7. cuda_gemm bench and tools/gpu_torch_peer.py: the micro-batch table (BF16, FP8, FP8 with its
#      quantization, MXFP8 through bf16), concord's cuBLASLt calls and PyTorch's on the same
#      shapes in the same run,
# each step under its own timeout (a failing step is recorded, the rest still run), in about 5
# minutes on an H100/H200. What comes back (the device tool returns at most 8 files, 16 MiB each):
#   $OUT/summary.txt   machine, each step's status and time, the checks' verdicts
#   $OUT/log.txt       every step's whole output
#   $OUT/results.jsonl every JSON line the tools wrote
#   $OUT/logits/*.npy  the five variants' lm_head logits (48 x 49152 float32, 9.4 MB each)
#
#   bash tools/gpu_check.sh                      OUT defaults to gpu-out/
#   device run: command "bash tools/gpu_check.sh", carry ["gpu-inputs"], timeout_s 540
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" "$OUT/logits"
BUILD=${CUDA_BUILD:-build-cuda}
INPUTS=${GPU_INPUTS:-gpu-inputs}
JOBS=$(nproc)
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
start=$(date +%s)
status=0
parts=$(mktemp -d)
: > "$OUT/summary.txt"
: > "$OUT/log.txt"
say() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/summary.txt"; }

step() {  # step NAME TIMEOUT_S COMMAND... : runs it, its output into log.txt, its status into summary.txt
  local name=$1 limit=$2
  shift 2
  local t0 rc
  t0=$(date +%s)
  echo "===== $name: $*" >> "$OUT/log.txt"
  timeout "$limit" "$@" > "$parts/$name.txt" 2>&1
  rc=$?
  cat "$parts/$name.txt" >> "$OUT/log.txt"
  tail -n 60 "$parts/$name.txt"
  say "$name: exit $rc in $(( $(date +%s) - t0 )) s"
  return $rc
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) x $(nproc)"
  git log -1 --format='concord %H %cd' 2>/dev/null || true
} | tee -a "$OUT/summary.txt" >> "$OUT/log.txt"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# Warnings stay errors in CI (g++ 12 here); the GPU image's compiler may warn differently, and
# that must not stop the run.
step configure 120 cmake -S src/concord/cuda -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCONCORD_WERROR=OFF || status=1
step build 300 cmake --build "$BUILD" -j "$JOBS" || status=1
bin="$BUILD/bin"
if [ -x "$bin/cuda_check" ] && [ -x "$bin/cuda_gemm" ]; then
  step check 150 "$bin/cuda_check" --json "$parts/check.jsonl" || status=1
  grep -h "^FAIL\|cuda_check:" "$parts/check.txt" | head -20 >> "$OUT/summary.txt"
  step gemm-check 150 "$bin/cuda_gemm" check --json "$parts/gemm-check.jsonl" || status=1
  grep -h "^FAIL\|cuda_gemm check:" "$parts/gemm-check.txt" | head -20 >> "$OUT/summary.txt"
  if [ -f "$INPUTS/hidden.npy" ] && [ -f "$INPUTS/token_embd.q8_0.npy" ]; then
    step logits 120 "$bin/cuda_gemm" logits --hidden "$INPUTS/hidden.npy" --q8-0 "$INPUTS/token_embd.q8_0.npy" \
      --sums "$INPUTS/cpu-fp32.sums.json" --out "$OUT/logits" --json "$parts/logits.jsonl" || status=1
    grep -h "^PASS\|^FAIL" "$parts/logits.txt" >> "$OUT/summary.txt"
  else
    say "logits: skipped ($INPUTS/ was not carried; make it with tools/gpu_inputs.sh)"
  fi
  # compute-sanitizer's memcheck over the kernels on the small tensors (it works on Firecracker
  # machines, not under gVisor: KINDS.md); reported, not counted in the status.
  if command -v compute-sanitizer >/dev/null; then
    step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/cuda_check" --quick ||
      say "memcheck: see log.txt (not counted: compute-sanitizer may not run on this machine's runtime)"
  fi
  step bench 120 "$bin/cuda_check" --bench --json "$parts/bench.jsonl" || status=1
  step gemm-bench 240 "$bin/cuda_gemm" bench --json "$parts/gemm-bench.jsonl" || status=1
  grep -h "peaks\|crossover" "$parts/gemm-bench.txt" >> "$OUT/summary.txt"
else
  say "cuda_check / cuda_gemm were not built: see log.txt"
  status=1
fi
step torch-peer 240 python3 tools/gpu_torch_peer.py --json "$parts/torch-peer.jsonl"
grep -h "^torch\|peaks\|crossover\|skipped" "$parts/torch-peer.txt" >> "$OUT/summary.txt"
cat "$parts"/*.jsonl > "$OUT/results.jsonl" 2>/dev/null
rm -rf "$parts"
say "gpu_check: done, status $status"
exit $status
