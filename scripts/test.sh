#!/usr/bin/env bash
# Install what is missing, then run the whole test suite (fast and slow tiers).
# No arguments (what .ci/run and the README run): the tests that tolerate a neighbour run on
# COCKPIT_TEST_WORKERS pytest-xdist workers (default 2: most of a test's time is one Python thread,
# imports and subprocess start-up), then the tests marked `serial` (timing windows, per-process
# memory peaks, the chaos test) one at a time. With arguments: one pytest run as given.
# COCKPIT_NO_BOOTSTRAP=1: the environment is ready, skip scripts/bootstrap.sh.
#
# Interrupting it (Ctrl-C, SIGTERM) ends everything it started, within about 3 s: pytest gets
# SIGINT (each test process then kills what its tests started, tests/conftest.py), and whatever
# still runs after that with this suite's COCKPIT_TEST_SESSION in its environment (pytest, its
# workers, detached supervisors in their own sessions, their ranks) is killed
# (scripts/kill_marked.py). Exit 130 (SIGINT) or 143 (SIGTERM); the serial part never starts. The
# same through a pipe (`| tee log`), whose reader a terminal's Ctrl-C ends as well.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "${COCKPIT_NO_BOOTSTRAP:-0}" = 1 ] || bash "$root/scripts/bootstrap.sh" --for test
cd "$root"
. "${COCKPIT_VENV:-$root/.venv}/bin/activate"
# A new one per suite (never inherited: a suite run by a test must not sweep its parent's processes).
COCKPIT_TEST_SESSION="test.sh-$$-$(date +%s%N)"
export COCKPIT_TEST_SESSION
pytest_q=(python -m pytest -q -p no:cacheprovider --durations=30)
pytest_pid=""
stopping=""
# Through a pipe (`bash scripts/test.sh 2>&1 | tee log`), a terminal's Ctrl-C ends the reader too: the
# next line written (the one below) then killed this script by SIGPIPE before it ended pytest and
# swept the tests' detached runs. Ignored: that write fails (and is let fail), the script goes on.
trap '' PIPE

on_signal() {
  [ -z "$stopping" ] || return 0
  stopping="$1"
  echo "[test] SIG$1: ending the tests and everything they started" >&2 || true
  if [ -n "$pytest_pid" ]; then kill -INT "$pytest_pid" 2>/dev/null || true; fi
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

sweep() { python "$root/scripts/kill_marked.py" "COCKPIT_TEST_SESSION=$COCKPIT_TEST_SESSION" || true; }

stop_now() {  # pytest had 3 s to end on its own; then the sweep; then this script ends
  local tenths=0
  while [ -n "$pytest_pid" ] && kill -0 "$pytest_pid" 2>/dev/null && [ "$tenths" -lt 30 ]; do
    sleep 0.1
    tenths=$((tenths + 1))
  done
  sweep
  if [ -n "$pytest_pid" ]; then wait "$pytest_pid" 2>/dev/null || true; fi
  [ "$stopping" = TERM ] && exit 143
  exit 130
}

# The command in the background and `wait`: bash runs a trap only once its foreground child has
# exited, and pytest, interrupted, exits with its own status (2), after which the script went on.
run_pytest() {
  [ -z "$stopping" ] || stop_now
  "$@" &
  pytest_pid=$!
  local rc=0
  wait "$pytest_pid" || rc=$?
  [ -z "$stopping" ] || stop_now
  pytest_pid=""
  return "$rc"
}

if [ "$#" -gt 0 ]; then
  rc=0
  run_pytest "${pytest_q[@]}" "$@" || rc=$?
  sweep
  exit "$rc"
fi
workers="${COCKPIT_TEST_WORKERS:-2}"
# each part's test times as JUnit XML, in a folder of this suite's own (a suite that a test runs, as
# tests/test_interrupt.py does, must not overwrite its parent's): the five slowest are printed at the end
# (scripts/durations.py --table makes docs/test-durations.md from them)
times="$root/.cache/test-times/$COCKPIT_TEST_SESSION"
mkdir -p "$times"
find "$root/.cache/test-times" -mindepth 1 -maxdepth 1 -type d -mtime +2 -exec rm -rf {} + 2>/dev/null || true
t0=$SECONDS
rc=0
# one OpenMP thread per test process: two workers' training runs at torch's default (one thread per
# core each) oversubscribe the cores: the demo preset trained at 10.5 tokens/s beside the DPO demo (2026-12-01)
run_pytest env OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "${pytest_q[@]}" -n "$workers" --dist loadfile --no-loadscope-reorder -m "not serial and not quarantine" --junitxml="$times/parallel.xml" || rc=$?
echo "[test] parallel part ($workers workers): exit $rc, $((SECONDS - t0)) s" || true
t1=$SECONDS
rs=0
run_pytest "${pytest_q[@]}" -m "serial and not quarantine" --junitxml="$times/serial.xml" || rs=$?
[ "$rs" = 5 ] && rs=0  # none marked serial
echo "[test] serial part: exit $rs, $((SECONDS - t1)) s; the suite: $((SECONDS - t0)) s" || true
python "$root/scripts/durations.py" --top 5 "$times"/*.xml || true
echo "[test] test times: $times" || true
sweep
[ "$rc" = 0 ] && rc=$rs
exit "$rc"
