"""The typed run config (issue 30, section 3): ``validate()`` returns a frozen ``RunConfig`` generated
from the key table, with the derived answers computed once; the planner, the supervisor and the ranks
read it; the planner has no defaults table of its own and refuses what ``cockpit check`` refuses."""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import yaml

from cockpit.config import dump_resolved, load_config, validate
from cockpit.config.run_config import KEY_NAMES, RunConfig
from cockpit.config.run_config_keys import RunConfigKeys
from cockpit.config.schema import KEYS
from cockpit.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted((ROOT / "presets").glob("*.yaml"))
HUB_MODEL = {"model_name_or_path": "meta-llama/Llama-3.1-8B", "dataset": "alpaca_en_demo"}


def test_the_generated_fields_are_current():
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_run_config.py"), "--check"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert KEY_NAMES == tuple(k.name for k in KEYS)


def _conforms(value, hint) -> bool:
    """A value against a field's annotation (str | None, Literal[...], dict[str, str], ...)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if origin is dict:
        return isinstance(value, dict)
    if hint is float:
        return isinstance(value, float)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_presets_validated_values_have_their_fields_types(preset, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(preset, check_paths=False)
    assert isinstance(cfg, RunConfig)
    hints = typing.get_type_hints(RunConfigKeys)
    wrong = {k: getattr(cfg, k) for k in KEY_NAMES if not _conforms(getattr(cfg, k), hints[k])}
    assert not wrong, f"values that do not match their field's type: {wrong}"


def test_the_config_is_frozen_and_a_change_is_a_new_config():
    cfg = validate(HUB_MODEL, check_paths=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cutoff_len = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg["cutoff_len"] = 8  # type: ignore[index]
    longer = cfg.replace(cutoff_len=4096)
    assert (cfg.cutoff_len, longer.cutoff_len) == (1024, 4096)
    assert cfg.cutoff_len == 1024
    assert not isinstance(cfg, Mapping)  # read by attribute: a key's typo is an AttributeError, not a None
    with pytest.raises(AttributeError):
        cfg.get("cutoff_len")  # type: ignore[attr-defined]


def test_the_flat_mapping_is_the_config_with_its_base_dir_and_notes(tmp_path):
    cfg = validate({**HUB_MODEL, "lora_target_modules": "q_proj"}, check_paths=False, base_dir=tmp_path)
    flat = cfg.mapping()
    assert set(flat) == set(KEY_NAMES) | {"_base_dir", "_notes"}
    assert flat["_base_dir"] == str(tmp_path.resolve()) == cfg.base_dir
    assert any("lora_target" in n for n in flat["_notes"])  # the alias said once
    assert RunConfig.from_mapping(flat) == cfg
    assert validate(cfg, check_paths=False) == cfg.replace(base_dir=str(Path.cwd()), notes=())


@pytest.mark.parametrize(
    ("keys", "world", "precision", "strategy", "sharded"),
    [
        ({}, 1, "fp32", "single process", False),
        ({"nproc_per_node": 4, "nnodes": 2, "master_port": 29500, "bf16": True}, 8, "bf16", "DDP", False),
        ({"nproc_per_node": 8, "zero_stage": 3, "bf16": True}, 8, "bf16", "deepspeed ZeRO-3", True),
        ({"nproc_per_node": 8, "zero_stage": 2, "fp16": True}, 8, "fp16", "deepspeed ZeRO-2", False),
        ({"nproc_per_node": 2, "fsdp": "full_shard", "finetuning_type": "full"}, 2, "fp32", "FSDP2 (full_shard)", True),
    ],
)
def test_the_derived_answers_come_from_the_keys(keys, world, precision, strategy, sharded):
    cfg = validate({**HUB_MODEL, **keys}, check_paths=False)
    assert (cfg.world_size, cfg.precision, cfg.strategy, cfg.sharded) == (world, precision, strategy, sharded)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_a_run_dirs_config_reads_back_as_the_config_that_was_written(preset, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(preset, check_paths=False)
    back = RunConfig.from_resolved(yaml.safe_load(dump_resolved(cfg)))
    assert back.keys_only() == cfg.keys_only()


def test_an_old_run_dirs_dropped_key_does_not_stop_it_being_read():
    back = RunConfig.from_resolved({"model_name_or_path": "m", "a_key_cockpit_no_longer_has": 1})
    assert back.model_name_or_path == "m" and back.cutoff_len == 1024


# -- the planner reads the same config --------------------------------------------------------------
def test_the_planner_refuses_what_cockpit_check_refuses_with_the_same_words():
    from cockpit.plan import plan

    raw = {**HUB_MODEL, "fsdp": "hybrid_shard_zero2", "nproc_per_node": 2, "finetuning_type": "full"}
    with pytest.raises(InputError) as checked:
        validate(raw, check_paths=False)
    with pytest.raises(InputError) as planned:
        plan(raw, gpu_memory_gb=192)
    assert [str(p) for p in planned.value.problems] == [str(p) for p in checked.value.problems]
    assert "hybrid_shard_zero2" in str(planned.value)


def test_the_planner_needs_no_dataset_and_no_package_of_the_machine_it_plans_for():
    from cockpit.plan import plan

    res = plan({"model_name_or_path": "meta-llama/Llama-3.1-8B", "optim": "adamw_8bit"}, gpu_memory_gb=192)
    assert res.run.optim == "adamw_8bit" and res.verdict["status"] == "fits"


def test_the_planner_reads_the_schemas_defaults():
    from cockpit.plan import plan
    from cockpit.plan import spec

    assert not hasattr(spec, "DEFAULTS")
    run = plan({"model_name_or_path": "meta-llama/Llama-3.1-8B"}).run
    defaults = validate(HUB_MODEL, check_paths=False)
    assert (run.lora_rank, run.cutoff_len, run.micro_batch, run.lora_target) == (
        defaults.lora_rank,
        defaults.cutoff_len,
        defaults.per_device_train_batch_size,
        defaults.lora_target,
    )
    assert run.double_quantization is defaults.double_quantization
