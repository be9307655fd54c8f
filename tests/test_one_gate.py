"""One gate: what a rank would refuse a config for, ``cockpit check`` and ``cockpit train`` refuse
first (exit 2, the key, the reason), and no run dir is made (issue 49).

The CLI runs in-process (``cockpit.cli.main``); the refusals come before any model is loaded.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import TINY_CONFIG, write_yaml

from cockpit.cli import main
from cockpit.config.run_config import RunConfig
from cockpit.errors import InputError
from cockpit.preflight import environment
from cockpit.preflight.checks import static_checks


def _config(tmp_path: Path, **over) -> Path:
    cfg = {**TINY_CONFIG, "probes": None, "max_steps": 1, **over}
    return write_yaml(tmp_path / "c.yaml", cfg)


def _both_refuse(tmp_path: Path, cfg: Path, capsys, *expected: str) -> None:
    """exit 2 naming ``expected`` at ``check`` and at ``train``, and no run dir."""
    runs = tmp_path / "runs"
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert all(e in err for e in expected), err
    assert main(["train", str(cfg), "--runs-dir", str(runs), "--detach"]) == 2
    err = capsys.readouterr().err
    assert all(e in err for e in expected), err
    assert not runs.exists() or not [p for p in runs.iterdir() if p.name != "queue"], list(runs.iterdir())
    assert main(["check", str(cfg), "--json", "--no-devices"]) == 2  # the cockpit's Setup (ui/cli_calls.py)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not out["ok"] and all(any(e in p for p in out["problems"]) for e in expected), out
    assert main(["queue", "--runs-dir", str(runs), "add", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert all(e in err for e in expected), err
    entries = runs / "queue" / "entries.json"
    assert not entries.exists() or not json.loads(entries.read_text()).get("entries"), entries.read_text()


def test_liger_on_the_cpu_is_refused_before_a_run_dir(tmp_path, capsys):
    _both_refuse(tmp_path, _config(tmp_path, enable_liger_kernel=True), capsys, "enable_liger_kernel", "need a GPU")


def test_torch_compile_without_a_compiler_is_refused_before_a_run_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no g++ / clang++ there
    _both_refuse(tmp_path, _config(tmp_path, torch_compile=True), capsys, "torch_compile", "C++ compiler")


def test_output_dir_naming_a_file_is_refused_before_a_run_dir(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file\n")
    cfg = _config(tmp_path, output_dir=str(tmp_path / "taken"))
    _both_refuse(tmp_path, cfg, capsys, "output_dir", "is a file, not a folder")
    cfg = _config(tmp_path, output_dir=str(tmp_path / "taken" / "out"))  # under a file: cannot be created
    _both_refuse(tmp_path, cfg, capsys, "output_dir", "cannot create")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_output_dir_that_cannot_be_written_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(InputError, match="output_dir.*not writable"):
            static_checks(RunConfig(output_dir=str(locked / "out")))
    finally:
        locked.chmod(0o700)
    assert environment.output_dir_refusal(RunConfig(output_dir=str(tmp_path / "new" / "deeper"))) is None


def test_images_in_a_text_sft_row_is_a_bad_row_with_file_and_line(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    rows = [
        {"instruction": "hi", "output": "hello"},
        {"instruction": "what is in <image>?", "output": "a cat", "images": ["cat.png"]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _config(tmp_path, dataset=str(data), template=None)
    _both_refuse(tmp_path, cfg, capsys, f"{data}:2", "images", "no such image 'cat.png'")


def test_the_gate_decides_the_device_as_the_ranks_do():
    """use_cpu unset: the CPU where no GPU is visible (refused), a GPU where one is (not for that reason)."""
    cfg = RunConfig(enable_liger_kernel=True)
    assert any("need a GPU" in p.message for p in environment.gate_problems(cfg, gpus=0))
    assert not any("need a GPU" in p.message for p in environment.gate_problems(cfg, gpus=1))
    # a config that needs GPUs where none is visible: the device's own refusal, not a kernel's
    problems = environment.gate_problems(cfg.replace(use_cpu=False), gpus=0)
    assert problems and problems[0].key == "use_cpu"
    # nothing device-dependent asked for: torch's GPU count is never asked (no torch import)
    assert environment.gate_problems(RunConfig(learning_rate=1e-4), gpus=None) == []


# -- what the key sweep (tests/test_key_sweep.py) found ------------------------------------------
def test_new_tokens_with_lora_in_a_trl_stage_are_refused_at_check():
    """kto + LoRA + add_special_tokens passed check and failed in the rank (TRL's fused LM head reads
    lm_head.bias off PEFT's TrainableTokensWrapper); sft, and full fine-tuning, keep them."""
    from cockpit.config.load import validate

    for stage in ("dpo", "kto", "grpo"):
        extra = {"reward_funcs": "exact_match", "num_generations": 2} if stage == "grpo" else {}
        with pytest.raises(InputError, match="add_special_tokens.*fused LM head"):
            validate({"dataset": "x.json", "stage": stage, "add_special_tokens": "<x>", **extra}, check_paths=False)
    validate({"dataset": "x.json", "stage": "kto", "finetuning_type": "full", "add_special_tokens": "<x>"}, check_paths=False)
    validate({"dataset": "x.json", "add_special_tokens": "<x>"}, check_paths=False)


def test_early_stopping_says_why_without_a_best_metric():
    """metric_for_best_model eval_accuracy, no best metric recorded yet: the stop's words crashed the
    rank (format of None), found by the key sweep's eval run."""
    from types import SimpleNamespace

    from transformers import TrainerControl

    from cockpit.config.run_config import RunConfig
    from cockpit.train.stopping import early_stopping_callbacks

    said: list[str] = []
    cb = early_stopping_callbacks(RunConfig(early_stopping_steps=1), None, said.append)[0]
    args = SimpleNamespace(metric_for_best_model="accuracy", greater_is_better=True, load_best_model_at_end=True,
                           eval_strategy="steps", save_strategy="steps")
    state = SimpleNamespace(global_step=2, best_metric=None, best_model_checkpoint=None)
    control = TrainerControl()
    cb.early_stopping_patience_counter = 1  # the patience is spent at this evaluation
    cb.check_metric_value = lambda *a: None  # no improvement
    cb.on_evaluate(args, state, control, {"eval_accuracy": 0.1})
    assert control.should_training_stop and said and "eval_accuracy has not improved" in said[0]
    assert "best" not in said[0]


def test_a_schedule_missing_its_required_kwargs_is_refused_at_check():
    """lr_scheduler_type warmup_stable_decay without num_decay_steps passed check and failed in the rank
    (get_wsd_schedule() missing 'num_decay_steps'); cosine_with_min_lr without min_lr(_rate) the same."""
    from cockpit.config.load import validate

    base = {"dataset": "x.json"}
    with pytest.raises(InputError, match="lr_scheduler_type: lr_scheduler_type warmup_stable_decay needs num_decay_steps"):
        validate({**base, "lr_scheduler_type": "warmup_stable_decay"}, check_paths=False)
    with pytest.raises(InputError, match="needs min_lr or min_lr_rate"):
        validate({**base, "lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"num_cycles": 0.5}}, check_paths=False)
    with pytest.raises(InputError, match="lr_scheduler_kwargs: .*set only one of min_lr or min_lr_rate"):
        validate({**base, "lr_scheduler_type": "cosine_warmup_with_min_lr",
                  "lr_scheduler_kwargs": {"min_lr": 1e-6, "min_lr_rate": 0.1}}, check_paths=False)
    validate({**base, "lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": 1}}, check_paths=False)
    validate({**base, "lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1}}, check_paths=False)
    for kind in ("reduce_lr_on_plateau", "greedy"):  # "requires an eval strategy" in the rank
        with pytest.raises(InputError, match=f"lr_scheduler_type: lr_scheduler_type {kind} steps on the evaluation loss"):
            validate({**base, "lr_scheduler_type": kind}, check_paths=False)
        with pytest.raises(InputError, match="evaluation loss"):
            validate({**base, "lr_scheduler_type": kind, "val_size": 2, "eval_strategy": "no"}, check_paths=False)
        validate({**base, "lr_scheduler_type": kind, "val_size": 2}, check_paths=False)


def test_a_slurm_job_is_gated_on_its_nodes_not_the_login_node(monkeypatch):
    """``cockpit train --slurm``: the gate counts the job's GPUs (the script asks for GPUs on a GPU
    cluster), so Liger is not refused for "the CPU" on a login node without GPUs."""
    import argparse

    from cockpit.commands.train import job_gpus
    from cockpit.slurm import script

    monkeypatch.setattr(script, "cluster_has_gpus", lambda *a, **k: True)
    cfg = RunConfig(enable_liger_kernel=True)
    assert job_gpus(argparse.Namespace(slurm=True), cfg) == 1
    assert job_gpus(argparse.Namespace(slurm=True), cfg.replace(use_cpu=True)) == 0
    assert job_gpus(argparse.Namespace(slurm=False), cfg) is None  # a run here: this machine's count
    assert not any("need a GPU" in p.message for p in environment.gate_problems(cfg, gpus=1))
