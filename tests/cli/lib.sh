# Shared by the CLI test scripts (sourced after `set -u`): a scratch directory $WORK removed on
# exit, pass/fail counting, the checks the scripts have in common, and `finish NAME`, which ends
# a script with its verdict (exit 1 when anything failed).
WORK="$(mktemp -d)"
CLI_TEST_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # help_walk.py lives here
trap 'rm -rf "$WORK"' EXIT
FAILURES=0

fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
pass() { echo "ok: $*"; }

# run_rc NAME EXPECTED_RC COMMAND... : runs with stdout in $WORK/out, stderr in $WORK/err.
run_rc() {
  local name="$1" expected="$2"; shift 2
  "$@" >"$WORK/out" 2>"$WORK/err" </dev/null; local rc=$?
  if [[ $rc -ne $expected ]]; then
    fail "$name: exit status $rc, expected $expected: $(cat "$WORK/out" "$WORK/err")"
    return 1
  fi
  return 0
}

# expect_error NAME FRAGMENT COMMAND... : exit 2, stderr is one line containing FRAGMENT.
expect_error() {
  local name="$1" fragment="$2"; shift 2
  "$@" >"$WORK/out" 2>"$WORK/err" </dev/null; local rc=$?
  local lines; lines=$(wc -l <"$WORK/err")
  if [[ $rc -ne 2 ]]; then
    fail "$name: exit status $rc, expected 2 ($(cat "$WORK/err"))"
  elif [[ $lines -ne 1 ]]; then
    fail "$name: stderr has $lines lines, expected 1: $(cat "$WORK/err")"
  elif ! grep -qF -- "$fragment" "$WORK/err"; then
    fail "$name: stderr lacks '$fragment': $(cat "$WORK/err")"
  else
    pass "$name"
  fi
}

# json_check NAME FILE PYTHON_EXPR : the expression over `j` (the parsed file) is true.
json_check() {
  local name="$1" file="$2" expr="$3"
  if python3 -c "import json, sys; j = json.load(open(sys.argv[1])); sys.exit(0 if ($expr) else 1)" "$file"; then
    pass "$name"
  else
    fail "$name: $expr on $file"
  fi
}

# finish NAME : the verdict of the script.
finish() {
  if [[ $FAILURES -ne 0 ]]; then
    echo "$FAILURES failure(s)"
    exit 1
  fi
  echo "all $1 tests passed"
}

# bad_flag_values TABLE : each line of TABLE (a file; "#" lines skipped) is
# "COMMAND|ARGS|FLAG|VALUE|DOMAIN": `concord COMMAND ARGS FLAG VALUE` must exit 2 with one line
# "COMMAND FLAG: 'VALUE' is not DOMAIN" (the flag checked when parsed, before any work). Needs
# $CONCORD.
bad_flag_values() {
  local table="$1" command args flag value domain
  while IFS='|' read -r command args flag value domain; do
    [[ -z "$command" || "$command" == \#* ]] && continue
    local words=() extra=()
    read -r -a words <<<"$command"
    read -r -a extra <<<"$args"
    expect_error "$command $flag $value" "$command $flag: '$value' is not $domain" \
      "$CONCORD" "${words[@]}" "${extra[@]}" "$flag" "$value"
  done <"$table"
}

# numeric_flags_covered TABLE INCLUDE|EXCLUDE COMMAND... : every numeric flag (INT, UINT, FLOAT in
# --help) of every leaf command under the given top-level commands (INCLUDE), or under all but
# them (EXCLUDE), has a row in TABLE, so a new flag cannot go unchecked.
numeric_flags_covered() {
  local table="$1"; shift
  if PYTHONPATH="$CLI_TEST_DIR" python3 - "$CONCORD" "$table" "$@" <<'PY'
import re, sys
from help_walk import leaves
concord, table, mode, chosen = sys.argv[1], sys.argv[2], sys.argv[3], set(sys.argv[4:])
rows = set()
for line in open(table):
    if line.strip() and not line.startswith("#"):
        f = line.rstrip("\n").split("|")
        rows.add((f[0], f[2]))
missing = []
count = 0
for words, text in leaves(concord, mode, chosen):
    for flag in re.findall(r"^  (--[\w-]+) (?:INT|UINT|FLOAT)\b", text, re.M):
        count += 1
        if (" ".join(words), flag) not in rows: missing.append(" ".join(words) + " " + flag)
print(f"{count} numeric flags listed by --help")
if missing or count == 0:
    print("no bad-value row for: " + ", ".join(missing))
    sys.exit(1)
PY
  then pass "every numeric flag has a bad-value case"; else fail "numeric flags without a bad-value case"; fi
}

# empty_values_refused INCLUDE|EXCLUDE COMMAND... : every option that takes a value (in --help) of
# every leaf command under the given top-level commands (or all but them) refuses "" with one
# line "COMMAND OPTION: an empty value", exit 2 (commands read "" as "not given": `rl --out ""`
# wrote to runs/rl). demo and rl get a bad arm or preset as well, so that a binary that took ""
# fails at once instead of running.
empty_values_refused() {
  if PYTHONPATH="$CLI_TEST_DIR" python3 - "$CONCORD" "$@" <<'PY'
import re, subprocess, sys
from help_walk import leaves
concord, mode, chosen = sys.argv[1], sys.argv[2], set(sys.argv[3:])
bad, count = [], 0
for words, text in leaves(concord, mode, chosen):
    for option in re.findall(r"^  (?:-\w,)?(--[\w-]+) [A-Z]", text, re.M):
        guard = {"demo": ["--arm", "bf16/fp7:rne"],
                 "rl": ["--learner" if option == "--sampler" else "--sampler", "fp7"]}.get(" ".join(words), [])
        r = subprocess.run([concord, *words, option, "", *guard], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60)
        count += 1
        want = f"{' '.join(words)} {option}: an empty value"
        if r.returncode != 2 or r.stderr.count("\n") != 1 or want not in r.stderr:
            bad.append(f"{' '.join(words)} {option} '' -> exit {r.returncode}: {r.stderr.strip()[:120]}")
print(f"{count} options that take a value tried with ''")
if bad or count == 0:
    print("\n".join(bad))
    sys.exit(1)
PY
  then pass "every option refuses an empty value"; else fail "options that take an empty value"; fi
}
