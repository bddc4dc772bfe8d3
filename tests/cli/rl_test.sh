#!/bin/bash
# `concord demo --quick` and `concord rl` end to end: the demo's table, combined report and per-arm
# files; an injected fault reported while the run goes on; the shm transport (2 sampler
# processes) and, when mpirun is installed, the MPI transport give the in-process run's results;
# bad flags and bad configs exit 2 with one line naming the problem.
# Usage: rl_test.sh PATH/TO/concord   (needs bash and python3, standard library only)
set -u
CONCORD="$1"
source "$(dirname "$0")/lib.sh"
export OMP_WAIT_POLICY=passive

# same_steps NAME A B : two metrics.jsonl files agree on everything but timing and sync reports.
same_steps() {
  local name="$1" a="$2" b="$3"
  if python3 - "$a" "$b" <<'PY'
import json, sys
def load(p):
    out = []
    for line in open(p):
        j = json.loads(line)
        out.append({k: v for k, v in j.items() if not k.startswith("time/") and k != "sync/reports"})
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a == b and len(a) > 0 else 1)
PY
  then pass "$name"; else fail "$name: $a and $b differ"; fi
}

# --- the demo, quick ---
if run_rc "demo --quick" 0 "$CONCORD" demo --quick --out "$WORK/demo"; then
  grep -q '^arm (sampler/learner export)' "$WORK/out" && grep -q '^bf16/bf16 rne ' "$WORK/out" \
    && grep -q '^mxfp8/mxfp8 sr ' "$WORK/out" && grep -q '^nvfp4/nvfp4 ef ' "$WORK/out" \
    && pass "demo prints the comparison table" || fail "demo table: $(cat "$WORK/out")"
  grep -q 'step 1/3' "$WORK/err" && pass "demo shows progress on stderr" || fail "demo progress: $(cat "$WORK/err")"
  [[ -s "$WORK/demo/report.html" && -s "$WORK/demo/base/model.safetensors" && -s "$WORK/demo/base/warmup.json" ]] \
    && grep -q '<svg' "$WORK/demo/report.html" && ! grep -q '<script' "$WORK/demo/report.html" \
    && pass "demo writes the combined report (inline SVG) and the cached base model" \
    || fail "demo outputs: $(ls -R "$WORK/demo")"
  for arm in bf16_bf16_rne mxfp8_mxfp8_sr nvfp4_nvfp4_ef; do
    [[ -s "$WORK/demo/$arm/metrics.jsonl" && -s "$WORK/demo/$arm/report.html" && -s "$WORK/demo/$arm/config.json" ]] \
      || fail "demo arm $arm lacks metrics.jsonl, report.html or config.json"
  done
  json_check "demo summary: 3 arms, no sync failure, rewards in [0, 1]" "$WORK/demo/summary.json" \
    "len(j['arms']) == 3 and all(a['sync_failures'] == 0 and 0 <= a['final_reward'] <= 1 for a in j['arms'])"
  json_check "matched bf16/bf16 has no mismatch" "$WORK/demo/summary.json" \
    "[a for a in j['arms'] if a['dir'] == 'bf16_bf16_rne'][0]['mean_k3_kl'] < 1e-12"
  # Everything the demo writes for an arm is named in docs/rl.md's demo section (issue 26 item 14:
  # checkpoints/ was not).
  DEMO_DOC="$(python3 -c 'import sys; t = open(sys.argv[1]).read(); print(t.split("## The demo", 1)[1].split("\n## ", 1)[0])' \
    "$(dirname "$0")/../../docs/rl.md")"
  for entry in $(ls "$WORK/demo/bf16_bf16_rne"); do
    grep -qF "$entry" <<<"$DEMO_DOC" || fail "docs/rl.md's demo section does not name an arm's $entry"
  done
  [[ -d "$WORK/demo/bf16_bf16_rne/checkpoints" ]] && grep -qF "OUT/<arm>/checkpoints/" <<<"$DEMO_DOC" \
    && pass "docs/rl.md names what each demo arm writes" || fail "demo arm entries vs docs/rl.md"
  run_rc "demo --quick again" 0 "$CONCORD" demo --quick --out "$WORK/demo" --arm bf16/bf16:sr \
    && grep -q 'warmed-up model from' "$WORK/err" && pass "a second demo reuses the warmed-up model" \
    || fail "demo rerun did not reuse base: $(cat "$WORK/err")"
fi

# --- concord rl: in process, then with a fault ---
QUICK=(rl --quick --seed 3 --quiet)
if run_rc "rl in-process" 0 "$CONCORD" "${QUICK[@]}" --out "$WORK/rl_a"; then
  grep -q 'every step passed the seven checks' "$WORK/out" && pass "clean run raises no alarm" \
    || fail "clean run output: $(cat "$WORK/out")"
  python3 -c "
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
need = ['rollout_corr/kl', 'rollout_corr/k3_kl', 'rollout_corr/log_ppl_abs_diff', 'token_mult_prob_error',
        'prob_diff_max', 'prob_diff_mean', 'reward', 'entropy', 'fair_cast', 'time/rollout_s',
        'time/learner_s', 'time/sync_s']
sys.exit(0 if len(lines) == 4 and all(k in l for l in lines for k in need) else 1)" "$WORK/rl_a/metrics.jsonl" \
    && pass "metrics.jsonl has a line per step with the named metrics" || fail "metrics.jsonl: $(head -c 600 "$WORK/rl_a/metrics.jsonl")"
fi
if run_rc "rl with a fault" 0 "$CONCORD" "${QUICK[@]}" --fault flipped_bit@2 --out "$WORK/rl_fault"; then
  grep -q 'step 2 sampler 1: ' "$WORK/out" && pass "the failed sync is reported with its check" \
    || fail "fault output: $(cat "$WORK/out")"
  json_check "summary: the fault was caught at step 2, the old version kept serving" "$WORK/rl_fault/summary.json" \
    "j['faults'] == [{'fault': 'flipped_bit', 'step': 2, 'caught': True}] and j['sync_failures'] == 1"
  python3 -c "
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
r = lines[1]['sync/reports'][0]
sys.exit(0 if (not lines[1]['sync/applied']) and r['serving'] == 1 and lines[2]['sync/applied'] else 1)" \
    "$WORK/rl_fault/metrics.jsonl" && pass "step 2 served version 1; step 3 synced again" \
    || fail "fault metrics: $(sed -n 2p "$WORK/rl_fault/metrics.jsonl" | head -c 800)"
fi

# --- other transports give the same run ---
if run_rc "rl shm, 2 samplers" 0 "$CONCORD" "${QUICK[@]}" --transport shm --samplers 2 --out "$WORK/rl_shm"; then
  grep -q 'over shm (2 samplers)' "$WORK/out" && pass "shm run names its transport" || fail "shm output: $(cat "$WORK/out")"
  same_steps "shm with 2 samplers = in process" "$WORK/rl_a/metrics.jsonl" "$WORK/rl_shm/metrics.jsonl"
fi
# --transport http: a `concord serve` process samples (weights by POST /v1/weights, rollouts by
# /v1/completions): the same steps, faults caught by the same checks; a running server by URL.
if run_rc "rl over http (concord serve started by rl)" 0 "$CONCORD" "${QUICK[@]}" --transport http --out "$WORK/rl_http"; then
  grep -q 'over http (1 sampler)' "$WORK/out" && pass "http run names its transport" || fail "http output: $(cat "$WORK/out")"
  same_steps "http (concord serve) = in process" "$WORK/rl_a/metrics.jsonl" "$WORK/rl_http/metrics.jsonl"
fi
if run_rc "rl over http with a fault" 0 "$CONCORD" "${QUICK[@]}" --transport http --fault flipped_bit@2 --out "$WORK/rl_http_fault"; then
  same_steps "http with a fault = in process with it" "$WORK/rl_fault/metrics.jsonl" "$WORK/rl_http_fault/metrics.jsonl"
fi
if [[ -d "$WORK/rl_http/sampler-model" ]]; then
  "$CONCORD" serve --model "$WORK/rl_http/sampler-model" --policy bf16 --port 0 --api-key k --max-queue 64 \
    2>"$WORK/serve_err" &
  SERVE_PID=$!
  for _ in $(seq 1 300); do grep -q 'listening on' "$WORK/serve_err" && break; sleep 0.1; done
  URL=$(grep -o 'http://[0-9.]*:[0-9]*' "$WORK/serve_err" | head -1)
  if run_rc "rl over http to a running server" 0 "$CONCORD" "${QUICK[@]}" --transport http --sampler-url "$URL" \
      --sampler-api-key k --out "$WORK/rl_http_url"; then
    same_steps "http to a running server = in process" "$WORK/rl_a/metrics.jsonl" "$WORK/rl_http_url/metrics.jsonl"
  fi
  # A new run starts at version 1 again, which that server has served: check 1 refuses it.
  expect_error "a server already past the run's versions" "already serves weights version 4" \
    "$CONCORD" "${QUICK[@]}" --transport http --sampler-url "$URL" --sampler-api-key k --out "$WORK/rl_http_again"
  expect_error "a wrong sampler API key" "GET /v1/weights answered 401: missing or wrong API key" \
    "$CONCORD" "${QUICK[@]}" --transport http --sampler-url "$URL" --sampler-api-key nope --out "$WORK/x"
  kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null
fi
expect_error "http to nothing" "is \`concord serve\` running there?" \
  "$CONCORD" "${QUICK[@]}" --transport http --sampler-url http://127.0.0.1:9 --out "$WORK/x"
expect_error "sampler URL without http" "--sampler-url needs --transport http" \
  "$CONCORD" "${QUICK[@]}" --sampler-url http://127.0.0.1:9 --out "$WORK/x"

if command -v mpirun >/dev/null 2>&1 && ldd "$CONCORD" 2>/dev/null | grep -q libmpi; then
  if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 run_rc "rl under mpirun -np 3" 0 \
      mpirun -np 3 --oversubscribe --mca btl self,vader "$CONCORD" "${QUICK[@]}" --out "$WORK/rl_mpi"; then
    grep -q 'over mpi (2 samplers)' "$WORK/out" && pass "mpi run names its transport" || fail "mpi output: $(cat "$WORK/out")"
    same_steps "mpi with 2 samplers = in process" "$WORK/rl_a/metrics.jsonl" "$WORK/rl_mpi/metrics.jsonl"
  fi
else
  echo "skip: mpirun not installed or concord built without MPI"
fi

# The README's own mpirun line, as written (issue 26 item 11: it needed --oversubscribe on a
# 2-core machine, and was not runnable as written). Its --out goes to the scratch directory.
README="$(dirname "$0")/../../README.md"
README_MPI=$(grep -m1 '^mpirun -np ' "$README" | sed 's/   *(.*$//')
if command -v mpirun >/dev/null 2>&1 && ldd "$CONCORD" 2>/dev/null | grep -q libmpi; then
  read -r -a words <<<"$README_MPI"
  for i in "${!words[@]}"; do
    [[ "${words[$i]}" == concord ]] && words[$i]="$CONCORD"
    [[ "${words[$i]}" == runs/rl-mpi ]] && words[$i]="$WORK/readme_mpi"
  done
  if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 run_rc "README: $README_MPI" 0 "${words[@]}"; then
    grep -q 'over mpi (2 samplers)' "$WORK/out" && [[ -s "$WORK/readme_mpi/summary.json" ]] \
      && pass "the README's mpirun command runs" || fail "README mpirun output: $(cat "$WORK/out")"
  fi
else
  echo "skip: the README's mpirun line (mpirun not installed or concord built without MPI)"
fi

# `make demo` builds the concord binary alone; `make test` builds everything (issue 26 item 14).
if command -v make >/dev/null 2>&1; then
  ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
  demo_builds=$(make -s -n -C "$ROOT" demo BUILD="$WORK/no-build" | grep 'cmake --build')
  test_builds=$(make -s -n -C "$ROOT" test BUILD="$WORK/no-build" | grep 'cmake --build')
  [[ -n "$demo_builds" && -z "$(grep -v -- '--target concord$' <<<"$demo_builds")" ]] \
    && [[ -n "$test_builds" && -z "$(grep -- '--target' <<<"$test_builds")" ]] \
    && pass "make demo builds only concord; make test builds everything" \
    || fail "make demo: '$demo_builds'; make test: '$test_builds'"
fi

# --- bad input: exit 2, one line ---
expect_error "unknown transport" "unknown --transport 'tcp' (in-process, shm, mpi, http)" "$CONCORD" rl --quick --transport tcp --out "$WORK/x"
expect_error "unknown fault" "melted" "$CONCORD" rl --quick --fault melted@2 --out "$WORK/x"
expect_error "fault without a step" "NAME@STEP" "$CONCORD" rl --quick --fault flipped_bit --out "$WORK/x"
expect_error "fault past the last step" "flipped_bit@99" "$CONCORD" rl --quick --fault flipped_bit@99 --out "$WORK/x"
expect_error "samplers in process" "--samplers needs --transport shm" "$CONCORD" rl --quick --samplers 2 --out "$WORK/x"
expect_error "unknown preset" "fp7" "$CONCORD" rl --quick --sampler fp7 --out "$WORK/x"
expect_error "unknown export" "unknown export rule 'stochastic'" "$CONCORD" rl --quick --export stochastic --out "$WORK/x"
echo '{"grpo": {"stepz": 3}}' >"$WORK/bad_key.json"
expect_error "config with an unknown key" "unknown key 'grpo.stepz'" "$CONCORD" rl --config "$WORK/bad_key.json" --out "$WORK/x"
echo '{"grpo": {"steps": 3' >"$WORK/bad_json.json"
expect_error "config that is not JSON" "bad_json.json: not valid JSON" "$CONCORD" rl --config "$WORK/bad_json.json" --out "$WORK/x"
expect_error "missing config" "cannot open the RL config" "$CONCORD" rl --config "$WORK/nope.json" --out "$WORK/x"
expect_error "demo arm syntax" "SAMPLER/LEARNER:EXPORT" "$CONCORD" demo --quick --arm bf16-bf16 --out "$WORK/x"
expect_error "demo arm preset" "fp7" "$CONCORD" demo --quick --arm bf16/fp7:rne --out "$WORK/x"
for lr in inf nan 0 -1e-3 " 1e-3" 1e-3x; do
  expect_error "demo arm lr '$lr'" "the learning rate after '@' must be a finite number > 0" \
    "$CONCORD" demo --quick --arm "bf16/bf16:rne@$lr" --out "$WORK/x"
done

# Numeric flags: a value outside the flag's domain is one line naming it, exit 2 (issue 26 item 3:
# -1 meant "not given", so `--steps -5 --lr -1 --kl-coef -2` ran with the defaults). ARGS holds a
# bad --sampler so that a binary ignoring the flag fails at once instead of running.
cat >"$WORK/rl_flags.table" <<'TABLE'
rl|--sampler fp7|--difficulty|0|an integer in [1, 2^31 - 1]
rl|--sampler fp7|--steps|-5|an integer in [1, 99999999]
rl|--sampler fp7|--steps|100000000|an integer in [1, 99999999]
rl|--sampler fp7|--warmup-steps|-1|an integer >= 0
rl|--sampler fp7|--prompts|0|an integer >= 1
rl|--sampler fp7|--group|1|an integer >= 2
rl|--sampler fp7|--max-new|0|an integer >= 1
rl|--sampler fp7|--lr|-1|a number >= 0
rl|--sampler fp7|--lr|inf|a number >= 0
rl|--sampler fp7|--kl-coef|-2|a number >= 0
rl|--sampler fp7|--kl-coef|nan|a number >= 0
rl|--sampler fp7|--seed|-1|an integer in [0, 2^64 - 1]
rl|--sampler fp7|--samplers|0|an integer in [1, 4096]
rl|--sampler fp7|--samplers|4097|an integer in [1, 4096]
rl|--sampler fp7|--checkpoint-every|-1|an integer >= 0
rl|--sampler fp7|--rank|0|an integer in [1, 4096]
rl|--sampler fp7|--speculative-tokens|0|an integer in [1, 64]
rl|--sampler fp7|--eval-every|-1|an integer >= 0
rl|--sampler fp7|--eval-prompts|0|an integer in [1, 4096]
rl|--sampler fp7|--eval-prompts|4097|an integer in [1, 4096]
TABLE
bad_flag_values "$WORK/rl_flags.table"
numeric_flags_covered "$WORK/rl_flags.table" INCLUDE rl
empty_values_refused INCLUDE rl
# Held-out evaluation: after the syncs of steps 1 and 3 and after the last step; it trains
# nothing (the run's other metrics equal a run without it, times aside).
if "$CONCORD" rl --quick --quiet --out "$WORK/rl_eval" --eval-every 2 --eval-prompts 4 >"$WORK/rl_eval.txt" 2>"$WORK/err" &&
   "$CONCORD" rl --quick --quiet --out "$WORK/rl_noeval" >/dev/null 2>>"$WORK/err"; then
  if python3 - "$WORK/rl_eval" "$WORK/rl_noeval" "$WORK/rl_eval.txt" <<'PY'
import json, sys
def lines(d): return [json.loads(l) for l in open(d + "/metrics.jsonl")]
a, b = lines(sys.argv[1]), lines(sys.argv[2])
assert [l["step"] for l in a if "eval" in l] == [1, 3], [l["step"] for l in a if "eval" in l]
for l in a:
    if "eval" in l:
        e = l["eval"]
        assert e["prompts"] == 4 and 0 <= e["reward_served"] <= 1 and 0 <= e["reward_master"] <= 1, e
        assert 0 <= e["greedy_same"] <= 1 and e["served_length"] >= 1, e
def strip(l):
    return {k: v for k, v in l.items() if k != "eval" and not k.startswith("time/") and k != "sync/reports"}
assert [strip(l) for l in a] == [strip(l) for l in b]
s = json.load(open(sys.argv[1] + "/summary.json"))
assert s["eval_final"]["step"] == 5 and s["eval_final"]["prompts"] == 4, s["eval_final"]
assert "held-out (4 prompts, greedy)" in open(sys.argv[3]).read()
PY
  then pass "rl --eval-every: held-out greedy rewards of the served copy and the master, and it trains nothing"
  else fail "rl --eval-every: metrics"; fi
else
  fail "rl --eval-every: $(head -c 300 "$WORK/err")"
fi
# rl-report: one report over finished runs; a missing or unfinished run is one line, exit 2.
if "$CONCORD" rl-report --run "$WORK/rl_eval" --run "$WORK/rl_noeval" --title "two runs" --out "$WORK/two.html" >/dev/null 2>"$WORK/err" &&
   python3 - "$WORK/two.html" <<'PY'
import sys
h = open(sys.argv[1], encoding="utf-8").read()
assert "<title>two runs</title>" in h and "Held-out evaluation" in h and "token_mult_prob_error" in h
assert h.count("<svg") >= 8 and h.count("<details>") == 2, h.count("<svg")
PY
then pass "rl-report over two runs (held-out evaluation, token_mult_prob_error)"
else fail "rl-report: $(head -c 300 "$WORK/err")"; fi
mkdir -p "$WORK/rl_unfinished" && cp "$WORK/rl_eval/config.json" "$WORK/rl_eval/metrics.jsonl" "$WORK/rl_unfinished/"
expect_error "rl-report: an unfinished run" "summary.json: missing (the run has not finished)" \
  "$CONCORD" rl-report --run "$WORK/rl_unfinished" --out "$WORK/x.html"
expect_error "rl-report: not a directory" "not a directory" "$CONCORD" rl-report --run "$WORK/nope" --out "$WORK/x.html"
head -c 100 "$WORK/rl_eval/metrics.jsonl" > "$WORK/rl_unfinished/metrics.jsonl"; cp "$WORK/rl_eval/summary.json" "$WORK/rl_unfinished/"
expect_error "rl-report: a cut metrics line" "metrics.jsonl: line 1" "$CONCORD" rl-report --run "$WORK/rl_unfinished" --out "$WORK/x.html"
if "$CONCORD" rl --quick --quiet --out "$WORK/rl_spec" --speculative self:bf16 --speculative-tokens 2 >/dev/null 2>"$WORK/err"; then
  if python3 - "$WORK/rl_spec/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines and all(l["spec/accept_rate"] == 1.0 and l["spec/accept_length"] >= 1 for l in lines), lines[0]
PY
  then pass "rl --speculative logs spec/accept_rate and spec/accept_length"
  else fail "rl --speculative: no spec/* metrics"
  fi
else
  fail "rl --speculative: $(cat "$WORK/err")"
fi
expect_error "rl --speculative with a malformed self drafter" "give self:layers=K with K an integer" \
  "$CONCORD" rl --quick --quiet --out "$WORK/rl_bad" --speculative self:layers=x
expect_error "rl --out ''" "rl --out: an empty value" "$CONCORD" rl --quick --out ""
expect_error "rl --name that is not UTF-8" "rl --name: not valid UTF-8 (byte 1)" \
  "$CONCORD" rl --quick --name $'a\xff' --out "$WORK/x"
expect_error "the issue's command" "rl --steps: '-5' is not an integer" \
  "$CONCORD" rl --quick --steps -5 --lr -1 --kl-coef -2 --out "$WORK/x"

# Messages list what is accepted, from the one table each (issue 26 item 6).
expect_error "unknown task lists every choice" "unknown task 'nope' (known: add, mul, reverse, sort, count, mixed)" \
  "$CONCORD" rl --quick --task nope --out "$WORK/x"
"$CONCORD" rl --quick --fault melted@2 --out "$WORK/x" >/dev/null 2>"$WORK/fault_err"
FAULTS=$(sed -n 's/.*(faults: none, \(.*\)).*/\1/p' "$WORK/fault_err")
"$CONCORD" rl --help >"$WORK/rl_help"
missing=""
for f in ${FAULTS//,/ }; do grep -q -- "--fault .*[ ,]$f\b" <(tr -s ' \n' ' ' <"$WORK/rl_help") || missing="$missing $f"; done
[[ -n "$FAULTS" && -z "$missing" ]] && pass "rl --help names every fault" \
  || fail "rl --help lacks faults:${missing:- (no fault list in: $(cat "$WORK/fault_err"))}"
grep -q -- "--task .*add, mul, reverse, sort, count, mixed" "$WORK/rl_help" && pass "rl --help names every task" \
  || fail "rl --help tasks: $(grep -- --task "$WORK/rl_help")"
[[ ! -e "$WORK/x" ]] && pass "failed commands write nothing" || fail "output written by a failed command"

# scripts/rl_smol_results.py --quick (issue 22's results script, CI smoke): every arm two steps on
# the built-in model, the tables and the report; run again, it keeps the finished arms.
SCRIPT="$(dirname "$0")/../../scripts/rl_smol_results.py"
if python3 "$SCRIPT" --quick --concord "$CONCORD" --out "$WORK/smol" >"$WORK/smol.txt" 2>"$WORK/smol.err" &&
   python3 - "$WORK/smol" <<'PY'
import json, sys
d = sys.argv[1]
rows = json.load(open(d + "/results.json"))
assert len(rows) == 11 and all(r["steps"] == 2 and r["sync_failures"] == 0 for r in rows), rows
assert {r["export"] for r in rows if r["name"].startswith("fc-")} == {"rne", "sr", "ef"}
md = open(d + "/results.md").read()
for title in ("## Fair Cast", "### Reward curves", "### Held-out reward", "## Matched vs mismatched precision",
              "## FP4 end to end", "## Weight syncs"):
    assert title in md, title
# the curves: one row per step window and per evaluation (after 0, 1 and 2 updates), both seeds in each cell
curve = md.split("### Reward curves")[1].split("###")[0]
assert sum(1 for l in curve.splitlines() if l.startswith("| 1-1 |") or l.startswith("| 2-2 |")) == 2, curve
held = md.split("### Held-out reward")[1].split("##")[0]
assert [l.split(" |")[0] for l in held.splitlines() if l[:3] in ("| 0", "| 1", "| 2")] == ["| 0", "| 1", "| 2"], held
assert "| mxfp8 / mxfp8 | 0 | 100% lower |" in md, md  # matched: bit-identical log-probs
assert open(d + "/report.html").read().count("<details>") == 11
PY
then
  if python3 "$SCRIPT" --quick --concord "$CONCORD" --out "$WORK/smol" >/dev/null 2>"$WORK/smol.err" &&
     [[ $(grep -c "finished earlier, kept" "$WORK/smol.err") -eq 11 ]]; then
    pass "rl_smol_results.py --quick: 11 arms, the tables and the report; a rerun keeps every finished arm"
  else fail "rl_smol_results.py --quick rerun: $(tail -3 "$WORK/smol.err")"; fi
else
  fail "rl_smol_results.py --quick: $(tail -3 "$WORK/smol.err")"
fi

finish "rl CLI"
