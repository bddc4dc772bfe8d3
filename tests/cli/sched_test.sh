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

expect_error "sched: unknown pass" "unknown pass 'backward'" "$CONCORD" sched --model "$WORK/config.json" --pass backward
expect_error "sched: alignment" "--alignment 6" "$CONCORD" sched --model "$WORK/config.json" --alignment 6
expect_error "sched: tokens past the positions" "max_position_embeddings" "$CONCORD" sched --model "$WORK/config.json" --tokens 1000
expect_error "sched: no such model" "nothing.json" "$CONCORD" sched --model "$WORK/nothing.json"
finish sched
