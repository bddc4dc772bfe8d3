#!/usr/bin/env bash
# Engine throughput (bench/engine_bench.cpp): prefill and decode per config, preset, batch and
# thread count, with prefill GFLOP/s against oneDNN's f32 matmul on the same GEMMs and decode
# weight bytes streamed per second against memcpy, both measured in the same run.
# Usage: bash bench/engine_run.sh [build-dir] [extra benchmark flags]  -> a table, $build/engine_bench.json
set -euo pipefail
build="${1:-build}"
shift || true
bin="$build/bin/engine_bench"
[[ -x "$bin" ]] || { echo "bench/engine_run.sh: $bin not found; build first (-DCONCORD_BUILD_BENCH=ON)" >&2; exit 2; }
out="$build/engine_bench.json"
"$bin" --benchmark_format=json --benchmark_out="$out" --benchmark_out_format=json "$@" >/dev/null
python3 - "$out" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
def args(name):
    return dict(p.split(":") for p in name.split("/")[1:] if ":" in p)
memcpy, onednn, rows = {}, {}, []
for b in report["benchmarks"]:
    a, kind = args(b["name"]), b["name"].split("/")[0]
    if kind == "BM_memcpy":
        memcpy[a["threads"]] = b["read_GB/s"]
    elif kind == "BM_onednn_prefill":
        onednn[(a["config"], a["batch"], a["threads"])] = b["GFLOP/s"]
    else:
        rows.append((kind.removeprefix("BM_"), b["label"], a, b))
ctx = report["context"]
print(f"host: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs; memcpy read GB/s: "
      + ", ".join(f"{t} thr {v:.1f}" for t, v in memcpy.items()))
print(f"{'phase':<8} {'config/preset':<18} {'batch':>5} {'thr':>3} {'tok/s':>9} {'GFLOP/s':>8} {'vs oneDNN':>9} {'weight GB/s':>11} {'vs memcpy':>9}")
for kind, label, a, b in rows:
    key = (a["config"], a["batch"], a["threads"])
    if kind == "prefill":
        g = b["GFLOP/s"]
        print(f"{kind:<8} {label:<18} {a['batch']:>5} {a['threads']:>3} {b['tokens_per_s']:>9.0f} {g:>8.1f} {g / onednn[key]:>8.0%} {'':>11} {'':>9}")
    else:
        w = b["weight_GB/s"]
        print(f"{kind:<8} {label:<18} {a['batch']:>5} {a['threads']:>3} {b['tokens_per_s']:>9.1f} {'':>8} {'':>9} {w:>11.1f} {w / memcpy[a['threads']]:>8.0%}")
PY
