"""The key sweep (issue 49): every key the schema accepts, with a representative non-default value,
goes through ``cockpit check`` on the CPU; for each one check accepts, a 1-step ``cockpit train``
must finish. Check says yes and the run trains, or check says no (exit 2, naming the key): never
yes and then a run that fails for a reason check could have given.

The table (``ROWS``) is the test's own: one row per key (aliases too), its value, why that value,
the run it goes in and what is expected of it:

- ``train``: check accepts it and the run trains (a refusal fails the test),
- ``either``: it hangs on what this machine has (a package, a side folder); check may refuse it,
  naming the key; when it accepts, the run must train,
- ``refused``: check must refuse it on this CPU box, naming the key (a GPU-only feature, a value
  Cockpit does not take),
- ``check``: check must accept it, no run (it needs what no single box has: a second node, Slurm).

Keys that do not interact share a run (``GROUPS``: each group's own base keys, then its rows); a
group's rows are checked together, and when check refuses the group, one key at a time, so that
the refusal names the row it belongs to. The runs use the tiny random Llama (nothing is learnt),
one optimizer step each. A key of the schema without a row fails the test, so a new key gets one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, write_yaml

from cockpit.config.schema import ALIASES, SCHEMA
from cockpit.errors import InputError
from cockpit.run import warm_start

pytestmark = pytest.mark.slow

TRAIN, EITHER, REFUSED, CHECK = "train", "either", "refused", "check"


@dataclass(frozen=True)
class Row:
    key: str
    value: Any  # a str may hold {tmp} / {tiny} / {adapter} / {data}, filled in per run
    group: str | None
    why: str
    expect: str = TRAIN


BASE: dict[str, Any] = {
    "template": "chatml",
    "dataset": "cockpit_identity",
    "finetuning_type": "lora",
    "lora_rank": 4,
    "lora_target": "all",
    "cutoff_len": 128,
    "max_samples": 8,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "learning_rate": 5e-3,
    "max_steps": 1,
    "logging_steps": 1,
    "save_steps": 500,
    "use_cpu": True,
    "telemetry_interval_s": 0.5,
}

# group -> the keys its run needs besides its rows (not rows themselves: each key's row is elsewhere)
GROUPS: dict[str, dict[str, Any]] = {
    "sft": {},
    "lora2": {"adapter_name_or_path": "{adapter}"},
    "pissa": {},
    "oft": {"finetuning_type": "oft"},
    "freeze": {"finetuning_type": "freeze"},
    "full": {"finetuning_type": "full"},
    "muon": {"finetuning_type": "full"},
    "adam_mini": {"finetuning_type": "full"},
    "galore": {"finetuning_type": "full"},
    "apollo": {"finetuning_type": "full"},
    "badam": {"finetuning_type": "full"},
    "qlora": {},
    "dpo": {"dataset": "cockpit_identity_pairs"},
    "dpo_ref": {"stage": "dpo", "dataset": "cockpit_identity_pairs"},
    "kto": {"stage": "kto", "dataset": "kto_demo", "dataset_dir": "{data}"},
    "grpo": {"stage": "grpo", "dataset": "{data}/prompts.jsonl", "reward_answer_column": "gold"},
    "eval": {"save_steps": 1},
    "predict": {"adapter_name_or_path": "{adapter}"},
    "mix": {},
    "ds": {},
    "fsdp": {"nproc_per_node": 2},
}

T, A, P = "{tmp}", "{adapter}", "{data}"
ROWS: list[Row] = [
    # -- model ------------------------------------------------------------------------------------
    Row("model_name_or_path", "{tiny}", "sft", "a local HF folder (the tiny Llama) instead of the embedded model"),
    Row("adapter_name_or_path", A, "predict", "a LoRA adapter folder to predict with (do_train: false)"),
    Row("trust_remote_code", True, "sft", "warned only: the tiny Llama ships no code"),
    Row("model_revision", "main", "sft", "a local folder holds one revision: refused with the reason", REFUSED),
    Row("template", "chatml", "sft", "a named LLaMA-Factory template (default: the tokenizer's own)"),
    Row("flash_attn", "eager", "sft", "the eager attention kernel (the CPU has no fa2)"),
    Row("rope_scaling", "linear", "sft", "RoPE scaling within the context: a no-op factor the loader must take"),
    Row("upcast_layernorm", True, "sft", "norm weights in fp32"),
    Row("upcast_lmhead_output", True, "sft", "logits in fp32"),
    Row("low_cpu_mem_usage", False, "sft", "transformers 5 always loads so: false is refused", REFUSED),
    Row("add_tokens", "<sweep_a>", "full", "a new normal token: the embeddings grow (full: trained)"),
    Row("add_special_tokens", "<sweep_b>", "full", "a new special token"),
    Row("resize_vocab", True, "full", "resize to the tokenizer"),
    Row("new_special_tokens", "<sweep_c>", "freeze", "the older name of add_special_tokens (an alias)"),
    # -- method -----------------------------------------------------------------------------------
    Row("stage", "dpo", "dpo", "preference pairs"),
    Row("do_train", False, "predict", "a prediction-only run"),
    Row("finetuning_type", "full", "full", "all weights trained"),
    Row("lora_rank", 4, "sft", "a smaller rank than the default 8"),
    Row("lora_alpha", 16, "sft", "alpha set (default: 2 x rank)"),
    Row("lora_dropout", 0.05, "sft", "adapter dropout"),
    Row("lora_target", "q_proj,v_proj", "sft", "named modules instead of all linear layers"),
    Row("lora_target_modules", "q_proj,k_proj", "dpo", "lora_target's other name (an alias)"),
    Row("oft_rank", 0, "oft", "the number of blocks from oft_block_size (its default 0 is kept: both set conflict)"),
    Row("oft_block_size", 16, "oft", "blocks of 16 (divides the tiny model's 64 and 128 inputs)"),
    Row("oft_target", "q_proj,v_proj", "oft", "named modules"),
    Row("module_dropout", 0.1, "oft", "whole-block dropout"),
    Row("freeze_trainable_layers", 1, "freeze", "the last layer trained"),
    Row("freeze_trainable_modules", "mlp", "freeze", "only the MLPs of the trained layers"),
    Row("freeze_extra_modules", "norm", "freeze", "the final norm trained too"),
    Row("use_llama_pro", True, "freeze", "block expansion: trains the expanded blocks"),
    Row("quantization_bit", 4, "qlora", "QLoRA on the CPU (bitsandbytes' CPU kernels), when installed", EITHER),
    Row("quantization_method", "bitsandbytes", "qlora", "the other spelling of bnb", EITHER),
    Row("quantization_type", "fp4", "qlora", "fp4 instead of nf4", EITHER),
    Row("double_quantization", False, "qlora", "no double quantization", EITHER),
    Row("pref_loss", "simpo", "dpo", "SimPO: no reference model"),
    Row("pref_beta", 2.0, "dpo", "SimPO's beta"),
    Row("pref_ftx", 0.1, "dpo", "an SFT term on the chosen answers"),
    Row("simpo_gamma", 1.0, "dpo", "SimPO's margin"),
    Row("dpo_label_smoothing", 0.1, "dpo_ref", "robust DPO (sigmoid)"),
    Row("kto_chosen_weight", 1.5, "kto", "desirable answers weighted up"),
    Row("kto_rejected_weight", 0.5, "kto", "undesirable answers weighted down"),
    Row("ref_model", "{tiny}", "dpo_ref", "an explicit reference model"),
    Row("ref_model_adapters", A, "dpo_ref", "a LoRA adapter on the reference"),
    Row("ref_model_quantization_bit", 8, "dpo_ref", "an 8-bit reference (bitsandbytes), when installed", EITHER),
    Row("reward_funcs", "exact_match,regex,length_penalty", "grpo", "three built-in rewards"),
    Row("reward_weights", "1.0,0.5,0.5", "grpo", "one weight per reward"),
    Row("reward_answer_column", "gold", "grpo", "the answer column named otherwise"),
    Row("reward_regex", r"\d", "grpo", "the regex reward's pattern"),
    Row("reward_target_words", 3, "grpo", "length_penalty's target"),
    Row("num_generations", 2, "grpo", "groups of 2 (the batch of 2 holds one group)"),
    Row("max_completion_length", 8, "grpo", "short completions"),
    Row("steps_per_generation", 1, "grpo", "one micro-step per generation round"),
    Row("num_iterations", 2, "grpo", "two passes over each generated batch"),
    Row("beta", 0.04, "grpo", "a KL term: a reference model is built"),
    Row("epsilon", 0.3, "grpo", "a wider clip"),
    Row("epsilon_high", 0.4, "grpo", "DAPO's clip-higher"),
    Row("loss_type", "grpo", "grpo", "GRPO's own aggregation (default dapo)"),
    Row("scale_rewards", "batch", "grpo", "advantages scaled by the batch's spread"),
    Row("mask_truncated_completions", True, "grpo", "cut completions out of the loss"),
    Row("reward_hack_window", 4, "grpo", "the reward-hacking watch over 4 logged steps"),
    Row("reward_hack_drop", 0.1, "grpo", "a smaller fall counts as hacking"),
    Row("reward_hack_min_length", 2.0, "grpo", "completions of 2 tokens or fewer count as collapsed"),
    Row("reward_hack_truncation_jump", 0.3, "grpo", "a larger truncated share needed"),
    Row("reward_hack_kl", 0.5, "grpo", "a lower KL bound"),
    Row("reward_hack_flat", 0.02, "grpo", "a stricter flat total"),
    Row("use_vllm", True, "grpo", "vLLM generates on a GPU: refused on the CPU", REFUSED),
    Row("vllm_mode", "server", "grpo", "without use_vllm: refused or unused", EITHER),
    # -- dataset ----------------------------------------------------------------------------------
    Row("dataset", "cockpit_identity,cockpit_bilingual", "mix", "two datasets by name"),
    Row("dataset_dir", "{demo}", "mix", "the built-in demo folder named explicitly"),
    Row("cutoff_len", 96, "sft", "a shorter cutoff"),
    Row("max_samples", 8, "sft", "8 samples a dataset"),
    Row("val_size", 4, "eval", "4 samples held out"),
    Row("overwrite_cache", True, "lora2", "tokenise afresh into tokenized_path"),
    Row("tokenized_path", T + "/tokenized", "lora2", "keep the tokenised samples"),
    Row("preprocessing_num_workers", 2, "sft", "two tokenising processes"),
    Row("default_system", "You are terse.", "sft", "a system message for every conversation"),
    Row("enable_thinking", False, "sft", "the template's thinking off"),
    Row("tool_format", "qwen", "mix", "Qwen's tool format (the data has no tools: unused)"),
    Row("mix_strategy", "interleave_under", "mix", "interleaved to the shortest"),
    Row("interleave_probs", "0.7,0.3", "mix", "sampling probabilities"),
    Row("train_on_prompt", True, "sft", "the prompt carries loss too"),
    Row("mask_history", True, "lora2", "the last reply only"),
    Row("ignore_pad_token_for_loss", False, "sft", "true is the only value: refused", REFUSED),
    Row("dataloader_num_workers", 1, "sft", "a DataLoader worker process"),
    Row("packing", True, "lora2", "padding-free micro-batches"),
    Row("neat_packing", True, "lora2", "the same as packing here"),
    Row("group_by_length", True, "sft", "length-grouped micro-batches"),
    Row("allow_bad_rows", True, "sft", "bad rows skipped (none here)"),
    # -- output -----------------------------------------------------------------------------------
    Row("output_dir", T + "/out", "sft", "checkpoints and adapter outside the run dir"),
    Row("overwrite_output_dir", True, "sft", "allowed over old checkpoints"),
    Row("logging_steps", 1, "sft", "every step"),
    Row("save_steps", 1, "sft", "a checkpoint at step 1"),
    Row("save_strategy", "epoch", "lora2", "checkpoints by epoch"),
    Row("save_total_limit", 1, "sft", "one checkpoint kept"),
    Row("save_only_model", True, "sft", "no optimizer state"),
    Row("plot_loss", False, "sft", "no loss.png"),
    Row("report_to", "tensorboard,trackio", "sft", "two trackers, when installed (their side folder)", EITHER),
    Row("project", "sweep", "sft", "trackio's project: refused with report_to when trackio is missing", EITHER),
    Row("use_swanlab", True, "lora2", "SwanLab offline, when installed", EITHER),
    Row("swanlab_project", "sweep", "lora2", "SwanLab's project", EITHER),
    Row("swanlab_workspace", "me", "lora2", "SwanLab's workspace (cloud only: unused offline)", EITHER),
    Row("swanlab_run_name", "sweep-run", "lora2", "SwanLab's experiment name", EITHER),
    Row("swanlab_mode", "offline", "lora2", "no network", EITHER),
    Row("swanlab_api_key", "not-a-key", "lora2", "passed as env, redacted (offline: unused)", EITHER),
    Row("swanlab_logdir", T + "/swanlog", "lora2", "SwanLab's folder", EITHER),
    Row("run_name", "sweep-sft", "sft", "the run dir's name"),
    Row("include_effective_tokens_per_second", True, "sft", "effective tokens/s in summary.json"),
    Row(
        "include_num_input_tokens_seen",
        False,
        "sft",
        "always on here (the tokens/s figures): false is refused",
        REFUSED,
    ),
    # -- training ---------------------------------------------------------------------------------
    Row("per_device_train_batch_size", 2, "sft", "micro-batches of 2"),
    Row("gradient_accumulation_steps", 2, "sft", "two micro-batches a step"),
    Row("learning_rate", 1e-3, "sft", "another rate"),
    Row("num_train_epochs", 1.0, "sft", "one epoch (max_steps decides)"),
    Row("max_steps", 1, "sft", "one step"),
    Row("lr_scheduler_type", "cosine_with_min_lr", "sft", "a schedule with kwargs"),
    Row("lr_scheduler_kwargs", {"min_lr_rate": 0.1}, "sft", "cosine_with_min_lr's floor"),
    Row("warmup_ratio", 0.1, "sft", "warmup by ratio"),
    Row("warmup_steps", 1, "lora2", "warmup by steps"),
    Row("weight_decay", 0.01, "sft", "AdamW decay"),
    Row("max_grad_norm", 0.5, "sft", "tighter clipping"),
    Row("bf16", True, "sft", "bf16 autocast on the CPU (warned where slow)"),
    Row("fp16", True, "lora2", "fp16 on the CPU: fp32 with a note"),
    Row("pure_bf16", True, "full", "weights and optimizer in bf16"),
    Row("gradient_checkpointing", True, "sft", "recompute activations"),
    Row("enable_liger_kernel", True, "sft", "Liger's Triton kernels: a GPU (refused on the CPU)", REFUSED),
    Row(
        "torch_compile",
        True,
        None,
        "inductor on the CPU (a C++ compiler; refused without one: tests/test_one_gate.py); "
        "its first step compiles for ~110 s here, measured: too long for the sweep",
        CHECK,
    ),
    Row(
        "torch_compile_mode",
        "default",
        "sft",
        "needs torch_compile: true (whose row is check-only): refused alone, naming the key",
        REFUSED,
    ),
    Row(
        "moe_aux_loss_coef",
        0.01,
        "sft",
        "the router's loss: refused on a dense model, naming it (trained on an MoE: tests/test_moe.py)",
        REFUSED,
    ),
    Row("media_dir", T, "sft", "where image paths are looked up: a folder that exists (the text rows have no images)"),
    Row(
        "image_max_pixels",
        65536,
        "sft",
        "a vision-language model's key: refused on the text model, naming it (trained on a LLaVA: tests/test_vlm_train.py)",
        REFUSED,
    ),
    Row(
        "image_min_pixels",
        4096,
        "sft",
        "a vision-language model's key: refused on the text model, naming it (trained on a LLaVA: tests/test_vlm_train.py)",
        REFUSED,
    ),
    Row(
        "video_max_pixels",
        16384,
        "sft",
        "a vision-language model's key: refused on the text model, naming it (inert on a VLM, said at check: "
        "tests/test_vlm_families.py)",
        REFUSED,
    ),
    Row(
        "video_min_pixels",
        1024,
        "sft",
        "a vision-language model's key: refused on the text model, naming it (inert on a VLM, said at check: "
        "tests/test_vlm_families.py)",
        REFUSED,
    ),
    Row(
        "freeze_vision_tower",
        False,
        "sft",
        "a vision-language model's key: refused on the text model, naming it (trained on a LLaVA: tests/test_vlm_train.py)",
        REFUSED,
    ),
    Row(
        "freeze_multi_modal_projector",
        False,
        "sft",
        "a vision-language model's key: refused on the text model, naming it (trained on a LLaVA: tests/test_vlm_train.py)",
        REFUSED,
    ),
    Row(
        "freeze_language_model",
        True,
        "sft",
        "a vision-language model's key: refused on the text model, naming it (trained on a LLaVA: tests/test_vlm_train.py)",
        REFUSED,
    ),
    Row(
        "train_mm_proj_only",
        True,
        "full",
        "a vision-language model's key: refused on the text model, naming it (trained on a LLaVA: tests/test_vlm_train.py)",
        REFUSED,
    ),
    Row("seed", 7, "sft", "another seed"),
    Row("resume_from_checkpoint", "last", "eval", "'last' with no checkpoint yet"),
    Row("ddp_timeout", 600, "fsdp", "a shorter collective timeout"),
    Row("use_cpu", True, "sft", "the CPU on purpose"),
    Row("optim", "adafactor", "full", "HF's Adafactor"),
    Row("use_muon", True, "muon", "Muon for the 2-D weights"),
    Row("use_adam_mini", True, "adam_mini", "Adam-mini, when installed", EITHER),
    Row("use_dft_loss", True, "full", "DFT loss"),
    Row("use_eaft_loss", True, "pissa", "EAFT loss"),
    Row("eaft_alpha", 0.5, "pissa", "EAFT's power"),
    Row("use_galore", True, "galore", "GaLore, when its side folder has it", EITHER),
    Row("galore_layerwise", True, "galore", "per layer", EITHER),
    Row("galore_target", "q_proj,v_proj", "galore", "named modules", EITHER),
    Row("galore_rank", 4, "galore", "rank 4", EITHER),
    Row("galore_update_interval", 1, "galore", "every step", EITHER),
    Row("galore_scale", 0.5, "galore", "another scale", EITHER),
    Row("galore_proj_type", "right", "galore", "right projection", EITHER),
    Row("use_apollo", True, "apollo", "APOLLO, when its side folder has it", EITHER),
    Row("apollo_layerwise", True, "apollo", "per layer", EITHER),
    Row("apollo_target", "q_proj,v_proj", "apollo", "named modules", EITHER),
    Row("apollo_rank", 4, "apollo", "rank 4", EITHER),
    Row("apollo_update_interval", 1, "apollo", "every step", EITHER),
    Row("apollo_scale", 1.0, "apollo", "another scale", EITHER),
    Row("apollo_proj", "svd", "apollo", "SVD projection", EITHER),
    Row("apollo_proj_type", "right", "apollo", "right projection", EITHER),
    Row("apollo_scale_type", "tensor", "apollo", "per tensor", EITHER),
    Row("apollo_scale_front", True, "apollo", "not in HF's APOLLO: refused", REFUSED),
    Row("use_badam", True, "badam", "BAdam, when installed", EITHER),
    Row("badam_mode", "layer", "badam", "layer mode (the default, set)", EITHER),
    Row("badam_start_block", 1, "badam", "start at the second layer", EITHER),
    Row("badam_switch_mode", "descending", "badam", "blocks in descending order", EITHER),
    Row("badam_switch_interval", 1, "badam", "switch every step", EITHER),
    Row("badam_update_ratio", 0.1, "badam", "ratio mode's share (unused in layer mode)", EITHER),
    Row("badam_mask_mode", "scatter", "badam", "ratio mode's mask (unused in layer mode)", EITHER),
    Row("badam_verbose", 1, "badam", "BAdam's log level", EITHER),
    Row("adam_beta1", 0.85, "sft", "Adam beta1"),
    Row("adam_beta2", 0.99, "sft", "Adam beta2"),
    Row("adam_epsilon", 1e-6, "sft", "Adam epsilon"),
    Row("disable_gradient_checkpointing", True, "pissa", "checkpointing forced off"),
    Row("use_reentrant_gc", True, "sft", "reentrant checkpointing"),
    Row("use_unsloth_gc", True, "sft", "checkpoints offloaded to host memory (with gradient_checkpointing)"),
    # -- LoRA variants ----------------------------------------------------------------------------
    Row("use_dora", True, "lora2", "DoRA"),
    Row("use_rslora", True, "lora2", "rank-stabilised scaling"),
    Row("pissa_init", True, "pissa", "PiSSA initialisation"),
    Row("pissa_iter", 4, "pissa", "fast SVD, 4 iterations"),
    Row("pissa_convert", True, "pissa", "the final adapter converted to plain LoRA"),
    Row("loraplus_lr_ratio", 4.0, "lora2", "LoRA+"),
    Row("loraplus_lr_embedding", 1e-5, "lora2", "LoRA+'s embedding rate"),
    Row("create_new_adapter", True, "lora2", "merge adapter_name_or_path, train a new one"),
    Row("additional_target", "norm", "lora2", "the final norm trained fully beside the adapter"),
    # -- strategy ---------------------------------------------------------------------------------
    Row("deepspeed", "{ds_json}", "ds", "a DeepSpeed ZeRO-2 JSON on one CPU rank", EITHER),
    Row("fsdp", "full_shard auto_wrap", "fsdp", "FSDP over two CPU ranks (gloo)", EITHER),
    Row("nproc_per_node", 2, "fsdp", "two ranks"),
    Row("nnodes", 2, None, "a second node: none here", CHECK),
    Row("node_rank", 1, None, "this node's rank in a two-node job", CHECK),
    Row("master_addr", "localhost", "fsdp", "the rendezvous by name"),
    Row("master_port", 29731, "fsdp", "a fixed rendezvous port"),
    Row("env", {"SWEEP_MARK": "1"}, "sft", "an environment variable on every rank"),
    Row("zero_stage", 2, None, "a generated ZeRO-2 config: the deepspeed row's run covers DeepSpeed", CHECK),
    Row("offload", "optimizer", None, "needs zero_stage: checked with it", CHECK),
    Row("slurm_gres", "gpu:mi300x", None, "Slurm only", CHECK),
    Row("numa_memory", "strict", "sft", "strict NUMA memory (no GPU: nothing bound)"),
    Row("numa_bind", "off", "sft", "no binding"),
    # -- watch ------------------------------------------------------------------------------------
    Row("probes", "@demo/identity_probes.jsonl", "sft", "the built-in probes"),
    Row("probe_max_new_tokens", 4, "sft", "short probe answers"),
    Row("nan_policy", "warn", "sft", "warn on NaN"),
    Row("spike_policy", "stop", "sft", "stop on a spike"),
    Row("spike_factor", 5.0, "sft", "a looser spike"),
    Row("hang_timeout_s", 600.0, "sft", "a longer hang floor"),
    Row("comm_probe", False, "fsdp", "no all-reduce probe"),
    Row("telemetry_interval_s", 0.5, "sft", "faster telemetry"),
    Row("load_timeout_s", 900.0, "sft", "a shorter load watchdog"),
    Row("memory_alert_headroom", 0.1, "sft", "another headroom"),
    Row("memory_alert_swing", 0.5, "sft", "another swing"),
    Row("cpu_memory_tracker", True, "sft", "live tensor bytes on the CPU"),
    # -- eval / predict ---------------------------------------------------------------------------
    Row("do_eval", True, "eval", "evaluate"),
    Row("eval_strategy", "steps", "eval", "by steps"),
    Row("eval_steps", 1, "eval", "every step"),
    Row("per_device_eval_batch_size", 2, "eval", "eval micro-batches of 2"),
    Row("eval_dataset", "cockpit_bilingual", "predict", "predict on another dataset"),
    Row("eval_on_start", True, "eval", "an evaluation before step 1"),
    Row("compute_accuracy", True, "eval", "token accuracy"),
    Row("load_best_model_at_end", True, "eval", "the best checkpoint at the end"),
    Row("metric_for_best_model", "eval_accuracy", "eval", "best by accuracy"),
    Row("greater_is_better", True, "eval", "higher accuracy is better"),
    Row("early_stopping_steps", 2, "eval", "early stopping"),
    Row("do_predict", True, "predict", "predictions"),
    Row("predict_with_generate", True, "predict", "generated"),
    Row("max_new_tokens", 4, "predict", "short answers"),
    Row("do_sample", True, "predict", "sampled"),
    Row("temperature", 0.7, "predict", "cooler"),
    Row("top_p", 0.9, "predict", "nucleus"),
    Row("top_k", 10, "predict", "top-k"),
    Row("repetition_penalty", 1.1, "predict", "a repetition penalty"),
]


def test_every_key_the_schema_accepts_has_one_row():
    keys = [r.key for r in ROWS]
    assert len(keys) == len(set(keys)), sorted({k for k in keys if keys.count(k) > 1})
    missing = sorted((set(SCHEMA) | set(ALIASES)) - set(keys))
    assert not missing, f"keys without a row in the sweep's table (give each a value and a reason): {missing}"
    extra = sorted(set(keys) - set(SCHEMA) - set(ALIASES))
    assert not extra, f"rows for keys the schema does not know: {extra}"
    for r in ROWS:
        assert r.group in GROUPS or (r.group is None and r.expect == CHECK), r
        default = SCHEMA[ALIASES.get(r.key, r.key)].default
        assert r.value != default or r.key in ("oft_rank", "badam_mode"), f"{r.key}: the sweep's value is the default"


# -- the inputs the rows name ---------------------------------------------------------------------
def _fixtures(tmp: Path, tiny: Path) -> dict[str, str]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    data = tmp / "data"
    data.mkdir()
    kto = []
    for i in range(4):
        kto.append(
            {
                "messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": f"A{i}."}],
                "label": True,
            }
        )
        kto.append(
            {
                "messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": "No."}],
                "label": False,
            }
        )
    (data / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kto))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    info = {
        "kto_demo": {
            "file_name": "kto.jsonl",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "kto_tag": "label"},
            "tags": tags,
        }
    }
    (data / "dataset_info.json").write_text(json.dumps(info))
    (data / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Say {i}?", "gold": str(i)}) + "\n" for i in range(4))
    )
    adapter = tmp / "adapter"
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(tiny)), LoraConfig(r=4, target_modules="all-linear")
    )
    model.save_pretrained(adapter)
    ds = tmp / "ds.json"
    ds.write_text(
        json.dumps(
            {
                "zero_optimization": {"stage": 2},
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "train_batch_size": "auto",
            }
        )
    )
    return {
        "tmp": str(tmp),
        "tiny": str(tiny),
        "adapter": str(adapter),
        "data": str(data),
        "demo": str(ROOT / "cockpit" / "demo_data"),
        "ds_json": str(ds),
    }


def _fill(value: Any, where: dict[str, str]) -> Any:
    return value.format(**where) if isinstance(value, str) and "{" in value else value


def _config(group: str, rows: list[Row], where: dict[str, str], tmp: Path, extra: dict | None = None) -> Path:
    cfg = {"model_name_or_path": where["tiny"], **BASE, **GROUPS[group], **(extra or {})}
    cfg.update({r.key: r.value for r in rows})
    cfg = {k: _fill(v, where) for k, v in cfg.items()}
    if "lora_target_modules" in cfg:
        cfg.pop("lora_target")
    path = tmp / "configs" / f"{group}-{abs(hash(tuple(r.key for r in rows))) % 10**8}.yaml"
    path.parent.mkdir(exist_ok=True)
    return write_yaml(path, cfg)


def _check(path: Path) -> InputError | None:
    """``cockpit check``'s function, in-process: None when it accepts the config."""
    from cockpit.config import load_config
    from cockpit.preflight.checks import check_run

    try:
        check_run(load_config(str(path), []), log=lambda *_: None)
    except InputError as err:
        return err
    return None


def _names(err: InputError, key: str) -> bool:
    """The refusal is about ``key`` (its problem's key, as the config or an alias spells it)."""
    name = ALIASES.get(key, key)
    return any(p.key in (key, name) for p in err.problems)


def _train(path: Path, runs: Path) -> tuple[int, str]:
    command = [sys.executable, "-m", "cockpit.cli", "train", str(path), "--runs-dir", str(runs)]
    res = warm_start.run(command, dict(os.environ), str(path.parent), timeout=600)
    return res.returncode, (res.stdout[-2500:] + res.stderr[-2500:])


@pytest.mark.budget(300, reason="213 rows: every accepted key checked and trained")
def test_check_says_yes_and_the_run_trains_or_check_says_no(tmp_path, tiny_model_dir):
    where = _fixtures(tmp_path, tiny_model_dir)
    findings: list[str] = []
    runs = 0
    for group in GROUPS:
        others = [r for r in ROWS if r.group == group and r.expect in (TRAIN, EITHER)]
        for r in (r for r in ROWS if r.group == group and r.expect == REFUSED):  # with the group's other rows
            err = _check(_config(group, [*others, r], where, tmp_path))
            if err is None or not _names(err, r.key):
                findings.append(
                    f"{r.key}={r.value!r}: the table says check refuses it ({r.why}); check says {err or 'OK'}"
                )
        accepted = others
        while accepted and (err := _check(_config(group, accepted, where, tmp_path))) is not None:
            refused = [r for r in accepted if _names(err, r.key)]  # the rows the refusal names go
            for r in refused:
                if r.expect == TRAIN:
                    findings.append(f"{r.key}={r.value!r}: check refuses it ({r.why}): {err}")
            if not refused:
                findings.append(f"group {group}: check refuses it, naming none of its rows: {err}")
            accepted = [r for r in accepted if r not in refused] if refused else []
        if not accepted:
            continue
        t0 = time.monotonic()
        code, out = _train(_config(group, accepted, where, tmp_path), tmp_path / "runs" / group)
        runs += 1
        print(f"key sweep: {group}: {len(accepted)} keys, exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
        if code != 0:
            findings.append(
                f"group {group} ({', '.join(r.key for r in accepted)}): check accepts it, the run exits {code}:\n{out}"
            )
    only = [
        r for r in ROWS if r.expect == CHECK
    ]  # check-only rows, together (offload needs zero_stage): accepted, no run
    if (err := _check(_config("sft", only, where, tmp_path, {"master_port": 29731}))) is not None:
        findings.append(f"check-only rows ({', '.join(r.key for r in only)}): check refuses them: {err}")
    print(f"key sweep: {len(ROWS)} rows, {runs} runs")
    assert not findings, "\n\n".join(findings)
