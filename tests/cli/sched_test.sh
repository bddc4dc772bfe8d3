#!/bin/bash
# `concord sched` end to end (docs/sched.md): on a small Qwen3-MoE config.json with --run, every
# order and planner executed and measured == predicted, the logits bit for bit Model::forward's
# (the JSON says so per row); the training pass peaks above inference; bad input exits 2 with one
# line. Usage: sched_test.sh PATH/TO/concord
set -u
CONCORD="$1"
source "$(dirname "$0")/lib.sh"

cat >"$WORK/config.json" <<'JSON'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 300,
 "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4,
 "num_experts_per_tok": 2, "mlp_only_layers": [0], "num_hidden_layers": 3,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
 "tie_word_embeddings": true}
JSON

for pass in forward train; do
  if run_rc "sched --run $pass" 0 "$CONCORD" sched --model "$WORK/config.json" --pass $pass --tokens 24 --batch 2 \
      --run --seed 3 --json "$WORK/$pass.json"; then
    if grep -q "measured == predicted for every order and planner" "$WORK/out"; then pass "sched --run $pass: all equal"
    else fail "sched --run $pass: $(cat "$WORK/out")"; fi
    json_check "sched $pass: every row measured == predicted, logits equal" "$WORK/$pass.json" \
      "j['all_equal'] and j['dp']['optimal'] and j['expert_rows'].startswith('exact') and all(r['measured_dynamic'] == r['peak'] and r['logits_equal'] and all(p['measured_high_water'] == p['arena_bytes'] == p['measured_touched'] and p['logits_equal'] for p in r['planners'].values()) for r in j['orders'])"
    json_check "sched $pass: bound <= DP optimum <= program order" "$WORK/$pass.json" \
      "j['working_set_bound'] <= j['dp']['peak'] <= j['orders'][0]['peak'] and j['dp']['lower_bound'] == j['dp']['peak']"
  fi
done
python3 -c "import json, sys; f = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2])); sys.exit(0 if t['dp']['peak'] > f['dp']['peak'] else 1)" \
  "$WORK/forward.json" "$WORK/train.json" && pass "the training pass peaks above inference" || fail "train peak <= forward peak"

# Without --run: the plan only, the balanced expert load; a tiny DP budget reports its gap.
if run_rc "sched plan only" 0 "$CONCORD" sched --model "$WORK/config.json" --tokens 32 --dp-states 2; then
  if grep -q "balanced" "$WORK/out" && grep -q "proven lower bound" "$WORK/out"; then pass "sched plan only: balanced load, a budgeted DP's gap"
  else fail "sched plan only: $(cat "$WORK/out")"; fi
fi

# The training step's recomputation: the curve, a budget's plan; --budget needs --pass train.
if run_rc "sched --pass train --budget" 0 "$CONCORD" sched --model "$WORK/config.json" --pass train --tokens 64 --batch 2 \
    --budget 3MiB --json "$WORK/budget.json"; then
  json_check "sched --budget: a plan within it, the curve from every block to keeping everything" "$WORK/budget.json" \
    "j['recompute']['budget']['peak'] <= 3 * 2**20 and j['recompute']['block'] < j['recompute']['attention'] < j['recompute']['keep'] and j['recompute']['curve'][0]['peak'] == j['recompute']['block'] and j['recompute']['curve'][-1]['peak'] == j['recompute']['keep'] and all(r['greedy_flops_percent'] >= r['flops_percent'] for r in j['recompute']['curve'])"
fi
expect_error "sched: --budget without --pass train" "use it with --pass train" "$CONCORD" sched --model "$WORK/config.json" --budget 1MiB

# concord train --memory-budget: within the budget, the losses of the run without one bit for bit;
# a budget below what the model and the smallest plan need is refused before the first step. The
# budget is the unbudgeted run's peak RSS less 40% of its activations (a sanitizer build's process
# is larger, so no fixed figure fits both).
TINY="$(dirname "$0")/../../configs/tiny.json"
if run_rc "train without a budget" 0 "$CONCORD" train --config "$TINY" --out "$WORK/keep" --steps 3 --quiet; then
  BUDGET=$(python3 - "$WORK/out" "$WORK/keep/metrics.jsonl" <<'PY'
import json, re, sys
rss = float(re.search(r"peak RSS (\d+) MiB", open(sys.argv[1]).read()).group(1))
act = max(json.loads(l)["activation_bytes"] for l in open(sys.argv[2]) if '"loss"' in l) / 2**20
print(f"{int(rss - 0.4 * act)}MiB")
PY
)
  if run_rc "train --memory-budget $BUDGET" 0 "$CONCORD" train --config "$TINY" --out "$WORK/budget" --steps 3 \
      --memory-budget "$BUDGET" --quiet; then
    # Under AddressSanitizer freed memory sits in its quarantine, still resident, so the process
    # outgrows any plan: there the run and its report are checked, not the RSS.
    if [[ -n "${ASAN_OPTIONS:-}" ]]; then
      if grep -q "memory budget ${BUDGET%MiB}.0 MiB: peak RSS" "$WORK/out"; then pass "train --memory-budget: reported (sanitizer build)"
      else fail "train --memory-budget: $(cat "$WORK/out")"; fi
    elif grep -q "memory budget ${BUDGET%MiB}.0 MiB: peak RSS .* (within)" "$WORK/out"; then pass "train --memory-budget: peak RSS within"
    else fail "train --memory-budget: $(cat "$WORK/out")"; fi
    python3 - "$WORK/keep/metrics.jsonl" "$WORK/budget/metrics.jsonl" <<'PY' && pass "train --memory-budget: the same losses, fewer activation bytes" || fail "train --memory-budget: losses or activations"
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
assert [x["loss"] for x in a] == [x["loss"] for x in b], "losses differ"
assert max(x["activation_bytes"] for x in b) < min(x["activation_bytes"] for x in a), "no activation saved"
PY
  fi
fi
expect_error "train: a budget too small" "the smallest activation plan (every block recomputed) needs" \
  "$CONCORD" train --config "$TINY" --out "$WORK/small" --steps 3 --memory-budget 20MiB --quiet

# The whole training step as nodes, executed: loss and gradients bit for bit forward_backward's.
cat >"$WORK/dense.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 300, "hidden_size": 64,
 "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
 "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
 "tie_word_embeddings": true}
JSON
if run_rc "sched --pass step --run" 0 "$CONCORD" sched --model "$WORK/dense.json" --pass step --tokens 32 --batch 2 \
    --run --policy nvfp4 --json "$WORK/step.json"; then
  if grep -q "loss and gradients == Model::forward_backward bit for bit" "$WORK/out"; then pass "sched --pass step --run: all equal"
  else fail "sched --pass step --run: $(cat "$WORK/out")"; fi
  json_check "sched --pass step: measured == predicted" "$WORK/step.json" \
    "j['all_equal'] and all(r['measured_dynamic'] == r['peak'] for r in j['orders'])"
fi
# The MoE training step (experts, router and top-k backward, the batch's exact expert rows).
if run_rc "sched --pass step --run (MoE)" 0 "$CONCORD" sched --model "$WORK/config.json" --pass step --tokens 16 \
    --batch 2 --run --policy nvfp4; then
  if grep -q "loss and gradients == Model::forward_backward bit for bit" "$WORK/out"; then pass "sched --pass step --run (MoE): all equal"
  else fail "sched --pass step --run (MoE): $(cat "$WORK/out")"; fi
fi

# A decode step and a prefill chunk: certified, and with --run executed on a KV cache of --context
# tokens per sequence (MoE: with the step's exact expert rows), logits and cache rows bit for bit
# Model::forward_cached's, every measured peak the prediction.
if run_rc "sched --pass decode" 0 "$CONCORD" sched --model "$WORK/config.json" --pass decode --context 200 --batch 4; then
  if grep -q "pass decode, 4 x 1 tokens after 200 cached" "$WORK/out" && grep -q "optimal (certificate" "$WORK/out" &&
     grep -q "^KV cache .* outside the activation arena" "$WORK/out"; then pass "sched --pass decode: certified"
  else fail "sched --pass decode: $(cat "$WORK/out")"; fi
fi
for pass in decode prefill; do
  if run_rc "sched --pass $pass --run" 0 "$CONCORD" sched --model "$WORK/config.json" --pass $pass --tokens 16 --context 40 \
      --batch 3 --run --policy nvfp4 --json "$WORK/$pass-run.json"; then
    if grep -q "logits and KV cache rows == Model::forward_cached bit for bit" "$WORK/out"; then pass "sched --pass $pass --run: all equal"
    else fail "sched --pass $pass --run: $(cat "$WORK/out")"; fi
  fi
done
if run_rc "sched --pass prefill" 0 "$CONCORD" sched --model "$WORK/config.json" --pass prefill --tokens 32 --context 128; then
  if grep -q "pass prefill, 1 x 32 tokens after 128 cached" "$WORK/out"; then pass "sched --pass prefill"
  else fail "sched --pass prefill: $(cat "$WORK/out")"; fi
fi
expect_error "sched: decode past the positions" "after --context 256" "$CONCORD" sched --model "$WORK/config.json" --pass decode --context 256
expect_error "sched: --context on the forward" "--context is for" "$CONCORD" sched --model "$WORK/config.json" --context 5

expect_error "sched: unknown pass" "unknown pass 'backward'" "$CONCORD" sched --model "$WORK/config.json" --pass backward
expect_error "sched: alignment" "--alignment 6" "$CONCORD" sched --model "$WORK/config.json" --alignment 6
expect_error "sched: tokens past the positions" "max_position_embeddings" "$CONCORD" sched --model "$WORK/config.json" --tokens 1000
expect_error "sched: no such model" "nothing.json" "$CONCORD" sched --model "$WORK/nothing.json"
finish sched
