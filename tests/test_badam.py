"""BAdam (use_badam, LLaMA-Factory's keys, issue 18): the config rules, and real tiny full fine-tunes
whose checkpoints show the block switching (layer mode) and the sparse updates (ratio mode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cockpit, tiny_config


def cfg_for(model_dir: Path, **over):
    from cockpit.config import validate

    return validate({"model_name_or_path": str(model_dir), "dataset": "cockpit_identity", "use_cpu": True,
                     "finetuning_type": "full", "use_badam": True, **over})


def refused(model_dir, match, **over):
    from cockpit.errors import InputError

    with pytest.raises(InputError, match=match):
        cfg_for(model_dir, **over)


def test_badam_keys_take_llamafactorys_defaults(tiny_model_dir):
    cfg = cfg_for(tiny_model_dir)
    assert (cfg.badam_mode, cfg.badam_switch_mode, cfg.badam_switch_interval, cfg.badam_update_ratio,
            cfg.badam_mask_mode, cfg.badam_start_block, cfg.badam_verbose) == (
        "layer", "ascending", 50, 0.05, "adjacent", None, 0)
    from cockpit.config.schema import LLAMAFACTORY_UNSUPPORTED

    assert not {k for k in LLAMAFACTORY_UNSUPPORTED if "badam" in k}


def test_badam_rules_name_their_key(tiny_model_dir):
    refused(tiny_model_dir, "use_badam: BAdam trains the whole model block by block: finetuning_type full, got lora",
            finetuning_type="lora")
    refused(tiny_model_dir, "use_badam: BAdam trains the whole model block by block: finetuning_type full, got freeze",
            finetuning_type="freeze")
    refused(tiny_model_dir, "use_badam: BAdam, GaLore and APOLLO .* choose one", use_galore=True)
    refused(tiny_model_dir, "use_badam: BAdam, GaLore and APOLLO .* choose one", use_apollo=True)
    refused(tiny_model_dir, "use_badam: .*DeepSpeed / FSDP own", zero_stage=2)
    refused(tiny_model_dir, "use_badam: .*DeepSpeed / FSDP own", fsdp="full_shard")
    refused(tiny_model_dir, "use_badam: BAdam trains in one process", nproc_per_node=2)
    refused(tiny_model_dir, "optim: BAdam runs torch's AdamW", optim="sgd")
    refused(tiny_model_dir, "badam_switch_interval: steps per block", badam_switch_interval=0)
    refused(tiny_model_dir, "badam_switch_mode: must be one of", badam_switch_mode="sideways")
    refused(tiny_model_dir, "badam_update_ratio: must be", badam_update_ratio=0)
    refused(tiny_model_dir, "badam_mode: must be one of", badam_mode="row")


def test_badam_missing_package_is_refused_naming_it(tiny_model_dir, monkeypatch):
    import cockpit.config.parity as parity

    real = parity.has_module
    monkeypatch.setattr(parity, "has_module", lambda name: False if name == "badam" else real(name))
    refused(tiny_model_dir, "use_badam: BAdam needs the badam package; it is not installed here", )


def test_badam_layer_optimizer_trains_one_layer_at_a_time(tiny_model_dir, tmp_path):
    """In-process: the optimizer LLaMA-Factory builds (BlockOptimizer over torch AdamW), block 0 first."""
    pytest.importorskip("badam")
    from cockpit.models.resolve import resolve_model
    from cockpit.train.arguments import training_arguments
    from cockpit.train.model import build_model
    from cockpit.train.variants import trainer_kwargs

    cfg = cfg_for(tiny_model_dir, badam_switch_interval=1)
    model = build_model(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0)
    args = training_arguments(cfg, {"checkpoints": tmp_path / "ck"}, True, 1)
    opt, sched = trainer_kwargs(cfg, model, args)["optimizers"]
    assert type(opt).__name__ == "BlockOptimizer" and sched is None
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("model.layers.0.") for n in trainable), sorted(trainable)
    assert sum(len(g["params"]) for g in opt.base_optimizer.param_groups) == len(trainable)  # fp32 copies of block 0


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _changed(before: dict, after: dict) -> set[str]:
    import torch

    return {n for n in after if not torch.equal(before[n], after[n])}


def _train(tmp_path: Path, model_dir: Path, **over) -> Path:
    cfg = tiny_config(tmp_path, model_dir, finetuning_type="full", use_badam=True, save_steps=1, probes=None,
                      save_total_limit=None, learning_rate=1e-3, **over)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return next((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_badam_layer_mode_switches_the_trained_layer_every_step(tmp_path, tiny_model_dir):
    """A real run (CLI, tiny 2-layer Llama, full): badam_switch_interval 1, ascending. Between two
    consecutive checkpoints only one decoder layer's weights change: layer 0, 1, 0 at steps 1, 2, 3;
    the embeddings (tied LM head) and the final norm, in no block, never change."""
    pytest.importorskip("badam")
    run = _train(tmp_path, tiny_model_dir, badam_mode="layer", badam_switch_interval=1, max_steps=3)
    states = [_weights(tiny_model_dir)] + [_weights(run / "checkpoints" / f"checkpoint-{s}") for s in (1, 2, 3)]
    layers = []
    for before, after in zip(states, states[1:]):
        changed = _changed(before, after)
        blocks = {n.split(".")[2] for n in changed if n.startswith("model.layers.")}
        assert changed and len(blocks) == 1 and all(n.startswith("model.layers.") for n in changed), sorted(changed)
        layer = blocks.pop()
        assert changed == {n for n in after if n.startswith(f"model.layers.{layer}.")}  # the whole layer trains
        layers.append(int(layer))
    assert layers == [0, 1, 0]
    log = (run / "logs" / "rank0.log").read_text()
    assert "model.layers.1." in log  # BAdam says which block it switched to


@pytest.mark.slow
def test_badam_ratio_mode_updates_a_share_of_each_weight(tmp_path, tiny_model_dir):
    """Ratio mode (sparse Adam, BAdam's gradient clipping): after one step each decoder weight
    matrix has changed in about badam_update_ratio of its entries, the embeddings not at all."""
    pytest.importorskip("badam")
    import torch

    run = _train(tmp_path, tiny_model_dir, badam_mode="ratio", badam_update_ratio=0.25, max_steps=1)
    before, after = _weights(tiny_model_dir), _weights(run / "checkpoints" / "checkpoint-1")
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        share = (before[name] != after[name]).float().mean().item()
        assert 0.15 < share <= 0.25, (name, share)


@pytest.mark.slow
def test_badam_resume_trains_the_block_it_stopped_on(tmp_path, tiny_model_dir):
    """Layer mode, ascending, a new block every step: a run stopped after step 1 (layer 0 trained,
    layer 1 next) and resumed from checkpoint-1 trains layer 1 at step 2 and layer 0 at step 3,
    as the uninterrupted run does; the block order is saved with each checkpoint."""
    pytest.importorskip("badam")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _train(tmp_path / "a", tiny_model_dir, badam_mode="layer", badam_switch_interval=1, max_steps=1)
    ckpt1 = first / "checkpoints" / "checkpoint-1"
    assert json.loads((ckpt1 / "badam_block.json").read_text())["active_block"] == 1  # switched after the step
    resumed = _train(tmp_path / "b", tiny_model_dir, badam_mode="layer", badam_switch_interval=1, max_steps=3,
                     resume_from_checkpoint=str(ckpt1))
    states = [_weights(ckpt1)] + [_weights(resumed / "checkpoints" / f"checkpoint-{s}") for s in (2, 3)]
    layers = []
    for before, after in zip(states, states[1:]):
        blocks = {n.split(".")[2] for n in _changed(before, after) if n.startswith("model.layers.")}
        assert len(blocks) == 1, blocks
        layers.append(int(blocks.pop()))
    assert layers == [1, 0]
    assert "BAdam: resumed on block 1" in (resumed / "logs" / "rank0.log").read_text()
