"""LLaMA-Factory keys of issue 18 wired in after the first round: compute_accuracy,
freeze_extra_modules, model_revision, pissa_convert. Each test shows the key's effect on what the
training rank builds (the tiny random Llama, in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_lf_parity import args_for, build, cfg_for, refused


def quiet(*_):
    return None


# -- compute_accuracy -----------------------------------------------------------------------------
def identity_rows(cfg):
    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import config_model, load_tokenizer

    tok = load_tokenizer(cfg, config_model(cfg, log=quiet), log=quiet)
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).rendered if r.target_kept > 0]
    return tok, rows


def hand_accuracy(model, rows) -> float:
    """argmax of the logits at each position vs the next label, -100 left out; mean over samples."""
    import torch

    per_sample = []
    model.eval()
    with torch.no_grad():
        for row in rows:
            logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0]
            predicted, labels = logits.argmax(-1)[:-1], torch.tensor(row["labels"])[1:]
            kept = labels != -100
            per_sample.append((predicted[kept] == labels[kept]).float().mean().item())
    return sum(per_sample) / len(per_sample)


@pytest.mark.slow
def test_compute_accuracy_is_the_argmax_accuracy_of_the_eval_set(tiny_model_dir, tmp_path):
    from cockpit.train.recipes.sft import sft_trainer
    from cockpit.train.trainer import CockpitTrainer

    over = dict(finetuning_type="full", template="chatml", cutoff_len=96, val_size=4, per_device_eval_batch_size=3,
                compute_accuracy=True, learning_rate=3e-3, max_steps=12, per_device_train_batch_size=4,
                logging_steps=50, save_steps=50)
    model, cfg = build(tiny_model_dir, **over)
    tok, rows = identity_rows(cfg)
    eval_rows = rows[:4]
    trainer = sft_trainer(CockpitTrainer, cfg, model, args_for(cfg, tmp_path), tok, rows[4:], eval_rows)
    trainer.train()  # a few steps: the model predicts some answer tokens (a random one predicts none)
    metrics = trainer.evaluate()
    accuracy = metrics["eval_accuracy"]
    assert 0.0 < accuracy < 1.0
    # padded eval batches of 3 (right-padded, -100 labels) give what single unpadded samples give
    assert accuracy == pytest.approx(hand_accuracy(trainer.model, eval_rows), abs=1e-6)
    assert "eval_accuracy" not in sft_trainer(CockpitTrainer, cfg.replace(compute_accuracy=False), model,
                                              args_for(cfg, tmp_path), tok, rows[4:], eval_rows).evaluate()


def test_eval_accuracy_reaches_the_eval_event_the_summary_and_its_screen(tmp_path):
    from types import SimpleNamespace

    from cockpit.config.run_config import RunConfig
    from cockpit.store.events import EventWriter, read_all
    from cockpit.run.follow import format_event
    from cockpit.store.rundir import RunDir
    from cockpit.train.callbacks import CockpitCallback
    from cockpit.train.outcome import eval_losses
    from cockpit.ui.screens.summary import summary_text

    events = tmp_path / "events.jsonl"
    callback = CockpitCallback(RunDir(tmp_path), RunConfig(), 0, 1, EventWriter(events))
    for step, loss, acc in ((0, 3.0, 0.25), (2, 2.0, 0.5), (4, 2.5, 0.4)):
        callback.on_log(None, SimpleNamespace(global_step=step), None, logs={"eval_loss": loss, "eval_accuracy": acc})
    written = [e for e in read_all(events) if e["kind"] == "eval"]
    assert [(e["step"], e["eval_loss"], e["eval_accuracy"]) for e in written] == [(0, 3.0, 0.25), (2, 2.0, 0.5), (4, 2.5, 0.4)]
    acc = eval_losses(read_all(events), "eval_accuracy")
    assert acc == {"count": 3, "first": [0, 0.25], "last": [4, 0.4], "best": [2, 0.5]}  # best = highest
    assert eval_losses(read_all(events))["best"] == [2, 2.0]  # loss: lowest
    assert format_event(written[1], None) == "eval at step 2: loss 2.0000, accuracy 50.0%"
    text = summary_text(RunDir(tmp_path), {"eval_accuracy": acc}, {}).plain
    assert "eval accuracy 25.0% (step 0) → 40.0% (step 4), best 50.0% at step 2" in text


def test_compute_accuracy_needs_sft_evaluation_data(tiny_model_dir):
    assert cfg_for(tiny_model_dir, compute_accuracy=True, val_size=0.2).compute_accuracy is True
    refused(tiny_model_dir, "compute_accuracy needs evaluation data", compute_accuracy=True)
    refused(tiny_model_dir, "compute_accuracy: token accuracy is measured in SFT's evaluation", compute_accuracy=True,
            val_size=0.2, stage="pt")


# -- freeze_extra_modules ---------------------------------------------------------------------------
def test_freeze_extra_modules_trains_the_named_modules_outside_the_layers(tiny_model_dir):
    from cockpit.errors import InputError

    model, _ = build(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=1, freeze_extra_modules="norm")
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    last_layer = {n for n, _ in model.named_parameters() if n.startswith("model.layers.1.")}
    assert trained == last_layer | {"model.norm.weight"}  # not the layers' input_layernorm / post_attention_layernorm
    both, _ = build(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=1,
                    freeze_extra_modules="embed_tokens, norm")
    assert {n for n, p in both.named_parameters() if p.requires_grad} == trained | {"model.embed_tokens.weight"}
    with pytest.raises(InputError, match="no module 'lm_head' outside the decoder layers; choose from embed_tokens, norm"):
        build(tiny_model_dir, finetuning_type="freeze", freeze_extra_modules="lm_head")  # tied: the embedding
    refused(tiny_model_dir, "freeze_extra_modules: applies to finetuning_type: freeze, got lora", freeze_extra_modules="norm")
    refused(tiny_model_dir, "freeze_extra_modules: expected a comma list of module names", finetuning_type="freeze",
            freeze_extra_modules="norm,,embed tokens")


def test_freeze_extra_modules_count_in_the_memory_plan():
    from cockpit.plan import estimate_config
    from cockpit.plan.catalogue import CATALOGUE
    from cockpit.plan.params import analytic_counts, dims_of

    base = {"model_name_or_path": "meta-llama/Llama-3.1-8B", "finetuning_type": "freeze", "freeze_trainable_layers": 2,
            "bf16": True}
    layers_only = estimate_config(base, use_meta=False)[1]
    with_embedding = estimate_config({**base, "freeze_extra_modules": "embed_tokens,norm"}, use_meta=False)[1]
    embedding = analytic_counts(dims_of(CATALOGUE["meta-llama/Llama-3.1-8B"])).embedding
    assert with_embedding.params["trainable"] - layers_only.params["trainable"] == embedding
    assert with_embedding.components["optimizer"] > layers_only.components["optimizer"]
    # the embedding's gradient flows back through every layer: all 32 layers' activations are kept
    all_layers = estimate_config({**base, "freeze_trainable_layers": 32}, use_meta=False)[1]
    assert with_embedding.components["activations_saved"] == all_layers.components["activations_saved"]
    assert with_embedding.components["activations_saved"] > 10 * layers_only.components["activations_saved"]


# -- model_revision -------------------------------------------------------------------------------
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


@pytest.fixture
def two_revision_hub(tiny_model_dir, tmp_path, monkeypatch):
    """An offline HF hub cache holding ``org/tiny`` at two commits: A (refs/main; the tiny Llama, 2
    layers) and B (1 layer, other weights), tokenizer in both."""
    import shutil

    import huggingface_hub.constants as hub
    import torch
    from transformers import AutoModelForCausalLM

    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / COMMIT_A)
    one_layer = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), num_hidden_layers=1)
    with torch.no_grad():
        one_layer.model.norm.weight.fill_(2.0)
    shutil.copytree(tiny_model_dir, repo / "snapshots" / COMMIT_B)
    one_layer.save_pretrained(repo / "snapshots" / COMMIT_B)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT_A)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    return "org/tiny"


def test_model_revision_loads_that_commit_of_a_hub_model(two_revision_hub, tiny_model_dir):
    from cockpit.models.resolve import config_model, load_model_config, load_tokenizer
    from cockpit.train.model import build_model

    def loaded(**over):
        cfg = cfg_for(Path(two_revision_hub), finetuning_type="full", **over)
        ref = config_model(cfg, log=quiet)
        model = build_model(cfg, ref, True, 0)
        return ref, model, load_tokenizer(cfg, ref, log=quiet), load_model_config(cfg, ref)

    ref, main, tok, config = loaded()
    assert ref.hub and "revision" not in ref.kwargs()
    assert len(main.model.layers) == 2 and config.num_hidden_layers == 2 and tok.pad_token is not None
    ref, pinned, tok, config = loaded(model_revision=COMMIT_B)
    assert ref.kwargs() == {"revision": COMMIT_B, "local_files_only": True}  # offline: from the cache only
    assert len(pinned.model.layers) == 1 and config.num_hidden_layers == 1 and tok.pad_token is not None
    assert float(pinned.model.norm.weight.detach().min()) == 2.0  # commit B's weights, not A's with a layer cut
    _, main_by_name, _, _ = loaded(model_revision="main")  # a branch name reads refs/
    assert len(main_by_name.model.layers) == 2


def test_model_revision_of_a_local_folder_or_a_missing_commit_is_refused(two_revision_hub, tiny_model_dir):
    from cockpit.errors import InputError
    from cockpit.models.resolve import config_model, load_tokenizer

    with pytest.raises(InputError, match="model_revision: pins a hub revision; .* is a local model"):
        config_model(cfg_for(tiny_model_dir, model_revision=COMMIT_B), log=quiet)
    cfg = cfg_for(Path(two_revision_hub), model_revision="c" * 40)
    # offline (the fixture's HF_HUB_OFFLINE): refused at once, no did-you-mean naming the same model
    with pytest.raises(InputError, match=f"cannot load 'org/tiny' at revision '{'c' * 40}': it is not in the local") as err:
        load_tokenizer(cfg, config_model(cfg, log=quiet), log=quiet)
    assert "did you mean" not in str(err.value)


# -- pissa_convert ----------------------------------------------------------------------------------
def logits_of(model, ids):
    import torch

    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def on_original_base(model_dir, adapter_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(model_dir)), str(adapter_dir))


@pytest.mark.slow
def test_pissa_convert_saves_a_lora_of_the_original_base_with_the_trained_models_logits(tiny_model_dir, tmp_path):
    from types import SimpleNamespace

    import torch

    from cockpit.train.recipes.base import save_final_model
    from cockpit.train.recipes.sft import sft_trainer
    from cockpit.train.trainer import CockpitTrainer
    from cockpit.train.variants import save_pissa_initial

    model, cfg = build(tiny_model_dir, pissa_init=True, pissa_iter=4, pissa_convert=True, template="chatml",
                       cutoff_len=96, max_steps=4, learning_rate=1e-2, logging_steps=50, save_steps=50)
    dirs = {"out": tmp_path, "adapter": tmp_path / "adapter", "checkpoints": tmp_path / "ck"}
    assert save_pissa_initial(model, tmp_path / "pissa_init")
    assert not save_pissa_initial(model, tmp_path / "pissa_init", resuming=True)  # an attempt resuming keeps it
    tok, rows = identity_rows(cfg)
    trainer = sft_trainer(CockpitTrainer, cfg, model, args_for(cfg, tmp_path), tok, rows)
    trainer.train()
    ids = torch.tensor([rows[0]["input_ids"]])
    trained = logits_of(trainer.model, ids)
    ctx = SimpleNamespace(cfg=cfg, dirs=dirs, rank=0, tokenizer=tok, log=quiet)
    save_final_model(ctx, SimpleNamespace(trainer=trainer, callback=SimpleNamespace(nan_seen=False)))

    saved = json.loads((dirs["adapter"] / "adapter_config.json").read_text())
    assert (saved["r"], saved["lora_alpha"], saved["init_lora_weights"]) == (8, 16, True)  # rank 2 x 4, same scale
    converted = logits_of(on_original_base(tiny_model_dir, dirs["adapter"]), ids)
    assert torch.allclose(converted, trained, atol=1e-4), (converted - trained).abs().max()
    assert torch.equal(logits_of(trainer.model, ids), trained)  # the model in memory is untouched (probes, predict)
    # the trained PiSSA adapter as it is, on the original base, is another model (W + BA, not W_res + BA)
    config = trainer.model.peft_config["default"]
    config.init_lora_weights = True
    trainer.model.save_pretrained(str(tmp_path / "as_trained"))
    unconverted = logits_of(on_original_base(tiny_model_dir, tmp_path / "as_trained"), ids)
    assert (unconverted - trained).abs().max() > 1e-2


@pytest.mark.slow
def test_pissa_convert_run_keeps_the_initial_adapter_and_converts_the_final_one(tiny_model_dir, tmp_path):
    """A real run (CLI): pissa_init/ written before the first step, checkpoints left as PiSSA
    adapters, adapter/ = [A | A0], [B | -B0] of the last checkpoint and the initial adapter."""
    from safetensors.torch import load_file

    from conftest import cockpit, tiny_config

    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=4, save_steps=4, pissa_init=True, pissa_iter=4,
                      pissa_convert=True, probes=None)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run = next((tmp_path / "runs").iterdir())
    assert json.loads((run / "summary.json").read_text())["pissa_converted"] is True
    final = load_file(run / "adapter" / "adapter_model.safetensors")
    trained = load_file(run / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors")
    initial = load_file(run / "pissa_init" / "adapter_model.safetensors")
    assert json.loads((run / "checkpoints" / "checkpoint-4" / "adapter_config.json").read_text())["r"] == 4
    assert json.loads((run / "adapter" / "adapter_config.json").read_text())["r"] == 8
    name_a = next(n for n in final if "q_proj.lora_A" in n)
    name_b = name_a.replace("lora_A", "lora_B")
    assert torch_equal(final[name_a], trained[name_a], initial[name_a], dim=0)
    assert torch_equal(final[name_b], trained[name_b], -initial[name_b], dim=1)
    assert set(final) == set(trained)


def torch_equal(joined, trained, initial, dim):
    import torch

    return torch.equal(joined, torch.cat([trained, initial], dim=dim)) and not torch.equal(trained, initial)


def test_pissa_convert_is_refused_where_the_conversion_would_lose_weights(tiny_model_dir):
    refused(tiny_model_dir, "pissa_convert: converts a PiSSA adapter: needs pissa_init: true", pissa_convert=True)
    refused(tiny_model_dir, "additional_target's weights would be lost", pissa_init=True, pissa_convert=True,
            additional_target="norm")
    refused(tiny_model_dir, "use_dora's weights would be lost", pissa_init=True, pissa_convert=True, use_dora=True)
    refused(tiny_model_dir, "not with FSDP, ZeRO-3", pissa_init=True, pissa_convert=True, zero_stage=3)
