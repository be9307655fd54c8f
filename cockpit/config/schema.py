"""The run config schema: one flat mapping, LLaMA-Factory's key names for the common subset.

Each key has a type, a default, and either choices or a range. ``cockpit check``, the TUI's
forms and ``cockpit train`` all validate through :func:`cockpit.config.load.validate`.
No torch / transformers imports here (the UI uses this module).
"""

from __future__ import annotations

from typing import Any

from cockpit.config.keys import KEYS
from cockpit.config.keys.base import OPTIMIZERS, REPORT_TO_HELP, SCHEDULERS, TRACKER_NAMES, Key

__all__ = [
    "ADAPTER_METHODS",
    "ALIASES",
    "KEYS",
    "LLAMAFACTORY_UNSUPPORTED",
    "OPTIMIZERS",
    "REPORT_TO_HELP",
    "SCHEDULERS",
    "SCHEMA",
    "TRACKER_NAMES",
    "Key",
    "default_config",
    "describe",
]

SCHEMA: dict[str, Key] = {k.name: k for k in KEYS}

# finetuning_type values that train a PEFT adapter over a frozen base (saved as adapter/, merged by export)
ADAPTER_METHODS = ("lora", "oft")

# Other spellings LLaMA-Factory users meet in guides -> the schema key they mean (said once in the log).
ALIASES: dict[str, str] = {"lora_target_modules": "lora_target", "new_special_tokens": "add_special_tokens"}

# LLaMA-Factory keys we know but do not implement yet: an error says so, never silently ignored.
LLAMAFACTORY_UNSUPPORTED = frozenset(
    """
    booster flash_attn shift_attn mixture_of_depths use_unsloth
    moe_aux_loss_coef disable_gradient_checkpointing use_reentrant_gc upcast_layernorm upcast_lmhead_output
    train_from_scratch infer_backend offload_folder use_cache infer_dtype hf_hub_token ms_hub_token om_hub_token
    print_param_status use_kv_cache model_revision low_cpu_mem_usage rope_scaling resize_vocab split_special_tokens
    add_tokens add_special_tokens new_special_tokens image_max_pixels image_min_pixels video_max_pixels
    video_min_pixels video_fps video_maxlen audio_sampling_rate crop_to_patches use_audio_in_video
    export_dir export_size export_device export_quantization_bit export_quantization_dataset
    export_quantization_nsamples export_quantization_maxlen export_legacy_format export_hub_model_id
    vllm_maxlen vllm_gpu_util vllm_enforce_eager vllm_max_lora_rank vllm_config
    quantization_device_map
    eval_dataset streaming buffer_size
    train_on_prompt mask_history tool_format default_system ignore_pad_token_for_loss
    media_dir data_shared_file_system
    use_dora use_rslora pissa_init pissa_iter pissa_convert loraplus_lr_ratio loraplus_lr_embedding
    additional_target create_new_adapter freeze_extra_modules freeze_vision_tower freeze_multi_modal_projector
    freeze_language_model train_mm_proj_only num_beams length_penalty max_length skip_special_tokens
    ppo_buffer_size ppo_epochs ppo_score_norm ppo_target ppo_whiten_rewards
    reward_model reward_model_adapters
    reward_model_quantization_bit reward_model_type use_badam badam_mode
    badam_start_block badam_switch_mode badam_switch_interval badam_update_ratio badam_mask_mode
    badam_verbose use_swanlab swanlab_project swanlab_workspace swanlab_run_name swanlab_mode
    swanlab_api_key swanlab_logdir compute_accuracy disable_shuffling predict_with_generate
    do_eval do_predict eval_strategy eval_steps per_device_eval_batch_size eval_on_start
    include_num_input_tokens_seen optim adam_beta1 adam_beta2 adam_epsilon lr_scheduler_kwargs
    load_best_model_at_end metric_for_best_model greater_is_better tf32 ray_run_name
    ray_storage_path ray_num_workers resources_per_worker placement_strategy ray_init_kwargs
    pure_bf16 use_muon use_adam_mini use_dft_loss use_eaft_loss use_asft_loss eaft_alpha asft_alpha
    oft_rank oft_block_size oft_target module_dropout early_stopping_steps include_effective_tokens_per_second
    ld_alpha pref_bco_weight init_special_tokens new_special_tokens_config adapter_folder cache_dir
    use_fast_tokenizer preserve_thinking preprocessing_batch_size eval_on_each_dataset eval_num_beams
    image_do_pan_and_scan sglang_config sglang_lora_backend sglang_maxlen sglang_mem_fraction sglang_tp_size
    use_kt kt_expert_checkpoint_path kt_lora_expert_intermediate_size kt_lora_expert_num kt_use_lora_experts
    kt_weight_path use_hyper_parallel hyper_parallel_args use_mca use_v1_kernels swanlab_lark_secret
    swanlab_lark_webhook_url fp8 fp8_backend fp8_enable_fsdp_float8_all_gather enable_torch_profiler
    profile_modules profiler_active_steps profiler_output_dir profiler_profile_memory profiler_record_shapes
    profiler_repeat profiler_wait_steps profiler_warmup_steps profiler_with_stack
    accelerator_config auto_find_batch_size average_tokens_across_devices batch_eval_metrics bf16_full_eval
    data_seed dataloader_drop_last dataloader_persistent_workers dataloader_pin_memory dataloader_prefetch_factor
    ddp_backend ddp_broadcast_buffers ddp_bucket_cap_mb ddp_find_unused_parameters ddp_static_graph debug
    disable_tqdm enable_jit_checkpoint eval_accumulation_steps eval_delay eval_do_concat_batches
    eval_use_gather_object fp16_full_eval fsdp_config full_determinism generation_config generation_max_length
    generation_num_beams gradient_checkpointing_kwargs hub_always_push hub_model_id hub_private_repo hub_revision
    hub_strategy hub_token ignore_data_skip include_for_metrics label_names label_smoothing_factor
    length_column_name liger_kernel_config local_rank log_level log_level_replica log_on_each_node logging_dir
    logging_first_step logging_nan_inf_filter logging_strategy neftune_noise_alpha optim_args optim_target_modules
    parallelism_config prediction_loss_only project push_to_hub remove_unused_columns
    restore_callback_states_from_checkpoint save_on_each_node skip_memory_metrics sortish_sampler
    torch_compile_backend torch_compile_mode torch_empty_cache_steps trackio_bucket_id trackio_space_id
    trackio_static_space_id train_sampling_strategy use_liger_kernel
    """.split()
) - ({k.name for k in KEYS} | set(ALIASES))  # a key the schema (or an alias) has now is no longer refused


def default_config() -> dict[str, Any]:
    return {k.name: k.default for k in KEYS}


def _bound(value: float) -> str:
    """A schema bound in words: whole numbers whole (1048576, not 1.04858e+06)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def describe(key: Key) -> str:
    """The allowed values of a key, for error messages."""
    if key.choices and key.type == "names":
        allowed = "one or a list of " + " | ".join(str(c) for c in key.choices)
    elif key.choices:
        allowed = " | ".join(str(c) for c in key.choices)
    elif key.type in ("int", "float"):
        lo = "" if key.min is None else (f"> {_bound(key.min)}" if key.min_exclusive else f">= {_bound(key.min)}")
        hi = "" if key.max is None else f"<= {_bound(key.max)}"
        allowed = f"{key.type} " + " and ".join(x for x in (lo, hi) if x) if (lo or hi) else key.type
    elif key.type == "bool":
        allowed = "true | false"
    elif key.type == "map":
        allowed = "a mapping of NAME: value"
    elif key.type == "dict":
        allowed = "a mapping"
    else:
        allowed = "a string"
    if key.nullable and key.default is None:
        allowed += " (or null)"
    return allowed
