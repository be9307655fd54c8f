"""LLaMA-Factory key parity (issue 18): each key's effect on the model, optimizer, schedule or
TrainingArguments that the training rank builds (tiny random Llama, in-process, fast tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT


def cfg_for(model_dir: Path, **over):
    from cockpit.config import validate

    return validate({"model_name_or_path": str(model_dir), "dataset": "cockpit_identity", "use_cpu": True,
                     "lora_rank": 4, "lora_alpha": 8, **over})


def build(model_dir: Path, **over):
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model

    cfg = cfg_for(model_dir, **over)
    return build_model(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0), cfg


def args_for(cfg, tmp_path):
    from cockpit.train.arguments import training_arguments

    return training_arguments(cfg, {"checkpoints": tmp_path / "ck"}, True, 1)


def refused(model_dir, match, **over):
    from cockpit.errors import InputError

    with pytest.raises(InputError, match=match):
        cfg_for(model_dir, **over)


def test_optimizer_names_match_transformers():
    from transformers.training_args import OptimizerNames

    from cockpit.config.schema import OPTIMIZERS

    assert set(OPTIMIZERS) == {o.value for o in OptimizerNames}


# -- LoRA variants ------------------------------------------------------------------------------
def test_use_dora_adds_magnitude_vectors(tiny_model_dir):
    plain, _ = build(tiny_model_dir)
    dora, _ = build(tiny_model_dir, use_dora=True)
    assert not any("lora_magnitude_vector" in n for n, _ in plain.named_parameters())
    assert any("lora_magnitude_vector" in n and p.requires_grad for n, p in dora.named_parameters())


def test_use_rslora_scales_by_alpha_over_sqrt_rank(tiny_model_dir):
    def scaling(model):
        layer = model.base_model.model.model.layers[0].self_attn.q_proj
        return layer.scaling["default"]

    assert scaling(build(tiny_model_dir)[0]) == pytest.approx(8 / 4)
    assert scaling(build(tiny_model_dir, use_rslora=True)[0]) == pytest.approx(8 / 4 ** 0.5)


def test_pissa_init_starts_from_singular_vectors_and_leaves_the_residual(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).model.layers[0].self_attn.q_proj.weight
    plain, _ = build(tiny_model_dir)
    pissa, _ = build(tiny_model_dir, pissa_init=True, pissa_iter=4)
    q_plain = plain.base_model.model.model.layers[0].self_attn.q_proj
    q_pissa = pissa.base_model.model.model.layers[0].self_attn.q_proj
    assert torch.count_nonzero(q_plain.lora_B["default"].weight) == 0  # default: B = 0
    assert torch.count_nonzero(q_pissa.lora_B["default"].weight) > 0
    assert not torch.allclose(q_pissa.base_layer.weight, base)  # the principal part moved into the adapter
    assert torch.allclose(q_plain.base_layer.weight, base)


def test_additional_target_trains_the_module_fully(tiny_model_dir):
    model, _ = build(tiny_model_dir, additional_target="norm")
    trained = [n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    assert trained and all("modules_to_save" in n and "norm" in n for n in trained)


def test_loraplus_gives_the_b_matrices_ratio_times_the_learning_rate(tiny_model_dir, tmp_path):
    from cockpit.train.variants import trainer_kwargs

    model, cfg = build(tiny_model_dir, loraplus_lr_ratio=16.0, learning_rate=1e-4)
    opt, sched = trainer_kwargs(cfg, model, args_for(cfg, tmp_path))["optimizers"]
    by_lr = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            by_lr.setdefault(group["lr"], set()).add("lora_B" if "lora_B" in names[id(p)] else "lora_A" if "lora_A" in names[id(p)] else "other")
    assert any(abs(lr - 1.6e-3) < 1e-12 and s == {"lora_B"} for lr, s in by_lr.items()), by_lr
    assert any(abs(lr - 1e-4) < 1e-12 and "lora_A" in s for lr, s in by_lr.items())
    assert sched is None and trainer_kwargs(cfg_for(tiny_model_dir), model, None) == {}


def test_lora_variants_need_lora(tiny_model_dir):
    refused(tiny_model_dir, "use_dora: a LoRA variant: needs finetuning_type: lora", use_dora=True, finetuning_type="full")
    refused(tiny_model_dir, "LoRA\\+ builds its own optimizer", loraplus_lr_ratio=4.0, zero_stage=2)


# -- optimizer and schedule -----------------------------------------------------------------------
def test_optim_and_adam_keys_reach_the_optimizer(tiny_model_dir, tmp_path):
    import torch
    from transformers import Trainer

    cfg = cfg_for(tiny_model_dir, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6)
    cls, kw = Trainer.get_optimizer_cls_and_kwargs(args_for(cfg, tmp_path))
    assert issubclass(cls, torch.optim.AdamW) and kw["betas"] == (0.8, 0.95) and kw["eps"] == 1e-6
    cls, _ = Trainer.get_optimizer_cls_and_kwargs(args_for(cfg_for(tiny_model_dir, optim="sgd"), tmp_path))
    assert cls is torch.optim.SGD


def test_optim_that_needs_a_missing_package_is_refused_naming_it(tiny_model_dir, tmp_path, monkeypatch):
    # installed nowhere: not on sys.path, and an empty side folder (bootstrap's <venv>/lowrank-site holds
    # galore-torch and bitsandbytes, which counts as installed: tests/test_side_site.py)
    monkeypatch.setenv("COCKPIT_LOWRANK_SITE", str(tmp_path / "empty-site"))
    refused(tiny_model_dir, "galore_adamw needs the galore-torch package", optim="galore_adamw")
    refused(tiny_model_dir, "paged_adamw_8bit needs the bitsandbytes package and a GPU", optim="paged_adamw_8bit")


def test_lr_scheduler_kwargs_set_the_floor_of_cosine_with_min_lr(tiny_model_dir, tmp_path):
    from transformers import Trainer

    model, cfg = build(tiny_model_dir, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.25}, learning_rate=1e-3)
    trainer = Trainer(model=model, args=args_for(cfg, tmp_path))
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    for _ in range(10):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.25e-3)
    refused(tiny_model_dir, "lr_scheduler_kwargs: must be a mapping", lr_scheduler_kwargs="fast")


# -- evaluation ---------------------------------------------------------------------------------------
def test_eval_keys_reach_the_trainer(tiny_model_dir, tmp_path):
    args = args_for(cfg_for(tiny_model_dir, val_size=0.2, do_eval=True, eval_steps=3, per_device_eval_batch_size=2), tmp_path)
    assert (str(args.eval_strategy.value), args.eval_steps, args.per_device_eval_batch_size) == ("steps", 3, 2)
    args = args_for(cfg_for(tiny_model_dir, val_size=0.2, eval_strategy="epoch"), tmp_path)
    assert str(args.eval_strategy.value) == "epoch"
    assert str(args_for(cfg_for(tiny_model_dir), tmp_path).eval_strategy.value) == "no"
    refused(tiny_model_dir, "do_eval needs evaluation data: set val_size or eval_dataset", do_eval=True)
    refused(tiny_model_dir, "eval_steps needs evaluation data", eval_steps=5)
    refused(tiny_model_dir, "val_size holds out a split and eval_dataset names other data", val_size=0.1, eval_dataset="cockpit_identity")
    refused(tiny_model_dir, "save_steps \\(5\\) to be a multiple of eval_steps \\(2\\)", val_size=0.2, eval_steps=2, save_steps=5, load_best_model_at_end=True)


@pytest.mark.slow
def test_eval_dataset_evaluates_on_schedule_and_keeps_the_best_checkpoint(tmp_path, tiny_model_dir):
    """A real run (tiny model, CLI): eval_dataset, eval_on_start, eval_steps, load_best_model_at_end."""
    import json

    from conftest import cockpit, read_events, tiny_config

    evalfile = tmp_path / "held_out.jsonl"
    evalfile.write_text("".join(json.dumps({"instruction": f"What is {i} plus {i}?", "input": "", "output": f"{2 * i}."}) + "\n" for i in range(4)))
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=4, save_steps=2, eval_dataset=str(evalfile), eval_steps=2,
                      eval_on_start=True, load_best_model_at_end=True, per_device_eval_batch_size=2, probes=None)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run = next((tmp_path / "runs").iterdir())
    evals = [e for e in read_events(run) if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 2, 4] and all(e["eval_loss"] > 0 for e in evals)
    state = json.loads((run / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    from cockpit.store.events import read_all
    from cockpit.train.outcome import loss_series

    assert [s for s, _ in loss_series(read_all(run / "events.jsonl"), "eval", "eval_loss")] == [0, 2, 4]  # loss.png's second line
    assert (run / "loss.png").stat().st_size > 0
    best = min(evals[1:], key=lambda e: e["eval_loss"])
    assert state["best_model_checkpoint"] == str(run / "checkpoints" / f"checkpoint-{best['step']}")  # not .staging
    assert state["best_metric"] == pytest.approx(best["eval_loss"])
    # summary.json and the Summary screen carry the eval losses
    summary = json.loads((run / "summary.json").read_text())
    ev = summary["eval_loss"]
    assert ev["count"] == 3 and ev["first"] == [0, pytest.approx(evals[0]["eval_loss"])] and ev["last"] == [4, pytest.approx(evals[-1]["eval_loss"])]
    assert ev["best"][1] == pytest.approx(min(e["eval_loss"] for e in evals))
    from cockpit.store.rundir import RunDir
    from cockpit.ui.screens.summary import summary_text

    text = summary_text(RunDir(run), summary, {}).plain
    assert f"eval loss {evals[0]['eval_loss']:.4f} (step 0) → {evals[-1]['eval_loss']:.4f} (step 4), 3 evals" in text


# -- model options ----------------------------------------------------------------------------------
def test_flash_attn_picks_the_attention_kernel(tiny_model_dir):
    assert build(tiny_model_dir, flash_attn="eager")[0].config._attn_implementation == "eager"
    assert build(tiny_model_dir, flash_attn="sdpa")[0].config._attn_implementation == "sdpa"
    refused(tiny_model_dir, "fa2 \\(FlashAttention-2\\) is a GPU kernel", flash_attn="fa2")


def test_gradient_checkpointing_switches(tiny_model_dir, tmp_path):
    args = args_for(cfg_for(tiny_model_dir, gradient_checkpointing=True, use_reentrant_gc=True), tmp_path)
    assert args.gradient_checkpointing and args.gradient_checkpointing_kwargs == {"use_reentrant": True}
    args = args_for(cfg_for(tiny_model_dir, gradient_checkpointing=True), tmp_path)
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert not args_for(cfg_for(tiny_model_dir, disable_gradient_checkpointing=True), tmp_path).gradient_checkpointing
    refused(tiny_model_dir, "disable_gradient_checkpointing too", gradient_checkpointing=True, disable_gradient_checkpointing=True)


def test_low_cpu_mem_usage_false_is_refused_with_the_reason(tiny_model_dir):
    assert cfg_for(tiny_model_dir, low_cpu_mem_usage=True).low_cpu_mem_usage is True
    refused(tiny_model_dir, "transformers 5 always loads weights", low_cpu_mem_usage=False)


# -- data options -----------------------------------------------------------------------------------
def test_preprocessing_num_workers_tokenises_in_that_many_processes(tiny_model_dir, monkeypatch, tmp_path):
    """A spawned pool of that many processes renders the rows (never a fork: a forked child of a
    threaded process can block forever on a copied lock), with the same ids and labels."""
    import multiprocessing.context as mpc
    import os

    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model

    made: list[list[int]] = []
    real_pool = mpc.SpawnContext.Pool

    def recording_pool(self, processes=None, *args, **kwargs):
        pool = real_pool(self, processes, *args, **kwargs)
        made.append([w.pid for w in pool._pool])
        return pool

    monkeypatch.setattr(mpc.SpawnContext, "Pool", recording_pool)
    cfg = cfg_for(tiny_model_dir, template="chatml")
    tok = load_tokenizer(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), log=lambda *_: None)
    one = prepare_dataset(cfg, tok)
    assert not made  # one process: no pool
    two = prepare_dataset(cfg.replace(preprocessing_num_workers=2), tok)
    assert len(made) == 1 and len(made[0]) == 2 and os.getpid() not in made[0]  # two spawned processes did the work
    assert [r.input_ids for r in two.rendered] == [r.input_ids for r in one.rendered]
    assert [r.labels for r in two.rendered] == [r.labels for r in one.rendered]
    assert len(one.rendered) > 2


# -- refused keys and the README table ----------------------------------------------------------------
def test_every_refused_key_has_its_own_reason():
    from cockpit.config.parity import refusal_reason
    from cockpit.config.schema import LLAMAFACTORY_UNSUPPORTED

    missing = sorted(k for k in LLAMAFACTORY_UNSUPPORTED if not refusal_reason(k))
    assert not missing, missing


def test_a_refused_key_names_its_reason(tiny_model_dir):
    refused(tiny_model_dir, "swanlab_lark_secret: a LLaMA-Factory key that Cockpit refuses: SwanLab's Lark",
            swanlab_lark_secret="s")
    refused(tiny_model_dir, "image_do_pan_and_scan: .*a vision-language model Cockpit does not train yet",
            image_do_pan_and_scan=True)


def test_readme_key_table_is_current():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "lf_keys_table.py"), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    table = (ROOT / "docs" / "configuration.md").read_text()
    assert "| `use_dora` | works:" in table and "| `use_badam` | works: BAdam" in table


def test_freeze_trainable_modules_trains_only_those_modules_of_the_last_layers(tiny_model_dir):
    from cockpit.errors import InputError

    model, _ = build(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=1, freeze_trainable_modules="mlp")
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(n.startswith("model.layers.1.mlp.") for n in trained)
    everything, _ = build(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=1)
    assert any(".self_attn." in n for n, p in everything.named_parameters() if p.requires_grad)
    with pytest.raises(InputError, match="no module named 'ffn'"):
        build(tiny_model_dir, finetuning_type="freeze", freeze_trainable_modules="ffn")
    refused(tiny_model_dir, "freeze_trainable_modules: applies to finetuning_type: freeze", freeze_trainable_modules="mlp")


def test_include_num_input_tokens_seen_is_always_on(tiny_model_dir, tmp_path):
    assert args_for(cfg_for(tiny_model_dir, include_num_input_tokens_seen=True), tmp_path).include_num_input_tokens_seen
    refused(tiny_model_dir, "include_num_input_tokens_seen: always on in Cockpit", include_num_input_tokens_seen=False)


def test_create_new_adapter_merges_the_old_adapter_and_starts_a_new_one(tiny_model_dir, tmp_path):
    import torch

    old, _ = build(tiny_model_dir)
    torch.manual_seed(1)
    for name, p in old.named_parameters():
        if "lora_B" in name:  # as if trained: B is no longer zero
            p.data.normal_(0, 0.05)
    old.save_pretrained(str(tmp_path / "old"))
    q_old = old.base_model.model.model.layers[0].self_attn.q_proj
    merged_weight = (q_old.base_layer.weight + q_old.get_delta_weight("default")).detach()
    continued, _ = build(tiny_model_dir, adapter_name_or_path=str(tmp_path / "old"))
    fresh, _ = build(tiny_model_dir, adapter_name_or_path=str(tmp_path / "old"), create_new_adapter=True)
    q_cont = continued.base_model.model.model.layers[0].self_attn.q_proj
    q_new = fresh.base_model.model.model.layers[0].self_attn.q_proj
    assert torch.count_nonzero(q_cont.lora_B["default"].weight) > 0  # the old adapter, trained on
    assert torch.count_nonzero(q_new.lora_B["default"].weight) == 0  # a new adapter ...
    assert torch.allclose(q_new.base_layer.weight, merged_weight, atol=1e-5)  # ... on the merged base
    refused(tiny_model_dir, "create_new_adapter: needs adapter_name_or_path", create_new_adapter=True)


def test_rope_scaling_stretches_the_context_to_cutoff_len(tiny_model_dir):
    model, _ = build(tiny_model_dir, rope_scaling="linear", cutoff_len=1024)  # the tiny model's context: 512
    rope = model.config.rope_parameters
    assert rope["rope_type"] == "linear" and rope["factor"] == 2.0
    logs = []
    from cockpit.models.resolve import resolve_model
    from cockpit.train.variants import model_load_kwargs

    cfg = cfg_for(tiny_model_dir, rope_scaling="dynamic", cutoff_len=256)
    assert "rope_scaling" not in model_load_kwargs(cfg, resolve_model(str(tiny_model_dir), log=lambda *_: None), log=logs.append)
    assert "fits the model's context (512); not scaled" in logs[0]


def test_upcast_keeps_norms_and_logits_in_fp32(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from cockpit.config.run_config import RunConfig
    from cockpit.train.variants import upcast

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    upcast(model, RunConfig(upcast_layernorm=True, upcast_lmhead_output=True))
    norms = {n: p.dtype for n, p in model.named_parameters() if "norm" in n}
    assert norms and set(norms.values()) == {torch.float32}
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the Trainer runs bf16 mixed precision
        assert model(torch.tensor([[1, 2, 3]])).logits.dtype == torch.float32
        assert plain(torch.tensor([[1, 2, 3]])).logits.dtype == torch.bfloat16


def test_lora_in_bf16_keeps_the_frozen_base_in_bf16_on_the_cpu_too(tiny_model_dir):
    """As on a GPU: the frozen base in bf16 (autocast never recasts it), the adapter in fp32;
    fp32 runs and full fine-tuning keep fp32 weights."""
    import torch

    model, _ = build(tiny_model_dir, bf16=True)
    base = model.base_model.model.model.layers[0].self_attn.q_proj
    assert base.base_layer.weight.dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss
    loss.backward()
    assert base.lora_A["default"].weight.grad is not None
    fp32, _ = build(tiny_model_dir)
    assert fp32.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.float32
    full, _ = build(tiny_model_dir, bf16=True, finetuning_type="full")
    assert full.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32


# -- use_llama_pro: only LLaMA Pro's expanded blocks train (LLaMA-Factory's stride rule) -------------
def test_llama_pro_freeze_trains_the_last_layer_of_each_group_only(tiny_model_dir):
    from cockpit.train.model import expanded_layer_ids

    assert list(expanded_layer_ids(32, 8)) == [3, 7, 11, 15, 19, 23, 27, 31]  # 24 layers expanded by 8
    model, _ = build(tiny_model_dir, finetuning_type="freeze", use_llama_pro=True, freeze_trainable_layers=1)
    trained = {n.split(".")[2] for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {"1"}  # 2 layers, 1 expanded block: the second
    model, _ = build(tiny_model_dir, finetuning_type="freeze", use_llama_pro=False, freeze_trainable_layers=1)
    assert {n.split(".")[2] for n, p in model.named_parameters() if p.requires_grad} == {"1"}


def test_llama_pro_lora_puts_adapters_in_the_expanded_blocks_only(tiny_model_dir):
    model, _ = build(tiny_model_dir, use_llama_pro=True, freeze_trainable_layers=1, lora_target="q_proj,v_proj")
    lora = {n for n, _ in model.named_parameters() if "lora_" in n}
    assert lora and all(".layers.1." in n for n in lora)
    assert {n.split(".")[-4] for n in lora} == {"q_proj", "v_proj"}  # ...q_proj.lora_A.default.weight
    everywhere, _ = build(tiny_model_dir, freeze_trainable_layers=1, lora_target="q_proj,v_proj")
    assert any(".layers.0." in n for n, _ in everywhere.named_parameters() if "lora_" in n)


def test_llama_pro_refusals_name_the_key(tiny_model_dir):
    from cockpit.errors import InputError

    refused(tiny_model_dir, "use_llama_pro", use_llama_pro=True, finetuning_type="full")
    with pytest.raises(InputError, match="freeze_trainable_layers"):
        build(tiny_model_dir, finetuning_type="freeze", use_llama_pro=True, freeze_trainable_layers=3)


# -- GaLore / APOLLO: LLaMA-Factory's keys as HF's low-rank optimizers ------------------------------
def test_galore_and_apollo_keys_become_hfs_low_rank_optimizers(tiny_model_dir, tmp_path, monkeypatch):
    from cockpit.config.parity import has_module, low_rank_optim
    from cockpit.config.run_config import RunConfig
    from cockpit.train.arguments import training_arguments

    base = cfg_for(tiny_model_dir, finetuning_type="full").mapping()
    galore = low_rank_optim({**base, "use_galore": True, "galore_rank": 8, "galore_target": "q_proj, v_proj", "galore_layerwise": True})
    assert galore == {"optim": "galore_adamw_layerwise", "optim_target_modules": ["q_proj", "v_proj"],
                      "optim_args": "rank=8,update_proj_gap=200,scale=2.0,proj_type=std"}
    assert low_rank_optim({**base, "use_galore": True, "optim": "adafactor"})["optim"] == "galore_adafactor"
    apollo = low_rank_optim({**base, "use_apollo": True, "apollo_proj": "svd"})
    assert apollo["optim"] == "apollo_adamw" and apollo["optim_target_modules"] == "all-linear"
    assert "proj=svd" in apollo["optim_args"] and "scale_type=channel" in apollo["optim_args"]
    args = training_arguments(RunConfig.from_mapping({**base, "use_galore": True, "galore_rank": 8}), {"checkpoints": tmp_path}, True, 1)
    assert args.optim == "galore_adamw" and args.optim_target_modules == "all-linear" and "rank=8" in args.optim_args
    monkeypatch.setenv("COCKPIT_LOWRANK_SITE", str(tmp_path / "empty"))  # no side folder (cockpit/side_site.py)
    if not has_module("galore_torch"):  # the config path refuses it here, naming the package
        refused(tiny_model_dir, "use_galore.*galore-torch", finetuning_type="full", use_galore=True)
    if not has_module("apollo_torch"):
        refused(tiny_model_dir, "use_apollo.*apollo-torch", finetuning_type="full", use_apollo=True)


def test_galore_rules_name_their_key(tiny_model_dir):
    refused(tiny_model_dir, "use_galore.*not lora", use_galore=True)
    refused(tiny_model_dir, "use_apollo.*choose one", finetuning_type="full", use_galore=True, use_apollo=True)
    refused(tiny_model_dir, "galore_layerwise.*gradient_accumulation_steps", finetuning_type="full", use_galore=True,
            galore_layerwise=True, gradient_accumulation_steps=2)
    refused(tiny_model_dir, "use_badam: BAdam trains the whole model.*got lora", use_badam=True)


def test_warmup_ratio_is_the_share_of_steps_that_warm_up_up_to_the_whole_run(tiny_model_dir, tmp_path):
    # HF's warmup_steps reads a value >= 1 as a step count: a warmup_ratio of 1.0 passed as is warmed
    # up for one step only (found by the sweep's warm-up rule, issue 62 item 7)
    for ratio, steps in ((0.1, 10), (0.5, 50), (1.0, 100)):
        args = args_for(cfg_for(tiny_model_dir, warmup_ratio=ratio), tmp_path)
        assert args.get_warmup_steps(100) == steps, ratio
