"""Issue 37: ``use_adam_mini`` as LLaMA-Factory builds it (``_create_adam_mini_optimizer``: the adam-mini
package's Adam_mini over the named parameters with the model's hidden size and head counts): the
trainer's optimizer keeps one second moment per query / key head and per neuron of the other weights,
a 3-step run's loss drops; refused with adapters, another optimizer or a sharding strategy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("adam_mini")  # the adam-mini extra (scripts/bootstrap.sh --for test installs it)


def cfg_for(model_dir: Path, **over):
    from cockpit.config import validate

    return validate({"model_name_or_path": str(model_dir), "dataset": "cockpit_identity", "use_cpu": True,
                     "template": "chatml", "finetuning_type": "full", "cutoff_len": 64, "max_steps": 3,
                     "per_device_train_batch_size": 4, "learning_rate": 1e-3, "logging_steps": 1,
                     "save_strategy": "no", "use_adam_mini": True, **over})


def refused(match: str, **over):
    from cockpit.config import validate
    from cockpit.errors import InputError

    with pytest.raises(InputError, match=match):
        validate({"dataset": "cockpit_identity", "use_adam_mini": True, "finetuning_type": "full", **over},
                 check_paths=False)


def test_adam_mini_trains_with_one_second_moment_per_head_and_neuron(tmp_path, tiny_model_dir):
    from adam_mini import Adam_mini

    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.arguments import training_arguments
    from cockpit.train.model import build_model
    from cockpit.train.recipes.sft import sft_trainer
    from cockpit.train.trainer import CockpitTrainer

    cfg = cfg_for(tiny_model_dir)
    ref = resolve_model(cfg.model_name_or_path, log=lambda *_: None)
    tok = load_tokenizer(cfg, ref, log=lambda *_: None)
    model = build_model(cfg, ref, True, 0)
    args = training_arguments(cfg, {"checkpoints": tmp_path / "ck"}, True, 1)
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).trainable][:4]
    trainer = sft_trainer(CockpitTrainer, cfg, model, args, tok, rows)  # every step the same batch of 4
    opt = trainer.create_optimizer()
    assert type(opt) is Adam_mini
    assert (opt.dim, opt.n_heads, opt.n_kv_heads) == (64, 4, 2)  # the tiny Llama's config, as LLaMA-Factory reads it
    out = trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert out.global_step == 3 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    params = dict(trainer.model.named_parameters())
    state = trainer.optimizer.optimizer.state  # accelerate's wrapper around Adam-mini
    q = state[params["model.layers.0.self_attn.q_proj.weight"]]
    assert q["vmean"].numel() == 4  # one per query head (64 x 64 weight, 4 heads), not one per weight
    down = state[params["model.layers.0.mlp.down_proj.weight"]]
    assert down["vmean"].numel() == 64  # one per output neuron


def test_adam_mini_refuses_adapters_other_optimizers_and_sharding():
    refused("use_adam_mini: use_adam_mini with finetuning_type lora: Adam-mini splits q_proj / k_proj",
            finetuning_type="lora")
    refused("use_adam_mini: use_adam_mini with finetuning_type oft", finetuning_type="oft")
    refused("use_adam_mini: use_muon is the optimizer and use_adam_mini picks another", use_muon=True)
    refused("optim: use_adam_mini is the optimizer and optim picks another", optim="adamw_torch")
    refused("use_adam_mini: use_adam_mini under zero_stage: Adam-mini partitions", zero_stage=3, nproc_per_node=2)
    refused("use_adam_mini: use_adam_mini under fsdp", fsdp="full_shard", nproc_per_node=2)


def test_adam_mini_not_installed_is_named_with_its_extra(monkeypatch):
    from cockpit.config import parity

    monkeypatch.setattr(parity, "has_module", lambda name: name != "adam_mini")
    refused("use_adam_mini: Adam-mini needs the adam-mini package; .*cockpit-tune\\[adam-mini\\]")
