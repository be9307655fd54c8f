"""The run config schema: one flat mapping, LLaMA-Factory's key names for the common subset.

Each key has a type, a default, and either choices or a range. ``cockpit check``, the TUI's
forms and ``cockpit train`` all validate through :func:`cockpit.config.load.validate`.
No torch / transformers imports here (the UI uses this module).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# transformers.SchedulerType values (pinned by tests/test_config.py against the real enum).
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
)


# transformers.training_args.OptimizerNames values (pinned by tests/test_lf_parity.py against the real enum).
OPTIMIZERS = (
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_torch_xla",
    "adamw_torch_npu_fused",
    "adafactor",
    "adamw_anyprecision",
    "adamw_torch_4bit",
    "adamw_torch_8bit",
    "ademamix",
    "sgd",
    "adagrad",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "ademamix_8bit",
    "lion_8bit",
    "lion_32bit",
    "paged_adamw_32bit",
    "paged_adamw_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "paged_lion_32bit",
    "paged_lion_8bit",
    "rmsprop",
    "rmsprop_bnb",
    "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit",
    "galore_adamw",
    "galore_adamw_8bit",
    "galore_adafactor",
    "galore_adamw_layerwise",
    "galore_adamw_8bit_layerwise",
    "galore_adafactor_layerwise",
    "lomo",
    "adalomo",
    "grokadamw",
    "schedule_free_radam",
    "schedule_free_adamw",
    "schedule_free_sgd",
    "apollo_adamw",
    "apollo_adamw_layerwise",
    "stable_adamw",
)


# report_to: the experiment trackers HF's Trainer logs to (cockpit/config/trackers.py, cockpit/train/trackers.py)
TRACKER_NAMES = ("tensorboard", "wandb", "mlflow", "trackio", "swanlab")
REPORT_TO_HELP = (
    "experiment trackers HF's Trainer logs to, one or a list: none | tensorboard | wandb | mlflow | trackio | swanlab "
    "(their files under RUN_DIR/trackers)"
)


@dataclass(frozen=True)
class Key:
    name: str
    type: str  # str | int | float | bool | map (env: NAME -> str) | dict (any YAML mapping) | choice | int_or_auto
    # | names (one or a YAML / comma list of the choices, stored as a comma string: report_to)
    default: Any = None
    help: str = ""
    group: str = "training"
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    nullable: bool = True
    llamafactory: bool = True  # the key (and its meaning) comes from LLaMA-Factory
    extra: dict[str, Any] = field(default_factory=dict)


def _k(*args: Any, **kwargs: Any) -> Key:
    return Key(*args, **kwargs)


KEYS: tuple[Key, ...] = (
    # -- model ---------------------------------------------------------------------------
    _k(
        "model_name_or_path",
        "str",
        "smollm2-135m-instruct",
        "embedded short name, local HF folder, .gguf file, or hub id",
        "model",
        nullable=False,
    ),
    _k("adapter_name_or_path", "str", None, "an existing LoRA adapter folder to start from", "model"),
    _k("trust_remote_code", "bool", False, "run Python code shipped with the model (warned)", "model", nullable=False),
    _k(
        "model_revision",
        "str",
        None,
        "a hub id's branch, tag or commit (from_pretrained revision=; default: main); refused with a local folder "
        "(it holds one revision)",
        "model",
    ),
    _k("template", "str", None, "chat template: the tokenizer's own when unset, else a named one", "model"),
    # -- method --------------------------------------------------------------------------
    _k(
        "stage",
        "choice",
        "sft",
        "sft | pt (raw text) | dpo (preference pairs) | kto (tagged answers) | rm (reward model) | grpo (online RL "
        "with reward functions)",
        "method",
        choices=("sft", "pt", "dpo", "kto", "rm", "grpo"),
        nullable=False,
    ),
    _k(
        "do_train",
        "bool",
        True,
        "train (false: a prediction-only run, with do_predict and adapter_name_or_path)",
        "method",
        nullable=False,
    ),
    _k(
        "finetuning_type",
        "choice",
        "lora",
        "lora | oft | freeze | full (oft: PEFT's orthogonal fine-tuning adapter, sft)",
        "method",
        choices=("lora", "oft", "freeze", "full"),
        nullable=False,
    ),
    _k("lora_rank", "int", 8, "LoRA rank r", "method", min=1, max=4096, nullable=False),
    # OFT (LLaMA-Factory's OFTArguments; PEFT's OFTConfig): give one of oft_rank / oft_block_size, the other 0
    _k(
        "oft_rank",
        "int",
        0,
        "finetuning_type oft: the number of OFT blocks per layer (0: from oft_block_size)",
        "method",
        min=0,
        nullable=False,
    ),
    _k(
        "oft_block_size",
        "int",
        32,
        "finetuning_type oft: each orthogonal block's size (0: from oft_rank); it divides every target's inputs",
        "method",
        min=0,
        nullable=False,
    ),
    _k(
        "oft_target",
        "str",
        None,
        "finetuning_type oft: 'all' linear layers or a comma list of module names (unset: lora_target's, which "
        "LLaMA-Factory 0.9.5 reads for OFT)",
        "method",
    ),
    _k(
        "module_dropout",
        "float",
        0.0,
        "finetuning_type oft: the probability of dropping a whole OFT block in training",
        "method",
        min=0.0,
        max=1.0,
        nullable=False,
    ),
    _k("lora_alpha", "int", None, "LoRA alpha (default: 2 x rank)", "method", min=1),
    _k("lora_dropout", "float", 0.0, "LoRA dropout", "method", min=0.0, max=1.0, nullable=False),
    _k("lora_target", "str", "all", "'all' linear layers, or a comma list of module names", "method", nullable=False),
    _k(
        "freeze_trainable_layers",
        "int",
        2,
        "freeze: train the last N layers (negative: the first N)",
        "method",
        nullable=False,
    ),
    _k(
        "use_llama_pro",
        "bool",
        False,
        "LLaMA Pro (block expansion): train only the expanded blocks, every (layers / freeze_trainable_layers)-th layer (freeze or LoRA)",
        "method",
        nullable=False,
    ),
    _k(
        "quantization_bit",
        "choice",
        None,
        "4 (QLoRA, NF4) or 8 bit base weights; needs bitsandbytes (its wheels train on a GPU or the CPU)",
        "method",
        choices=(4, 8),
    ),
    _k(
        "quantization_method",
        "choice",
        "bnb",
        "how quantization_bit quantizes: bitsandbytes on the fly (LLaMA-Factory's hqq / eetq are not supported)",
        "method",
        choices=("bnb", "bitsandbytes"),
        nullable=False,
    ),
    _k(
        "quantization_type",
        "choice",
        "nf4",
        "4-bit data type of bitsandbytes",
        "method",
        choices=("nf4", "fp4"),
        nullable=False,
    ),
    _k(
        "double_quantization",
        "bool",
        True,
        "4-bit: quantize the quantization constants too (about 0.37 bit a weight less)",
        "method",
        nullable=False,
    ),
    # -- preference stages (dpo / kto; cockpit/config/stages.py has their cross-key rules) ----
    _k(
        "pref_loss",
        "choice",
        "sigmoid",
        "dpo loss: sigmoid (DPO) | ipo | hinge | orpo | simpo",
        "method",
        choices=("sigmoid", "ipo", "hinge", "orpo", "simpo"),
        nullable=False,
    ),
    _k(
        "pref_beta",
        "float",
        0.1,
        "dpo/kto beta: how far the policy may move from the reference",
        "method",
        min=0.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "pref_ftx",
        "float",
        0.0,
        "weight of the SFT loss on the chosen answer added to the preference loss",
        "method",
        min=0.0,
        nullable=False,
    ),
    _k("simpo_gamma", "float", 0.5, "SimPO target reward margin", "method", min=0.0, nullable=False),
    _k(
        "dpo_label_smoothing",
        "float",
        0.0,
        "probability a preference label is flipped (robust DPO; sigmoid only)",
        "method",
        min=0.0,
        max=0.499,
        nullable=False,
    ),
    _k(
        "kto_chosen_weight",
        "float",
        1.0,
        "KTO weight of desirable (kto_tag true) answers",
        "method",
        min=0.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "kto_rejected_weight",
        "float",
        1.0,
        "KTO weight of undesirable (kto_tag false) answers",
        "method",
        min=0.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "ref_model",
        "str",
        None,
        "dpo/kto reference model (default: the base with the LoRA adapter disabled, else a copy of the base)",
        "method",
    ),
    _k("ref_model_adapters", "str", None, "a LoRA adapter folder applied to ref_model", "method"),
    _k(
        "ref_model_quantization_bit",
        "choice",
        None,
        "4 or 8 bit reference weights (bitsandbytes)",
        "method",
        choices=(4, 8),
    ),
    # -- grpo (online RL with reward functions; TRL GRPOConfig's names; rules in config/grpo.py) ----
    _k(
        "reward_funcs",
        "str",
        None,
        "grpo: comma list of reward functions: exact_match | contains_answer | numeric_match | regex | length_penalty | "
        "concise_answer | "
        "path/file.py:function (def f(prompts, completions, **columns) -> list of floats)",
        "method",
        llamafactory=False,
    ),
    _k(
        "reward_weights",
        "str",
        None,
        "grpo: comma list of weights, one per reward function (default: 1.0 each); the total reward is the weighted sum",
        "method",
        llamafactory=False,
    ),
    _k(
        "reward_answer_column",
        "str",
        "answer",
        "grpo: the dataset column exact_match and numeric_match compare the completion with",
        "method",
        nullable=False,
        llamafactory=False,
    ),
    _k("reward_regex", "str", None, "grpo: the regex reward's pattern (re.search)", "method", llamafactory=False),
    _k(
        "reward_target_words",
        "int",
        None,
        "grpo: the length_penalty and concise_answer rewards' target: 1 up to this many words, then target / words",
        "method",
        min=1,
        llamafactory=False,
    ),
    _k(
        "num_generations",
        "int",
        8,
        "grpo: completions sampled per prompt (a group; advantages are relative within it)",
        "method",
        min=2,
        max=4096,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "max_completion_length",
        "int",
        256,
        "grpo: tokens per sampled completion at most (longer ones are truncated)",
        "method",
        min=1,
        max=1_048_576,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "steps_per_generation",
        "int",
        None,
        "grpo: optimizer micro-steps per generation round (default: gradient_accumulation_steps)",
        "method",
        min=1,
        llamafactory=False,
    ),
    _k(
        "num_iterations",
        "int",
        1,
        "grpo: optimisation passes over each generated batch (TRL's mu)",
        "method",
        min=1,
        max=64,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "beta",
        "float",
        0.0,
        "grpo: KL coefficient to the reference model (0: no reference model is built or run)",
        "method",
        min=0.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "epsilon",
        "float",
        0.2,
        "grpo: clipping range of the policy ratio (lower bound; the upper too without epsilon_high)",
        "method",
        min=0.0,
        max=10.0,
        min_exclusive=True,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "epsilon_high",
        "float",
        None,
        "grpo: upper clipping bound of the policy ratio (DAPO's clip-higher; default: epsilon)",
        "method",
        min=0.0,
        max=10.0,
        min_exclusive=True,
        llamafactory=False,
    ),
    _k(
        "loss_type",
        "choice",
        "dapo",
        "grpo: loss aggregation, as TRL: grpo | dr_grpo | dapo | bnpo | cispo | sapo | luspo | vespo",
        "method",
        choices=("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "scale_rewards",
        "choice",
        "group",
        "grpo: advantages divided by the reward spread of the group | batch | none (Dr. GRPO)",
        "method",
        choices=("group", "batch", "none"),
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "mask_truncated_completions",
        "bool",
        False,
        "grpo: leave completions cut at max_completion_length out of the loss",
        "method",
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "use_vllm",
        "bool",
        False,
        "grpo: generate the completions with vLLM on the GPU (default: HF generate); needs vllm and a GPU",
        "method",
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "vllm_mode",
        "choice",
        "colocate",
        "grpo with use_vllm: colocate (vLLM in the training processes) | server (a trl vllm-serve on localhost:8000)",
        "method",
        choices=("colocate", "server"),
        nullable=False,
        llamafactory=False,
    ),
    # -- dataset -------------------------------------------------------------------------
    _k(
        "dataset",
        "str",
        None,
        "a .json/.jsonl file, or comma-separated names from dataset_info.json",
        "dataset",
        nullable=False,
    ),
    _k(
        "dataset_dir",
        "str",
        None,
        "folder with dataset_info.json (default: ./data where the command runs, else next to the config; then the built-in demo data)",
        "dataset",
    ),
    _k(
        "cutoff_len",
        "int",
        1024,
        "max tokens per sample; longer samples are truncated",
        "dataset",
        min=8,
        max=1_048_576,
        nullable=False,
    ),
    _k("max_samples", "int", None, "use at most N samples per dataset", "dataset", min=1),
    _k("val_size", "float", 0.0, "fraction (<1) or count (>=1) held out for eval", "dataset", min=0.0, nullable=False),
    _k(
        "overwrite_cache",
        "bool",
        False,
        "with tokenized_path: tokenise afresh and replace the cache (false: reuse it when its settings match)",
        "dataset",
        nullable=False,
    ),
    _k(
        "tokenized_path",
        "str",
        None,
        "a folder keeping SFT's tokenised samples for later runs (reused when tokenizer, template, cutoff, masking and data match)",
        "dataset",
    ),
    _k(
        "preprocessing_num_workers",
        "int",
        None,
        "processes that tokenise the data (default: one)",
        "dataset",
        min=1,
        max=1024,
    ),
    _k(
        "default_system",
        "str",
        None,
        "the system message of every conversation that has none (training, probes, chat, the saved template)",
        "dataset",
    ),
    _k(
        "enable_thinking",
        "bool",
        True,
        "false: the chat template renders with enable_thinking false (a reasoning model's template then writes an empty thought)",
        "dataset",
        nullable=False,
    ),
    _k(
        "tool_format",
        "choice",
        None,
        "how a dataset's tools and function calls are written, as LLaMA-Factory's tool format of that name "
        "(default: Action / Action Input lines; qwen: <tools> / <tool_call> XML; glm4, glm4_moe, ling, llama3, lfm2, "
        "minimax1, minimax2, mistral, seed_oss); unset: a named template's own; with no template (the tokenizer's "
        "own, parsed as LLaMA-Factory parses it) default (gemma4, qwen3_5: not implemented yet)",
        "dataset",
        choices=(
            "default",
            "gemma4",
            "glm4",
            "glm4_moe",
            "lfm2",
            "ling",
            "llama3",
            "minimax1",
            "minimax2",
            "mistral",
            "qwen",
            "qwen3_5",
            "seed_oss",
        ),
    ),
    _k(
        "mix_strategy",
        "choice",
        "concat",
        "several datasets: concat | interleave_under (stop at the shortest) | interleave_over (until the longest ends, oversampling the others)",
        "dataset",
        choices=("concat", "interleave_under", "interleave_over"),
        nullable=False,
    ),
    _k(
        "interleave_probs",
        "str",
        None,
        "interleaving: each dataset's sampling probability, comma-separated, in the datasets' order (default: alternate)",
        "dataset",
    ),
    _k(
        "train_on_prompt",
        "bool",
        False,
        "the loss on the prompt tokens too (system, user), not only the assistant replies",
        "dataset",
        nullable=False,
    ),
    _k(
        "mask_history",
        "bool",
        False,
        "the loss on the last assistant reply only (earlier turns are context)",
        "dataset",
        nullable=False,
    ),
    _k(
        "ignore_pad_token_for_loss",
        "bool",
        True,
        "padding never carries the loss (labels -100): true is the only value",
        "dataset",
        nullable=False,
    ),
    _k("dataloader_num_workers", "int", 0, "DataLoader workers", "dataset", min=0, max=256, nullable=False),
    _k(
        "packing",
        "bool",
        None,
        "padding-free: each micro-batch's samples in one row, position ids restart per sample, attention never crosses samples; "
        "unset: auto (padding-free for micro-batch x cutoff_len <= 4096 tokens or FlashAttention)",
        "dataset",
    ),
    _k(
        "neat_packing",
        "bool",
        False,
        "same as packing here (attention never crosses samples either way)",
        "dataset",
        nullable=False,
    ),
    _k(
        "group_by_length",
        "bool",
        False,
        "micro-batches of similar-length samples (less padding; same samples per epoch)",
        "dataset",
        nullable=False,
    ),
    _k(
        "allow_bad_rows",
        "bool",
        False,
        "skip bad dataset rows (each still reported) instead of failing",
        "dataset",
        nullable=False,
        llamafactory=False,
    ),
    # -- output --------------------------------------------------------------------------
    _k("output_dir", "str", None, "checkpoints, adapter and loss plot go here (default: the run dir)", "output"),
    _k(
        "overwrite_output_dir",
        "bool",
        False,
        "allow an output_dir that already holds checkpoints",
        "output",
        nullable=False,
    ),
    _k("logging_steps", "int", 5, "log every N optimizer steps", "output", min=1, nullable=False),
    _k("save_steps", "int", 500, "checkpoint every N optimizer steps", "output", min=1, nullable=False),
    _k(
        "save_strategy",
        "choice",
        "steps",
        "steps | epoch | no",
        "output",
        choices=("steps", "epoch", "no"),
        nullable=False,
    ),
    _k("save_total_limit", "int", None, "keep at most N checkpoints", "output", min=1),
    _k(
        "save_only_model",
        "bool",
        False,
        "checkpoints without optimizer state (cannot resume exactly)",
        "output",
        nullable=False,
    ),
    _k("plot_loss", "bool", True, "write loss.png at the end", "output", nullable=False),
    _k("report_to", "names", "none", REPORT_TO_HELP, "output", choices=("none", *TRACKER_NAMES), nullable=False),
    _k("project", "str", "huggingface", "report_to trackio: the Trackio project", "output", nullable=False),
    _k("use_swanlab", "bool", False, "log to SwanLab (as report_to: swanlab)", "output", nullable=False),
    _k("swanlab_project", "str", "llamafactory", "SwanLab: the project", "output", nullable=False),
    _k("swanlab_workspace", "str", None, "SwanLab: the workspace (cloud mode)", "output"),
    _k("swanlab_run_name", "str", None, "SwanLab: the experiment name (default: the run id)", "output"),
    _k(
        "swanlab_mode",
        "choice",
        None,
        "SwanLab: offline (the default here: SWANLAB_MODE in env: else offline) | local | cloud | disabled",
        "output",
        choices=("offline", "local", "cloud", "disabled"),
    ),
    _k(
        "swanlab_api_key",
        "str",
        None,
        "SwanLab: the cloud API key; passed to the ranks as env SWANLAB_API_KEY, redacted in the run dir",
        "output",
    ),
    _k("swanlab_logdir", "str", None, "SwanLab: its log folder (default: RUN_DIR/trackers/swanlog)", "output"),
    _k("run_name", "str", None, "a name for the run dir (default: from the config file)", "output", llamafactory=False),
    # -- training ------------------------------------------------------------------------
    _k("per_device_train_batch_size", "int", 1, "micro-batch per device", "training", min=1, max=65536, nullable=False),
    _k(
        "gradient_accumulation_steps",
        "int",
        1,
        "micro-batches per optimizer step",
        "training",
        min=1,
        max=65536,
        nullable=False,
    ),
    _k(
        "learning_rate",
        "float",
        5e-5,
        "peak learning rate",
        "training",
        min=0.0,
        max=1e6,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "num_train_epochs",
        "float",
        3.0,
        "epochs (ignored when max_steps > 0)",
        "training",
        min=0.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k("max_steps", "int", -1, "optimizer steps (-1: from epochs)", "training", min=-1, nullable=False),
    _k(
        "lr_scheduler_type",
        "choice",
        "cosine",
        "learning-rate schedule",
        "training",
        choices=SCHEDULERS,
        nullable=False,
    ),
    _k("warmup_ratio", "float", 0.0, "fraction of steps for warmup", "training", min=0.0, max=1.0, nullable=False),
    _k("warmup_steps", "int", 0, "warmup steps (overrides warmup_ratio when > 0)", "training", min=0, nullable=False),
    _k("weight_decay", "float", 0.0, "AdamW weight decay", "training", min=0.0, max=10.0, nullable=False),
    _k("max_grad_norm", "float", 1.0, "gradient clipping norm (0: off)", "training", min=0.0, nullable=False),
    _k("bf16", "bool", False, "bfloat16 mixed precision", "training", nullable=False),
    _k("fp16", "bool", False, "float16 mixed precision (GPU only)", "training", nullable=False),
    _k(
        "pure_bf16",
        "bool",
        False,
        "train in bf16 without mixed precision: the model loaded in bf16 (LoRA's adapter too), bf16 gradients and "
        "optimizer states, no autocast (LLaMA-Factory's pure_bf16; bf16 and fp16 stay false)",
        "training",
        nullable=False,
    ),
    _k("gradient_checkpointing", "bool", False, "recompute activations in backward", "training", nullable=False),
    _k(
        "enable_liger_kernel",
        "bool",
        False,
        "Liger's Triton kernels (RMSNorm, SwiGLU, RoPE, fused linear cross-entropy: no full logits); GPU only",
        "training",
        nullable=False,
    ),
    _k(
        "torch_compile",
        "bool",
        False,
        "torch.compile the model (first steps compile; CPU needs a C++ compiler)",
        "training",
        nullable=False,
    ),
    _k("seed", "int", 42, "random seed", "training", min=0, nullable=False),
    _k("resume_from_checkpoint", "str", None, "a checkpoint folder, or 'last'", "training"),
    _k("ddp_timeout", "int", 1800, "collective timeout (s)", "training", min=1, nullable=False),
    _k("use_cpu", "bool", None, "train on the CPU (default: when no GPU is visible)", "training", llamafactory=False),
    # -- strategy / launch -----------------------------------------------------------------
    _k("deepspeed", "str", None, "a DeepSpeed JSON config", "strategy"),
    _k("fsdp", "str", None, "FSDP options, e.g. 'full_shard auto_wrap'", "strategy"),
    _k(
        "nproc_per_node",
        "int",
        1,
        "processes (GPUs) per node",
        "strategy",
        min=1,
        max=1024,
        nullable=False,
        llamafactory=False,
    ),
    _k("nnodes", "int", 1, "nodes", "strategy", min=1, max=100000, nullable=False, llamafactory=False),
    _k("node_rank", "int", 0, "this node's rank", "strategy", min=0, nullable=False, llamafactory=False),
    _k("master_addr", "str", "127.0.0.1", "rendezvous address", "strategy", nullable=False, llamafactory=False),
    _k(
        "master_port",
        "int",
        0,
        "rendezvous port (0: pick a free one)",
        "strategy",
        min=0,
        max=65535,
        nullable=False,
        llamafactory=False,
    ),
    _k("env", "map", None, "environment variables applied to every rank", "strategy", llamafactory=False),
    _k(
        "zero_stage",
        "choice",
        None,
        "generate a DeepSpeed ZeRO config (2 | 3; written to the run dir as ds_config.json)",
        "strategy",
        choices=(2, 3),
        llamafactory=False,
    ),
    _k(
        "offload",
        "choice",
        "none",
        "DeepSpeed offload to the CPU: none | optimizer | optimizer+params (params: ZeRO-3)",
        "strategy",
        choices=("none", "optimizer", "optimizer+params"),
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "slurm_gres",
        "str",
        None,
        "Slurm: the cluster's GPU GRES name, e.g. 'gpu:mi300x' (--gres=NAME:N per node; unset: --gpus-per-node=N)",
        "strategy",
        llamafactory=False,
    ),
    _k(
        "numa_memory",
        "choice",
        "preferred",
        "with NUMA binding, each rank's memory: preferred (its node first, spills over) | strict (numactl --membind: "
        "only its node; an offload run can be OOM-killed while the other node has room)",
        "strategy",
        choices=("preferred", "strict"),
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "numa_bind",
        "str",
        "auto",
        "bind each local rank's CPUs and memory: auto (its GPU's NUMA node) | off | a map like '0:0,1:0,2:1'",
        "strategy",
        nullable=False,
        llamafactory=False,
    ),
    # -- watching --------------------------------------------------------------------------
    _k(
        "probes",
        "str",
        None,
        "a JSON/JSONL file of {prompt, expect} checked before and after training",
        "watch",
        llamafactory=False,
    ),
    _k(
        "probe_max_new_tokens",
        "int",
        40,
        "tokens generated per probe",
        "watch",
        min=1,
        max=4096,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "nan_policy",
        "choice",
        "stop",
        "on a NaN/inf loss: warn, or stop and save",
        "watch",
        choices=("warn", "stop"),
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "spike_policy",
        "choice",
        "warn",
        "on a loss spike: warn, or stop and save",
        "watch",
        choices=("warn", "stop"),
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "spike_factor",
        "float",
        3.0,
        "a loss above factor x the recent median is a spike",
        "watch",
        min=1.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "hang_timeout_s",
        "float",
        300.0,
        "floor of the hang watchdog (s)",
        "watch",
        min=1.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "comm_probe",
        "bool",
        True,
        "time an all-reduce across the ranks at run start",
        "watch",
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "telemetry_interval_s",
        "float",
        1.0,
        "telemetry sampling period (s; 0: off)",
        "watch",
        min=0.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "load_timeout_s",
        "float",
        1800.0,
        "hang watchdog before the first training step: model loading, probes, strategy setup (s)",
        "watch",
        min=1.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "memory_alert_headroom",
        "float",
        0.08,
        "memory-pressure alert when a rank's peak or reserved memory comes within this fraction of its device capacity (0: off)",
        "watch",
        min=0.0,
        max=0.9,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "memory_alert_swing",
        "float",
        0.25,
        "memory-pressure alert when a rank's per-step peak changes by more than this fraction between logging steps (0: off)",
        "watch",
        min=0.0,
        nullable=False,
        llamafactory=False,
    ),
    # -- grpo's reward-hacking watch (cockpit/train/reward_watch.py): a warn alert, each sign once a run ---------
    _k(
        "reward_hack_window",
        "int",
        6,
        "grpo reward-hacking alert: logged steps compared, the later half against the earlier half",
        "watch",
        min=2,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "reward_hack_drop",
        "float",
        0.15,
        "grpo reward-hacking alert: a reward function whose mean falls by this much over the window while the total rises",
        "watch",
        min=0.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "reward_hack_min_length",
        "float",
        1.5,
        "grpo reward-hacking alert: the mean completion length (tokens) at or under which completions collapsed",
        "watch",
        min=0.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "reward_hack_truncation_jump",
        "float",
        0.5,
        "grpo reward-hacking alert: a rise of the truncated completions' share (0..1) over the window",
        "watch",
        min=0.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "reward_hack_kl",
        "float",
        1.0,
        "grpo reward-hacking alert: KL (median of the window's later half) past this bound while the total reward moved less than reward_hack_flat",
        "watch",
        min=0.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "reward_hack_flat",
        "float",
        0.05,
        "grpo reward-hacking alert: the total reward's move over the window under which it barely moved (with reward_hack_kl)",
        "watch",
        min=0.0,
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "cpu_memory_tracker",
        "bool",
        False,
        "on the CPU, report live tensor bytes (plan/measure.py's tracker) as each rank's allocator figures; costs time per op",
        "watch",
        nullable=False,
        llamafactory=False,
    ),
    # -- LLaMA-Factory parity (issue 18): LoRA variants, optimizer, evaluation, model options ----
    _k("use_dora", "bool", False, "DoRA: weight-decomposed LoRA (PEFT use_dora)", "method", nullable=False),
    _k(
        "use_rslora",
        "bool",
        False,
        "rank-stabilised LoRA: scale alpha/sqrt(r) (PEFT use_rslora)",
        "method",
        nullable=False,
    ),
    _k(
        "pissa_init",
        "bool",
        False,
        "PiSSA: initialise the adapter from the principal singular vectors (PEFT init_lora_weights)",
        "method",
        nullable=False,
    ),
    _k("pissa_iter", "int", 16, "PiSSA fast-SVD iterations (-1: full SVD)", "method", min=-1, nullable=False),
    _k(
        "pissa_convert",
        "bool",
        False,
        "with pissa_init: save the initial adapter (pissa_init/ beside adapter/) and convert the final adapter into a "
        "plain LoRA of rank 2r that applies to the original base (PEFT path_initial_model_for_weight_conversion); "
        "checkpoints stay PiSSA adapters",
        "method",
        nullable=False,
    ),
    _k(
        "loraplus_lr_ratio",
        "float",
        None,
        "LoRA+: learning rate of the B matrices = ratio x learning_rate",
        "method",
        min=0.0,
        min_exclusive=True,
    ),
    _k(
        "loraplus_lr_embedding",
        "float",
        1e-6,
        "LoRA+: learning rate of embedding adapters",
        "method",
        min=0.0,
        nullable=False,
    ),
    _k(
        "create_new_adapter",
        "bool",
        False,
        "with adapter_name_or_path: merge that adapter into the base and train a new one",
        "method",
        nullable=False,
    ),
    _k(
        "additional_target",
        "str",
        None,
        "comma list of modules trained fully beside the adapter (PEFT modules_to_save)",
        "method",
    ),
    _k(
        "optim",
        "choice",
        None,
        "optimizer by HF TrainingArguments name (default: HF's); some need a package",
        "training",
        choices=OPTIMIZERS,
    ),
    _k(
        "use_muon",
        "bool",
        False,
        "Muon (torch.optim.Muon) for the trainable 2-D weights but embeddings and the LM head, AdamW for the "
        "rest, as LLaMA-Factory splits them; one learning_rate and weight_decay (DDP only)",
        "training",
        nullable=False,
    ),
    _k(
        "use_adam_mini",
        "bool",
        False,
        "Adam-mini (the adam-mini package, LLaMA-Factory's adam-mini extra): one second moment per attention "
        "head / neuron instead of per weight; full or freeze fine-tuning, DDP only",
        "training",
        nullable=False,
    ),
    # token-weighted SFT losses (LLaMA-Factory's; cockpit/train/token_weights.py), with the chunked loss too
    _k(
        "use_dft_loss",
        "bool",
        False,
        "sft: DFT (Dynamic Fine-Tuning) loss: each token's cross-entropy weighted by its probability under the "
        "model (detached), in training and evaluation, as LLaMA-Factory's",
        "training",
        nullable=False,
    ),
    _k(
        "use_eaft_loss",
        "bool",
        False,
        "sft: EAFT loss: each token's cross-entropy weighted by (entropy of its top-20 softmax / 3) ** eaft_alpha "
        "(detached), in training and evaluation, as LLaMA-Factory's",
        "training",
        nullable=False,
    ),
    _k(
        "eaft_alpha",
        "float",
        1.0,
        "use_eaft_loss: the power of EAFT's entropy weight",
        "training",
        min=0.0,
        nullable=False,
    ),
    # GaLore / APOLLO (LLaMA-Factory's keys): HF's galore_* / apollo_* optimizers (config/parity.low_rank_optim)
    _k(
        "use_galore",
        "bool",
        False,
        "GaLore: gradient low-rank projection (full or freeze fine-tuning; needs galore-torch)",
        "training",
        nullable=False,
    ),
    _k("galore_layerwise", "bool", False, "GaLore per layer (no gradient accumulation)", "training", nullable=False),
    _k(
        "galore_target",
        "str",
        "all",
        "GaLore's modules: all (linear layers) or comma-separated names",
        "training",
        nullable=False,
    ),
    _k("galore_rank", "int", 16, "GaLore projection rank", "training", min=1, nullable=False),
    _k(
        "galore_update_interval",
        "int",
        200,
        "GaLore: steps between projection updates",
        "training",
        min=1,
        nullable=False,
    ),
    _k("galore_scale", "float", 2.0, "GaLore scaling", "training", min=0.0, nullable=False),
    _k(
        "galore_proj_type",
        "choice",
        "std",
        "GaLore projection",
        "training",
        choices=("std", "reverse_std", "right", "left", "full"),
        nullable=False,
    ),
    _k(
        "use_apollo",
        "bool",
        False,
        "APOLLO: approximated gradient scaling (full or freeze fine-tuning; needs apollo-torch)",
        "training",
        nullable=False,
    ),
    _k("apollo_layerwise", "bool", False, "APOLLO per layer (no gradient accumulation)", "training", nullable=False),
    _k(
        "apollo_target",
        "str",
        "all",
        "APOLLO's modules: all (linear layers) or comma-separated names",
        "training",
        nullable=False,
    ),
    _k("apollo_rank", "int", 16, "APOLLO projection rank", "training", min=1, nullable=False),
    _k(
        "apollo_update_interval",
        "int",
        200,
        "APOLLO: steps between projection updates",
        "training",
        min=1,
        nullable=False,
    ),
    _k("apollo_scale", "float", 32.0, "APOLLO scaling", "training", min=0.0, nullable=False),
    _k("apollo_proj", "choice", "random", "APOLLO projection", "training", choices=("svd", "random"), nullable=False),
    _k(
        "apollo_proj_type",
        "choice",
        "std",
        "APOLLO projection type",
        "training",
        choices=("std", "right", "left"),
        nullable=False,
    ),
    _k(
        "apollo_scale_type",
        "choice",
        "channel",
        "APOLLO scaling granularity",
        "training",
        choices=("channel", "tensor"),
        nullable=False,
    ),
    _k(
        "apollo_scale_front",
        "bool",
        False,
        "APOLLO: scale before the update (not in HF's APOLLO: refused)",
        "training",
        nullable=False,
    ),
    # BAdam (LLaMA-Factory's keys): badam.BlockOptimizer / BlockOptimizerRatio (train/variants.badam_optimizer)
    _k(
        "use_badam",
        "bool",
        False,
        "BAdam: block-coordinate Adam, one decoder layer (or a ratio of each weight) trained at a time "
        "(full fine-tuning, one process; needs badam)",
        "training",
        nullable=False,
    ),
    _k(
        "badam_mode",
        "choice",
        "layer",
        "BAdam: layer (one decoder layer at a time) or ratio (a share of every weight's entries)",
        "training",
        choices=("layer", "ratio"),
        nullable=False,
    ),
    _k("badam_start_block", "int", None, "BAdam layer mode: the block (layer index) trained first", "training", min=0),
    _k(
        "badam_switch_mode",
        "choice",
        "ascending",
        "BAdam layer mode: the order of the blocks",
        "training",
        choices=("ascending", "descending", "random", "fixed"),
        nullable=False,
    ),
    _k(
        "badam_switch_interval",
        "int",
        50,
        "BAdam layer mode: optimizer steps per block (-1: never switch)",
        "training",
        min=-1,
        nullable=False,
    ),
    _k(
        "badam_update_ratio",
        "float",
        0.05,
        "BAdam ratio mode: the share of each weight's entries updated",
        "training",
        min=0.0,
        min_exclusive=True,
        max=1.0,
        nullable=False,
    ),
    _k(
        "badam_mask_mode",
        "choice",
        "adjacent",
        "BAdam ratio mode: adjacent entries or scattered ones",
        "training",
        choices=("adjacent", "scatter"),
        nullable=False,
    ),
    _k(
        "badam_verbose",
        "int",
        0,
        "passed to BAdam (badam 1.4 logs the trained block's prefix at every switch whatever the value)",
        "training",
        min=0,
        max=2,
        nullable=False,
    ),
    _k("adam_beta1", "float", 0.9, "Adam beta1", "training", min=0.0, max=1.0, nullable=False),
    _k("adam_beta2", "float", 0.999, "Adam beta2", "training", min=0.0, max=1.0, nullable=False),
    _k("adam_epsilon", "float", 1e-8, "Adam epsilon", "training", min=0.0, min_exclusive=True, nullable=False),
    _k(
        "lr_scheduler_kwargs",
        "dict",
        None,
        "extra arguments of the schedule, e.g. {min_lr_rate: 0.1} for cosine_with_min_lr",
        "training",
    ),
    _k(
        "do_eval",
        "bool",
        None,
        "false: no evaluation (the val_size split is held out, never measured; LLaMA-Factory's reading when "
        "eval_strategy is unset); unset or true: evaluate when val_size or eval_dataset is set",
        "eval",
    ),
    _k(
        "eval_strategy",
        "choice",
        None,
        "steps | epoch | no (default: stage sft steps when val_size or eval_dataset is set; the other stages "
        "no unless an eval key asks, as LLaMA-Factory: their held-out rows are measured before and after)",
        "eval",
        choices=("steps", "epoch", "no"),
    ),
    _k("eval_steps", "int", None, "evaluate every N optimizer steps (default: logging_steps)", "eval", min=1),
    _k("per_device_eval_batch_size", "int", 1, "eval micro-batch per device", "eval", min=1, max=65536, nullable=False),
    _k(
        "eval_dataset",
        "str",
        None,
        "datasets to evaluate on (as dataset: a file or names), instead of a val_size split",
        "eval",
    ),
    _k("eval_on_start", "bool", False, "evaluate once before the first step", "eval", nullable=False),
    _k(
        "compute_accuracy",
        "bool",
        False,
        "sft evaluation: token accuracy (argmax of the logits = label, padding and prompt left out; the mean over "
        "samples) as eval_accuracy beside eval_loss",
        "eval",
        nullable=False,
    ),
    _k(
        "load_best_model_at_end",
        "bool",
        False,
        "end with the checkpoint of the best eval metric (save and eval on the same schedule)",
        "eval",
        nullable=False,
    ),
    _k("metric_for_best_model", "str", None, "the eval metric that picks the best checkpoint (default: loss)", "eval"),
    _k(
        "greater_is_better",
        "bool",
        None,
        "whether a higher metric_for_best_model is better (default: false for loss)",
        "eval",
    ),
    _k(
        "early_stopping_steps",
        "int",
        None,
        "stop training when metric_for_best_model has not improved for N evaluations in a row (HF's "
        "EarlyStoppingCallback, as LLaMA-Factory adds it); needs evaluation data and load_best_model_at_end or "
        "metric_for_best_model",
        "eval",
        min=1,
    ),
    # prediction (LLaMA-Factory's do_predict + predict_with_generate; its generating arguments)
    _k(
        "do_predict",
        "bool",
        False,
        "generate an answer for every prediction sample (eval_dataset, else the val_size split; with do_train "
        "false, else dataset) with the trained adapter: generated_predictions.jsonl, BLEU-4 and ROUGE scores",
        "predict",
        nullable=False,
    ),
    _k(
        "predict_with_generate",
        "bool",
        False,
        "prediction generates (required with do_predict: the scores compare generated text with the labels)",
        "predict",
        nullable=False,
    ),
    _k(
        "max_new_tokens",
        "int",
        1024,
        "prediction: tokens generated per sample at most",
        "predict",
        min=1,
        nullable=False,
    ),
    _k(
        "do_sample",
        "bool",
        False,
        "prediction: sample (seeded by seed) instead of greedy decoding (LLaMA-Factory's default is true; Cockpit's "
        "false: the same adapter gives the same predictions)",
        "predict",
        nullable=False,
    ),
    _k(
        "temperature",
        "float",
        0.95,
        "prediction with do_sample, and grpo's sampled completions: sampling temperature",
        "predict",
        min=0.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "top_p",
        "float",
        0.7,
        "prediction with do_sample, and grpo's sampled completions: nucleus sampling mass",
        "predict",
        min=0.0,
        max=1.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "top_k",
        "int",
        50,
        "prediction with do_sample, and grpo's sampled completions: sample among the k likeliest tokens (0: all)",
        "predict",
        min=0,
        nullable=False,
    ),
    _k(
        "repetition_penalty",
        "float",
        1.0,
        "prediction and grpo's sampled completions: penalty of repeated tokens (1.0: none)",
        "predict",
        min=0.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "flash_attn",
        "choice",
        "auto",
        "attention kernel: auto | sdpa | eager | fa2 (fa2 needs flash-attn and a GPU)",
        "model",
        choices=("auto", "sdpa", "eager", "disabled", "fa2"),
        nullable=False,
    ),
    _k("disable_gradient_checkpointing", "bool", False, "force gradient checkpointing off", "training", nullable=False),
    _k(
        "use_reentrant_gc",
        "bool",
        False,
        "reentrant gradient checkpointing (LLaMA-Factory's default is true; Cockpit's false)",
        "training",
        nullable=False,
    ),
    _k(
        "use_unsloth_gc",
        "bool",
        False,
        "offload the gradient checkpoints (each layer's input) to pinned host memory, copied back for the "
        "backward (LLaMA-Factory's name; torch's save_on_cpu around each checkpointed layer)",
        "training",
        nullable=False,
    ),
    _k(
        "freeze_trainable_modules",
        "str",
        "all",
        "freeze: in the trained layers, 'all' or a comma list of module names (e.g. mlp,self_attn)",
        "method",
        nullable=False,
    ),
    _k(
        "freeze_extra_modules",
        "str",
        None,
        "freeze: modules outside the decoder layers also trained fully, a comma list (e.g. embed_tokens,norm)",
        "method",
    ),
    _k(
        "include_effective_tokens_per_second",
        "bool",
        False,
        "after training: effective_tokens_per_sec in summary.json (sft, pt): the "
        "training samples' tokens x epochs / train runtime / ranks, as LLaMA-Factory computes it",
        "output",
        nullable=False,
    ),
    _k(
        "include_num_input_tokens_seen",
        "bool",
        True,
        "count input tokens (always on: the tokens/s figures need it)",
        "output",
        nullable=False,
    ),
    _k(
        "rope_scaling",
        "choice",
        None,
        "RoPE scaling for a cutoff_len beyond the model's context: linear | dynamic | yarn | llama3 (factor: cutoff_len / context, rounded up)",
        "model",
        choices=("linear", "dynamic", "yarn", "llama3"),
    ),
    _k("upcast_layernorm", "bool", False, "keep the norm layers' weights in fp32", "model", nullable=False),
    _k("upcast_lmhead_output", "bool", False, "compute the LM head's logits in fp32", "model", nullable=False),
    _k(
        "low_cpu_mem_usage",
        "bool",
        True,
        "load weights without a random init first (transformers 5 always does)",
        "model",
        nullable=False,
    ),
    _k(
        "add_tokens",
        "str",
        None,
        "comma-separated normal tokens added to the tokenizer (each then one id; the embeddings grow, resize_vocab)",
        "model",
    ),
    _k(
        "add_special_tokens",
        "str",
        None,
        "comma-separated special tokens added to the tokenizer (new_special_tokens: the older name)",
        "model",
    ),
    _k(
        "resize_vocab",
        "bool",
        False,
        "resize the embeddings and LM head to the tokenizer (a multiple of 64), new rows trained; on when tokens are added",
        "model",
        nullable=False,
    ),
)

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
