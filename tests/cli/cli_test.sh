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
expect_error "unknown activation arena (generate)" "unknown activation arena 'heap' (planned, bump)" \
  "$CONCORD" generate --model m --prompt p --activation-arena heap
expect_error "unknown activation arena (serve)" "unknown activation arena 'heap' (planned, bump)" \
  "$CONCORD" serve --model m --activation-arena heap
expect_error "bad skip regex" "--skip '(' is not a valid regular expression" "$CONCORD" quant a b --format mxfp4 --skip "("

# Unknown commands and options name what was given and list the commands of that level.
expect_error "unknown command lists the commands" "unknown command 'frobnicate'; the commands are codec, quant," \
  "$CONCORD" frobnicate
expect_error "unknown top-level option" "unknown option '--frob'; the commands are codec," "$CONCORD" --frob
expect_error "no command" "a command is required: codec, quant," "$CONCORD"
expect_error "unknown codec command" "codec: unknown command 'frob'; the commands are encode, decode, quantize, dequantize" \
  "$CONCORD" codec frob
expect_error "unknown option of a command" "inspect: unknown option '--frob' (see concord inspect --help)" \
  "$CONCORD" inspect x --frob

# --- numeric flags: every one has a domain, checked when parsed (issue 26 item 3: -1 was "not
# given"). COMMAND|ARGS IT REQUIRES|FLAG|BAD VALUE|DOMAIN NAMED. The rl flags: rl_test.sh.
# (demo's bad --arm makes a binary that ignored the flag fail at once instead of running.)
cat >"$WORK/flags.table" <<'TABLE'
codec encode|-f e4m3|--seed|-1|an integer in [0, 2^64 - 1]
codec quantize|-f mxfp4|--seed|18446744073709551616|an integer in [0, 2^64 - 1]
quant|a.safetensors b.safetensors -f mxfp4|--seed|-1|an integer in [0, 2^64 - 1]
quant|a.safetensors b.safetensors -f mxfp4|--seed|0x10|an integer in [0, 2^64 - 1]
demo|--arm bf16/fp7:rne|--steps|-1|an integer in [1, 99999999]
demo|--arm bf16/fp7:rne|--steps|0|an integer in [1, 99999999]
demo|--arm bf16/fp7:rne|--seed|-1|an integer in [0, 2^64 - 1]
train|--config c.json|--steps|-1|an integer in [1, 99999999]
train|--config c.json|--steps|100000000|an integer in [1, 99999999]
train|--config c.json|--steps|1e3|an integer in [1, 99999999]
train|--config c.json|--seed|-1|an integer in [0, 2^64 - 1]
generate|--model m --prompt p|--max-tokens|0|an integer >= 1
task-eval|--model m --task add|--prompts|0|an integer in [1, 100000]
task-eval|--model m --task add|--group|0|an integer in [1, 1024]
task-eval|--model m --task add|--max-new|0|an integer in [1, 4096]
task-eval|--model m --task add|--show|-1|an integer in [0, 100]
task-eval|--model m --task add|--temp|-1|a number >= 0
task-eval|--model m --task add|--seed|-1|an integer in [0, 2^64 - 1]
task-eval|--model m --task add|--difficulty|0|an integer in [1, 30]
task-eval|--model m --task add|--difficulty|31|an integer in [1, 30]
generate|--model m --prompt p|--temp|-1|a number >= 0
generate|--model m --prompt p|--temp|nan|a number >= 0
generate|--model m --prompt p|--temp|inf|a number >= 0
generate|--model m --prompt p|--temp|1e39|a number >= 0 that a 32-bit float can hold
generate|--model m --prompt p|--top-k|-1|an integer in [0, 2^31 - 1]
generate|--model m --prompt p|--top-k|2147483648|an integer in [0, 2^31 - 1]
generate|--model m --prompt p|--top-p|0|a number in (0, 1]
generate|--model m --prompt p|--top-p|1.5|a number in (0, 1]
generate|--model m --prompt p|--min-p|-0.1|a number in [0, 1]
generate|--model m --prompt p|--min-p|2|a number in [0, 1]
generate|--model m --prompt p|--seed|-1|an integer in [0, 2^64 - 1]
generate|--model m --prompt p|--prefill-chunk|0|an integer >= 1
generate|--model m --prompt p|--prefill-chunk|x|an integer >= 1
generate|--model m --prompt p --json|--top-logprobs|21|an integer in [0, 20]
generate|--model m --prompt p --json|--top-logprobs|-1|an integer in [0, 20]
serve|--model m|--port|-1|an integer in [0, 65535]
serve|--model m|--port|65536|an integer in [0, 65535]
serve|--model m|--max-sequences|0|an integer in [1, 4096]
serve|--model m|--prefill-chunk|0|an integer >= 1
serve|--model m|--max-context|-1|an integer >= 0
serve|--model m|--max-queue|0|an integer in [1, 1000000]
serve|--model m|--max-body-bytes|0|an integer in [1, 4294967296]
serve|--model m|--max-weights-body-bytes|0|an integer in [1, 1099511627776]
serve|--model m|--prefix-cache-bytes|-1|an integer in [0, 1099511627776]
serve|--model m|--prefix-cache-block|-1|an integer in [0, 1048576]
serve|--model m|--request-timeout|-1|a number >= 0
serve|--model m|--read-timeout|0|an integer in [1, 3600]
serve|--model m|--receive-timeout|0|a number > 0
serve|--model m|--write-timeout|0|an integer in [1, 3600]
serve|--model m|--http-threads|-1|an integer in [0, 65536]
contract dump|--model m --kernel fp32 --out o.npy|--count|0|an integer >= 1
contract dump|--model m --kernel fp32 --out o.npy|--difficulty|0|an integer in [1, 2^31 - 1]
contract dump|--model m --kernel fp32 --out o.npy|--seed|-1|an integer in [0, 2^64 - 1]
contract dump|--model m --kernel fp32 --out o.npy|--max-new|-1|an integer >= 0
contract dump|--model m --kernel fp32 --out o.npy|--batch|0|an integer >= 1
contract measure|--ref a --cand b --out o|--count|-5|an integer >= 1
contract measure|--ref a --cand b --out o|--difficulty|-1|an integer in [1, 2^31 - 1]
contract measure|--ref a --cand b --out o|--seed|1.5|an integer in [0, 2^64 - 1]
contract measure|--ref a --cand b --out o|--max-new|-2|an integer >= 0
contract measure|--ref a --cand b --out o|--batch|-1|an integer >= 1
contract measure|--ref a --cand b --out o|--decided-margin|-1|a number >= 0
contract measure|--ref a --cand b --out o|--position-edges|-3|an integer in [1, 2^31 - 1]
contract measure|--ref a --cand b --out o|--prompt-length-edges|0|an integer in [1, 2^31 - 1]
contract measure|--ref a --cand b --out o|--headroom|0.5|a number >= 1
contract measure|--ref a --cand b --out o|--quantile|0|a number in (0, 1]
contract measure|--ref a --cand b --out o|--quantile|1.01|a number in (0, 1]
contract check|--contract c --ref a --cand b|--count|0|an integer >= 1
contract check|--contract c --ref a --cand b|--difficulty|0|an integer in [1, 2^31 - 1]
contract check|--contract c --ref a --cand b|--seed|-2|an integer in [0, 2^64 - 1]
contract check|--contract c --ref a --cand b|--max-new|-1|an integer >= 0
contract check|--contract c --ref a --cand b|--batch|0|an integer >= 1
contract check|--contract c --ref a --cand b|--decided-margin|-0.5|a number >= 0
contract check|--contract c --ref a --cand b|--position-edges|0|an integer in [1, 2^31 - 1]
contract check|--contract c --ref a --cand b|--prompt-length-edges|-16|an integer in [1, 2^31 - 1]
generate|--model m --prompt p|--depth|0|an integer in [1, 4096]
generate|--model m --prompt p|--exit-kl|-1|a number >= 0
generate|--model m --prompt p|--max-depth|0|an integer in [1, 4096]
generate|--model m --prompt p|--kv-core-slots|5000|an integer in [1, 4096]
generate|--model m --prompt p|--slots-per-rank|-1|an integer in [0, 1048576]
generate|--model m --prompt p|--replan-every|-1|an integer in [0, 1048576]
generate|--model m --prompt p|--rank-speeds|0|a number > 0
generate|--model m --prompt p|--draft-tokens|0|an integer in [1, 64]
generate|--model m --prompt p|--memory-cap|12XB|a size (bytes, or a number with KiB, MiB or GiB)
generate|--model m --prompt p|--memory-cap|0%|a percentage in (0, 100]
generate|--model m --prompt p|--memory-cap|101%|a percentage in (0, 100]
generate|--model m --prompt p|--pin-share|1.5|a number in [0, 1]
serve|--model m|--memory-cap|0%|a percentage in (0, 100]
serve|--model m|--pin-share|-1|a number in [0, 1]
cap-plan|--model m --trace t|--pin-share|2|a number in [0, 1]
cap-plan|--model m --trace t|--prefill-passes|-1|an integer in [0, 1048576]
disagg-plan|--model m|--prefill-chunk|0|an integer >= 1
disagg-plan|--model m|--calibrate-tokens|1|an integer >= 2
disagg-plan|--model m|--max-sequences|2|an integer in [4, 4096]
disagg-plan|--model m|--seed|-1|an integer in [0, 2^64 - 1]
disagg-plan|--model m|--prompt-tokens|1|an integer in [2, 16777216]
disagg-plan|--model m|--streams|-1|an integer in [0, 4096]
disagg-plan|--model m|--stream-tokens|-1|an integer in [0, 16777216]
disagg-plan|--model m|--step-overhead|-1|a number >= 0
serve|--model m|--draft-tokens|65|an integer in [1, 64]
contract measure|--ref a --cand b --out o|--depths|0|an integer in [1, 4096]
contract check|--contract c --ref a --cand b|--depths|4097|an integer in [1, 4096]
eval|--run r|--depths|0|an integer in [1, 4096]
eval|--run r|--exit-kl|-0.1|a number >= 0
eval|--run r|--max-depth|0|an integer in [1, 4096]
eval|--run r|--decode-rows|0|an integer in [1, 1048576]
eval|--run r|--addition|19|an integer in [1, 18]
eval|--run r|--problems|0|an integer in [1, 100000]
flow lsq||--n|0|an integer in [1, 1048576]
flow lsq||--d|257|an integer in [1, 256]
flow lsq||--condition|0.5|a number >= 1
flow lsq||--noise|-1|a number >= 0
flow lsq||--seed|-1|an integer in [0, 2^64 - 1]
flow lsq||--time|0|a number > 0
flow lsq||--gd-steps|0|a number > 0
flow lsq||--sgd-steps|2|a number in (0, 2)
flow lsq||--batches|0|an integer in [1, 1048576]
flow lsq||--sgd-runs|1|an integer in [2, 100000]
flow lsq||--precision-step|2|a number in (0, 2)
flow model|--model m|--population|0|an integer in [1, 4096]
flow model|--model m|--seq-len|1|an integer in [2, 8192]
sched|--model m|--tokens|0|an integer in [1, 1048576]
sched|--model m --pass prefill|--context|-1|an integer in [0, 1048576]
sched|--model m|--batch|4097|an integer in [1, 4096]
sched|--model m|--alignment|2|an integer in [4, 1048576]
sched|--model m|--dp-states|0|an integer in [1, 1099511627776]
sched|--model m|--dp-seconds|0|a number > 0
sched|--model m|--seed|-1|an integer in [0, 2^64 - 1]
sched|--model m --pass train|--budget|12XB|a size (bytes, or a number with KiB, MiB or GiB)
sched|--model m --pass train|--budget|0|a size (bytes, or a number with KiB, MiB or GiB)
train|--config c|--memory-budget|-5MiB|a size (bytes, or a number with KiB, MiB or GiB)
train|--config c|--ed-bits|9|an integer in [0, 8]
train|--config c|--latent-range|0|a number in (0, 1]
flow model|--model m|--probe|0|an integer in [1, 4096]
flow model|--model m|--time|-1|a number > 0
flow model|--model m|--gd-steps|0|a number > 0
flow model|--model m|--sgd-step|0|a number > 0
flow model|--model m|--batches|0|an integer in [1, 4096]
flow model|--model m|--sgd-runs|0|an integer in [1, 1000]
flow model|--model m|--adam-lrs|-1|a number > 0
flow model|--model m|--precision-step|0|a number > 0
flow model|--model m|--points|0|an integer in [1, 1000]
flow model|--model m|--rtol|0|a number in (0, 0.01]
flow model|--model m|--seed|-1|an integer in [0, 2^64 - 1]
ep-sim||--zipf|-1|a number >= 0
ep-sim||--experts|0|an integer in [1, 65536]
ep-sim||--top-k|0|an integer in [1, 65536]
ep-sim||--layers|0|an integer in [1, 4096]
ep-sim||--burst|-0.5|a number >= 0
ep-sim||--tokens|0|an integer in [1, 16777216]
ep-sim||--batches|0|an integer in [1, 1048576]
ep-sim||--plan-batches|0|an integer in [1, 1048576]
ep-sim||--ranks|0|an integer in [1, 4096]
ep-sim||--slots-per-rank|0|an integer in [1, 65536]
ep-sim||--seed|-1|an integer in [0, 2^64 - 1]
ep-sim||--fit-runs|0|an integer in [1, 65536]
ep-sim||--search-tries|-1|an integer in [0, 16777216]
TABLE
bad_flag_values "$WORK/flags.table"
expect_error "a list flag checks every element" "contract measure --position-edges: '-3' is not an integer in [1, 2^31 - 1]" \
  "$CONCORD" contract measure --ref a --cand b --out o --position-edges 16,-3
numeric_flags_covered "$WORK/flags.table" EXCLUDE rl
empty_values_refused EXCLUDE rl
expect_error "an option value that is not UTF-8" "train --out: not valid UTF-8 (byte 1)" \
  "$CONCORD" train --config c.json --out $'a\xff'

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
# A damaged .gguf is reported by the GGUF reader, whatever its bytes, by every command that reads
# model or tensor files; the safetensors commands say they read safetensors (issue 26 item 7).
printf 'GGUX\003\000\000\000' >"$WORK/magic.gguf"
printf 'GGU' >"$WORK/three.gguf"
for f in magic three; do
  expect_error "inspect $f.gguf names GGUF" "[gguf] $WORK/$f.gguf:" "$CONCORD" inspect "$WORK/$f.gguf"
  expect_error "generate $f.gguf names GGUF" "[gguf] $WORK/$f.gguf:" "$CONCORD" generate --model "$WORK/$f.gguf" --prompt hi
  expect_error "export $f.gguf names GGUF" "[gguf] $WORK/$f.gguf:" \
    "$CONCORD" export --model "$WORK/$f.gguf" --to safetensors --out "$WORK/x"
  expect_error "contract dump $f.gguf names GGUF" "[gguf] $WORK/$f.gguf:" \
    "$CONCORD" contract dump --model "$WORK/$f.gguf" --kernel fp32 --task add --out "$WORK/x.npy"
  expect_error "quant $f.gguf" "[quant] $WORK/$f.gguf: a GGUF file; quant reads safetensors" \
    "$CONCORD" quant "$WORK/$f.gguf" "$WORK/x.safetensors" --format mxfp4
  expect_error "dequant $f.gguf" "[dequant] $WORK/$f.gguf: a GGUF file; dequant reads safetensors" \
    "$CONCORD" dequant "$WORK/$f.gguf" "$WORK/x.safetensors"
done
expect_error "contract --ref with a GGUF file" "[contract] --ref $WORK/three.gguf: a GGUF file is a model (give it as --model)" \
  "$CONCORD" contract measure --ref "$WORK/three.gguf" --cand fp32 --out "$WORK/x"
expect_error "inspect bad magic says so" "bad magic 47 47 55 58, expected \"GGUF\"" "$CONCORD" inspect "$WORK/magic.gguf"
expect_error "inspect 3-byte gguf says truncated" "needs 4 bytes but the file ends 3 bytes later" \
  "$CONCORD" inspect "$WORK/three.gguf"
expect_error "a safetensors file is not a model" "a .safetensors file alone is not a model" \
  "$CONCORD" generate --model "$WORK/model.safetensors" --prompt hi
[[ ! -e "$WORK/x" && ! -e "$WORK/x.npy" && ! -e "$WORK/x.safetensors" ]] && pass "damaged GGUF: nothing written" \
  || fail "output written for a damaged GGUF"

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
# Text that is not UTF-8 is the input's fault: stdin is named with the byte offset, the
# tokenizer file is not (issue 26 item 8).
expect_error "tokenize names stdin for bad UTF-8" "[tokenize] stdin: not valid UTF-8 (byte 3)" \
  bash -c "printf 'ok \xff\xfe' | '$CONCORD' tokenize --tokenizer '$DATA/tokenizer/qwen3_kjv_4096.json'"
grep -q "qwen3_kjv_4096.json" "$WORK/err" && fail "the UTF-8 error names the tokenizer: $(cat "$WORK/err")" \
  || pass "the UTF-8 error does not blame the tokenizer file"
expect_error "tokenize --batch names the text and its stdin offset" "stdin: not valid UTF-8 (byte 5, in text 2 of the batch)" \
  bash -c "printf 'ab\0cd\xc3(' | '$CONCORD' tokenize --batch --tokenizer '$DATA/tokenizer/qwen3_kjv_4096.json'"
expect_error "task-eval: an unknown task, before the model loads" "[task-eval] --task divide: [rl] unknown task 'divide'" \
  "$CONCORD" task-eval --model "$WORK/none" --task add,divide
expect_error "task-eval: a difficulty past a task's range" "[task-eval] --task mul: [rl] task 'mul': difficulty 19 outside [1, 18]" \
  "$CONCORD" task-eval --model "$WORK/none" --task mul --difficulty 19
# A byte-level run (no chat template) in the completion form: the table and the JSON.
run_rc "task-eval on a trained run" 0 "$CONCORD" task-eval --model "$WORK/run" --task add,count --difficulty 1,2 \
    --prompts 3 --group 2 --max-new 4 --json "$WORK/taskeval.json" \
  && grep -q "completion (first line) form" "$WORK/out" && grep -q "^count  *2 " "$WORK/out" \
  && python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['form']=='line' and len(j['rows'])==4 and all(0<=r['reward']<=1 for r in j['rows'])" "$WORK/taskeval.json" \
  && pass "task-eval prints a row per task and difficulty and writes the JSON" || fail "task-eval: $(cat "$WORK/out" "$WORK/err")"
expect_error "generate names --prompt for bad UTF-8" "generate --prompt: not valid UTF-8 (byte 1)" \
  "$CONCORD" generate --model "$WORK/run" --prompt $'a\xff'

"$CONCORD" export --model "$WORK/run" --to gguf --out "$WORK/run.gguf" >"$WORK/export.out" 2>&1 \
  && "$CONCORD" export --model "$WORK/run.gguf" --to safetensors --out "$WORK/from_gguf" >>"$WORK/export.out" 2>&1 \
  && pass "export run -> gguf -> safetensors" || fail "export: $(cat "$WORK/export.out")"
# 4-bit GGUF exports (issue 15): llama.cpp's file types 2 / 3, matrices in the type, a file that
# loads back; a quant tensor cut short or of an unknown type is one line and exit 2.
for q in q4_0 q4_1; do
  if run_rc "export --dtype $q" 0 "$CONCORD" export --model "$WORK/run" --to gguf --dtype "$q" --out "$WORK/run_$q.gguf" \
      && run_rc "inspect the $q export" 0 "$CONCORD" inspect "$WORK/run_$q.gguf"; then
    grep -q "general.file_type: uint32 = $([[ $q == q4_0 ]] && echo 2 || echo 3)" "$WORK/out" \
      && grep -q "^token_embd.weight  *${q^^} " "$WORK/out" && grep -q "^output_norm.weight  *F32 " "$WORK/out" \
      && pass "export --dtype $q: file type and tensor types" || fail "export --dtype $q: $(cat "$WORK/out")"
    run_rc "the $q export loads back" 0 "$CONCORD" generate --model "$WORK/run_$q.gguf" --prompt "And God" \
      --max-tokens 4 --temp 0 && pass "the $q export loads back"
  fi
done
python3 - "$WORK/run_q4_0.gguf" "$WORK/cut_q4_0.gguf" "$WORK/type_q4_0.gguf" <<'PY'
import struct, sys
raw = open(sys.argv[1], "rb").read()
# the tensor infos follow the metadata; find token_embd.weight's: name, n_dims, dims, type
name = b"token_embd.weight"
at = raw.find(struct.pack("<Q", len(name)) + name) + 8 + len(name)
n_dims = struct.unpack_from("<I", raw, at)[0]
type_at = at + 4 + 8 * n_dims
assert struct.unpack_from("<I", raw, type_at)[0] == 2  # Q4_0
offset = struct.unpack_from("<Q", raw, type_at + 4)[0]
count = struct.unpack_from("<Q", raw, 8)[0]
kvs = struct.unpack_from("<Q", raw, 16)[0]
open(sys.argv[3], "wb").write(raw[:type_at] + struct.pack("<I", 4) + raw[type_at + 4:])
# cut the file 5 bytes into token_embd.weight's data: its offset is relative to the data section,
# which starts at the first multiple of 32 after the tensor infos (GGUF's default alignment)
pos = 24
def skip_string(p):
    return p + 8 + struct.unpack_from("<Q", raw, p)[0]
def skip_value(p, t):
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if t == 8:
        return skip_string(p)
    if t == 9:
        et, n = struct.unpack_from("<IQ", raw, p)
        p += 12
        for _ in range(n):
            p = skip_value(p, et)
        return p
    return p + sizes[t]
for _ in range(kvs):
    pos = skip_string(pos)
    t = struct.unpack_from("<I", raw, pos)[0]
    pos = skip_value(pos + 4, t)
for _ in range(count):
    pos = skip_string(pos)
    nd = struct.unpack_from("<I", raw, pos)[0]
    pos += 4 + 8 * nd + 4 + 8
data = (pos + 31) // 32 * 32
open(sys.argv[2], "wb").write(raw[:data + offset + 5])
PY
expect_error "a Q4_0 tensor cut short" "[gguf] $WORK/cut_q4_0.gguf: tensor 'token_embd.weight': bytes [0, " \
  "$CONCORD" generate --model "$WORK/cut_q4_0.gguf" --prompt hi
grep -q "run past its end" "$WORK/err" && pass "the cut tensor runs past the end" || fail "cut: $(cat "$WORK/err")"
expect_error "a tensor of unknown ggml type" "tensor 'token_embd.weight' has unknown ggml type 4" \
  "$CONCORD" export --model "$WORK/type_q4_0.gguf" --to safetensors --out "$WORK/x"
# Inconsistent tokenizer metadata (issue 15): one line naming the file and the key, exit 2, from
# tokenize and generate alike. The broken files are the run's GGUF export with tokenizer.* keys
# rewritten (tests/cli/gguf_retoken.py, standard library).
retoken() {  # retoken NAME EDITS_JSON -> $WORK/tok_NAME.gguf
  python3 "$CLI_TEST_DIR/gguf_retoken.py" "$WORK/run.gguf" "$WORK/tok_$1.gguf" "$2" >"$WORK/retoken.out" 2>&1 \
    || fail "gguf_retoken.py $1: $(tail -3 "$WORK/retoken.out")"
}
N_TOKENS=259  # the byte tokenizer: 256 bytes, <|bos|>, <|eos|>, <|pad|>
retoken types "{\"tokenizer.ggml.token_type\": $(python3 -c "print([1] * ($N_TOKENS - 1))")}"
retoken merge '{"tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.merges": ["\u0120 zz"]}'
retoken bos "{\"tokenizer.ggml.bos_token_id\": [\"UINT32\", $N_TOKENS]}"
retoken pad '{"tokenizer.ggml.padding_token_id": ["UINT32", 4000000000]}'
DUP_TOKENS=$(PYTHONPATH="$CLI_TEST_DIR" python3 -c "
import json, sys, gguf_retoken
tokens = dict((k, v) for k, _, v in gguf_retoken.read(sys.argv[1]))['tokenizer.ggml.tokens'][1]
tokens[-1] = tokens[-2]
print(json.dumps(tokens))" "$WORK/run.gguf")
retoken dup "{\"tokenizer.ggml.tokens\": $DUP_TOKENS}"
retoken pre '{"tokenizer.ggml.pre": "deepseek-llm"}'
while IFS='|' read -r name fragment; do
  expect_error "tokenize: tokenizer metadata $name" "$WORK/tok_$name.gguf: $fragment" \
    "$CONCORD" tokenize --tokenizer "$WORK/tok_$name.gguf"
  expect_error "generate: tokenizer metadata $name" "$WORK/tok_$name.gguf: $fragment" \
    "$CONCORD" generate --model "$WORK/tok_$name.gguf" --prompt hi --max-tokens 1
done <<EOT
types|tokenizer.ggml.token_type must be an integer array of $N_TOKENS entries (one per tokenizer.ggml.tokens entry; it has $((N_TOKENS - 1)))
merge|tokenizer.ggml.merges: merge 0 'Ġ zz' names 'zz', which is not in tokenizer.ggml.tokens
bos|tokenizer.ggml.bos_token_id is $N_TOKENS, outside the vocabulary (0..$((N_TOKENS - 1)))
pad|tokenizer.ggml.padding_token_id is 4000000000, outside the vocabulary
dup|tokenizer.ggml.tokens: token '<|eos|>' appears twice (ids 257 and 258)
pre|tokenizer.ggml.pre 'deepseek-llm' is not supported (concord implements default, qwen2,
EOT
expect_error "tokenize --add-special with --no-special" "[tokenize] --add-special: encodes with special tokens parsed" \
  "$CONCORD" tokenize --tokenizer "$WORK/run.gguf" --add-special --no-special
# add_bos_token / add_eos_token: --add-special puts <|bos|> (256) first and <|eos|> (257) last.
retoken addbos '{"tokenizer.ggml.bos_token_id": ["UINT32", 256], "tokenizer.ggml.eos_token_id": ["UINT32", 257], "tokenizer.ggml.add_bos_token": ["BOOL", true], "tokenizer.ggml.add_eos_token": ["BOOL", true]}'
expect_output "tokenize --add-special follows add_bos_token / add_eos_token" "256 104 105 257" \
  bash -c "printf hi | '$CONCORD' tokenize --add-special --tokenizer '$WORK/tok_addbos.gguf'"
expect_output "tokenize without --add-special adds nothing" "104 105" \
  bash -c "printf hi | '$CONCORD' tokenize --tokenizer '$WORK/tok_addbos.gguf'"
run_rc "export keeps add_bos_token / add_eos_token" 0 \
  "$CONCORD" export --model "$WORK/tok_addbos.gguf" --to gguf --out "$WORK/tok_addbos_export.gguf" \
  && expect_output "the export adds BOS and EOS as its source" "256 104 105 257" \
    bash -c "printf hi | '$CONCORD' tokenize --add-special --tokenizer '$WORK/tok_addbos_export.gguf'"
# The unbroken copy tokenizes as the original (the rewrite itself changes nothing).
retoken same '{}'
expect_output "the rewritten GGUF tokenizes as its source" "$(printf 'And God' | "$CONCORD" tokenize --tokenizer "$WORK/run.gguf")" \
  bash -c "printf 'And God' | '$CONCORD' tokenize --tokenizer '$WORK/tok_same.gguf'"
# --out: no parent created silently, never the source or overlapping it, and a failed export
# leaves nothing (issue 26 item 9).
expect_error "export into a missing folder" "the folder $WORK/missing/deeper does not exist (create it first)" \
  "$CONCORD" export --model "$WORK/run" --to safetensors --out "$WORK/missing/deeper/m"
[[ ! -e "$WORK/missing" ]] && pass "export creates no parent folders" || fail "export created $WORK/missing"
expect_error "export into its own run" "--out $WORK/run/final lies inside the source --model $WORK/run" \
  "$CONCORD" export --model "$WORK/run" --to safetensors --out "$WORK/run/final"
expect_error "export over its source" "is the source --model $WORK/from_gguf" \
  "$CONCORD" export --model "$WORK/from_gguf" --to safetensors --out "$WORK/from_gguf/"
expect_error "export over a folder holding the source" "--out $WORK/run contains the source --model $WORK/run/final" \
  "$CONCORD" export --model "$WORK/run/final" --to safetensors --out "$WORK/run"
expect_error "gguf export over its source" "is the source --model $WORK/run.gguf" \
  "$CONCORD" export --model "$WORK/run.gguf" --to gguf --out "$WORK/run.gguf"
[[ -f "$WORK/run/config.json" && -f "$WORK/run/final/model.safetensors" && -f "$WORK/run/metrics.jsonl" ]] \
  && pass "refused exports leave the run as it was" || fail "the run changed: $(ls -R "$WORK/run")"
# A model with a weight that f16 cannot hold: the f16 export fails once it has begun writing.
cp -r "$WORK/from_gguf" "$WORK/huge"
python3 - "$WORK/huge/model.safetensors" <<'PY'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
t = next(v for k, v in sorted(header.items()) if k != "__metadata__" and v["dtype"] == "F32")
struct.pack_into("<f", raw, 8 + n + t["data_offsets"][0], 1e6)
open(sys.argv[1], "wb").write(raw)
PY
expect_error "failed export" "which overflows F16" \
  "$CONCORD" export --model "$WORK/huge" --to safetensors --dtype f16 --out "$WORK/failed"
grep -q "export-tmp" "$WORK/err" && fail "the error names the temporary folder: $(cat "$WORK/err")" \
  || pass "a failed export names --out, not its temporary folder"
[[ ! -e "$WORK/failed" && -z "$(ls -A "$WORK" | grep export-)" ]] && pass "a failed export leaves nothing" \
  || fail "a failed export left: $(ls -A "$WORK")"
"$CONCORD" export --model "$WORK/run" --to safetensors --dtype bf16 --out "$WORK/from_gguf" >/dev/null 2>"$WORK/err" \
  && python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['torch_dtype'] == 'bfloat16' else 1)" \
    "$WORK/from_gguf/config.json" && pass "export replaces an earlier export" || fail "re-export: $(cat "$WORK/err")"
mkdir -p "$WORK/notes" && echo keep >"$WORK/notes/mine.txt"
expect_error "export into a folder with other files" "holds 'mine.txt', which an export does not write" \
  "$CONCORD" export --model "$WORK/run" --to safetensors --out "$WORK/notes"
[[ "$(ls "$WORK/notes")" == "mine.txt" ]] && pass "a folder with other files is left alone" || fail "notes/ changed"
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
# The prefix snapshot cache across processes (issue 25): the second run resumes every prompt token
# but the last from the files and prints the same log-probs bit for bit; a corrupt file is named
# on stderr and recomputed.
LONG_PROMPT="And God said, Let there be light: and there was l"  # 49 tokens of the 64 the model has
for i in 1 2; do
  "$CONCORD" generate --model "$WORK/run" --prompt "$LONG_PROMPT" --max-tokens 8 --seed 3 --json \
    --prefix-cache-dir "$WORK/snaps" >"$WORK/snap$i.json" 2>"$WORK/snap$i.err"
done
if [[ -s "$WORK/snap1.json" ]] && cmp -s "$WORK/snap1.json" "$WORK/snap2.json" \
    && grep -q "prefix cache: 0 prompt tokens resumed" "$WORK/snap1.err" \
    && grep -q "prefix cache: 48 prompt tokens resumed" "$WORK/snap2.err"; then
  pass "generate --prefix-cache-dir: a second run resumes the prompt from the files, same bits"
else
  fail "prefix cache runs: $(cat "$WORK/snap1.err" "$WORK/snap2.err")"
fi
SNAP=$(ls "$WORK"/snaps/*/*.kvsnap | head -1)
printf 'garbage' | dd of="$SNAP" bs=1 seek=100 conv=notrunc 2>/dev/null
"$CONCORD" generate --model "$WORK/run" --prompt "$LONG_PROMPT" --max-tokens 8 --seed 3 --json \
  --prefix-cache-dir "$WORK/snaps" >"$WORK/snap3.json" 2>"$WORK/snap3.err"
cmp -s "$WORK/snap1.json" "$WORK/snap3.json" && grep -qF "$SNAP: checksum mismatch (corrupt); the prefix is recomputed" "$WORK/snap3.err" \
  && pass "a corrupt snapshot file is named and recomputed, same bits" || fail "corrupt snapshot: $(cat "$WORK/snap3.err")"

# Disaggregated prefill and decode (issue 25): the prefill worker's rows handed to a decode worker
# in this process, in a second process over shared memory and (when mpirun exists) over MPI give
# the one-worker run's tokens and log-probs bit for bit; the decode worker resumes all but the
# last prompt token.
"$CONCORD" generate --model "$WORK/run" --prompt "$LONG_PROMPT" --max-tokens 8 --seed 3 --json >"$WORK/dis0.json" 2>/dev/null
DIS=(in-process shm)
if command -v mpirun >/dev/null 2>&1 && ldd "$CONCORD" 2>/dev/null | grep -q libmpi; then DIS+=(mpi); else echo "skip: --disaggregate mpi (no mpirun)"; fi
for t in "${DIS[@]}"; do
  LAUNCH=()
  # (Open MPI's own allocations at init are reported as leaks under ASan: the sanitizer build's
  # ranks run without leak detection, as tests/cli/CMakeLists.txt does for cli.rl.)
  [[ $t == mpi ]] && LAUNCH=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0
                             mpirun -np 2 --oversubscribe --mca btl self,vader)
  "${LAUNCH[@]}" "$CONCORD" generate --model "$WORK/run" --prompt "$LONG_PROMPT" --max-tokens 8 --seed 3 --json \
    --disaggregate "$t" >"$WORK/dis_$t.json" 2>"$WORK/dis_$t.err" </dev/null
  if [[ -s "$WORK/dis0.json" ]] && cmp -s "$WORK/dis0.json" "$WORK/dis_$t.json" \
      && grep -q "prefill worker: 49 prompt tokens" "$WORK/dis_$t.err" \
      && grep -q "prefix cache: 48 prompt tokens resumed" "$WORK/dis_$t.err"; then
    pass "generate --disaggregate $t: the prompt's rows handed over, the same tokens and log-probs"
  else
    fail "generate --disaggregate $t: $(cat "$WORK/dis_$t.err")"
  fi
done
expect_error "--disaggregate names its transports" "unknown --disaggregate transport 'tcp' (in-process, shm, mpi)" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --disaggregate tcp
expect_error "--disaggregate refuses --echo" "--disaggregate with --echo" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --json --echo --disaggregate in-process
expect_error "--rank alone is refused" "--rank is for the decode worker" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --rank 1

# Expert parallelism (issue 23): the committed tiny Qwen3-MoE GGUF (4 experts) under mpirun -np 2 and
# 3 gives the one-process tokens and log-probs bit for bit; --ep-stats has a line per MoE layer and
# rank whose rows add up to every routed row once; a slow rank changes the timing, not the bits.
MOE_GGUF="$(cd "$(dirname "$0")/../golden/moe" && pwd)/tiny_qwen3moe.gguf"
"$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 --json \
  >"$WORK/ep1.json" 2>/dev/null
if command -v mpirun >/dev/null 2>&1 && ldd "$CONCORD" 2>/dev/null | grep -q libmpi; then
  for np in 2 3; do
    SLOW=()
    [[ $np == 3 ]] && SLOW=(--slow-rank 1:3)
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 \
      mpirun -np $np --oversubscribe --mca btl self,vader \
      "$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
      --json --expert-parallel --ep-stats "$WORK/ep$np.jsonl" --routing-trace "$WORK/ep$np.trace" "${SLOW[@]}" \
      >"$WORK/ep$np.json" 2>"$WORK/ep$np.err" </dev/null
    rows_ok=$(python3 -c "
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
apps = {l['application'] for l in lines}
ok = len(lines) == len(apps) * $np and all(sum(l['rows'] for l in lines if l['application'] == a) == lines[0]['layer_rows'] for a in apps)
print('yes' if ok and len(apps) == 2 else 'no')" "$WORK/ep$np.jsonl" 2>/dev/null)
    if [[ -s "$WORK/ep1.json" ]] && cmp -s "$WORK/ep1.json" "$WORK/ep$np.json" && [[ $rows_ok == yes ]] \
        && grep -q "expert parallel: $np ranks, 2 MoE layers" "$WORK/ep$np.err"; then
      pass "generate --expert-parallel at $np ranks: the one-process bits; every routed row computed once"
    else
      fail "generate --expert-parallel at $np ranks: rows_ok=$rows_ok $(cat "$WORK/ep$np.err")"
    fi
  done
  # The simulator's cost model fitted to the 2-rank run, the 3-rank run (a rank 3x slower) predicted
  # from it; the ep-stats of one run with the trace of another prompt is refused.
  if "$CONCORD" ep-sim --calibrate --run "$WORK/ep2.jsonl" "$WORK/ep2.trace" --run "$WORK/ep3.jsonl" "$WORK/ep3.trace" \
      --cost-out "$WORK/cost.json" --html "$WORK/cal.html" >"$WORK/cal.out" 2>"$WORK/err" \
      && grep -q "cost model fitted on 1 run" "$WORK/cal.out" && grep -q "<svg" "$WORK/cal.html" \
      && grep -q "ep3.jsonl | no | p50 / p99 of a layer" "$WORK/cal.out" && grep -q '"row_s"' "$WORK/cost.json"; then
    pass "ep-sim --calibrate fits the cost model to one real run and predicts another"
  else
    fail "ep-sim --calibrate: $(cat "$WORK/err" "$WORK/cal.out")"
  fi
  "$CONCORD" generate --model "$MOE_GGUF" --prompt "In the beginning God created the heaven" --max-tokens 16 \
    --routing-trace "$WORK/other.trace" >/dev/null 2>&1
  expect_error "ep-sim --calibrate: a trace of another run" "are not of the same run" \
    "$CONCORD" ep-sim --calibrate --run "$WORK/ep2.jsonl" "$WORK/other.trace"
  # EPLB's placement from the router statistics of another prompt: replicated experts' rows are
  # split among their holders, and the bits stay the one-process ones.
  "$CONCORD" generate --model "$MOE_GGUF" --prompt "In the beginning God created the heaven" --max-tokens 16 \
    --router-stats "$WORK/loads.json" >/dev/null 2>&1
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 \
    mpirun -np 2 --oversubscribe --mca btl self,vader \
    "$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
    --json --expert-parallel --placement eplb --placement-loads "$WORK/loads.json" --slots-per-rank 3 \
    >"$WORK/ep_eplb.json" 2>"$WORK/ep_eplb.err" </dev/null
  cmp -s "$WORK/ep1.json" "$WORK/ep_eplb.json" && grep -q "expert parallel: 2 ranks" "$WORK/ep_eplb.err" \
    && pass "generate --expert-parallel --placement eplb: replicas split the rows, the one-process bits" \
    || fail "--placement eplb: $(cat "$WORK/ep_eplb.err")"
  # Experts placed again every 4 passes from the tokens routed since, the newly held ones moved
  # between the ranks over MPI and content-checked; each rank holds only its experts' weights.
  "$CONCORD" generate --model "$MOE_GGUF" --policy fp32 --prompt "And God said, let there be light" --max-tokens 16 \
    --seed 5 --json >"$WORK/ep1_fp32.json" 2>/dev/null
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 \
    mpirun -np 2 --oversubscribe --mca btl self,vader \
    "$CONCORD" generate --model "$MOE_GGUF" --policy fp32 --prompt "And God said, let there be light" --max-tokens 16 \
    --seed 5 --json --expert-parallel --placement eplb --placement-loads "$WORK/loads.json" --slots-per-rank 3 \
    --replan-every 4 >"$WORK/ep_moved.json" 2>"$WORK/ep_moved.err" </dev/null
  if [[ -s "$WORK/ep1_fp32.json" ]] && cmp -s "$WORK/ep1_fp32.json" "$WORK/ep_moved.json" \
      && grep -q "placed again 3 times" "$WORK/ep_moved.err" && grep -q "expert weights held per rank" "$WORK/ep_moved.err"; then
    pass "generate --expert-parallel --replan-every: experts moved between passes, content-checked, the one-process bits"
  else
    fail "--replan-every: $(cat "$WORK/ep_moved.err")"
  fi
  # --move-aware: with moves that cost more than any layer can save, every new placement is declined
  # (nothing moves, the bits stay); with free moves only the placements that are faster move.
  printf '{"pass_s": 0, "piece_s": 1e-6, "row_s": 1e-6, "exchange_pass_s": 10, "exchange_row_s": 0}' >"$WORK/dear.json"
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 \
    mpirun -np 2 --oversubscribe --mca btl self,vader \
    "$CONCORD" generate --model "$MOE_GGUF" --policy fp32 --prompt "And God said, let there be light" --max-tokens 16 \
    --seed 5 --json --expert-parallel --placement eplb --placement-loads "$WORK/loads.json" --slots-per-rank 3 \
    --replan-every 4 --move-aware --ep-cost "$WORK/dear.json" >"$WORK/ep_kept.json" 2>"$WORK/ep_kept.err" </dev/null
  if cmp -s "$WORK/ep1_fp32.json" "$WORK/ep_kept.json" && grep -q "placed again 3 times, 0 experts moved" "$WORK/ep_kept.err" \
      && grep -q "layer placements kept (the move would not pay)" "$WORK/ep_kept.err"; then
    pass "generate --replan-every --move-aware: moves dearer than their saving are declined, the one-process bits"
  else
    fail "--move-aware: $(cat "$WORK/ep_kept.err")"
  fi
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 \
    mpirun -np 2 --oversubscribe --mca btl self,vader \
    "$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
    --json --expert-parallel --placement speed --placement-loads "$WORK/loads.json" --slow-rank 1:3 \
    >"$WORK/ep_speed.json" 2>"$WORK/ep_speed.err" </dev/null
  cmp -s "$WORK/ep1.json" "$WORK/ep_speed.json" && grep -q "expert parallel: 2 ranks" "$WORK/ep_speed.err" \
    && pass "generate --expert-parallel --placement speed (a rank 3x slower): the one-process bits" \
    || fail "--placement speed: $(cat "$WORK/ep_speed.err")"
  # The balanced router (ep-sim's per-batch re-routing) in real ranks: a replicated expert's rows
  # split to level the ranks' predicted finishing times — the slow rank's share shrinks, the bits
  # stay the one-process ones.
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 \
    mpirun -np 2 --oversubscribe --mca btl self,vader \
    "$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
    --json --expert-parallel --placement speed --placement-loads "$WORK/loads.json" --slow-rank 1:3 --slots-per-rank 3 \
    --router balanced --ep-stats "$WORK/ep_bal.jsonl" >"$WORK/ep_bal.json" 2>"$WORK/ep_bal.err" </dev/null
  bal_rows=$(python3 -c "
import json, sys
rows = [0, 0]
for l in open(sys.argv[1]):
    d = json.loads(l)
    rows[d['rank']] += d['rows']
print('yes' if rows[1] < rows[0] else 'no')" "$WORK/ep_bal.jsonl" 2>/dev/null)
  if cmp -s "$WORK/ep1.json" "$WORK/ep_bal.json" && [[ $bal_rows == yes ]]; then
    pass "generate --expert-parallel --router balanced (a rank 3x slower): fewer rows on the slow rank, the one-process bits"
  else
    fail "--router balanced: bal_rows=$bal_rows $(cat "$WORK/ep_bal.err")"
  fi
  # ep-sim's tail search as a real placement, planned on another prompt's routing trace.
  "$CONCORD" generate --model "$MOE_GGUF" --prompt "In the beginning God created the heaven" --max-tokens 16 \
    --routing-trace "$WORK/plan.trace" >/dev/null 2>&1
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 \
    mpirun -np 2 --oversubscribe --mca btl self,vader \
    "$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
    --json --expert-parallel --placement search --placement-trace "$WORK/plan.trace" --slots-per-rank 3 \
    --slow-rank 1:3 --router balanced >"$WORK/ep_search.json" 2>"$WORK/ep_search.err" </dev/null
  cmp -s "$WORK/ep1.json" "$WORK/ep_search.json" && grep -q "expert parallel: 2 ranks" "$WORK/ep_search.err" \
    && pass "generate --expert-parallel --placement search --router balanced: the one-process bits" \
    || fail "--placement search: $(cat "$WORK/ep_search.err")"
  # Data-parallel attention: each rank its own sample (seed + rank; a stop string ends them at
  # different lengths, so ranks idle while others finish), the MoE layers' rows traded with
  # MPI_Alltoallv; rank 0's output is the one-process outputs of seeds 5, 6 (, 7) in rank order.
  for s in 5 6 7; do
    "$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 16 --seed $s \
      --stop c --json 2>/dev/null
  done >"$WORK/dp_single.json"
  for np in 2 3; do
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 \
      mpirun -np $np --oversubscribe --mca btl self,vader \
      "$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
      --stop c --json --expert-parallel --data-parallel >"$WORK/dp$np.json" 2>"$WORK/dp$np.err" </dev/null
    lengths=$(python3 -c "
import json, sys
print(sorted({len(json.loads(l)['tokens']) for l in open(sys.argv[1])}))" "$WORK/dp_single.json" 2>/dev/null)
    if [[ $lengths == "[11, 15, 16]" ]] && head -n $np "$WORK/dp_single.json" | cmp -s - "$WORK/dp$np.json" \
        && grep -q "data-parallel attention, rows sent to / received from other ranks" "$WORK/dp$np.err"; then
      pass "generate --expert-parallel --data-parallel at $np ranks: each rank's sample is the one-process one of its seed"
    else
      fail "--data-parallel at $np ranks (sample lengths $lengths): $(cat "$WORK/dp$np.err")"
    fi
  done
else
  echo "skip: --expert-parallel (no mpirun)"
fi
expect_error "serve --expert-parallel needs experts" "--expert-parallel: $WORK/run is a" \
  "$CONCORD" serve --model "$WORK/run" --expert-parallel
expect_error "serve --expert-parallel mirrors plain steps" "not with the prefix cache, --disaggregate or a draft model" \
  "$CONCORD" serve --model "$MOE_GGUF" --expert-parallel --prefix-cache-bytes 1000000
expect_error "--move-aware needs --replan-every" "--move-aware weighs --replan-every's moves" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --move-aware
expect_error "--placement search needs a trace" "--placement search plans on --placement-trace" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --placement search
expect_error "--placement-trace is for search" "--placement search plans on --placement-trace" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --placement-trace t.trace
expect_error "--router names its kinds" "unknown --router 'fair' (even, balanced)" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --router fair
expect_error "--router balanced needs replicas" "--router balanced splits replicated experts' rows" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --router balanced
expect_error "--ep-cost is for the balanced router" "--ep-cost is for --router balanced, --placement search and --move-aware" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --ep-cost c.json
expect_error "--data-parallel needs --expert-parallel" "--data-parallel is the attention of --expert-parallel" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --data-parallel
expect_error "--data-parallel runs plain samples" "--data-parallel runs one plain sample per rank" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --json --echo --expert-parallel --data-parallel
expect_error "--data-parallel under NVFP4" "the nvfp4 policy quantizes rows with a shared scale" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --policy nvfp4 --expert-parallel --data-parallel
# The simulator (issue 23): a routing trace of the tiny MoE replayed at 2 and 4 ranks under every
# placement; a Zipf router at 8 and 16 ranks; the lower bound printed under them.
if "$CONCORD" generate --model "$MOE_GGUF" --prompt "And God said, let there be light" --max-tokens 24 \
     --routing-trace "$WORK/t.trace" >/dev/null 2>"$WORK/err" \
   && "$CONCORD" ep-sim --trace "$WORK/t.trace" --ranks 2,4 --tokens 16 --batches 30 --plan-batches 10 \
     --json "$WORK/sim.jsonl" --html "$WORK/sim.html" >"$WORK/sim.out" 2>>"$WORK/err" \
   && grep -q "| 4 | 2 | eplb+balanced |" "$WORK/sim.out" && grep -q "(lower bound)" "$WORK/sim.out" \
   && grep -q "<svg" "$WORK/sim.html" && grep -q "<td>search+balanced</td>" "$WORK/sim.html" \
   && grep -q "| 2 | 3 | optimal |" "$WORK/sim.out" && [[ $(wc -l <"$WORK/sim.jsonl") -ge 10 ]] \
   && "$CONCORD" ep-sim --trace "$WORK/t.trace" --trace "$WORK/t.trace" --batching passes --ranks 2 \
     --policies eplb,speed+balanced --slow-rank 1:2 >"$WORK/sim2.out" 2>>"$WORK/err" \
   && grep -q "| 2 | 3 | speed+balanced |" "$WORK/sim2.out" \
   && "$CONCORD" ep-sim --zipf 1.2 --experts 32 --top-k 4 --layers 2 --tokens 256 --batches 20 --ranks 8,16 \
     --policies contiguous,eplb,eplb+balanced >"$WORK/sim3.out" 2>>"$WORK/err" \
   && grep -q "| 16 | 3 | eplb+balanced |" "$WORK/sim3.out"; then
  pass "generate --routing-trace; ep-sim replays it and a Zipf router at several rank counts"
else
  fail "ep-sim: $(cat "$WORK/err" "$WORK/sim.out" "$WORK/sim3.out" 2>/dev/null)"
fi
expect_error "ep-sim needs a router" "give --trace FILE (concord generate --routing-trace) or --zipf SKEW" \
  "$CONCORD" ep-sim
printf '{"routing_trace": 1, "num_experts": 4, "num_experts_per_tok": 2}\n{"application": 0, "pass_rows": [2], "selected": [0, 1, 2]}\n' \
  >"$WORK/bad.trace"
expect_error "ep-sim: a corrupt trace names its file and line" "$WORK/bad.trace: line 2: application 0: 1 passes' 2 tokens but 3 picks" \
  "$CONCORD" ep-sim --trace "$WORK/bad.trace"
expect_error "ep-sim: a --slow-rank outside the ranks" "[ep-sim] --slow-rank 9:2: the rank must lie in [0, 8)" \
  "$CONCORD" ep-sim --zipf 1 --ranks 16,8 --slow-rank 9:2
expect_error "ep-sim: unknown policy" "unknown policy 'fastest' in --policies" \
  "$CONCORD" ep-sim --zipf 1 --policies eplb,fastest
expect_error "ep-sim --calibrate needs runs" "--calibrate needs --run EP_STATS TRACE" \
  "$CONCORD" ep-sim --calibrate
expect_error "--routing-trace needs a router" "--routing-trace: $WORK/run is a" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --max-tokens 1 --routing-trace "$WORK/none.trace"
expect_error "--placement names its kinds" "unknown --placement 'random' (contiguous, eplb, speed, search)" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --placement random
expect_error "--replan-every needs a placement policy" "--replan-every places the experts again with --placement eplb or speed" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --replan-every 4
expect_error "--placement eplb needs loads" "--placement eplb and speed take their loads from --placement-loads" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --expert-parallel --placement eplb
expect_error "--expert-parallel needs experts" "--expert-parallel: $WORK/run is a" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --expert-parallel
expect_error "--slow-rank needs --expert-parallel" "--slow-rank, --ep-stats and --placement need --expert-parallel" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --slow-rank 1:2
# Experts under a memory cap (issue 25): the tiny MoE as Q4_0 blocks gives the uncapped tokens and
# log-probs bit for bit at caps of 30% and 60% of its 8 experts' bytes (with and without prefetch,
# with a pinned hot set from its router statistics), and says what it held.
"$CONCORD" export --model "$MOE_GGUF" --to gguf --dtype q4_0 --out "$WORK/moe_q4.gguf" >/dev/null 2>&1
"$CONCORD" generate --model "$WORK/moe_q4.gguf" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
  --json --router-stats "$WORK/moe_q4_stats.json" >"$WORK/cap0.json" 2>/dev/null
for extra in "30%" "30% --no-prefetch" "60% --pin-loads $WORK/moe_q4_stats.json --pin-share 0.4" \
             "30% --prefix-cache-dir $WORK/cap_prefix"; do
  # shellcheck disable=SC2086
  if "$CONCORD" generate --model "$WORK/moe_q4.gguf" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
       --json --memory-cap $extra >"$WORK/cap.json" 2>"$WORK/cap.err" \
     && python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
m = b["memory_cap"]
ok = a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"] and m["high_water_bytes"] <= m["cap_bytes"]
ok = ok and m["decode"]["uses"] > 0 and m["decode"]["loads"] > 0 and (m["pinned"] > 0) == ("pin" in sys.argv[3])
sys.exit(0 if ok else 1)' "$WORK/cap0.json" "$WORK/cap.json" "$extra" && grep -q "^memory cap: " "$WORK/cap.err"; then
    pass "generate --memory-cap $extra: the uncapped bits, the cap never exceeded"
  else
    fail "generate --memory-cap $extra: $(cat "$WORK/cap.err")"
  fi
done
# The cap planner replays a routing trace by the pager's rules: its reads are a --no-prefetch run's.
"$CONCORD" generate --model "$WORK/moe_q4.gguf" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
  --json --routing-trace "$WORK/moe_q4.trace" >/dev/null 2>&1
"$CONCORD" generate --model "$WORK/moe_q4.gguf" --prompt "And God said, let there be light" --max-tokens 16 --seed 5 \
  --json --memory-cap 30% --no-prefetch >"$WORK/cap_lru.json" 2>/dev/null
if "$CONCORD" cap-plan --model "$WORK/moe_q4.gguf" --trace "$WORK/moe_q4.trace" --caps 30%,100% --calibrate "$WORK/cap_lru.json" \
     --json >"$WORK/plan.jsonl" 2>"$WORK/plan.err" \
   && python3 -c '
import json, sys
run = json.load(open(sys.argv[1]))["memory_cap"]
plan = [json.loads(l) for l in open(sys.argv[2])]
ok = plan[0]["prefill_reads"] == run["prefill"]["loads"] and plan[0]["decode_reads"] == run["decode"]["loads"]
ok = ok and plan[0]["decode_reads"] > 0 and plan[1]["decode_reads"] == 0 and plan[0]["predicted_decode_tokens_per_s"] > 0
sys.exit(0 if ok else 1)' "$WORK/cap_lru.json" "$WORK/plan.jsonl"; then
  pass "cap-plan: the replayed reads are the --no-prefetch run's; a prediction per cap"
else
  fail "cap-plan: $(cat "$WORK/plan.err" "$WORK/plan.jsonl")"
fi
# The split planner measures the engine here; its saved rates predict what the measurement did.
if "$CONCORD" disagg-plan --model "$WORK/run_q4_0.gguf" --calibrate-tokens 48 --prefill-chunk 16 --prompt-tokens 20,48 \
     --streams 0,2 --json --save-rates "$WORK/rates.json" >"$WORK/split.jsonl" 2>"$WORK/split.err" \
   && "$CONCORD" disagg-plan --rates "$WORK/rates.json" --prefill-chunk 16 --prompt-tokens 20,48 --streams 0,2 --json \
     >"$WORK/split_again.jsonl" 2>>"$WORK/split.err" \
   && python3 -c '
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
rates = json.load(open(sys.argv[3]))
ok = len(a) == 5 and a[1:] == b[1:] and a[0]["rates"] == b[0]["rates"] == rates["rates"]
ok = ok and len(rates["measured"]["prefill_steps"]) == 3 and a[2]["engine"]["max_gap_s"] == 0 and a[4]["engine"]["max_gap_s"] > 0
sys.exit(0 if ok else 1)' "$WORK/split.jsonl" "$WORK/split_again.jsonl" "$WORK/rates.json" \
   && grep -q "prefill alone: 48 tokens in 3 chunks" "$WORK/split.err"; then
  pass "disagg-plan: measured, saved, and the saved rates predict the same"
else
  fail "disagg-plan: $(cat "$WORK/split.err" "$WORK/split.jsonl")"
fi
expect_error "disagg-plan without a model or rates" "give --model (to measure) or --rates" "$CONCORD" disagg-plan
expect_error "disagg-plan with both" "give --model (to measure) or --rates" \
  "$CONCORD" disagg-plan --model "$WORK/run_q4_0.gguf" --rates "$WORK/rates.json"
expect_error "disagg-plan --rates of another file" "not a rates file of \`concord disagg-plan --save-rates\`" \
  "$CONCORD" disagg-plan --rates "$WORK/cap_lru.json"
expect_error "disagg-plan --save-rates with --rates" "with --rates nothing is measured" \
  "$CONCORD" disagg-plan --rates "$WORK/rates.json" --save-rates "$WORK/x.json"
expect_error "disagg-plan past the context" "a calibration prompt of 100 tokens: 2 to 63" \
  "$CONCORD" disagg-plan --model "$WORK/run_q4_0.gguf" --calibrate-tokens 100
expect_error "cap-plan calibrated from a run with prefetch" "a run with prefetch" \
  "$CONCORD" cap-plan --model "$WORK/moe_q4.gguf" --trace "$WORK/moe_q4.trace" --calibrate "$WORK/cap.json"
expect_error "cap-plan below one expert" "cannot hold one expert" \
  "$CONCORD" cap-plan --model "$WORK/moe_q4.gguf" --trace "$WORK/moe_q4.trace" --caps 64
expect_error "--memory-cap below one expert" "cannot hold one expert" \
  "$CONCORD" generate --model "$WORK/moe_q4.gguf" --prompt hi --memory-cap 64
expect_error "--memory-cap on f32 experts" "a memory cap pages experts stored as Q4_0, Q4_1 or Q8_0 blocks" \
  "$CONCORD" generate --model "$MOE_GGUF" --prompt hi --memory-cap 50%
expect_error "--memory-cap on a dense model" "has none" \
  "$CONCORD" generate --model "$WORK/run_q4_0.gguf" --prompt hi --memory-cap 50%
expect_error "--memory-cap under another policy" "--memory-cap pages a GGUF's quantized experts as stored" \
  "$CONCORD" generate --model "$WORK/moe_q4.gguf" --prompt hi --memory-cap 50% --policy fp32
expect_error "--no-prefetch needs --memory-cap" "--pin-loads, --pin-share and --no-prefetch are for --memory-cap" \
  "$CONCORD" generate --model "$WORK/moe_q4.gguf" --prompt hi --no-prefetch
expect_error "serve --memory-cap with --disaggregate" "--memory-cap with --disaggregate" \
  "$CONCORD" serve --model "$WORK/moe_q4.gguf" --memory-cap 50% --disaggregate
expect_error "serve --no-prefetch needs --memory-cap" "--pin-loads, --pin-share and --no-prefetch are for --memory-cap" \
  "$CONCORD" serve --model "$WORK/moe_q4.gguf" --no-prefetch
expect_error "--pin-share needs --pin-loads" "--pin-share needs --pin-loads" \
  "$CONCORD" generate --model "$WORK/moe_q4.gguf" --prompt hi --memory-cap 50% --pin-share 0.2
a="$("$CONCORD" generate --model "$WORK/run" --prompt "The" --max-tokens 16 --seed 7 --top-k 20 2>/dev/null)"
b="$("$CONCORD" generate --model "$WORK/run" --prompt "The" --max-tokens 16 --seed 7 --top-k 20 --policy mxfp8 2>/dev/null)"
c="$("$CONCORD" generate --model "$WORK/run" --prompt "The" --max-tokens 16 --seed 7 --top-k 20 2>/dev/null)"
[[ -n "$a" && "$a" == "$c" && -n "$b" ]] && pass "generate is reproducible by seed; runs at mxfp8" \
  || fail "generate seeds: '$a' vs '$c' (mxfp8: '$b')"
# Speculative decoding (issue 16): greedy output with any drafter is the plain greedy output; a
# GGUF-served target has no fp32 weights for a self drafter; a drafter of another vocabulary is
# refused naming both.
"$CONCORD" generate --model "$WORK/run" --prompt "And God said" --max-tokens 24 --temp 0 --json >"$WORK/plain.json" 2>/dev/null
for d in ngram self:bf16 self:layers=1 "$WORK/run.gguf"; do
  if "$CONCORD" generate --model "$WORK/run" --prompt "And God said" --max-tokens 24 --temp 0 --json --draft "$d" \
       --draft-tokens 3 --stats >"$WORK/spec.json" 2>"$WORK/spec.err" \
     && python3 -c 'import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); sys.exit(0 if a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"] else 1)' \
       "$WORK/plain.json" "$WORK/spec.json" \
     && grep -q "^speculation: drafter" "$WORK/spec.err" && grep -q "^acceptance by draft position:" "$WORK/spec.err"; then
    pass "generate --draft $(basename "$d"): the greedy tokens and log-probs of plain decoding, with --stats"
  else
    fail "generate --draft $d: $(cat "$WORK/spec.err")"
  fi
done
expect_error "a self drafter of a GGUF-served target" "needs the target's fp32 weights" \
  "$CONCORD" generate --model "$WORK/run_q4_0.gguf" --prompt hi --max-tokens 2 --draft self:bf16
expect_error "--stats without --draft" "need --draft" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --max-tokens 2 --stats
expect_error "self:layers beyond the model" "must lie in 1.." \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --max-tokens 2 --draft self:layers=99
expect_error "an unknown drafter" "--draft" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --max-tokens 2 --draft "$WORK/no-such-model"
# At a huge temperature the byte-level model samples arbitrary bytes; stdout stays valid UTF-8
# (invalid bytes become U+FFFD) (issue 26 item 10).
if "$CONCORD" generate --model "$WORK/run" --prompt "The" --max-tokens 48 --temp 1e30 --seed 3 \
    >"$WORK/hot.out" 2>"$WORK/hot.err" \
    && python3 -c 'import sys; t = sys.stdin.buffer.read().decode("utf-8"); sys.exit(0 if len(t) > 10 else 1)' <"$WORK/hot.out"; then
  pass "generate --temp 1e30 writes valid UTF-8"
else
  fail "generate --temp 1e30: not valid UTF-8 (or nothing): $(head -c 200 "$WORK/hot.out" | od -c | head -3) $(cat "$WORK/hot.err")"
fi
# generate --json (one object: prompt_tokens, tokens, text, logprobs, finish_reason, and
# top_logprobs / prompt_logprobs on request), --stop (text ends before the stop string, tokens run
# through the token that completed it), --top-logprobs, --echo; text mode prints the JSON text.
if python3 - "$CONCORD" "$WORK/run" <<'PY'
import json, math, subprocess, sys
concord, model = sys.argv[1], sys.argv[2]
failures = []
def check(name, ok):
    print(("ok: " if ok else "FAIL: ") + name)
    if not ok: failures.append(name)
def gen(*extra, as_json=True):
    args = [concord, "generate", "--model", model, "--prompt", "And God", "--max-tokens", "24",
            "--seed", "7", "--top-k", "20", *extra] + (["--json"] if as_json else [])
    r = subprocess.run(args, capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
    if r.returncode != 0 or b"decode:" not in r.stderr:
        sys.exit(f"{args}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    return json.loads(r.stdout) if as_json else r.stdout
def text_of(tokens):  # the byte tokenizer: ids < 256 are bytes, the rest special
    return bytes(t for t in tokens if t < 256).decode("utf-8", "replace")
full = gen()
check("--json fields", list(full) == ["prompt_tokens", "tokens", "text", "logprobs", "finish_reason"])
check("--json prompt tokens", full["prompt_tokens"][-7:] == list(b"And God"))
check("--json tokens and logprobs", len(full["tokens"]) == len(full["logprobs"]) > 0
      and all(lp <= 0 for lp in full["logprobs"]) and full["finish_reason"] in ("stop", "length"))
check("--json text is the tokens' text", full["text"] == text_of(full["tokens"]))
check("text mode prints the --json text", gen(as_json=False) == (full["text"] + "\n").encode())
# A stop string that first occurs at character 3 or later.
text = full["text"]
stop = next((text[i:i + 2] for i in range(3, len(text) - 1)
             if text[i:i + 2].isascii() and text[i:i + 2].isprintable() and text.find(text[i:i + 2]) == i), None)
check(f"a stop string in {text!r}", stop is not None)
if stop:
    cut = gen("--stop", "zzzq", "--stop", stop)
    n = len(cut["tokens"])
    check("--stop: finish_reason stop", cut["finish_reason"] == "stop")
    check("--stop: the text ends before the stop string", cut["text"] == text[:text.find(stop)])
    check("--stop: tokens and logprobs are the run's, through the stop string",
          cut["tokens"] == full["tokens"][:n] and cut["logprobs"] == full["logprobs"][:n]
          and stop in text_of(cut["tokens"]) and stop not in text_of(cut["tokens"][:-1]))
    check("--stop in text mode", gen("--stop", stop, as_json=False) == (cut["text"] + "\n").encode())
top = gen("--top-logprobs", "3")
check("--top-logprobs changes no token", top["tokens"] == full["tokens"] and top["logprobs"] == full["logprobs"])
lists = top.get("top_logprobs", [])
check("--top-logprobs: 3 entries per token, logprob descending, ids ascending on ties",
      len(lists) == len(top["tokens"]) and all(len(l) == 3 and all(len(e) == 2 for e in l) for l in lists)
      and all((a[1], -a[0]) > (b[1], -b[0]) for l in lists for a, b in zip(l, l[1:])))
check("--top-logprobs: the sampled token's entry is its logprob",
      all(e[1] == lp for l, t, lp in zip(lists, top["tokens"], top["logprobs"]) for e in l if e[0] == t))
greedy = gen("--temp", "0", "--top-logprobs", "1")
check("greedy: the top entry is the token",
      [l[0][0] for l in greedy["top_logprobs"]] == greedy["tokens"]
      and [l[0][1] for l in greedy["top_logprobs"]] == greedy["logprobs"])
echo = gen("--echo", "--top-logprobs", "2")
p = echo.get("prompt_logprobs", [])
check("--echo: a log-prob per prompt token after the first", len(p) == len(echo["prompt_tokens"]) - 1
      and all(math.isfinite(x) and x <= 0 for x in p) and echo["tokens"] == full["tokens"])
check("--echo --top-logprobs: prompt top entries",
      len(echo.get("prompt_top_logprobs", [])) == len(p)
      and all(l[0][1] >= x for l, x in zip(echo["prompt_top_logprobs"], p)))
check("--echo: prompt log-probs do not depend on --prefill-chunk",
      gen("--echo", "--prefill-chunk", "1")["prompt_logprobs"] == p)
sys.exit(1 if failures else 0)
PY
then pass "generate --json, --stop, --top-logprobs, --echo"; else fail "generate --json, --stop, --top-logprobs, --echo"; fi
expect_error "generate --top-logprobs needs --json" "[generate] --top-logprobs needs --json" \
  "$CONCORD" generate --model "$WORK/run" --prompt "The" --top-logprobs 2
expect_error "generate --echo needs --json" "[generate] --echo needs --json" \
  "$CONCORD" generate --model "$WORK/run" --prompt "The" --echo
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

# ---- issue 37: a Qwen3-MoE trained, its routing in the metrics, generated with --router-stats ----
cat >"$WORK/moe.json" <<JSON
{"name": "cli-moe", "model": {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 259, "hidden_size": 32,
 "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
 "head_dim": 16, "max_position_embeddings": 64, "num_experts": 4, "num_experts_per_tok": 2,
 "moe_intermediate_size": 16, "norm_topk_prob": true, "mlp_only_layers": [0], "output_router_logits": true},
 "data": {"corpus": "$WORK/corpus.txt", "chunk": 256, "validation_fraction": 0.1},
 "train": {"batch_size": 2, "seq_len": 32, "steps": 4, "warmup_steps": 1},
 "eval": {"every": 2, "batches": 1}, "checkpoint": {"every": 2, "keep": 1}, "out": "$WORK/moe"}
JSON
if "$CONCORD" train --config "$WORK/moe.json" --quiet >"$WORK/train.out" 2>"$WORK/train.err" \
   && python3 - "$WORK/moe/metrics.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(steps) == 4, steps
for s in steps:
    assert [sum(c) for c in s["tokens_per_expert"]] == [2 * 32 * 2], s  # layer 1 only: B*T*k picks
    assert s["moe_aux_loss"] >= 1.0, s
PY
then
  pass "train runs a Qwen3-MoE and writes its tokens per expert and aux loss per step"
else
  fail "moe train: $(cat "$WORK/train.out" "$WORK/train.err")"
fi
if "$CONCORD" generate --model "$WORK/moe/final" --prompt "And it came" --max-tokens 5 --temp 0 \
     --router-stats "$WORK/routed.json" >/dev/null 2>"$WORK/err" \
   && python3 - "$WORK/routed.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["num_experts"] == 4 and d["num_experts_per_tok"] == 2, d
assert [l["block"] for l in d["layers"]] == [1], d  # layer 0 is dense (mlp_only_layers)
assert sum(d["layers"][0]["tokens_per_expert"]) == 2 * d["tokens"] and d["tokens"] > 5, d
PY
then
  pass "generate --router-stats writes the tokens routed to each expert"
else
  fail "generate --router-stats: $(cat "$WORK/err")"
fi
expect_error "router stats of a dense model" "has no router" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --max-tokens 1 --router-stats "$WORK/none.json"
expect_error "GGUF export of a Qwen3-MoE with a dense layer (llama.cpp's qwen3moe has none)" "layer 0 is dense" \
  "$CONCORD" export --model "$WORK/moe/final" --to gguf --out "$WORK/moe.gguf"

# ---- issue 20: the least-squares gradient-flow study ----
if "$CONCORD" flow lsq --d 6 --n 64 --sgd-runs 8 --json "$WORK/flow.json" --report "$WORK/flow.html" \
     >"$WORK/flow.out" 2>"$WORK/err" \
   && grep -q "order of the gap in η" "$WORK/flow.out" && grep -q "<svg" "$WORK/flow.html" \
   && python3 - "$WORK/flow.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert abs(d["gd"]["slope"] - 1) < 0.05, d["gd"]["slope"]
assert d["flow_check"]["closed_vs_integrated"] < 1e-8, d["flow_check"]
assert [r["rule"] for r in d["precision"]["rows"]] == ["fp32", "bf16-rne", "bf16-sr", "bf16-ef"]
assert 0.8 < d["precision"]["rows"][1]["stalls"]["ratio_median"] < 1.2, d["precision"]["rows"][1]
PY
then
  pass "flow lsq: GD's gap is O(η), the flow checks, the rne stalls match ulp/|ηg|; JSON and HTML written"
else
  fail "flow lsq: $(cat "$WORK/flow.out" "$WORK/err")"
fi
expect_error "flow lsq refuses fewer rows than dimensions" "at least as many rows as dimensions" \
  "$CONCORD" flow lsq --n 4 --d 8
if "$CONCORD" flow model --model "$WORK/run/final" --corpus "$WORK/corpus.txt" --population 2 --seq-len 16 --probe 2 \
     --points 4 --sgd-runs 1 --batches 1,2 --adam-lrs 0.001 --gd-steps 0.5,0.25 --json "$WORK/flowm.json" \
     --report "$WORK/flowm.html" >"$WORK/flow.out" 2>"$WORK/err" \
   && grep -q "<svg" "$WORK/flowm.html" && python3 - "$WORK/flowm.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"]["lambda_max"] > 0 and d["model"]["loss_flow"] < d["model"]["loss_start"], d["model"]
assert 0.8 < d["gd"]["slope"] < 1.2, d["gd"]
assert [r["batch"] for r in d["sgd"]["rows"]] == [1, 2]
assert [r["rule"] for r in d["precision"]["rows"]] == ["fp32", "bf16-rne", "bf16-sr", "bf16-ef"]
assert "predicted_held_fraction" in d["precision"]["rows"][1]
assert 0 <= d["linearized"]["param_gap"] and d["linearized"]["flow_displacement"] > 0, d["linearized"]
assert set(d["gd"]["rows"][0]["groups"]) == {"attention", "embedding", "mlp", "norm"}
PY
then
  pass "flow model: GD converges to the integrated flow at O(η); SGD, AdamW, bf16 rules and groups reported"
else
  fail "flow model: $(cat "$WORK/flow.out" "$WORK/err")"
fi
expect_error "flow model names a missing model" "no-such-model: no such file or folder" "$CONCORD" flow model --model "$WORK/no-such-model"

# ---- issue 18: a depth-recurrent model trained with randomized depth, generated, evaluated ----
cat >"$WORK/rec.json" <<JSON
{"name": "cli-rec", "model": {"architectures": ["ConcordRecurrentForCausalLM"], "vocab_size": 259, "hidden_size": 32,
 "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,
 "head_dim": 16, "max_position_embeddings": 64, "n_layers_in_prelude": 1, "n_layers_in_recurrent_block": 1,
 "n_layers_in_coda": 1, "mean_recurrence": 3},
 "depth": {"sigma": 0.5, "backprop": 2},
 "data": {"corpus": "$WORK/corpus.txt", "chunk": 256, "validation_fraction": 0.1},
 "train": {"batch_size": 2, "seq_len": 32, "steps": 4, "warmup_steps": 1},
 "eval": {"every": 2, "batches": 1}, "checkpoint": {"every": 2, "keep": 1}, "out": "$WORK/rec"}
JSON
if "$CONCORD" train --config "$WORK/rec.json" --quiet >"$WORK/train.out" 2>"$WORK/train.err" \
   && python3 - "$WORK/rec/metrics.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(steps) == 4 and all(s["depth"] >= 1 for s in steps), steps
PY
then
  pass "train runs a depth-recurrent model and writes each step's depth"
else
  fail "recurrent train: $(cat "$WORK/train.out" "$WORK/train.err")"
fi
if "$CONCORD" generate --model "$WORK/rec/final" --prompt "And it came" --max-tokens 5 --temp 0 --exit-kl 1e-3 \
     --max-depth 6 >/dev/null 2>"$WORK/err" && grep -q "depth: at most 6 core iterations per token, adaptive exit" "$WORK/err" \
   && "$CONCORD" generate --model "$WORK/rec/final" --prompt "And it came" --max-tokens 5 --temp 0 --depth 5 \
     --kv-core-slots 2 >/dev/null 2>"$WORK/err2" && grep -q "depth: 5 core iterations per token" "$WORK/err2"; then
  pass "generate --depth, --kv-core-slots and --exit-kl report the core iterations per token"
else
  fail "recurrent generate: $(cat "$WORK/err" "$WORK/err2")"
fi
if "$CONCORD" eval --run "$WORK/rec" --depths 1,3 --exit-kl 0.01 --max-depth 4 --decode-rows 1 --json "$WORK/eval.json" \
     >"$WORK/eval.out" 2>"$WORK/err" \
   && python3 - "$WORK/eval.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert [r["depth"] for r in d["depths"]] == [1, 3] and all(r["loss"] > 0 for r in d["depths"]), d
a = d["decode"]["adaptive"][0]
assert d["decode"]["max_depth"] == 4 and 2 <= a["iterations_per_token"] <= 4 and a["loss"] > 0, d
PY
then
  pass "eval reports the held-out loss by depth and adaptive-exit decoding"
else
  fail "recurrent eval: $(cat "$WORK/eval.out" "$WORK/err")"
fi
printf 'And it came to pass\nIn the beginning\n' >"$WORK/rec_prompts.txt"
if "$CONCORD" contract measure --model "$WORK/rec/final" --ref fp32 --cand bf16 --prompts "$WORK/rec_prompts.txt" \
     --max-new 4 --depths 1,3 --out "$WORK/rec_contract" --quiet >/dev/null 2>"$WORK/err" \
   && json_check "contract measure --depths gives a depth:R slice per depth" "$WORK/rec_contract/measurement.json" \
        "[s['slice'] for s in j['slices'] if s['slice'].startswith('depth:')] == ['depth:1', 'depth:3']"; then :
else
  fail "contract measure --depths: $(cat "$WORK/err")"
fi
expect_error "contract --depths of a dense model" "not a depth-recurrent model" \
  "$CONCORD" contract measure --model "$WORK/run/final" --ref fp32 --cand bf16 --prompts "$WORK/rec_prompts.txt" \
  --depths 2 --out "$WORK/none_contract" --quiet
expect_error "--depth of a dense model" "are for a depth-recurrent model" \
  "$CONCORD" generate --model "$WORK/run" --prompt hi --max-tokens 1 --depth 3
expect_error "--max-depth without --exit-kl" "--max-depth needs --exit-kl" \
  "$CONCORD" generate --model "$WORK/rec/final" --prompt hi --max-tokens 1 --max-depth 3
expect_error "eval --addition of a run not trained on additions" "is for a run trained on an addition corpus" \
  "$CONCORD" eval --run "$WORK/rec" --depths 1 --addition 2
expect_error "GGUF export of a depth-recurrent model" "has no llama.cpp architecture" \
  "$CONCORD" export --model "$WORK/rec/final" --to gguf --out "$WORK/rec.gguf"

finish "CLI"
