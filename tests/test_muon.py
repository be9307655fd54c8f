"""Issue 37: ``use_muon`` as LLaMA-Factory builds it (``_create_muon_optimizer``): torch's Muon for the
trainable 2-D weights that are neither embeddings nor the LM head, AdamW for the rest, one optimizer
for HF's Trainer; refused with another optimizer key or a sharding strategy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def cfg_for(model_dir: Path, **over):
    from cockpit.config import validate

    return validate({"model_name_or_path": str(model_dir), "dataset": "cockpit_identity", "use_cpu": True,
                     "template": "chatml", "finetuning_type": "full", "cutoff_len": 64, "max_steps": 3,
                     "per_device_train_batch_size": 4, "learning_rate": 2e-3, "logging_steps": 1,
                     "save_strategy": "no", "use_muon": True, "weight_decay": 0.01, **over})


def refused(match: str, **over):
    from cockpit.config import validate
    from cockpit.errors import InputError

    with pytest.raises(InputError, match=match):
        validate({"dataset": "cockpit_identity", "use_muon": True, **over}, check_paths=False)


def _trainer(tmp_path, tiny_model_dir, **over):
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
    args = training_arguments(cfg, {"checkpoints": tmp_path / "ck"}, True, 1)
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).trainable][:4]
    return sft_trainer(CockpitTrainer, cfg, model, args, tok, rows)  # 4 rows, batch 4: every step the same batch


def test_the_trainer_builds_muon_for_2d_weights_and_adamw_for_the_rest(tmp_path, tiny_model_dir):
    from cockpit.train.muon import MuonWithAdamW

    trainer = _trainer(tmp_path, tiny_model_dir)
    opt = trainer.create_optimizer()
    assert isinstance(opt, MuonWithAdamW)
    muon, adamw = opt.parts
    assert type(muon) is torch.optim.Muon and type(adamw) is torch.optim.AdamW
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    to_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    to_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    attn, mlp = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")
    assert to_muon == {f"model.layers.{i}.self_attn.{m}.weight" for i in range(2) for m in attn} | {
        f"model.layers.{i}.mlp.{m}.weight" for i in range(2) for m in mlp
    }
    assert "model.embed_tokens.weight" in to_adamw and "model.norm.weight" in to_adamw
    assert to_muon.isdisjoint(to_adamw) and to_muon | to_adamw == {n for n, p in trainer.model.named_parameters()
                                                                   if p.requires_grad}
    # LLaMA-Factory's scaling (adjust_lr_for_muon), its betas / eps / weight decay from the config
    assert muon.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    assert muon.param_groups[0]["weight_decay"] == adamw.param_groups[0]["weight_decay"] == 0.01
    assert adamw.param_groups[0]["betas"] == (trainer.args.adam_beta1, trainer.args.adam_beta2)
    assert opt.param_groups == muon.param_groups + adamw.param_groups  # the scheduler's lr reaches both parts


def test_a_three_step_muon_run_lowers_the_loss_and_moves_both_parts(tmp_path, tiny_model_dir):
    trainer = _trainer(tmp_path, tiny_model_dir)
    params = dict(trainer.model.named_parameters())
    before = {n: params[n].detach().clone() for n in ("model.layers.0.mlp.down_proj.weight",
                                                      "model.embed_tokens.weight")}
    out = trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert out.global_step == 3 and len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    for name, b in before.items():  # Muon moved the matrix, AdamW the embedding
        assert not torch.equal(params[name].detach(), b), name
    muon, adamw = trainer.optimizer.optimizer.parts  # accelerate's wrapper around ours
    assert all("momentum_buffer" in muon.state[p] for g in muon.param_groups for p in g["params"])
    assert all("exp_avg" in adamw.state[p] for g in adamw.param_groups for p in g["params"])


def test_muons_state_goes_through_a_checkpoint(tiny_model_dir):
    """state_dict / load_state_dict carry both parts' states (HF saves and resumes the optimizer so)."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from cockpit.train.muon import muon_optimizer

    args = SimpleNamespace(learning_rate=1e-3, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    opt = muon_optimizer(model, args)
    model(input_ids=torch.tensor([[5, 6, 7, 8]]), labels=torch.tensor([[5, 6, 7, 8]])).loss.backward()
    opt.step()
    fresh = muon_optimizer(model, args)
    fresh.load_state_dict(opt.state_dict())
    for old, new in zip(opt.parts, fresh.parts, strict=True):
        for p in (p for g in old.param_groups for p in g["params"]):
            for key, value in old.state[p].items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(new.state[p][key])), key


def test_muon_refuses_another_optimizer_and_sharding():
    refused("optim: use_muon is the optimizer and optim picks another", optim="adamw_torch")
    refused("use_galore: use_muon is the optimizer and use_galore picks another", use_galore=True,
            finetuning_type="full")
    refused("loraplus_lr_ratio: use_muon is the optimizer", loraplus_lr_ratio=16.0)
    refused("use_muon: use_muon under zero_stage: Muon orthogonalises each whole 2-D update", zero_stage=2,
            nproc_per_node=2)
    refused("use_muon: use_muon under fsdp", fsdp="full_shard", nproc_per_node=2)
