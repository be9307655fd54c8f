"""The run config's keys, one module per group: LLaMA-Factory's argument groups (model, data, training,
finetuning, generation) and Cockpit's own (telemetry, launch, grpo). Each key is declared once, in its
group's module, with its type, default, help text, range or choices and whether LLaMA-Factory has it; the
LLaMA-Factory keys Cockpit refuses, and why, are in :mod:`cockpit.config.keys.refused`."""

from __future__ import annotations

from cockpit.config.keys import data, finetuning, generation, grpo, launch, model, telemetry, training
from cockpit.config.keys.base import Key

GROUPS = (model, data, training, finetuning, generation, telemetry, launch, grpo)

# The order the resolved config.yaml, the Setup form's YAML and RunConfig's fields list the keys in (the
# schema's order before the split into groups); a key not named here comes after these, in GROUPS' order.
_ORDER = """
    model_name_or_path adapter_name_or_path trust_remote_code model_revision template stage do_train
    finetuning_type lora_rank oft_rank oft_block_size oft_target module_dropout lora_alpha lora_dropout
    lora_target freeze_trainable_layers use_llama_pro quantization_bit quantization_method quantization_type
    double_quantization pref_loss pref_beta pref_ftx simpo_gamma dpo_label_smoothing kto_chosen_weight
    kto_rejected_weight ref_model ref_model_adapters ref_model_quantization_bit reward_funcs reward_weights
    reward_answer_column reward_regex reward_target_words num_generations max_completion_length
    steps_per_generation num_iterations beta epsilon epsilon_high loss_type scale_rewards
    mask_truncated_completions use_vllm vllm_mode dataset dataset_dir cutoff_len max_samples val_size
    overwrite_cache tokenized_path preprocessing_num_workers default_system enable_thinking tool_format
    mix_strategy interleave_probs train_on_prompt mask_history ignore_pad_token_for_loss dataloader_num_workers
    packing neat_packing group_by_length allow_bad_rows output_dir overwrite_output_dir logging_steps save_steps
    save_strategy save_total_limit save_only_model plot_loss report_to project use_swanlab swanlab_project
    swanlab_workspace swanlab_run_name swanlab_mode swanlab_api_key swanlab_logdir run_name
    per_device_train_batch_size gradient_accumulation_steps learning_rate num_train_epochs max_steps
    lr_scheduler_type warmup_ratio warmup_steps weight_decay max_grad_norm bf16 fp16 pure_bf16
    gradient_checkpointing enable_liger_kernel torch_compile torch_compile_mode seed resume_from_checkpoint ddp_timeout use_cpu
    deepspeed fsdp nproc_per_node nnodes node_rank master_addr master_port env zero_stage offload slurm_gres
    numa_memory numa_bind probes probe_max_new_tokens nan_policy spike_policy spike_factor hang_timeout_s
    comm_probe telemetry_interval_s load_timeout_s memory_alert_headroom memory_alert_swing reward_hack_window
    reward_hack_drop reward_hack_min_length reward_hack_truncation_jump reward_hack_kl reward_hack_flat
    cpu_memory_tracker use_dora use_rslora pissa_init pissa_iter pissa_convert loraplus_lr_ratio
    loraplus_lr_embedding create_new_adapter additional_target optim use_muon use_adam_mini use_dft_loss
    use_eaft_loss eaft_alpha use_galore galore_layerwise galore_target galore_rank galore_update_interval
    galore_scale galore_proj_type use_apollo apollo_layerwise apollo_target apollo_rank apollo_update_interval
    apollo_scale apollo_proj apollo_proj_type apollo_scale_type apollo_scale_front use_badam badam_mode
    badam_start_block badam_switch_mode badam_switch_interval badam_update_ratio badam_mask_mode badam_verbose
    adam_beta1 adam_beta2 adam_epsilon lr_scheduler_kwargs do_eval eval_strategy eval_steps
    per_device_eval_batch_size eval_dataset eval_on_start compute_accuracy load_best_model_at_end
    metric_for_best_model greater_is_better early_stopping_steps do_predict predict_with_generate max_new_tokens
    do_sample temperature top_p top_k repetition_penalty flash_attn disable_gradient_checkpointing
    use_reentrant_gc use_unsloth_gc freeze_trainable_modules freeze_extra_modules
    include_effective_tokens_per_second include_num_input_tokens_seen rope_scaling upcast_layernorm
    upcast_lmhead_output low_cpu_mem_usage add_tokens add_special_tokens resize_vocab
""".split()


def _ordered() -> tuple[Key, ...]:
    keys = [k for group in GROUPS for k in group.KEYS]
    rank = {name: i for i, name in enumerate(_ORDER)}
    return tuple(sorted(keys, key=lambda k: rank.get(k.name, len(rank))))  # stable: new keys keep GROUPS' order


KEYS: tuple[Key, ...] = _ordered()
