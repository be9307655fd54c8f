"""use_galore / use_apollo for real: a run through the CLI with HF's galore_adamw / apollo_adamw
(galore-torch, apollo-torch), and what each does to the weights and the optimizer state.

The packages live off the suite's sys.path, in the side folder ``<venv>/lowrank-site`` (cockpit/side_site.py):
the runs go through the plain ``cockpit train``, which puts the folder on the ranks' PYTHONPATH because the
config uses them (no test-only env); only reading GaLore's pickled optimizer state here takes ``lowrank_env``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cockpit, read_events, tiny_config

from cockpit import side_site

RANK = 4


def _train(tmp_path: Path, model_dir: Path, **over) -> Path:
    """Two full fine-tuning steps of the tiny Llama on q_proj only, at a constant learning rate, no
    weight decay (its full-rank shrink would hide the update's rank); a checkpoint after step 2. The
    plain ``cockpit train``: the side folder reaches the ranks through the launch, not the test."""
    cfg = tiny_config(tmp_path, model_dir, finetuning_type="full", max_steps=2, save_steps=2, probes=None,
                      save_total_limit=None, learning_rate=1e-3, lr_scheduler_type="constant", warmup_ratio=0.0,
                      weight_decay=0.0, logging_steps=1, **over)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next((tmp_path / "runs").iterdir())
    assert [e["step"] for e in read_events(run) if e["kind"] == "step"] == [1, 2]
    (rank,) = json.loads((run / "launch.json").read_text())["ranks"]
    assert rank["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(side_site.folder())
    return run


def _deltas(model_dir: Path, checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    before, after = load_file(str(model_dir / "model.safetensors")), load_file(str(checkpoint / "model.safetensors"))
    return {n: (after[n].double() - before[n].double()) for n in after}


def _rank(delta) -> int:
    """Singular values above 1e-4 of the largest: the weights are fp32, whose rounding of W + dW
    leaves the rest near 1e-6."""
    import torch

    s = torch.linalg.svdvals(delta)
    return int((s / s[0] > 1e-4).sum().item())


_STATE_SHAPES = """
import json, sys, torch
state = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
groups = [g for g in state["param_groups"] if "rank" in g]
print(json.dumps([[tuple(state["state"][i]["exp_avg"].shape) for i in g["params"] if i in state["state"]] for g in groups]))
"""


def _projected_states(checkpoint: Path, env: dict) -> list[tuple[int, ...]]:
    """Shapes of Adam's first moments in the low-rank group (the one with a ``rank``). Read in a
    subprocess with the packages on its path: GaLore pickles its projectors into the state."""
    res = subprocess.run([sys.executable, "-c", _STATE_SHAPES, str(checkpoint / "optimizer.pt")],
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    groups = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(groups) == 1, groups
    return [tuple(shape) for shape in groups[0]]


@pytest.mark.slow
def test_galore_updates_the_targeted_weights_by_a_rank_r_matrix(tmp_path, tiny_model_dir, lowrank_env):
    """GaLore projects each targeted weight's gradient onto its top-r singular directions (the same ones
    until galore_update_interval) and the Adam step back: after two steps the change of every q_proj has
    rank <= galore_rank, while the other linear weights (plain AdamW) change at full rank; Adam's moments
    are r x n."""
    run = _train(tmp_path, tiny_model_dir, use_galore=True, galore_rank=RANK, galore_target="q_proj")
    ckpt = run / "checkpoints" / "checkpoint-2"
    deltas = _deltas(tiny_model_dir, ckpt)
    for layer in (0, 1):
        q = deltas[f"model.layers.{layer}.self_attn.q_proj.weight"]
        k = deltas[f"model.layers.{layer}.self_attn.k_proj.weight"]
        assert q.abs().max() > 0 and 0 < _rank(q) <= RANK
        assert _rank(k) > RANK
    shapes = _projected_states(ckpt, lowrank_env)
    assert len(shapes) == 2 and all(RANK in s and max(s) == 64 for s in shapes), shapes
    assert "use_galore: true" in (run / "config.yaml").read_text()


@pytest.mark.slow
def test_apollo_keeps_rank_r_moments_for_the_targeted_weights(tmp_path, tiny_model_dir, lowrank_env):
    """APOLLO keeps Adam's moments of a random rank-r projection of the gradient and scales the raw
    gradient by them channel by channel: the optimizer state of each targeted weight is r x n (not
    the weight's shape), and the targeted weights do change."""
    run = _train(tmp_path, tiny_model_dir, use_apollo=True, apollo_rank=RANK, apollo_target="q_proj")
    ckpt = run / "checkpoints" / "checkpoint-2"
    deltas = _deltas(tiny_model_dir, ckpt)
    assert all(deltas[f"model.layers.{i}.self_attn.q_proj.weight"].abs().max() > 0 for i in (0, 1))
    shapes = _projected_states(ckpt, lowrank_env)
    assert len(shapes) == 2 and all(RANK in s and max(s) == 64 for s in shapes), shapes


def test_without_the_packages_the_keys_are_refused_naming_the_install_command(tmp_path, tiny_model_dir):
    """The suite's own interpreter has neither package on its path and the side folder is empty: the same
    configs stop at check, naming the key, the package and the one command that installs them."""
    empty = {"COCKPIT_LOWRANK_SITE": str(tmp_path / "lowrank-site")}
    if side_site.available("galore_torch", empty) or side_site.available("apollo_torch", empty):
        pytest.skip("galore-torch / apollo-torch are on this interpreter's path")
    command = side_site.install_command(empty)
    assert command.endswith(f"--target {tmp_path / 'lowrank-site'} galore-torch==1.0 apollo-torch==1.0.3 bitsandbytes==0.50.2")
    for key, package in (("use_galore", "galore-torch"), ("use_apollo", "apollo-torch")):
        cfg = tiny_config(tmp_path, tiny_model_dir, key, finetuning_type="full", **{key: True})
        res = cockpit("check", str(cfg), env=empty)
        out = res.stdout + res.stderr
        assert res.returncode == 2 and f"{key}: " in out and f"needs the {package} package" in out, out
        assert f"install it with: {command}" in " ".join(out.split()), out


def test_the_install_command_pins_what_bootstrap_installs():
    """One set of versions: the side folder's command and scripts/constraints.txt (which bootstrap.sh reads)."""
    pins = (Path(__file__).resolve().parents[1] / "scripts" / "constraints.txt").read_text().splitlines()
    assert all(p in pins for p in side_site.PACKAGES), side_site.PACKAGES


_IMPORT_PEFT = "import sys, peft; print('bitsandbytes' in sys.modules)"


@pytest.mark.slow
def test_only_a_run_that_uses_them_gets_the_side_folder(tmp_path, lowrank_env):
    """The ranks' environment from the launch: a plain LoRA run's ``import peft`` does not import
    bitsandbytes (seconds per process, bench/lowrank_import.py); a use_galore run's has the side folder
    first on PYTHONPATH, where ``import peft`` does import it."""
    from cockpit.config import validate
    from cockpit.strategy.launch import node_launch

    def rank_env(**keys) -> dict:
        cfg = validate({"dataset": "cockpit_identity", **keys}, check_paths=False)
        (rank,) = node_launch(tmp_path, "r", cfg).ranks
        return {**os.environ, **{k: v for k, v in rank["env"].items() if k == "PYTHONPATH"}}

    def imports_bnb(env: dict) -> bool:
        res = subprocess.run([sys.executable, "-c", _IMPORT_PEFT], env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        return res.stdout.strip().splitlines()[-1] == "True"

    plain, galore = rank_env(), rank_env(use_galore=True, finetuning_type="full")
    assert plain.get("PYTHONPATH") == os.environ.get("PYTHONPATH")
    assert galore["PYTHONPATH"].split(os.pathsep)[0] == str(side_site.folder())
    assert not imports_bnb(plain)
    assert imports_bnb(galore)
