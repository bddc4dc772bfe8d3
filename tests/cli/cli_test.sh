#!/bin/bash
# End-to-end tests of the concord binary: named codec values, usage errors (one line, exit 2),
# quant -> inspect -> dequant on a generated checkpoint, corrupt files, train, tokenize, export
# (safetensors <-> GGUF) and generate.
# Usage: cli_test.sh PATH/TO/concord
set -u
CONCORD="$1"
source "$(dirname "$0")/lib.sh"

# expect_output NAME EXPECTED COMMAND... : stdout equals EXPECTED and exit status is 0.
expect_output() {
  local name="$1" expected="$2"; shift 2
  local got; got="$("$@" 2>"$WORK/stderr")"; local rc=$?
  if [[ $rc -ne 0 || "$got" != "$expected" ]]; then
    fail "$name: rc=$rc, got '$got', expected '$expected' ($(cat "$WORK/stderr"))"
  else
    pass "$name"
  fi
}

# --- codec: named values ---
expect_output "e4m3 464 ties to even at max" "0x7E" bash -c "echo 464 | '$CONCORD' codec encode --format e4m3"
expect_output "e5m2 61440 overflows to inf" "0x7C" bash -c "echo 61440 | '$CONCORD' codec encode --format e5m2"
expect_output "e5m2 61440 saturates" "0x7B" bash -c "echo 61440 | '$CONCORD' codec encode --format e5m2 --saturate"
expect_output "bf16 encode 1" "0x3F80" bash -c "echo 1 | '$CONCORD' codec encode --format bf16"
expect_output "e2m1 decode 0x7" "0x40C00000 6" bash -c "echo 0x7 | '$CONCORD' codec decode --format e2m1"

# --- usage errors: one line, exit 2 ---
expect_error "missing --format" "format" "$CONCORD" codec encode
expect_error "unknown subcommand" "concord:" "$CONCORD" no-such-command
expect_error "unknown quant format" "unknown --format 'mxfp3'" "$CONCORD" quant a b --format mxfp3
expect_error "bad skip regex" "--skip '(' is not a valid regular expression" "$CONCORD" quant a b --format mxfp4 --skip "("

# --- a generated checkpoint (python3 standard library only) ---
python3 - "$WORK/model.safetensors" <<'PY'
import json, random, struct, sys
random.seed(1)
def f32(values): return struct.pack("<%df" % len(values), *values)
tensors = {
    "model.layers.0.mlp.up_proj.weight": ("F32", [64, 96], f32([random.gauss(0, 0.02) for _ in range(64 * 96)])),
    "model.layers.0.input_layernorm.weight": ("F32", [96], f32([1 + random.gauss(0, 0.02) for _ in range(96)])),
    "model.embed_tokens.weight": ("F32", [32, 96], f32([random.gauss(0, 1) for _ in range(32 * 96)])),
    "odd": ("F32", [3, 5], f32([random.gauss(0, 1) for _ in range(15)])),
    "step": ("I64", [1], struct.pack("<q", 7)),
}
header, data = {"__metadata__": {"format": "pt"}}, b""
for name, (dtype, shape, raw) in tensors.items():
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
[[ -s "$WORK/model.safetensors" ]] || fail "could not generate the checkpoint"

"$CONCORD" quant "$WORK/model.safetensors" "$WORK/q.safetensors" --format mxfp8-e4m3 --skip 'norm|odd' >"$WORK/table" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then
  fail "quant mxfp8-e4m3: exit $rc: $(cat "$WORK/table")"
else
  grep -q "SQNR dB" "$WORK/table" && grep -q "^total (2 quantized)" "$WORK/table" &&
    grep -q "model.layers.0.input_layernorm.weight .*kept (skip)" "$WORK/table" &&
    grep -q "^model.layers.0.mlp.up_proj.weight .*mxfp8-e4m3  *[0-9]" "$WORK/table" &&
    grep -q "^bytes: in [0-9]*, out [0-9]*" "$WORK/table" &&
    pass "quant prints the table" || fail "quant table: $(cat "$WORK/table")"
  # E4M3 with 32-element MX blocks of Gaussian data: SQNR ~31 dB.
  sqnr=$(awk '/^total/ {print $(NF-2)}' "$WORK/table")
  awk -v s="$sqnr" 'BEGIN {exit !(s > 28 && s < 34)}' && pass "mxfp8 SQNR $sqnr dB in (28, 34)" ||
    fail "mxfp8 total SQNR $sqnr dB outside (28, 34)"
fi
[[ -z "$(ls "$WORK" | grep '\.tmp\.')" ]] && pass "no temp files left" || fail "temp files left: $(ls "$WORK")"

"$CONCORD" inspect "$WORK/q.safetensors" >"$WORK/inspect" 2>&1
if [[ $? -ne 0 ]]; then
  fail "inspect: $(cat "$WORK/inspect")"
else
  grep -q "^model.layers.0.mlp.up_proj.weight  *F8_E4M3  *\[64, 96\]" "$WORK/inspect" &&
    grep -q "^model.layers.0.mlp.up_proj.weight.scales  *F8_E8M0  *\[64, 3\]" "$WORK/inspect" &&
    grep -q "^step  *I64" "$WORK/inspect" &&
    grep -q "format = pt" "$WORK/inspect" &&
    grep -q "model.embed_tokens.weight: MX: e4m3 elements in 1x32 blocks, e8m0 power-of-two scales (rule floor)" "$WORK/inspect" &&
    pass "inspect lists tensors, metadata and formats" || fail "inspect output: $(cat "$WORK/inspect")"
fi

"$CONCORD" dequant "$WORK/q.safetensors" "$WORK/d.safetensors" >/dev/null 2>"$WORK/stderr" &&
  "$CONCORD" inspect "$WORK/d.safetensors" >"$WORK/inspect_d" 2>&1 &&
  grep -q "^model.layers.0.mlp.up_proj.weight  *F32  *\[64, 96\]" "$WORK/inspect_d" &&
  ! grep -q "scales\|concord.quant" "$WORK/inspect_d" &&
  pass "dequant restores F32 tensors" || fail "dequant: $(cat "$WORK/stderr" "$WORK/inspect_d")"
# Kept tensors are copied bit for bit.
a=$("$CONCORD" inspect "$WORK/model.safetensors" --dump odd)
b=$("$CONCORD" inspect "$WORK/d.safetensors" --dump odd)
[[ -n "$a" && "$a" == "$b" ]] && pass "skipped tensor unchanged" || fail "skipped tensor changed"

# bf16 of fp32 values that are already bf16 (dequantized MXFP8) is exact: SQNR inf.
"$CONCORD" quant "$WORK/d.safetensors" "$WORK/b.safetensors" --format bf16 --skip "norm|odd" >"$WORK/table16" 2>&1 &&
  grep -q "^total (2 quantized) .* inf  *0.000e+00  *0.000e+00" "$WORK/table16" &&
  pass "bf16 of bf16-representable values is exact" || fail "bf16 exactness: $(cat "$WORK/table16")"
"$CONCORD" quant "$WORK/model.safetensors" "$WORK/p.safetensors" --format mxfp6-e2m3 --scale-rule rceil --round sr --seed 3 --skip odd >"$WORK/table6" 2>&1 &&
  grep -q "^total" "$WORK/table6" && pass "quant with --scale-rule/--round sr" || fail "quant options: $(cat "$WORK/table6")"

expect_error "4-bit format needs even columns" "tensor 'odd' has shape [3, 5] with an odd last dim" \
  "$CONCORD" quant "$WORK/model.safetensors" "$WORK/x.safetensors" --format mxfp4
expect_error "scale rule on a non-MX format" "--scale-rule applies to MX formats only" \
  "$CONCORD" quant "$WORK/model.safetensors" "$WORK/x.safetensors" --format nvfp4 --scale-rule ceil
expect_error "quantizing twice" "already holds concord-quantized tensors" \
  "$CONCORD" quant "$WORK/q.safetensors" "$WORK/x.safetensors" --format mxfp4

# --- corrupt files: exit 2, one line naming the file ---
head -c 100 "$WORK/model.safetensors" >"$WORK/truncated.safetensors"
expect_error "inspect truncated file" "[safetensors] $WORK/truncated.safetensors: header length" \
  "$CONCORD" inspect "$WORK/truncated.safetensors"
size=$(stat -c %s "$WORK/model.safetensors")
head -c $((size - 1)) "$WORK/model.safetensors" >"$WORK/short.safetensors"
expect_error "quant truncated data" "[safetensors] $WORK/short.safetensors:" \
  "$CONCORD" quant "$WORK/short.safetensors" "$WORK/x.safetensors" --format mxfp4
printf 'not a safetensors file at all' >"$WORK/text.safetensors"
expect_error "inspect text file" "[safetensors] $WORK/text.safetensors: header length" \
  "$CONCORD" inspect "$WORK/text.safetensors"
expect_error "inspect missing file" "[safetensors] $WORK/none.safetensors: cannot open" \
  "$CONCORD" inspect "$WORK/none.safetensors"
expect_error "dump unknown tensor" "no tensor named 'nope'" \
  "$CONCORD" inspect "$WORK/model.safetensors" --dump nope
[[ ! -e "$WORK/x.safetensors" ]] && pass "failed commands write no output" || fail "x.safetensors written"

# train: a few steps of a tiny model on a generated text file; errors name the config key/file.
for i in $(seq 1 400); do echo "And it came to pass, in the $i th year, that the king went up."; done >"$WORK/corpus.txt"
cat >"$WORK/train.json" <<JSON
{"name": "cli", "model": {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 259, "hidden_size": 32,
 "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
 "head_dim": 16, "max_position_embeddings": 64},
 "data": {"corpus": "$WORK/corpus.txt", "chunk": 256, "validation_fraction": 0.1},
 "train": {"batch_size": 2, "seq_len": 32, "steps": 4, "warmup_steps": 1},
 "eval": {"every": 2, "batches": 1}, "checkpoint": {"every": 2, "keep": 1}, "out": "$WORK/run"}
JSON
"$CONCORD" train --config "$WORK/train.json" --quiet >"$WORK/train.out" 2>"$WORK/train.err"
if [[ $? -eq 0 && -f "$WORK/run/final/model.safetensors" && -f "$WORK/run/checkpoints/step-00000004/state.json" \
      && $(grep -c '"loss"' "$WORK/run/metrics.jsonl") -eq 4 ]] && grep -q "steps 0..4" "$WORK/train.out"; then
  pass "train writes metrics, checkpoints and the final model"
else
  fail "train: $(cat "$WORK/train.out" "$WORK/train.err")"
fi
"$CONCORD" train --config "$WORK/train.json" --quiet >"$WORK/train.out" 2>"$WORK/train.err"
grep -q "already trained to step 4" "$WORK/train.out" && pass "train on a finished run does nothing" \
  || fail "train rerun: $(cat "$WORK/train.out" "$WORK/train.err")"
"$CONCORD" train --config "$WORK/train.json" --quiet --steps 6 >"$WORK/train.out" 2>"$WORK/train.err"
grep -q "different 'train'" "$WORK/train.err" && pass "train refuses to resume under another config" \
  || fail "train resume mismatch: $(cat "$WORK/train.out" "$WORK/train.err")"
"$CONCORD" inspect "$WORK/run/final/model.safetensors" >/dev/null && pass "final model is valid safetensors" \
  || fail "final model does not inspect"
expect_error "train missing config" "cannot open the training config" \
  "$CONCORD" train --config "$WORK/none.json"
echo '{"train": {"stpes": 3}}' >"$WORK/bad.json"
expect_error "train unknown key" "unknown key 'train.stpes'" "$CONCORD" train --config "$WORK/bad.json"
expect_error "train unknown policy" "neither a preset" \
  "$CONCORD" train --config "$WORK/train.json" --policy fp5 --out "$WORK/run2"

# tokenize / export / generate on the model just trained, and on the committed test tokenizer.
DATA="$(cd "$(dirname "$0")/../data" && pwd)"
expect_output "tokenize byte tokenizer" "104 105" \
  bash -c "printf hi | '$CONCORD' tokenize --tokenizer '$WORK/run/final'"
expect_output "tokenize --decode" "hi" \
  bash -c "echo 104 105 | '$CONCORD' tokenize --tokenizer '$WORK/run/final/tokenizer.json' --decode"
TEXT=$'In the beginning God created the heaven and the earth.\n<|im_start|>user 日本語 🙂'
expect_output "tokenize BPE round trip" "$TEXT" \
  bash -c "printf '%s' \"\$1\" | '$CONCORD' tokenize --tokenizer '$DATA/tokenizer/qwen3_kjv_4096.json' \
    | '$CONCORD' tokenize --tokenizer '$DATA/tokenizer/qwen3_kjv_4096.json' --decode" _ "$TEXT"
expect_error "tokenize missing tokenizer" "tokenizer" \
  "$CONCORD" tokenize --tokenizer "$WORK/none/tokenizer.json"

"$CONCORD" export --model "$WORK/run" --to gguf --out "$WORK/run.gguf" >"$WORK/export.out" 2>&1 \
  && "$CONCORD" export --model "$WORK/run.gguf" --to safetensors --out "$WORK/from_gguf" >>"$WORK/export.out" 2>&1 \
  && pass "export run -> gguf -> safetensors" || fail "export: $(cat "$WORK/export.out")"
"$CONCORD" generate --model "$WORK/run" --prompt "And God" --max-tokens 12 --temp 0 \
  >"$WORK/gen_st.out" 2>"$WORK/gen_st.err"
"$CONCORD" generate --model "$WORK/run.gguf" --prompt "And God" --max-tokens 12 --temp 0 \
  >"$WORK/gen_gguf.out" 2>"$WORK/gen_gguf.err"
"$CONCORD" generate --model "$WORK/from_gguf" --prompt "And God" --max-tokens 12 --temp 0 \
  >"$WORK/gen_back.out" 2>"$WORK/gen_back.err"
if [[ -s "$WORK/gen_st.out" ]] && cmp -s "$WORK/gen_st.out" "$WORK/gen_gguf.out" \
    && cmp -s "$WORK/gen_st.out" "$WORK/gen_back.out" && grep -q "decode:" "$WORK/gen_st.err"; then
  pass "generate: same greedy text from safetensors, GGUF and back"
else
  fail "generate formats differ: '$(cat "$WORK/gen_st.out")' / '$(cat "$WORK/gen_gguf.out")' / '$(cat "$WORK/gen_back.out")' $(cat "$WORK/gen_st.err" "$WORK/gen_gguf.err")"
fi
a="$("$CONCORD" generate --model "$WORK/run" --prompt "The" --max-tokens 16 --seed 7 --top-k 20 2>/dev/null)"
b="$("$CONCORD" generate --model "$WORK/run" --prompt "The" --max-tokens 16 --seed 7 --top-k 20 --policy mxfp8 2>/dev/null)"
c="$("$CONCORD" generate --model "$WORK/run" --prompt "The" --max-tokens 16 --seed 7 --top-k 20 2>/dev/null)"
[[ -n "$a" && "$a" == "$c" && -n "$b" ]] && pass "generate is reproducible by seed; runs at mxfp8" \
  || fail "generate seeds: '$a' vs '$c' (mxfp8: '$b')"
expect_error "generate --chat without a template" "chat template" \
  "$CONCORD" generate --model "$WORK/run" --prompt "hi" --chat
expect_error "generate missing model" "none" "$CONCORD" generate --model "$WORK/none" --prompt "hi"
head -c 3000 "$WORK/run.gguf" >"$WORK/cut.gguf"
expect_error "generate on a truncated GGUF" "cut.gguf" \
  "$CONCORD" generate --model "$WORK/cut.gguf" --prompt "hi"
expect_error "export unknown format" "--to" \
  "$CONCORD" export --model "$WORK/run" --to onnx --out "$WORK/x"

# ---- issue 26, items 1, 2, 4 (run directories and config errors) ----
# A fresh start (--no-resume) that dies before its first checkpoint (here: its corpus is not there
# yet) used to leave the old run's checkpoints and final/ beside its own config.json, and the
# plain rerun then "resumed" the old run ("already trained ... nothing to do", seed-1 weights).
cp -r "$WORK/run" "$WORK/run4"
sed "s|$WORK/corpus.txt|$WORK/corpus4.txt|" "$WORK/train.json" >"$WORK/train4.json"
run_rc "train --no-resume that fails at once" 2 \
  "$CONCORD" train --config "$WORK/train4.json" --quiet --seed 2 --no-resume --out "$WORK/run4"
cp "$WORK/corpus.txt" "$WORK/corpus4.txt"
"$CONCORD" train --config "$WORK/train4.json" --quiet --seed 2 --out "$WORK/run4" >"$WORK/train.out" 2>"$WORK/train.err"
if grep -q "steps 0..4" "$WORK/train.out" && ! cmp -s "$WORK/run/final/model.safetensors" "$WORK/run4/final/model.safetensors"; then
  pass "a rerun after a failed --no-resume trains the new run, not the old one"
else
  fail "rerun after --no-resume: $(cat "$WORK/train.out" "$WORK/train.err")"
fi
# final/ lost after the last checkpoint is rebuilt from it, byte for byte.
cp "$WORK/run4/final/model.safetensors" "$WORK/final4.safetensors"
rm -rf "$WORK/run4/final"
"$CONCORD" train --config "$WORK/train4.json" --quiet --seed 2 --out "$WORK/run4" >"$WORK/train.out" 2>"$WORK/train.err"
if grep -q "rebuilt its final/" "$WORK/train.out" && cmp -s "$WORK/final4.safetensors" "$WORK/run4/final/model.safetensors"; then
  pass "train rebuilds a missing final/ from the last checkpoint"
else
  fail "final/ rebuild: $(cat "$WORK/train.out" "$WORK/train.err")"
fi
echo '{"name": 5}' >"$WORK/type.json"
expect_error "train config with a number for a string" "type.json: 'name' must be a string, got an integer" \
  "$CONCORD" train --config "$WORK/type.json"
echo '{"data": {"corpus": 7}}' >"$WORK/type.json"
expect_error "train config with a number for data.corpus" "type.json: 'data.corpus' must be a string" \
  "$CONCORD" train --config "$WORK/type.json"
echo '{"train": {"lr": -1}}' >"$WORK/type.json"
expect_error "train config with a negative lr" "'train.lr' must be > 0, got -1" \
  "$CONCORD" train --config "$WORK/type.json"
expect_error "train config that is a directory" "cannot open the training config: it is a directory" \
  "$CONCORD" train --config "$WORK"
printf '{"name":\n x}' >"$WORK/type.json"
expect_error "train config that is not JSON names the line" "not valid JSON (parse error at line 2" \
  "$CONCORD" train --config "$WORK/type.json"
# A demo that stops part-way (here: its warm-up cache OUT/base is a file, not a folder) must not
# leave the previous demo's summary and report beside its arms.
mkdir -p "$WORK/demo26"
echo '{"format": "concord-demo/1", "arms": []}' >"$WORK/demo26/summary.json"
echo '<html>old</html>' >"$WORK/demo26/report.html"
touch "$WORK/demo26/base"
run_rc "demo that fails part-way" 2 "$CONCORD" demo --quick --quiet --out "$WORK/demo26" \
  && [[ ! -e "$WORK/demo26/summary.json" && ! -e "$WORK/demo26/report.html" ]] \
  && pass "a demo that fails part-way leaves no previous demo's summary or report" \
  || fail "demo part-way: $(ls "$WORK/demo26") $(cat "$WORK/err")"
# ---- end of issue 26, items 1, 2, 4 ----

finish "CLI"
