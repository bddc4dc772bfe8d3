#!/usr/bin/env bash
# The one prepared GPU run of concord's CUDA slice (docs/cuda.md; issue 39). On a GPU machine that
# has nvcc, CMake and a C++ compiler but none of concord's Debian packages, it
#   1. records the machine (date, nvidia-smi name and driver, nvcc, CMake),
#   2. builds src/concord/cuda on its own (the numerics layer from source, nothing else),
#   3. runs cuda_check: every GPU quantizer bit-exact against numerics::quantize_ref,
#   4. runs cuda_check --bench: the quantizers' GB/s against a device-to-device copy,
# and writes everything under $OUT (default gpu-out/) with summary.txt last. Sized to finish well
# inside 8 minutes on an H100/H200 (the build is most of it); each step has its own timeout, and
# a failing step is recorded and the rest still run.
#
#   OUT=/tmp/gpu-out bash tools/gpu_check.sh        (the device tool: run(command="bash tools/gpu_check.sh"))
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BUILD=${CUDA_BUILD:-build-cuda}
JOBS=$(nproc)
export PATH="$PATH:/usr/local/cuda/bin"
start=$(date +%s)
status=0
log() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

step() {  # step NAME TIMEOUT_S COMMAND... : runs, logs its time and exit status
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  log "$name: exit $rc in $(( $(date +%s) - t0 )) s (output: $OUT/$name.txt)"
  tail -n 40 "$OUT/$name.txt"
  return $rc
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) x $(nproc)"
  git log -1 --format='concord %H %cd' 2>/dev/null || true
} > "$OUT/machine.txt"
cat "$OUT/machine.txt" | tee -a "$OUT/summary.txt"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
step configure 120 cmake -S src/concord/cuda -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release || status=1
step build 300 cmake --build "$BUILD" -j "$JOBS" || status=1
if [ -x "$BUILD/bin/cuda_check" ]; then
  step check 180 "$BUILD/bin/cuda_check" --json "$OUT/check.jsonl" || status=1
  step bench 180 "$BUILD/bin/cuda_check" --bench --json "$OUT/bench.jsonl" || status=1
else
  log "cuda_check was not built: see $OUT/build.txt"
  status=1
fi
grep -h "cuda_check:" "$OUT/check.txt" 2>/dev/null | tee -a "$OUT/summary.txt"
grep -h "^FAIL" "$OUT/check.txt" 2>/dev/null | head -20 | tee -a "$OUT/summary.txt"
log "gpu_check: done, status $status"
exit $status
