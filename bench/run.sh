#!/usr/bin/env bash
# Runs the numerics benchmark (JSON out) and prints each case's throughput and its ratio to
# memcpy of the same 64 MiB buffer at the same thread count, measured in the same run.
# Usage: bash bench/run.sh [build-dir]   (CONCORD_ISA=generic|avx2|avx512 forces a lower ISA)
set -euo pipefail
build="${1:-build}"
bin="$build/bin/numerics_bench"
out="$build/numerics_bench.json"
if [[ ! -x "$bin" ]]; then
  echo "bench/run.sh: $bin not found; build first (make build, or cmake --build $build)" >&2
  exit 2
fi
"$bin" --benchmark_format=json --benchmark_out="$out" --benchmark_out_format=json >/dev/null
python3 - "$out" <<'PY'
import json, sys

report = json.load(open(sys.argv[1]))
rows = []
for b in report["benchmarks"]:
    parts = [p for p in b["name"].split("/") if ":" not in p and p != "real_time"]
    threads = int(parts[-1])
    case = "/".join(parts[:-1]).removeprefix("BM_")
    rows.append((case, threads, b["bytes_per_second"] / 1e9, b.get("label", "")))
memcpy = {t: gbps for case, t, gbps, _ in rows if case == "memcpy"}
ctx = report["context"]
print(f"host: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs, "
      f"{ctx.get('mhz_per_cpu', '?')} MHz; GB/s of fp32 input; ratio = case / memcpy")
print(f"{'case':<28} {'threads':>7} {'GB/s':>8} {'vs memcpy':>10}  isa")
for case, t, gbps, isa in rows:
    print(f"{case:<28} {t:>7} {gbps:>8.2f} {gbps / memcpy[t]:>9.0%}  {isa}")
PY
