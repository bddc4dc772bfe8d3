# Shared by the CLI test scripts (sourced after `set -u`): a scratch directory $WORK removed on
# exit, pass/fail counting, the checks the scripts have in common, and `finish NAME`, which ends
# a script with its verdict (exit 1 when anything failed).
WORK="$(mktemp -d)"
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
