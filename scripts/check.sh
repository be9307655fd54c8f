#!/usr/bin/env bash
# The fast static checks (seconds; .ci/run runs them before the tests): ruff's lint and format, the
# architecture's import contracts (import-linter), mypy. Runs all four, then fails if any failed.
# The tools come with the dev extra (scripts/bootstrap.sh). Configuration: pyproject.toml.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f "${COCKPIT_VENV:-$root/.venv}/bin/activate" ]; then
  # shellcheck disable=SC1091
  . "${COCKPIT_VENV:-$root/.venv}/bin/activate"
fi
failed=()
run() {
  local name="$1"; shift
  local t0=$SECONDS
  echo "[check] $name: $*"
  if "$@"; then echo "[check] $name ok ($((SECONDS - t0)) s)"; else failed+=("$name"); fi
}
run ruff ruff check cockpit
run format ruff format --check cockpit
run imports lint-imports
run mypy mypy
if [ ${#failed[@]} -gt 0 ]; then
  echo "[check] FAILED: ${failed[*]}" >&2
  exit 1
fi
