"""Config schema, YAML loading, overrides, and the errors users see."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cockpit.config import SCHEMA, load_config, parse_overrides, to_yaml
from cockpit.config.load import REDACTED, dump_resolved
from cockpit.config.schema import SCHEDULERS
from cockpit.errors import InputError


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def errors(path, overrides=None) -> str:
    with pytest.raises(InputError) as info:
        load_config(path, overrides)
    return str(info.value)


def test_defaults_filled_and_types(tmp_path):
    cfg = load_config(write(tmp_path, "dataset: cockpit_identity\nlearning_rate: 1e-4\nlora_rank: 4\n"))
    assert cfg.learning_rate == pytest.approx(1e-4)  # YAML 1.1 reads 1e-4 as a string
    assert cfg.lora_alpha == 8  # 2 x rank
    assert cfg.finetuning_type == "lora"
    assert set(SCHEMA) <= set(cfg.keys_only())


def test_llamafactory_example_loads_as_is(tmp_path):
    text = """### model
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
trust_remote_code: true
### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
### dataset
dataset: identity,alpaca_en_demo
template: qwen3_nothink
cutoff_len: 2048
max_samples: 1000
preprocessing_num_workers: 16
dataloader_num_workers: 4
### output
output_dir: saves/qwen3-4b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none  # choices: [none, wandb, tensorboard, swanlab, mlflow]
### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
resume_from_checkpoint: null
"""
    cfg = load_config(write(tmp_path, text))
    assert cfg.report_to == "none" and cfg.bf16 is True and cfg.ddp_timeout == 180000000


def test_unknown_key_did_you_mean_with_line(tmp_path):
    p = write(tmp_path, "dataset: x.json\nlora_rnak: 3\n")
    msg = errors(p)
    assert f"{p}:2: lora_rnak: unknown key (did you mean 'lora_rank'?)" in msg


def test_llamafactory_unsupported_key_is_an_error(tmp_path):
    msg = errors(write(tmp_path, "dataset: x\nshift_attn: true\n"))
    assert ":2: shift_attn: a LLaMA-Factory key that Cockpit refuses: LongLoRA" in msg


def test_type_and_range_errors_name_key_and_allowed_values(tmp_path):
    msg = errors(write(tmp_path, "dataset: x\nlora_rank: 0\nlr_scheduler_type: cosin\nbf16: maybe\n"))
    assert ":2: lora_rank: must be int >= 1" in msg
    assert ":3: lr_scheduler_type: must be one of linear | cosine" in msg
    assert ":4: bf16: must be true | false" in msg


def test_all_problems_listed_not_only_first(tmp_path):
    with pytest.raises(InputError) as info:
        load_config(write(tmp_path, "dataset: x\nlora_rank: -1\nlearning_rate: abc\nfoo: 1\n"))
    assert len(info.value.problems) == 3


def test_conflicting_precision(tmp_path):
    assert "bf16 and fp16 are both true" in errors(write(tmp_path, "dataset: x\nbf16: true\nfp16: true\n"))


def test_python_tag_refused(tmp_path):
    msg = errors(write(tmp_path, 'dataset: !!python/object/apply:os.system ["touch /tmp/pwned"]\n'))
    assert "refused" in msg and ":1" in msg


def test_broken_yaml_and_duplicates_and_non_mapping(tmp_path):
    assert "invalid YAML" in errors(write(tmp_path, "dataset: [unclosed\n"))
    assert "duplicate key 'dataset'" in errors(write(tmp_path, "dataset: a\ndataset: b\n", "d.yaml"))
    assert "expected a mapping" in errors(write(tmp_path, "- a\n- b\n", "l.yaml"))


def test_missing_file_directory_and_encoding(tmp_path):
    assert "no such file" in errors(tmp_path / "nope.yaml")
    assert "is a directory" in errors(tmp_path)
    p = tmp_path / "latin1.yaml"
    p.write_bytes("dataset: caf\xe9\n".encode("latin-1"))
    assert "not UTF-8" in errors(p)


def test_bom_and_crlf_accepted(tmp_path):
    p = tmp_path / "bom.yaml"
    p.write_bytes(b"\xef\xbb\xbfdataset: cockpit_identity\r\nlora_rank: 4\r\n")
    assert load_config(p).lora_rank == 4


def test_overrides_are_typed_and_named(tmp_path):
    p = write(tmp_path, "dataset: x\n")
    cfg = load_config(p, ["lora_rank=32", "bf16=true", "learning_rate=2e-4", "env={NCCL_DEBUG: INFO}"])
    assert cfg.lora_rank == 32 and cfg.bf16 is True and cfg.learning_rate == pytest.approx(2e-4)
    assert cfg.env == {"NCCL_DEBUG": "INFO"}
    msg = errors(p, ["lora_rank=many"])
    assert "--set: lora_rank: must be int" in msg
    with pytest.raises(InputError):
        parse_overrides(["novalue"])


def test_missing_paths_named(tmp_path):
    msg = errors(write(tmp_path, "dataset: x\nprobes: nope.jsonl\ndeepspeed: ds.json\n"))
    assert "probes: no such file" in msg and "deepspeed: no such file" in msg


def test_secrets_redacted_in_resolved_config(tmp_path):
    cfg = load_config(write(tmp_path, "dataset: x\nenv:\n  HF_TOKEN: hf_planted_secret\n  NCCL_DEBUG: INFO\n  MY_API_KEY: k123\n"))
    text = dump_resolved(cfg)
    assert "hf_planted_secret" not in text and "k123" not in text
    assert REDACTED in text and "NCCL_DEBUG: INFO" in text


def test_preset_roundtrip(tmp_path):
    cfg = load_config(write(tmp_path, "dataset: cockpit_identity\nlora_rank: 4\nlearning_rate: 0.001\n"))
    again = load_config(write(tmp_path, to_yaml(cfg), "again.yaml"))
    assert again.lora_rank == 4 and again.learning_rate == pytest.approx(0.001)


def test_schedulers_match_transformers():
    from transformers import SchedulerType

    assert set(SCHEDULERS) == {s.value for s in SchedulerType}


def test_presets_validate():
    root = Path(__file__).resolve().parent.parent / "presets"
    for p in sorted(root.glob("*.yaml")):
        load_config(p)
