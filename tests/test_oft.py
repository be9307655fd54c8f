"""Issue 37: ``finetuning_type: oft`` as LLaMA-Factory builds it (PEFT's OFTConfig with ``oft_rank``,
``oft_block_size``, ``module_dropout``, ``additional_target``; the targets of ``oft_target``, else
``lora_target``'s): only OFT's blocks train, a few steps change them, and the saved adapter goes
through ``cockpit export --merge`` like a LoRA one; what it is not built for is refused by name."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import cockpit, tiny_config


def cfg_for(model_dir: Path, **over):
    from cockpit.config import validate

    return validate({"model_name_or_path": str(model_dir), "dataset": "cockpit_identity", "use_cpu": True,
                     "template": "chatml", "finetuning_type": "oft", "cutoff_len": 64, "max_steps": 3,
                     "per_device_train_batch_size": 4, "learning_rate": 1e-2, "logging_steps": 1,
                     "save_strategy": "no", **over})


def refused(match: str, **over):
    from cockpit.config import validate
    from cockpit.errors import InputError

    with pytest.raises(InputError, match=match):
        validate({"dataset": "cockpit_identity", **over}, check_paths=False)


def test_oft_refuses_what_it_is_not_built_for():
    refused("oft_block_size: an OFT key: needs finetuning_type: oft, got lora", oft_block_size=16)
    refused("module_dropout: an OFT key: needs finetuning_type: oft, got full", finetuning_type="full",
            module_dropout=0.1)
    refused("oft_rank: OFT needs exactly one of oft_rank \\(4\\) and oft_block_size \\(32\\)", finetuning_type="oft",
            oft_rank=4)
    refused("oft_block_size: OFT needs exactly one of", finetuning_type="oft", oft_block_size=0)
    refused("finetuning_type: finetuning_type oft is built for sft; stage dpo", finetuning_type="oft", stage="dpo")
    refused("zero_stage: finetuning_type oft: not built for OFT yet", finetuning_type="oft", zero_stage=2,
            nproc_per_node=2)
    refused("fsdp: finetuning_type oft: not built for OFT yet", finetuning_type="oft", fsdp="full_shard",
            nproc_per_node=2)
    refused("adapter_name_or_path: finetuning_type oft: an existing adapter is loaded for LoRA only",
            finetuning_type="oft", adapter_name_or_path="/tmp")
    refused("use_dora: a LoRA variant: needs finetuning_type: lora, got oft", finetuning_type="oft", use_dora=True)
    refused("quantization_bit needs finetuning_type: lora", finetuning_type="oft", quantization_bit=4)
    from cockpit.config import validate

    ok = validate({"dataset": "cockpit_identity", "finetuning_type": "oft", "oft_rank": 2, "oft_block_size": 0,
                   "additional_target": "embed_tokens", "nproc_per_node": 2}, check_paths=False)
    assert ok.finetuning_type == "oft" and ok.oft_rank == 2
    # a resolved config (config.yaml, every key at its value) validates again, OFT or not
    assert validate(ok, check_paths=False).oft_rank == 2
    plain = validate({"dataset": "cockpit_identity"}, check_paths=False)
    assert validate(plain, check_paths=False).finetuning_type == "lora"


@pytest.mark.parametrize(("over", "block"), [({}, lambda i: 32), ({"oft_rank": 4, "oft_block_size": 0}, lambda i: i // 4)],
                         ids=["block-size", "rank"])
def test_only_ofts_blocks_train_and_three_steps_change_them(tmp_path, tiny_model_dir, over, block):
    """The tiny Llama (hidden 64, MLP 128): every linear layer but the head gets an OFT block matrix,
    in_features / block blocks of block x (block - 1) / 2 parameters each (oft_rank: rank blocks of
    in_features / rank); nothing else trains; after
    three steps the blocks moved and the loss is finite."""
    import torch

    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.arguments import training_arguments
    from cockpit.train.model import build_model
    from cockpit.train.recipes.sft import sft_trainer
    from cockpit.train.trainer import CockpitTrainer

    cfg = cfg_for(tiny_model_dir, **over)
    ref = resolve_model(cfg.model_name_or_path, log=lambda *_: None)
    tok = load_tokenizer(cfg, ref, log=lambda *_: None)
    model = build_model(cfg, ref, True, 0)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".oft_R." in n for n in trained)
    in_features = {"q_proj": 64, "k_proj": 64, "v_proj": 64, "o_proj": 64, "gate_proj": 64, "up_proj": 64,
                   "down_proj": 128}
    want = 2 * sum(i // block(i) * block(i) * (block(i) - 1) // 2 for i in in_features.values())  # 2 layers
    assert sum(p.numel() for p in trained.values()) == want
    before = {n: p.detach().clone() for n, p in trained.items()}
    args = training_arguments(cfg, {"checkpoints": tmp_path / "ck"}, True, 1)
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).trainable][:12]
    trainer = sft_trainer(CockpitTrainer, cfg, model, args, tok, rows)
    out = trainer.train()
    assert out.global_step == 3 and math.isfinite(out.training_loss)
    assert all(not torch.equal(p.detach(), before[n]) for n, p in trained.items())


def test_oft_target_picks_the_modules_and_lora_target_stands_in_for_it(tmp_path, tiny_model_dir):
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model

    for over, modules in (({"oft_target": "q_proj,v_proj"}, {"q_proj", "v_proj"}),
                          ({"lora_target": "down_proj"}, {"down_proj"})):
        cfg = cfg_for(tiny_model_dir, **over)
        model = build_model(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0)
        adapted = {n.split(".oft_R.")[0].rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad}
        assert adapted == modules


@pytest.mark.slow
def test_an_oft_run_saves_its_adapter_and_export_merges_it(tmp_path, tiny_model_dir):
    """Through the CLI: the run saves a PEFT OFT adapter, ``cockpit export --merge`` merges it into the
    base (the same path as LoRA's), and the merged model's logits are the base + adapter's."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    runs = tmp_path / "runs"
    cfg = tiny_config(tmp_path, tiny_model_dir, finetuning_type="oft", max_steps=3, save_steps=3, probes=None)
    res = cockpit("train", str(cfg), "--runs-dir", str(runs), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    run = next(d for d in runs.iterdir() if d.is_dir())
    adapter = run / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "OFT"
    out = tmp_path / "merged"
    exp = cockpit("export", run.name, "--runs-dir", str(runs), "--merge", "--out", str(out))
    assert exp.returncode == 0, exp.stderr
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, str(adapter)).eval()
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        want, got = adapted(input_ids=ids).logits, merged(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)(input_ids=ids).logits
    assert (got - want).abs().max().item() < 1e-4
    assert (want - plain).abs().max().item() > 1e-3  # the adapter changed the model
    serve = cockpit("serve", run.name, "--runs-dir", str(runs), "--vllm-url", "http://127.0.0.1:9")
    assert serve.returncode == 2 and "vLLM loads LoRA adapters only" in serve.stderr
