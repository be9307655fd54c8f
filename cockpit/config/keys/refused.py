"""LLaMA-Factory's keys Cockpit refuses, and why: the names (:data:`REFUSED_NAMES`; a name the schema
has now is no longer refused, :data:`cockpit.config.schema.LLAMAFACTORY_UNSUPPORTED`) and the reason for
each (:data:`REFUSAL_REASONS`, :func:`refusal_reason`). Each key Cockpit does take is declared in its
group's module beside this one."""

from __future__ import annotations

import fnmatch

# LLaMA-Factory keys we know but do not implement yet (less the schema's own keys and aliases: see above).
REFUSED_NAMES = frozenset(
    """
    booster flash_attn shift_attn mixture_of_depths use_unsloth
    disable_gradient_checkpointing use_reentrant_gc upcast_layernorm upcast_lmhead_output
    train_from_scratch infer_backend offload_folder use_cache infer_dtype hf_hub_token ms_hub_token om_hub_token
    print_param_status use_kv_cache model_revision low_cpu_mem_usage rope_scaling resize_vocab split_special_tokens
    add_tokens add_special_tokens new_special_tokens
    video_fps video_maxlen audio_sampling_rate crop_to_patches use_audio_in_video
    export_dir export_size export_device export_quantization_bit export_quantization_dataset
    export_quantization_nsamples export_quantization_maxlen export_legacy_format export_hub_model_id
    vllm_maxlen vllm_gpu_util vllm_enforce_eager vllm_max_lora_rank vllm_config
    quantization_device_map
    eval_dataset streaming buffer_size
    train_on_prompt mask_history tool_format default_system ignore_pad_token_for_loss
    data_shared_file_system
    use_dora use_rslora pissa_init pissa_iter pissa_convert loraplus_lr_ratio loraplus_lr_embedding
    additional_target create_new_adapter freeze_extra_modules
    num_beams length_penalty max_length skip_special_tokens
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
    torch_compile_backend torch_empty_cache_steps trackio_bucket_id trackio_space_id
    trackio_static_space_id train_sampling_strategy use_liger_kernel
    """.split()
)


# Why each LLaMA-Factory key Cockpit does not implement is refused: (fnmatch patterns, reason).
# The first match wins; tests/test_lf_parity.py checks that every refused key has one.
REFUSAL_REASONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        (
            "video_*",
            "audio_*",
            "use_audio_in_video",
        ),
        "video / audio training: Cockpit reads images only (the images column, media_dir); videos and audios are refused",
    ),
    (
        (
            "image_*",
            "crop_to_patches",
        ),
        "an image setting of a vision-language model Cockpit does not train yet (it trains LLaVA: issue 63)",
    ),
    (("export_*",), "export settings of llamafactory-cli export; use `cockpit export RUN [--merge]`"),
    (
        ("vllm_*", "sglang_*", "infer_backend", "infer_dtype", "use_kv_cache"),
        "inference settings of llamafactory-cli chat/api; use `cockpit serve` / `cockpit chat`",
    ),
    (("ppo_*", "reward_model*"), "a PPO (RLHF) stage key; Cockpit trains the sft, pt, dpo, kto and rm stages"),
    (
        ("swanlab_lark_*",),
        "SwanLab's Lark (Feishu) notifications are not wired in; notify_command runs your own webhook script when a "
        "run ends or alerts (docs/cockpit.md#notifications)",
    ),
    (
        ("ray_*", "resources_per_worker", "placement_strategy"),
        "Ray launching; Cockpit launches with torchrun (nproc_per_node / nnodes) or Slurm",
    ),
    (
        ("hf_hub_token", "ms_hub_token", "om_hub_token"),
        "a hub token in a config file; set HF_TOKEN in the environment instead (never stored in the run dir)",
    ),
    (
        ("quantization_device_map",),
        "Cockpit places a quantized (QLoRA) base on the rank's own device (the CPU, or the rank's GPU); other maps are not supported",
    ),
    (("use_unsloth",), "Unsloth's kernels are CUDA-only; not available on ROCm or the CPU"),
    (("booster",), "booster picks FlashAttention-2 / Unsloth / Liger; set flash_attn instead"),
    (("shift_attn",), "LongLoRA shift short attention is Llama-only and patches the model; not supported"),
    (("mixture_of_depths",), "Mixture-of-Depths conversion needs the MoD package; not supported"),
    (
        ("train_from_scratch",),
        "random initialisation instead of the checkpoint's weights: not supported (fine-tuning only)",
    ),
    (
        ("offload_folder", "use_cache", "print_param_status"),
        "a model-loading option not wired in yet",
    ),
    (
        ("split_special_tokens",),
        "splitting special tokens into their pieces changes how every prompt tokenizes and what the chat template's "
        "markers are; not supported (add_tokens / add_special_tokens add tokens, each kept whole)",
    ),
    (
        ("streaming", "buffer_size"),
        "streaming datasets are not supported yet (the data are read whole; tokenized_path keeps the tokens for later runs)",
    ),
    (("data_shared_file_system", "disable_shuffling"), "a data-loading option not supported yet"),
    (
        ("num_beams", "length_penalty", "max_length", "skip_special_tokens", "generation_*", "eval_num_beams"),
        "a decoding option not wired into prediction yet (do_sample, temperature, top_p, top_k, max_new_tokens "
        "and repetition_penalty are; special tokens are always left out of the predictions)",
    ),
    (("tf32",), "TF32 is an NVIDIA Ampere+ matmul mode; not supported"),
    # issue 37: the rest of LLaMA-Factory 0.9.5's keys (tests/fixtures/llamafactory/lf_keys.json), each with a verdict
    (
        ("use_asft_loss", "asft_alpha"),
        "not built yet: ASFT adds to DFT a KL term against a reference model's logits over the whole vocabulary at "
        "every position (a second model's forward per step); use_dft_loss is its DFT part",
    ),
    (("ld_alpha",), "not built yet: LD-DPO's length weighting; pref_loss is sigmoid | ipo | hinge | orpo | simpo"),
    (("pref_bco_weight",), "not built yet: DPO's BCO term; pref_ftx adds an SFT term instead"),
    (
        ("init_special_tokens", "new_special_tokens_config"),
        "not built yet: initialising new tokens from descriptions; add_special_tokens' new rows start from the old "
        "rows' mean",
    ),
    (
        ("adapter_folder",),
        "a subfolder of adapter_name_or_path: give the subfolder's path as adapter_name_or_path",
    ),
    (
        ("cache_dir",),
        "hub downloads go to Hugging Face's cache: set HF_HUB_CACHE (or HF_HOME) in the environment instead",
    ),
    (
        ("use_fast_tokenizer",),
        "not settable: the tokenizer is the one AutoTokenizer loads (the fast one where the model has it)",
    ),
    (
        ("preserve_thinking",),
        "not built yet: keeping earlier turns' thoughts with mask_history (they are dropped, LLaMA-Factory's default)",
    ),
    (
        ("preprocessing_batch_size",),
        "Cockpit tokenises sample by sample; preprocessing_num_workers sets the processes",
    ),
    (("eval_on_each_dataset",), "not built yet: one evaluation over all of eval_dataset"),
    (
        ("use_kt", "kt_*"),
        "KTransformers' AMX MoE backend is not supported (Intel AMX CPUs and its own kernels)",
    ),
    (
        ("use_hyper_parallel", "hyper_parallel_args", "use_mca", "parallelism_config"),
        "tensor / Megatron parallel backends are not supported; shard with fsdp or zero_stage",
    ),
    (
        ("use_v1_kernels",),
        "LLaMA-Factory's v1 kernels are not supported; flash_attn and enable_liger_kernel pick Cockpit's kernels",
    ),
    (("use_liger_kernel",), "HF's name for enable_liger_kernel: write enable_liger_kernel: true"),
    (("liger_kernel_config",), "not settable: enable_liger_kernel applies Liger's default kernels"),
    (("fp8", "fp8_*"), "FP8 training is not supported; bf16: true for mixed precision"),
    (
        ("enable_torch_profiler", "profiler_*", "profile_modules"),
        "not built yet: torch profiler traces (the step events carry each rank's step memory)",
    ),
    (
        ("push_to_hub", "hub_*"),
        "pushing to the Hugging Face Hub is not supported; `cockpit export RUN [--merge]` writes a folder to upload",
    ),
    (
        ("trackio_*",),
        "report_to: trackio logs locally (RUN_DIR/trackers/trackio, `trackio show`); deploying it to a Hugging Face "
        "Space or bucket is not supported",
    ),
    (
        ("auto_find_batch_size",),
        "use `cockpit tune CONFIG`: it finds the micro-batch that fits and runs fastest",
    ),
    (
        ("logging_strategy", "logging_first_step", "logging_nan_inf_filter", "log_level", "log_level_replica"),
        "set by Cockpit: it logs every logging_steps from the first step, NaN/inf losses unfiltered (nan_policy acts "
        "on them)",
    ),
    (
        ("log_on_each_node", "disable_tqdm", "skip_memory_metrics", "debug"),
        "set by Cockpit: every rank logs to RUN_DIR/logs/rank<N>.log, the step events carry each rank's memory, "
        "nan_policy / spike_policy watch the loss",
    ),
    (
        ("logging_dir",),
        "report_to: tensorboard writes under RUN_DIR/trackers/tensorboard; set TENSORBOARD_LOGGING_DIR in env: to "
        "move it",
    ),
    (("data_seed",), "set by Cockpit: the data order is seeded by seed"),
    (("remove_unused_columns",), "set by Cockpit: its collators pick the columns (always false)"),
    (
        ("gradient_checkpointing_kwargs",),
        "set by Cockpit from gradient_checkpointing and use_reentrant_gc",
    ),
    (
        ("optim_args", "optim_target_modules"),
        "set by Cockpit from use_galore / use_apollo and their keys (galore_rank, galore_target, ...); not settable "
        "for other optimizers",
    ),
    (
        ("torch_compile_backend",),
        "not settable yet: torch_compile: true compiles with inductor (torch's default backend); the mode is "
        "torch_compile_mode",
    ),
    (
        ("train_sampling_strategy", "sortish_sampler", "length_column_name"),
        "the sampler is random, or length-grouped with group_by_length: true (sequential: not supported)",
    ),
    (
        (
            "dataloader_drop_last",
            "dataloader_pin_memory",
            "dataloader_persistent_workers",
            "dataloader_prefetch_factor",
        ),
        "a DataLoader option left at HF's default (dataloader_num_workers is settable)",
    ),
    (
        ("ddp_backend",),
        "set by Cockpit: the GPUs' collective backend (NCCL / RCCL), gloo on the CPU",
    ),
    (
        ("ddp_broadcast_buffers", "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph"),
        "a DDP option left at HF's default; not settable yet",
    ),
    (("local_rank",), "set by the launcher (torchrun) for each rank, never in a config"),
    (
        ("fsdp_config", "accelerator_config"),
        "set by Cockpit from the strategy keys: fsdp's options (full_shard, shard_grad_op, hybrid_shard, offload, "
        "auto_wrap), zero_stage, deepspeed",
    ),
    (
        ("save_on_each_node", "ignore_data_skip", "restore_callback_states_from_checkpoint"),
        "a checkpoint / resume option left at HF's default (resuming skips the batches already seen); not settable yet",
    ),
    (
        (
            "eval_accumulation_steps",
            "eval_delay",
            "eval_do_concat_batches",
            "eval_use_gather_object",
            "batch_eval_metrics",
            "include_for_metrics",
            "prediction_loss_only",
            "bf16_full_eval",
            "fp16_full_eval",
            "label_names",
        ),
        "an evaluation-loop option left at HF's default (evaluation runs in the training precision); not settable yet",
    ),
    (("average_tokens_across_devices",), "left at HF's default: the loss averages over every rank's tokens"),
    (("label_smoothing_factor",), "not built yet for sft / pt (dpo_label_smoothing is DPO's)"),
    (("neftune_noise_alpha",), "not built yet: NEFTune's noise on the embeddings"),
    (("full_determinism",), "not supported: seed seeds every rank, deterministic kernels are not forced"),
    (("torch_empty_cache_steps",), "not settable: Cockpit never empties the allocator's cache during training"),
    (
        ("enable_jit_checkpoint",),
        "not built yet: a checkpoint on SIGTERM; `cockpit stop RUN` saves and stops a run",
    ),
)


def refusal_reason(key: str) -> str | None:
    for patterns, reason in REFUSAL_REASONS:
        if any(fnmatch.fnmatchcase(key, p) for p in patterns):
            return reason
    return None
