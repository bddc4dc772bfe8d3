#!/usr/bin/env bash
# Speed under contention (bench/contention_bench.cpp): every case idle, then beside a busy
# process pinned to the last CPU (one of two cores taken), in alternation, three rounds; prints
# the median time of each and the slowdown ratio (contended / idle). Two settings of the same
# binary: "concord" (what concord itself runs: its OpenMP wait setup, src/concord/cli/runtime.cpp)
# and "spin" (GOMP_SPINCOUNT=300000: libgomp's default spin when OMP_WAIT_POLICY is unset, the
# behaviour before issue 26). The machine must be otherwise idle: the load average is printed,
# and other load found before the start or between rounds is reported as a warning.
# Usage: bash bench/contention_run.sh [build-dir] [rounds]  -> a table, $build/contention_bench.json
# Takes about 3 minutes on a 2-core machine.
set -euo pipefail
build="${1:-build}"
rounds="${2:-3}"
bin="$build/bin/contention_bench"
[[ -x "$bin" ]] || { echo "bench/contention_run.sh: $bin not found; build first (cmake --build $build --target contention_bench)" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench/contention_run.sh: rounds '$rounds' must be an integer >= 1" >&2; exit 2; }
if [[ -n "${OMP_WAIT_POLICY:-}${GOMP_SPINCOUNT:-}${OMP_NUM_THREADS:-}" ]]; then
  echo "bench/contention_run.sh: unset OMP_WAIT_POLICY, GOMP_SPINCOUNT and OMP_NUM_THREADS first (the script sets them per setting)" >&2
  exit 2
fi
cpus=$(nproc)
last_cpu=$((cpus - 1))
tmp="$build/contention_bench.parts"
rm -rf "$tmp" && mkdir -p "$tmp"

spinner=""
stop_spinner() {
  if [[ -n "$spinner" ]]; then
    kill "$spinner" 2>/dev/null || true
    wait "$spinner" 2>/dev/null || true
  fi
  spinner=""
}
trap stop_spinner EXIT

# Load not our own, checked while no benchmark of ours runs: the CPU time the whole machine used
# over 2 s (/proc/stat user+nice+system+irq+softirq), in cores. The load average is printed too,
# but it cannot tell other load from the rounds just run (it decays over minutes).
busy_cores() {
  local a b
  a=$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat)
  sleep 2
  b=$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat)
  python3 -c "a = '$a'.split(); b = '$b'.split(); print(f'{(float(b[0]) - float(a[0])) / max(1.0, float(b[1]) - float(a[1])) * $cpus:.2f}')"
}
check_load() {
  local busy
  busy=$(busy_cores)
  echo "load average $(cut -d' ' -f1-3 /proc/loadavg); CPU in use by others over 2 s: $busy cores ($1)"
  if python3 -c "import sys; sys.exit(0 if $busy > 0.2 else 1)"; then
    echo "WARNING: other load is present ($busy cores busy between our runs): the figures are unreliable; rerun on a quiet machine" >&2
  fi
}

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $cpus CPUs; competing process: a busy loop pinned to CPU $last_cpu"
check_load "before the start"
parts=()
for round in $(seq "$rounds"); do
  for setting in concord spin; do
    for load in idle busy; do
      env_args=()
      [[ "$setting" == spin ]] && env_args=(GOMP_SPINCOUNT=300000)
      if [[ "$load" == busy ]]; then
        taskset -c "$last_cpu" bash -c 'while :; do :; done' &
        spinner=$!
      fi
      part="$tmp/$setting.$load.$round.json"
      env "${env_args[@]}" "$bin" --benchmark_min_time=0.3 --benchmark_format=json \
        --benchmark_out="$part" --benchmark_out_format=json >/dev/null
      stop_spinner
      parts+=("$part")
    done
  done
  check_load "after round $round"
done

python3 - "$build/contention_bench.json" "${parts[@]}" <<'PY'
import json, os, statistics, sys
times, merged = {}, None
for path in sys.argv[2:]:
    setting, load, _, _ = os.path.basename(path).split(".")
    report = json.load(open(path))
    merged = merged or {"context": report["context"], "runs": []}
    merged["runs"].append({"setting": setting, "load": load, "benchmarks": report["benchmarks"]})
    for b in report["benchmarks"]:
        case = b["name"].removeprefix("BM_").split("/")[0] + " " + b.get("label", "")
        times.setdefault(case, {}).setdefault((setting, load), []).append(b["real_time"])
json.dump(merged, open(sys.argv[1], "w"), indent=1)
med = lambda xs: statistics.median(xs)
print(f"\nmedian ms of {len(sys.argv[2:]) // 4} rounds; ratio = beside a busy process / idle (goal <= 2.5x)")
print("idle cost = concord idle / spin idle (what the passive wait costs on an idle machine)")
print(f"{'case':<28} {'spin idle':>9} {'spin busy':>9} {'ratio':>6}   {'concord idle':>12} {'concord busy':>12} {'ratio':>6}   {'idle cost':>9}")
worst = 0.0
for case, t in times.items():
    si, sb, ci, cb = (med(t[k]) for k in [("spin", "idle"), ("spin", "busy"), ("concord", "idle"), ("concord", "busy")])
    worst = max(worst, cb / ci)
    print(f"{case:<28} {si:>9.2f} {sb:>9.2f} {sb / si:>5.1f}x   {ci:>12.2f} {cb:>12.2f} {cb / ci:>5.1f}x   {ci / si:>8.2f}x")
print(f"worst concord ratio: {worst:.2f}x (goal <= 2.5x)")
PY
