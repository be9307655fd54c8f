#!/usr/bin/env bash
# Install what is missing, then run the whole test suite (fast and slow tiers).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
. "${COCKPIT_VENV:-$root/.venv}/bin/activate"
exec python -m pytest -q -p no:cacheprovider --durations=30 "$@"
