#!/usr/bin/env bash
# Install what is missing, then start the cockpit on the embedded default model.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
. "${COCKPIT_VENV:-$root/.venv}/bin/activate"
exec cockpit train presets/cpu-demo.yaml "$@"
