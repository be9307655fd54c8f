#!/usr/bin/env bash
# Install what the cockpit needs (bootstrap.sh --for demo: no test tools, nothing system-wide),
# then start the cockpit on the embedded default model (the cpu-demo preset is offered first on a
# CPU-only machine). Without a terminal (CI, pipes) it runs the same preset headless:
# cockpit train presets/cpu-demo.yaml.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" --for demo
cd "$root"
. "${COCKPIT_VENV:-$root/.venv}/bin/activate"
if [ -t 0 ] && [ -t 1 ]; then
  exec cockpit "$@"
fi
exec cockpit train presets/cpu-demo.yaml "$@"
