"""Issue 37: LLaMA-Factory's v1 trainer YAML (``USE_V1=1``: ``model:``, ``peft_config:``, ``dist_config:``,
``micro_batch_size:``, ``train_dataset:``) is recognised: read as v0 with a note when every key has one exact
v0 form, else refused once with the table of v0 keys, never as a list of unknown keys
(cockpit/config/lf_v1.py). Fixtures: LLaMA-Factory 0.9.5's own v1 examples with the model swapped
(tests/fixtures/llamafactory/v1/), and its v1 argument fields (lf_v1_keys.json, bench/lf_key_list.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import cockpit, read_events

LF = Path(__file__).resolve().parent / "fixtures" / "llamafactory"
V1 = LF / "v1"


def test_the_v1_keys_are_llamafactorys_and_the_v1_only_ones_are_no_v0_keys():
    from cockpit.config import lf_v1

    v1 = json.loads((LF / "lf_v1_keys.json").read_text())
    v0 = json.loads((LF / "lf_keys.json").read_text())["keys"]
    assert v1["llamafactory"] == "0.9.5" and set(v1["keys"]) == set(lf_v1.V1_KEYS)
    assert lf_v1.V1_ONLY == set(v1["keys"]) - set(v0)
    assert set(lf_v1.SAME) <= set(v0)
    assert set(lf_v1.V1_KEYS) - lf_v1.SAME == set(lf_v1.TABLE)  # every other key has its row


def test_llamafactorys_v1_lora_example_is_read_as_v0_with_a_note():
    """train_lora_sft.yaml: each v1 key to its v0 key, and v1's defaults where Cockpit's differ (a constant
    rate, torch AdamW's weight decay, bf16, activation checkpointing, logging every step)."""
    from cockpit.config import load_config

    cfg = load_config(V1 / "train_lora_sft.yaml", ["nproc_per_node=2"])
    expect = {
        "model_name_or_path": "smollm2-135m-instruct", "template": "qwen3_nothink", "finetuning_type": "lora",
        "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target": "all", "fsdp": "full_shard auto_wrap",
        "dataset": str(V1 / "data" / "identity.json"), "output_dir": str(Path.cwd() / "outputs" / "test_lora"),
        "per_device_train_batch_size": 1,
        "cutoff_len": 2048, "learning_rate": 1.0e-4, "max_steps": 10, "max_new_tokens": 128, "bf16": True,
        "gradient_checkpointing": True, "lr_scheduler_type": "constant", "weight_decay": 0.01, "logging_steps": 1,
        "optim": "adamw_torch",
    }  # fmt: skip
    assert {k: getattr(cfg, k) for k in expect} == expect
    (note,) = [n for n in cfg.notes if "LLaMA-Factory v1" in n]
    assert "peft_config -> finetuning_type, lora_rank, lora_alpha, lora_dropout, lora_target" in note
    assert "micro_batch_size -> per_device_train_batch_size" in note and "dist_config -> fsdp" in note
    assert "lr_scheduler_type: constant" in note and "weight_decay: 0.01" in note


def test_a_v1_file_with_a_key_without_one_v0_form_is_refused_once_with_the_table(tmp_path):
    """train_freeze_sft.yaml's global_batch_size depends on the processes v1's launcher starts: the file is
    refused once, at its first v1 key's line, listing every key with its v0 key; no key is "unknown"."""
    res = cockpit("check", str(V1 / "train_freeze_sft.yaml"))
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert f"{V1 / 'train_freeze_sft.yaml'}:1: a LLaMA-Factory v1 config (USE_V1=1)" in out
    assert "unknown key" not in out and out.count("LLaMA-Factory v1 config") == 1
    rows = {line.split("->")[0].strip(): line.split("->", 1)[1] for line in out.splitlines() if " -> " in line}
    assert set(rows) == set(yaml.safe_load((V1 / "train_freeze_sft.yaml").read_text()))
    assert rows["micro_batch_size"].strip() == "per_device_train_batch_size"
    assert rows["model"].strip() == "model_name_or_path"
    assert "[not read: depends on the processes" in rows["global_batch_size"]
    assert [k for k, v in rows.items() if "[not read" in v] == ["global_batch_size"]


def test_a_v0_config_is_not_taken_for_v1(tmp_path):
    """Keys both versions have (flash_attn, template, learning_rate, ...) do not make a file v1."""
    from cockpit.config import lf_v1

    assert not lf_v1.is_v1(yaml.safe_load((LF / "qwen3_lora_dpo.yaml").read_text()))
    assert not lf_v1.is_v1({"flash_attn": "sdpa", "template": "qwen3", "learning_rate": 1e-4, "max_steps": 3})
    assert lf_v1.is_v1({"micro_batch_size": 1})


@pytest.mark.slow
def test_a_v1_config_trains_two_steps_through_cockpit_train(tmp_path):
    """LLaMA-Factory's v1 LoRA example without its dist_config (one process), on the CPU: 2 steps of
    LoRA r16 on the embedded model, at v1's constant learning rate."""
    text = (V1 / "train_lora_sft.yaml").read_text()
    text = text.replace("dist_config:\n  name: fsdp2\n  dcp_path: null\n", "").replace(
        "data/v1_sft_demo.yaml", str(V1 / "data" / "v1_sft_demo.yaml")
    )
    text = text.replace("output_dir: ./outputs/test_lora", f"output_dir: {tmp_path / 'out'}")
    cfg = tmp_path / "v1_lora.yaml"
    cfg.write_text(text)
    res = cockpit(
        "train", str(cfg), "--runs-dir", str(tmp_path / "runs"), "--set", "max_steps=2", "--set", "cutoff_len=128",
        "--set", "bf16=false", "--set", "use_cpu=true", "--set", "probes=null", "--set", "save_steps=2",
        cwd=str(V1), timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2] and all(e["lr"] == pytest.approx(1e-4) for e in steps if "lr" in e)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["finetuning_type"] == "lora" and saved["lora_rank"] == 16 and saved["lr_scheduler_type"] == "constant"
    adapter = json.loads((tmp_path / "out" / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 16 and adapter["lora_alpha"] == 32


def test_llamafactorys_megatron_keys_are_refused_by_name_never_unknown():
    """examples/megatron/qwen3_moe_full.yaml's "mcore speed up" block (USE_MCA=1): each key is refused with
    the reason and the alternative, none is an unknown key; none of them is a v0 or a Cockpit key."""
    from cockpit.config import lf_v1, validate
    from cockpit.config.schema import SCHEMA
    from cockpit.errors import InputError

    block = yaml.safe_load(
        "tensor_model_parallel_size: 1\nsequence_parallel: false\npipeline_model_parallel_size: 4\n"
        "bias_activation_fusion: true\napply_rope_fusion: true\nuse_distributed_optimizer: true\n"
        "overlap_param_gather: true\noverlap_grad_reduce: true\nmoe_grouped_gemm: true\n"
        "moe_token_dispatcher_type: alltoall\nexpert_model_parallel_size: 2\nrecompute_granularity: full\n"
    )
    v0 = json.loads((LF / "lf_keys.json").read_text())["keys"]
    assert not lf_v1.MCORE_KEYS & (set(v0) | set(SCHEMA))
    with pytest.raises(InputError) as err:
        validate({"dataset": "cockpit_identity", **block}, file="moe.yaml", check_paths=False)
    messages = {p.key: p.message for p in err.value.problems}
    assert set(messages) == set(block)
    assert all(m.startswith("a Megatron-Core key (LLaMA-Factory's USE_MCA=1 mode") and "FSDP2" in m for m in messages.values())
