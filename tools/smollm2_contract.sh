#!/usr/bin/env bash
# The first cross-engine kernel contract (issue 15): SmolLM2-135M-Instruct (its Q4_1 GGUF) on real
# traffic — chat prompts of six task kinds rendered with the GGUF's ChatML template — measured per
# slice (osc, TV, KL, greedy flips) with `concord contract measure` for
#   fp32-vs-native      concord fp32-dequant vs concord W4A8 (the stored Q4_1/Q8_0 blocks)
#   llamacpp-vs-native  llama.cpp's own logits vs concord W4A8, teacher-forced on llama.cpp's sequences
#   llamacpp-vs-fp32    llama.cpp's own logits vs concord fp32-dequant, the same sequences
#   fp32-vs-PRESET      the precision presets bf16, mxfp8, mxfp4, nvfp4 on the dequantized weights
#
#   tools/smollm2_contract.sh [build-dir]          # -> BUILD/smollm2/contract/<case>/, summary.md
#
# llama.cpp's side (tools/make_llamacpp_golden.py --traffic, in tools/.llamacpp-venv) is written
# once to BUILD/smollm2/llamacpp-traffic.safetensors (+ .json with the token sequences, +
# .prompts.jsonl with the rendered prompts) and reused while it exists (REDO_TRAFFIC=1 rewrites it).
# The kernel-vs-kernel cases read the very prompt texts llama.cpp rendered (.prompts.jsonl, with
# their task labels) and complete each greedily with the reference kernel for MAX_NEW tokens; the
# script first checks that concord tokenizes every rendered prompt to llama.cpp's ids.
# Env: PER_TASK (prompts per task kind, default 10), MAX_NEW (default 30), THREADS (llama.cpp's,
# default 1; concord uses OMP_NUM_THREADS).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${1:-build}"
concord="$build/bin/concord"
[[ -x "$concord" ]] || { echo "tools/smollm2_contract.sh: $concord not found (build it: cmake --build build --target concord)" >&2; exit 2; }
model="$(scripts/smollm2-path)"
[[ -f "$model" ]] || { echo "tools/smollm2_contract.sh: $model: no model file (run scripts/setup)" >&2; exit 2; }
lpy="tools/.llamacpp-venv/bin/python"
out="$build/smollm2"
dump="$out/llamacpp-traffic.safetensors"
prompts="$dump.prompts.jsonl"
per_task="${PER_TASK:-10}" max_new="${MAX_NEW:-30}"
mkdir -p "$out/contract"

if [[ -n "${REDO_TRAFFIC:-}" || ! -f "$dump" || ! -f "$dump.json" || ! -f "$prompts" ]]; then
  [[ -x "$lpy" ]] || { echo "tools/smollm2_contract.sh: $lpy not found (build llama.cpp once: tools/llamacpp_env.sh)" >&2; exit 2; }
  echo "== llama.cpp real traffic -> $dump" >&2
  "$lpy" tools/make_llamacpp_golden.py --skip-goldens --model "$model" --threads "${THREADS:-1}" \
    --traffic "$dump" --traffic-per-task "$per_task" --traffic-max-new "$max_new"
fi

# The kernel-vs-kernel cases tokenize the rendered prompts themselves (contract measure --prompts):
# check that they come out as llama.cpp's ids, through the same reader (contract dump --prompts,
# prompts alone), comparing the dump's token/next columns with llama.cpp's sequences.
check="$out/contract/prompt-tokens.npy"
"$concord" contract dump --model "$model" --kernel fp32 --prompts "$prompts" --max-new 0 \
  --out "$check" --quiet
.venv/bin/python - "$check.rows.json" "$dump.json" <<'PY'
import json, sys
rows, seqs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["sequences"]
got = {}
for s, p, t, n in zip(rows["sequence"], rows["position"], rows["token"], rows["next"]):
    ids = got.setdefault(s, {})
    ids[p], ids[p + 1] = t, n
bad = [q["label"] for i, q in enumerate(seqs)
       if [got.get(i, {}).get(p) for p in range(q["prompt_length"])] != q["tokens"][: q["prompt_length"]]]
if len(got) != len(seqs) or bad:
    sys.exit(f"tools/smollm2_contract.sh: concord tokenizes {len(bad)} of {len(seqs)} rendered "
             f"prompt(s) differently from llama.cpp ({', '.join(bad[:5])}); fix the tokenizer first")
print(f"tokenization: concord == llama.cpp on all {len(seqs)} rendered prompts", file=sys.stderr)
PY
rm -f "$check" "$check.rows.json"

status=0
measure() {  # measure CASE --ref R --cand C [more flags]
  local case="$1"; shift
  local dir="$out/contract/$case"
  mkdir -p "$dir"
  echo "== $case: concord contract measure --model MODEL $* --out $dir" >&2
  local rc=0
  "$concord" contract measure --model "$model" "$@" --out "$dir" --quiet > "$dir/table.txt" || rc=$?
  cat "$dir/table.txt"
  # exit 1 is a broken guarantee (printed in the table); anything else is a failure to run
  if (( rc == 1 )); then status=1; elif (( rc != 0 )); then exit "$rc"; fi
}
measure fp32-vs-native --ref fp32 --cand native --prompts "$prompts" --max-new "$max_new"
measure llamacpp-vs-native --ref "$dump" --cand native
measure llamacpp-vs-fp32 --ref "$dump" --cand fp32
for preset in bf16 mxfp8 mxfp4 nvfp4; do
  measure "fp32-vs-$preset" --ref fp32 --cand "$preset" --prompts "$prompts" --max-new "$max_new"
done

# One markdown table per case (the slices of measurement.json but the per-prompt label: ones) for
# docs/results.md.
python3 - "$out/contract" > "$out/contract/summary.md" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
order = ["fp32-vs-native", "llamacpp-vs-native", "llamacpp-vs-fp32",
         "fp32-vs-bf16", "fp32-vs-mxfp8", "fp32-vs-mxfp4", "fp32-vs-nvfp4"]
for case in order:
    f = root / case / "measurement.json"
    if not f.exists():
        continue
    m = json.load(open(f))
    print(f"#### {case} (ref {Path(m.get('ref', '?')).name}, cand {Path(m.get('cand', '?')).name})\n")
    print("| slice | rows | osc p99 | osc max | TV max | KL max | flips | predicted | missed | bound violations |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in m["slices"]:
        if s["slice"].startswith("label:"):  # one per prompt: in measurement.json
            continue
        print(f"| {s['slice']} | {s['rows']} | {s['osc']['p99']:.4g} | {s['osc']['max']:.4g} | "
              f"{s['tv']['max']:.4g} | {s['kl']['max']:.4g} | {s['flips']} | {s['predicted_flips']} | "
              f"{s['missed_flips']} | {s['bound_violations']} |")
    print()
PY
echo "tools/smollm2_contract.sh: tables in $out/contract/summary.md" >&2
exit "$status"
