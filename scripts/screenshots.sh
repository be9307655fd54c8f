#!/usr/bin/env bash
# Regenerate screenshots/*.svg (every screen at 80x24 and 160x48) from the recorded run in
# tests/fixtures/ui_run. The same scenes are pinned by tests/test_ui_snapshots.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
exec "$PY" scripts/ui_screenshots.py "${1:-screenshots}"
