#!/bin/bash
# concord's OpenMP wait policy (src/concord/cli/runtime.cpp): with neither OMP_WAIT_POLICY nor
# GOMP_SPINCOUNT set, concord re-executes itself once with OMP_WAIT_POLICY=passive (libgomp then
# waits without spinning: spin count 0), except for `concord serve`; a policy the user set is
# kept, with no re-exec; argv,
# stdin, stdout and the exit status pass through the re-exec unchanged.
# libgomp prints its settings (OMP_DISPLAY_ENV=verbose) when it is loaded, once per image.
# Usage: runtime_test.sh PATH/TO/concord
set -u
CONCORD="$1"
source "$(dirname "$0")/lib.sh"

# displays NAME EXPECTED_COUNT EXPECTED_LAST_SPINCOUNT ENV... : run `concord --version` with the
# given environment (OMP_WAIT_POLICY and GOMP_SPINCOUNT removed first).
displays() {
  local name="$1" count="$2" spin="$3"; shift 3
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "$@" "$CONCORD" --version \
    >"$WORK/out" 2>"$WORK/err" </dev/null
  local rc=$? got_count got_spin
  got_count=$(grep -c "OPENMP DISPLAY ENVIRONMENT BEGIN" "$WORK/err")
  got_spin=$(grep "GOMP_SPINCOUNT" "$WORK/err" | tail -1 | sed "s/.*= '\(.*\)'/\1/")
  if [[ $rc -ne 0 || "$(cat "$WORK/out")" != "concord 0.1.0" ]]; then
    fail "$name: rc $rc, stdout '$(cat "$WORK/out")'"
  elif [[ "$got_count" != "$count" || "$got_spin" != "$spin" ]]; then
    fail "$name: libgomp loaded $got_count time(s), last spin count '$got_spin'; expected $count, '$spin'"
  else
    pass "$name"
  fi
}

displays "unset: one re-exec, passive (spin count 0)" 2 0
displays "GOMP_SPINCOUNT kept, no re-exec" 1 12345 GOMP_SPINCOUNT=12345
displays "OMP_WAIT_POLICY=active kept, no re-exec" 1 30000000000 OMP_WAIT_POLICY=active
displays "OMP_WAIT_POLICY=passive: no re-exec" 1 0 OMP_WAIT_POLICY=passive

# `concord serve` keeps libgomp's default bounded spin (300000): no re-exec.
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "$CONCORD" serve --help \
  >"$WORK/out" 2>"$WORK/err" </dev/null
serve_rc=$?
serve_count=$(grep -c "OPENMP DISPLAY ENVIRONMENT BEGIN" "$WORK/err")
serve_spin=$(grep "GOMP_SPINCOUNT" "$WORK/err" | tail -1 | sed "s/.*= '\(.*\)'/\1/")
if [[ $serve_rc -ne 0 || "$serve_count" != 1 || "$serve_spin" != 300000 ]] || ! grep -q -- "--max-sequences" "$WORK/out"; then
  fail "serve keeps the default spin: rc $serve_rc, libgomp loaded $serve_count time(s), spin count '$serve_spin'"
else
  pass "serve keeps the default spin: no re-exec"
fi
# So does `concord disagg-plan`, which measures the server's engine.
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "$CONCORD" disagg-plan --help \
  >"$WORK/out" 2>"$WORK/err" </dev/null
plan_count=$(grep -c "OPENMP DISPLAY ENVIRONMENT BEGIN" "$WORK/err")
plan_spin=$(grep "GOMP_SPINCOUNT" "$WORK/err" | tail -1 | sed "s/.*= '\(.*\)'/\1/")
if [[ "$plan_count" != 1 || "$plan_spin" != 300000 ]]; then
  fail "disagg-plan keeps the default spin: libgomp loaded $plan_count time(s), spin count '$plan_spin'"
else
  pass "disagg-plan keeps the default spin, as serve"
fi

# The same command with and without the re-exec: identical stdout, stderr and exit status
# (arguments with spaces, quotes and an empty one; stdin read through).
same() {
  local name="$1" input="$2"; shift 2
  printf '%s' "$input" | env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$CONCORD" "$@" >"$WORK/a.out" 2>"$WORK/a.err"
  local rc_a=$?
  printf '%s' "$input" | env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive "$CONCORD" "$@" >"$WORK/b.out" 2>"$WORK/b.err"
  local rc_b=$?
  if [[ $rc_a -ne $rc_b ]] || ! cmp -s "$WORK/a.out" "$WORK/b.out" || ! cmp -s "$WORK/a.err" "$WORK/b.err"; then
    fail "$name: re-exec rc $rc_a '$(cat "$WORK/a.out" "$WORK/a.err")' vs direct rc $rc_b '$(cat "$WORK/b.out" "$WORK/b.err")'"
  else
    pass "$name (rc $rc_a)"
  fi
}
same "stdin and stdout through the re-exec" $'1.5\n-2\n' codec encode --format bf16
same "odd arguments through the re-exec" "" codec encode --format "it's a \"format\" " ""
same "an unknown command through the re-exec" "" "no such  command" --x=' y '

finish runtime
