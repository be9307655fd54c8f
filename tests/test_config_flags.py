"""LLaMA-Factory's flag form on cockpit train / check / plan (issue 20 item 1)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from conftest import cockpit, read_events, write_yaml

# The guide's command as pasted (after `llamafactory-cli train`), with the model and dataset
# swapped for ones available here, plus the two flags the issue adds for a CPU run.
GUIDE = (
    "--model_name_or_path {model} --do_train "
    "--dataset cockpit_bilingual --template llama3 --finetuning_type lora --lora_target_modules all "
    "--output_dir ./saves/llama3-lora --per_device_train_batch_size 2 --gradient_accumulation_steps 4 "
    "--lr_scheduler_type cosine --logging_steps 10 --save_steps 100 --learning_rate 5e-5 "
    "--num_train_epochs 3.0 --plot_loss --fp16 --gradient_checkpointing true --deepspeed ds_config.json "
    "--use_cpu true --max_steps 2"
)
# The same run as a YAML file (LLaMA-Factory's other form).
GUIDE_YAML = {
    "do_train": True, "dataset": "cockpit_bilingual", "template": "llama3", "finetuning_type": "lora",
    "lora_target": "all", "output_dir": "./saves/llama3-lora", "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4, "lr_scheduler_type": "cosine", "logging_steps": 10, "save_steps": 100,
    "learning_rate": 5e-5, "num_train_epochs": 3.0, "plot_loss": True, "gradient_checkpointing": True,
    "fp16": True, "deepspeed": "ds_config.json", "use_cpu": True, "max_steps": 2,
}
# LLaMA-Factory's examples/deepspeed/ds_z2_config.json (HF fills the "auto" values).
DS_Z2 = {
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8, "overlap_comm": False,
                          "reduce_scatter": True, "reduce_bucket_size": 5e8, "contiguous_gradients": True, "round_robin_gradients": True},
}


def guide_argv(model: str, *, drop: tuple[str, ...] = ()) -> list[str]:
    argv = shlex.split(GUIDE.format(model=model))
    return [a for a in argv if a not in drop]


def resolved(argv: list[str], cwd: Path, monkeypatch) -> dict:
    """The resolved config `cockpit check ARGV` would validate, as config.yaml holds it."""
    from cockpit.cli import parse_args
    from cockpit.commands.common import config_from_args
    from cockpit.config import dump_resolved

    monkeypatch.chdir(cwd)
    cfg = config_from_args(parse_args(["check", *argv]))
    return yaml.safe_load(dump_resolved(cfg))


# -- splitting the command line -----------------------------------------------------------------
def test_split_takes_the_config_flags_out_and_leaves_the_commands_own():
    from cockpit.config.flags import split_config_flags

    own = {"--set": True, "--json": False, "--runs-dir": True, "-h": False}
    rest, flags = split_config_flags(
        ["my.yaml", "--do_train", "--dataset", "a,b", "--set", "seed=1", "--max_steps", "-1", "--json",
         "--plot_loss", "--gradient_checkpointing", "false", "--learning-rate=1e-4", "--runs-dir", "/r", "--bf16"],
        own,
    )
    assert rest == ["my.yaml", "--set", "seed=1", "--json", "--runs-dir", "/r"]
    assert [(f.flag, f.key, f.value) for f in flags] == [
        ("--do_train", "do_train", True),
        ("--dataset", "dataset", "a,b"),
        ("--max_steps", "max_steps", "-1"),
        ("--plot_loss", "plot_loss", True),
        ("--gradient_checkpointing", "gradient_checkpointing", "false"),
        ("--learning-rate", "learning_rate", "1e-4"),
        ("--bf16", "bf16", True),
    ]


def test_a_flag_that_needs_a_value_and_has_none_is_named():
    from cockpit.config.flags import split_config_flags
    from cockpit.errors import InputError

    with pytest.raises(InputError, match="--dataset: expects a value"):
        split_config_flags(["--dataset", "--do_train"], {})


# -- the same resolved config whichever form ------------------------------------------------------
def test_flags_yaml_and_mixed_forms_resolve_to_the_same_config(tmp_path, tiny_model_dir, monkeypatch):
    (tmp_path / "ds_config.json").write_text(json.dumps(DS_Z2))
    argv = guide_argv(str(tiny_model_dir))
    from_flags = resolved(argv, tmp_path, monkeypatch)
    full = write_yaml(tmp_path / "guide.yaml", {"model_name_or_path": str(tiny_model_dir), **GUIDE_YAML})
    from_yaml = resolved([str(full)], tmp_path, monkeypatch)
    # a YAML file with other values, overridden by the flags (as --set does)
    half = write_yaml(tmp_path / "half.yaml", {**GUIDE_YAML, "learning_rate": 1.0, "lora_target": "q_proj", "max_steps": 50})
    mixed = resolved([str(half), "--model_name_or_path", str(tiny_model_dir), "--learning_rate", "5e-5",
                      "--lora_target_modules", "all", "--max_steps", "2"], tmp_path, monkeypatch)
    assert from_flags == from_yaml == mixed
    assert from_flags["lora_target"] == "all" and from_flags["learning_rate"] == 5e-5
    assert from_flags["gradient_checkpointing"] is True and from_flags["plot_loss"] is True
    assert from_flags["output_dir"] == str(tmp_path / "saves" / "llama3-lora")
    assert from_flags["deepspeed"] == str(tmp_path / "ds_config.json")


def test_set_overrides_a_flag_and_a_flag_overrides_the_yaml(tmp_path, tiny_model_dir, monkeypatch):
    base = write_yaml(tmp_path / "b.yaml", {"model_name_or_path": str(tiny_model_dir), "dataset": "cockpit_identity", "lora_rank": 4, "seed": 1})
    cfg = resolved([str(base), "--lora_rank", "16", "--seed", "2", "--set", "seed=3"], tmp_path, monkeypatch)
    assert (cfg["lora_rank"], cfg["seed"], cfg["lora_alpha"]) == (16, 3, 32)


# -- errors name the flag -------------------------------------------------------------------------
def test_bad_flags_exit_2_naming_each_flag(tmp_path, tiny_model_dir):
    res = cockpit("check", "--model_name_or_path", str(tiny_model_dir), "--dataset", "cockpit_identity",
                  "--learning_rate", "fast", "--lora-rank", "0", "--do_predict", "--cutoff_lenn", "64", cwd=str(tmp_path))
    assert res.returncode == 2, res.stdout + res.stderr
    err = res.stderr
    assert "--learning_rate: must be float > 0" in err and "'fast'" in err
    assert "--lora-rank: must be int >= 1" in err
    assert "--do_predict: needs predict_with_generate: true" in err
    assert "--cutoff_lenn: unknown key (did you mean 'cutoff_len'?)" in err


def test_fp16_on_the_cpu_is_a_warning_not_a_refusal(tmp_path, tiny_model_dir):
    """The guide's --fp16 with --use_cpu true: the preflight says the CPU run trains in fp32
    (DeepSpeed's CPU accelerator would raise 'Type fp16 is not supported on your device')."""
    from cockpit.config.run_config import RunConfig
    from cockpit.device import CPU, GPU, FP16_ON_CPU, cpu_precision
    from cockpit.preflight.checks import device_checks

    assert any(w == f"fp16: {FP16_ON_CPU}" for w in device_checks(RunConfig(use_cpu=True, fp16=True, nproc_per_node=1)))
    assert cpu_precision({"fp16": True}, CPU) == ({"fp16": False}, FP16_ON_CPU)
    assert cpu_precision({"fp16": True}, GPU) == ({"fp16": True}, None)


def test_alias_and_its_key_both_given_is_an_error(tmp_path, tiny_model_dir, monkeypatch):
    from cockpit.errors import InputError

    cfg = write_yaml(tmp_path / "a.yaml", {"model_name_or_path": str(tiny_model_dir), "dataset": "cockpit_identity",
                                           "lora_target": "all", "lora_target_modules": "q_proj"})
    with pytest.raises(InputError, match="lora_target_modules: is another spelling of lora_target"):
        resolved([str(cfg)], tmp_path, monkeypatch)


def test_no_config_and_no_flags_is_bad_input(tmp_path):
    res = cockpit("check", cwd=str(tmp_path))
    assert res.returncode == 2 and "give a YAML config, or the config as flags" in res.stderr


def test_other_commands_still_refuse_unknown_arguments(tmp_path):
    res = cockpit("runs", "--runs-dir", str(tmp_path), "--model_name_or_path", "x")
    assert res.returncode == 2 and "unrecognized arguments" in res.stderr


# -- plan -------------------------------------------------------------------------------------------
def test_plan_takes_the_flag_form_and_agrees_with_the_yaml_form(tmp_path, tiny_model_dir):
    keys = {"model_name_or_path": str(tiny_model_dir), "dataset": "cockpit_identity", "lora_target": "q_proj,v_proj",
            "per_device_train_batch_size": 4, "cutoff_len": 256, "gradient_checkpointing": True}
    cfg = write_yaml(tmp_path / "p.yaml", keys)
    by_yaml = cockpit("plan", str(cfg), "--json", "--gpu-memory", "64", cwd=str(tmp_path))
    by_flags = cockpit("plan", "--json", "--gpu-memory", "64", "--model_name_or_path", str(tiny_model_dir),
                       "--dataset", "cockpit_identity", "--lora_target_modules", "q_proj,v_proj",
                       "--per_device_train_batch_size", "4", "--cutoff_len", "256", "--gradient_checkpointing", cwd=str(tmp_path))
    assert by_yaml.returncode == by_flags.returncode == 0, by_yaml.stderr + by_flags.stderr
    a, b = json.loads(by_yaml.stdout), json.loads(by_flags.stdout)
    assert a["peak_bytes"] == b["peak_bytes"] and a["params"] == b["params"]
    bad = cockpit("plan", "--model_name_or_path", str(tiny_model_dir), "--cutoff_len", "lots", cwd=str(tmp_path))
    assert bad.returncode == 2 and "--cutoff_len: must be int" in bad.stderr


# -- the guide's command, trained -----------------------------------------------------------------
@pytest.mark.slow
def test_the_guides_command_trains_as_pasted_and_saves_the_same_config(tmp_path, tiny_model_dir, monkeypatch):
    """llamafactory-cli train's flags on `cockpit train`: a model and a dataset here (the tiny
    Llama: the embedded 135M model with gradient checkpointing under DeepSpeed took minutes on a
    loaded 2-core machine), --use_cpu true --max_steps 2, the guide's DeepSpeed ZeRO-2 file;
    --fp16 as pasted (the CPU trains in fp32 and says so once, as a warn alert). Two steps train;
    config.yaml equals the YAML form's resolved config (fp16: true, what the user asked for)."""
    (tmp_path / "ds_config.json").write_text(json.dumps(DS_Z2))
    argv = guide_argv(str(tiny_model_dir))
    res = cockpit("train", *argv, "--runs-dir", str(tmp_path / "runs"), cwd=str(tmp_path), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("lora_target_modules is read as lora_target") == 1
    run = next((tmp_path / "runs").iterdir())
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert steps and steps[0]["step"] == 1  # logging_steps 10: the first step is logged, the last is in the summary
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == 2
    assert (tmp_path / "saves" / "llama3-lora" / "adapter" / "adapter_config.json").exists()
    assert (run / "ds_config.json").exists()
    assert json.loads((run / "ds_config.json").read_text())["fp16"]["enabled"] is False  # HF filled "auto" from fp32
    fp16 = [e for e in read_events(run) if e["kind"] == "alert" and e["code"] == "fp16_on_cpu"]
    assert len(fp16) == 1 and fp16[0]["level"] == "warn" and "trains in fp32" in fp16[0]["message"]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    yaml_form = write_yaml(tmp_path / "guide.yaml", {"model_name_or_path": str(tiny_model_dir), **GUIDE_YAML, "master_port": saved["master_port"]})
    assert resolved([str(yaml_form)], tmp_path, monkeypatch) == saved
