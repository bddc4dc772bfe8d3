#!/bin/bash
# `concord contract` end to end on a small model trained here: kernels; measure (task and prompts
# file sources, slices in the JSON); fp32 vs fp32 has osc 0; check passes against a fitted
# contract and fails naming the slice an out-of-contract kernel breaks; dumps (.safetensors,
# .npy) give the same statistics as kernels; bad input exits 2 with one line.
# Usage: contract_test.sh PATH/TO/concord   (needs bash and python3, standard library only)
set -u
CONCORD="$1"
source "$(dirname "$0")/lib.sh"

# --- a small model, trained for a few steps on text with arithmetic in it ---
for i in $(seq 1 200); do
  printf 'Q: %d+%d=\nA: %d\nAnd it came to pass in the %d th year that the king went up.\n' \
    $((i * 7 % 100)) $((i * 3 % 100)) $((i * 7 % 100 + i * 3 % 100)) "$i"
done >"$WORK/corpus.txt"
cat >"$WORK/train.json" <<JSON
{"name": "contract", "model": {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 259, "hidden_size": 64,
 "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
 "head_dim": 32, "max_position_embeddings": 256},
 "data": {"corpus": "$WORK/corpus.txt", "chunk": 256, "validation_fraction": 0.1},
 "train": {"batch_size": 4, "seq_len": 64, "steps": 16, "warmup_steps": 2, "lr": 0.01},
 "eval": {"every": 16, "batches": 1}, "checkpoint": {"every": 16, "keep": 1}, "out": "$WORK/run"}
JSON
if ! "$CONCORD" train --config "$WORK/train.json" --quiet >"$WORK/train.out" 2>&1; then
  echo "FAIL: cannot train the test model: $(cat "$WORK/train.out")"
  exit 1
fi
MODEL="$WORK/run/final"
# Task prompts are ~15 tokens; 64 generated tokens make every sequence reach positions >= 64.
TASK=(--model "$MODEL" --task add --count 6 --max-new 64 --batch 4 --quiet)

# --- kernels ---
run_rc "kernels" 0 "$CONCORD" contract kernels \
  && grep -q '^fp32 ' "$WORK/out" && grep -q '^bf16 ' "$WORK/out" && grep -q '^fp32-drop-late .*OUT OF CONTRACT' "$WORK/out" \
  && pass "kernels lists names and descriptions" || fail "kernels: $(cat "$WORK/out")"

# --- measure fp32 vs bf16 on a task ---
if run_rc "measure bf16 task" 0 "$CONCORD" contract measure --ref fp32 --cand bf16 "${TASK[@]}" --out "$WORK/m_bf16"; then
  [[ -s "$WORK/m_bf16/measurement.json" && -s "$WORK/m_bf16/contract.json" && -s "$WORK/m_bf16/report.html" ]] \
    && grep -q '^slice .*osc p99 .*missed' "$WORK/out" && grep -q '^task:add ' "$WORK/out" \
    && pass "measure writes the table, measurement, contract and report" || fail "measure outputs: $(cat "$WORK/out")"
  json_check "measurement has position, margin and task slices" "$WORK/m_bf16/measurement.json" \
    "{s['slice'] for s in j['slices']} >= {'all', 'position:[0,16)', 'position:[16,64)', 'position:[64,inf)', 'task:add'} \
     and any(s['slice'].startswith('margin:') for s in j['slices'])"
  json_check "bf16 differs from fp32 and no guarantee broke" "$WORK/m_bf16/measurement.json" \
    "j['slices'][0]['slice'] == 'all' and j['slices'][0]['osc']['max'] > 0 \
     and all(s['missed_flips'] == 0 and s['bound_violations'] == 0 for s in j['slices'])"
  json_check "fitted contract has the slices" "$WORK/m_bf16/contract.json" \
    "j['format'] == 'concord-contract/1' and 'position:[64,inf)' in [s['slice'] for s in j['slices']]"
fi

# --- measure on a prompts file (plain lines and JSON lines with labels) ---
{
  echo "And it came to pass in the first year that the king went up to the city of David, and"
  echo ""
  echo '{"prompt": "Q: 12+30=\nA: ", "label": "arith", "task": "add"}'
  echo '{"prompt": "And the king said", "label": "story"}'
} >"$WORK/prompts.txt"
if run_rc "measure prompts file" 0 "$CONCORD" contract measure --ref fp32 --cand bf16 --model "$MODEL" \
    --prompts "$WORK/prompts.txt" --max-new 40 --quiet --out "$WORK/m_prompts"; then
  json_check "prompts file: label, task and prompt-length slices" "$WORK/m_prompts/measurement.json" \
    "{'label:arith', 'label:story', 'task:add', 'prompt_len:[0,16)', 'prompt_len:[64,inf)'} <= {s['slice'] for s in j['slices']}"
fi

# --- the same kernel on both sides: osc 0 everywhere ---
if run_rc "measure fp32 vs fp32" 0 "$CONCORD" contract measure --ref fp32 --cand fp32 "${TASK[@]}" --out "$WORK/m_same"; then
  json_check "fp32 vs fp32 has osc max 0 in every slice" "$WORK/m_same/measurement.json" \
    "all(s['osc']['max'] == 0 and s['flips'] == 0 for s in j['slices'])"
fi

# --- check: bf16 against its fitted contract passes ---
if run_rc "check bf16 passes" 0 "$CONCORD" contract check --contract "$WORK/m_bf16/contract.json" \
    --ref fp32 --cand bf16 "${TASK[@]}" --out "$WORK/c_bf16"; then
  grep -q '^PASS' "$WORK/out" && [[ -s "$WORK/c_bf16/check.json" && -s "$WORK/c_bf16/report.html" ]] \
    && pass "check prints PASS and writes check.json and report.html" || fail "check pass output: $(cat "$WORK/out")"
  json_check "check.json says pass" "$WORK/c_bf16/check.json" "j['pass'] is True and j['violations'] == []"
fi

# --- check: an out-of-contract kernel fails, naming the late-position slice ---
run_rc "measure fp32-reversed" 0 "$CONCORD" contract measure --ref fp32 --cand fp32-reversed "${TASK[@]}" \
  --out "$WORK/m_rev"
if run_rc "check fp32-drop-late fails" 1 "$CONCORD" contract check --contract "$WORK/m_rev/contract.json" \
    --ref fp32 --cand fp32-drop-late "${TASK[@]}" --out "$WORK/c_drop"; then
  grep -q '^position:\[64,inf) *FAIL' "$WORK/out" && grep -q '^position:\[0,16) *PASS' "$WORK/out" \
    && grep -q '^position:\[16,64) *PASS' "$WORK/out" && grep -q '^FAIL: .*position:\[64,inf)' "$WORK/out" \
    && pass "check names position:[64,inf) as violated, earlier positions pass" \
    || fail "check drop-late output: $(cat "$WORK/out")"
  json_check "check.json lists the violated slice" "$WORK/c_drop/check.json" \
    "j['pass'] is False and 'position:[64,inf)' in [v['slice'] for v in j['violations']] \
     and 'position:[0,16)' not in [v['slice'] for v in j['violations']]"
fi

# --- dumps: dump vs dump and kernel vs dump give the kernel-vs-kernel statistics ---
run_rc "dump fp32 safetensors" 0 "$CONCORD" contract dump --kernel fp32 "${TASK[@]}" --out "$WORK/fp32.safetensors"
run_rc "dump bf16 npy" 0 "$CONCORD" contract dump --kernel bf16 "${TASK[@]}" --out "$WORK/bf16.npy"
run_rc "dump bf16 safetensors" 0 "$CONCORD" contract dump --kernel bf16 "${TASK[@]}" --out "$WORK/bf16.safetensors"
[[ -s "$WORK/bf16.npy.rows.json" ]] && pass "npy dump has its rows sidecar" || fail "no bf16.npy.rows.json"
SAME_SLICES="json.load(open(sys.argv[1]))['slices'] == json.load(open(sys.argv[2]))['slices']"
same_stats() {
  local name="$1" dir="$2"
  if python3 -c "import json, sys; sys.exit(0 if $SAME_SLICES else 1)" "$WORK/m_bf16/measurement.json" "$dir/measurement.json"; then
    pass "$name"
  else
    fail "$name: slices differ from kernel vs kernel"
  fi
}
run_rc "measure dump vs dump (safetensors vs npy)" 0 "$CONCORD" contract measure \
  --ref "$WORK/fp32.safetensors" --cand "$WORK/bf16.npy" --out "$WORK/m_dumps" \
  && same_stats "dump vs dump (safetensors vs npy) = kernel vs kernel" "$WORK/m_dumps"
run_rc "measure dump vs dump (safetensors)" 0 "$CONCORD" contract measure \
  --ref "$WORK/fp32.safetensors" --cand "$WORK/bf16.safetensors" --out "$WORK/m_dumps2" \
  && same_stats "dump vs dump (safetensors) = kernel vs kernel" "$WORK/m_dumps2"
run_rc "measure kernel vs dump" 0 "$CONCORD" contract measure --ref fp32 --cand "$WORK/bf16.npy" \
  --model "$MODEL" --quiet --out "$WORK/m_mixed" \
  && same_stats "kernel vs dump = kernel vs kernel" "$WORK/m_mixed"
run_rc "check dump vs dump" 0 "$CONCORD" contract check --contract "$WORK/m_bf16/contract.json" \
  --ref "$WORK/fp32.safetensors" --cand "$WORK/bf16.npy" && pass "check passes on dumps"

# --- bad input: exit 2, one line ---
echo '{"format": "concord-contract/1", "slices": 3' >"$WORK/bad_contract.json"
expect_error "corrupt contract" "bad_contract.json" \
  "$CONCORD" contract check --contract "$WORK/bad_contract.json" --ref fp32 --cand bf16 "${TASK[@]}"
head -c 3000 "$WORK/fp32.safetensors" >"$WORK/cut.safetensors"
expect_error "truncated dump" "cut.safetensors" \
  "$CONCORD" contract measure --ref "$WORK/cut.safetensors" --cand "$WORK/bf16.npy" --out "$WORK/x"
run_rc "dump other sequences" 0 "$CONCORD" contract dump --kernel bf16 --model "$MODEL" --task add --count 6 \
  --seed 9 --max-new 64 --batch 4 --quiet --out "$WORK/other.npy"
expect_error "dumps of other sequences" "differ" \
  "$CONCORD" contract measure --ref "$WORK/fp32.safetensors" --cand "$WORK/other.npy" --out "$WORK/x"
expect_error "unknown kernel" "unknown kernel 'fp33'" \
  "$CONCORD" contract measure --ref fp32 --cand fp33 "${TASK[@]}" --out "$WORK/x"
expect_error "kernel sides need a model" "needs --model" \
  "$CONCORD" contract measure --ref fp32 --cand bf16 --task add --out "$WORK/x"
expect_error "no prompt source" "--prompts FILE or --task T" \
  "$CONCORD" contract measure --ref fp32 --cand bf16 --model "$MODEL" --out "$WORK/x"
expect_error "unknown task" "unknown task 'div'" \
  "$CONCORD" contract dump --kernel fp32 --model "$MODEL" --task div --out "$WORK/x.npy"
echo '{"prompt": "hi", "lable": "x"}' >"$WORK/bad_prompts.txt"
expect_error "bad prompts line" "bad_prompts.txt:1: unknown key 'lable'" \
  "$CONCORD" contract measure --ref fp32 --cand bf16 --model "$MODEL" --prompts "$WORK/bad_prompts.txt" --out "$WORK/x"
expect_error "dump extension" "a dump is a .safetensors or .npy file" \
  "$CONCORD" contract dump --kernel fp32 "${TASK[@]}" --out "$WORK/x.bin"
[[ ! -e "$WORK/x" && ! -e "$WORK/x.npy" ]] && pass "failed commands write nothing" || fail "output written by a failed command"

finish "contract CLI"
