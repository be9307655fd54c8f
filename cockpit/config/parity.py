"""Cross-key rules of the LLaMA-Factory parity keys (LoRA variants, optimizer, model options; the
evaluation and prediction rules are in cockpit/config/evaluation.py, and the reason each LLaMA-Factory
key Cockpit refuses is refused in cockpit/config/keys/refused.py, both re-exported here). Pure: no
torch; a package's presence is side_site.available (sys.path or its side folder)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cockpit import side_site
from cockpit.config.evaluation import early_stopping_problems as early_stopping_problems
from cockpit.config.evaluation import eval_problems, predict_only_problems
from cockpit.config.evaluation import eval_schedule as eval_schedule
from cockpit.config.evaluation import evaluates as evaluates
from cockpit.config.evaluation import predict_data_key as predict_data_key
from cockpit.config.keys.refused import REFUSAL_REASONS as REFUSAL_REASONS
from cockpit.config.keys.refused import refusal_reason as refusal_reason
from cockpit.config.schema import SCHEMA
from cockpit.config.trackers import tracker_problems
from cockpit.errors import Problem
from cockpit.shape import world_size_of

# optim name prefix -> (import name, pip name, needs a GPU)
_OPTIM_PACKAGES: tuple[tuple[str, str, str, bool], ...] = (
    ("galore_", "galore_torch", "galore-torch", False),
    ("apollo_", "apollo_torch", "apollo-torch", False),
    ("lomo", "lomo_optim", "lomo-optim", False),
    ("adalomo", "lomo_optim", "lomo-optim", False),
    ("schedule_free_", "schedulefree", "schedulefree", False),
    ("grokadamw", "grokadamw", "grokadamw", False),
    ("adamw_torch_4bit", "torchao", "torchao", False),
    ("adamw_torch_8bit", "torchao", "torchao", False),
    ("adamw_anyprecision", "torchdistx", "torchdistx", False),
    ("stable_adamw", "optimi", "torch-optimi", False),
    ("adamw_torch_xla", "torch_xla", "torch-xla (TPU)", True),
    ("adamw_torch_npu_fused", "torch_npu", "torch-npu (Ascend NPU)", True),
    *((prefix, "bitsandbytes", "bitsandbytes", True) for prefix in side_site.BNB_OPTIMS),
)
LORA_ONLY = ("use_dora", "use_rslora", "pissa_init", "loraplus_lr_ratio", "additional_target", "create_new_adapter")


def optim_requirement(name: str) -> tuple[str, str, bool] | None:
    """(import name, pip name, needs a GPU) of an HF optimizer name, None when torch alone has it."""
    for prefix, module, pip, gpu in _OPTIM_PACKAGES:
        if name.startswith(prefix):
            return module, pip, gpu
    return None


def has_module(name: str) -> bool:
    """Whether a run can import ``name``: on sys.path, or in the side folder the README's install puts it in
    (``<venv>/lowrank-site``, ``<venv>/trackers-site``), which the ranks of a run that needs it get."""
    return side_site.available(name)


def parity_problems(
    raw: Mapping[str, Any],
    cfg: dict[str, Any],
    where: Callable[[str], dict[str, Any]],
    installed: Callable[[str], bool] | None = None,
) -> list[Problem]:
    """LLaMA-Factory's keys against Cockpit's; ``installed`` says whether a package is importable (here:
    ``has_module``; a plan for another machine: assume it is)."""
    installed = installed or has_module  # looked up at the call (tests replace has_module)
    out: list[Problem] = []
    out += _lora_variant_problems(raw, cfg, where)
    out += _optim_problems(cfg, where, installed)
    out += eval_problems(raw, cfg, where)
    out += early_stopping_problems(cfg, where)
    out += pure_bf16_problems(cfg, where)
    out += _compile_mode_problems(cfg, where)
    out += token_weighting_problems(cfg, where)
    out += oft_problems(raw, cfg, where)
    out += custom_optimizer_problems(cfg, where, installed)
    out += predict_problems(cfg, where, installed)
    out += _model_setup_problems(cfg, where, installed)
    if cfg.get("include_num_input_tokens_seen") is False:
        out.append(
            Problem(
                "always on in Cockpit: the tokens/s figures of the step events and the summary count the input tokens",
                **where("include_num_input_tokens_seen"),
            )
        )
    out += _freeze_modules_problems(raw, cfg, where)
    out += _tool_format_problems(cfg, where)
    out += _vocab_problems(cfg, where)
    out += schedule_problems(cfg, where)
    out += _mix_problems(cfg, where)
    out += _low_rank_problems(cfg, where)
    out += badam_problems(cfg, where, installed)
    out += tracker_problems(cfg, where, installed)  # report_to, swanlab_*, project
    if cfg.get("use_llama_pro") and (cfg["finetuning_type"] == "full" or cfg["freeze_trainable_layers"] <= 0):
        out.append(
            Problem(
                "LLaMA Pro trains the expanded blocks: finetuning_type freeze or lora, and freeze_trainable_layers "
                f"> 0 (how many blocks were added); got {cfg['finetuning_type']}, {cfg['freeze_trainable_layers']}",
                **where("use_llama_pro"),
            )
        )
    if cfg.get("tokenized_path") and cfg.get("stage", "sft") != "sft":
        out.append(
            Problem(
                f"tokenized_path keeps SFT's rendered samples; stage {cfg.get('stage')} tokenises afresh",
                **where("tokenized_path"),
            )
        )
    if cfg.get("low_cpu_mem_usage") is False:
        out.append(
            Problem(
                "transformers 5 always loads weights without a full random init first; it cannot be turned off",
                **where("low_cpu_mem_usage"),
            )
        )
    return out


# tool_format values LLaMA-Factory accepts that Cockpit does not write yet, and why
TOOL_FORMATS_LEFT_OUT = {
    "gemma4": "Gemma 4's tool format is not implemented as text; use default (what LLaMA-Factory writes, tool_format "
    "unset, with the template parsed from a tokenizer's own chat template) or another format Cockpit writes",
    "qwen3_5": "Qwen3.5's XML tool format is not implemented as text; use qwen (<tool_call> JSON lines) or leave "
    "tool_format unset with template qwen3 or qwen3_nothink (their own: qwen)",
}


def _tool_format_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    why = TOOL_FORMATS_LEFT_OUT.get(str(cfg.get("tool_format")))
    return [Problem(why, **where("tool_format"))] if why else []


def token_list(text: Any) -> list[str]:
    """``add_tokens`` / ``add_special_tokens`` as tokens: comma-separated, stripped (LLaMA-Factory's reading)."""
    if text in (None, ""):
        return []
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return [str(t).strip() for t in items]


def adds_tokens(cfg: Mapping[str, Any]) -> bool:
    """Whether the config adds tokens to the tokenizer (and so resizes the embeddings)."""
    return bool(token_list(cfg.get("add_tokens")) or token_list(cfg.get("add_special_tokens")))


# lr_scheduler_type -> the lr_scheduler_kwargs its transformers function cannot do without (one of them)
SCHEDULE_KWARGS: dict[str, tuple[str, ...]] = {
    "warmup_stable_decay": ("num_decay_steps",),  # get_wsd_schedule's required argument
    "cosine_with_min_lr": ("min_lr", "min_lr_rate"),  # exactly one (HF raises otherwise)
    "cosine_warmup_with_min_lr": ("min_lr", "min_lr_rate"),
}


def schedule_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """A schedule whose transformers function needs an lr_scheduler_kwargs entry the config lacks, or
    evaluation the run does not do: the rank failed building it (after the run dir was made)."""
    kind = cfg.get("lr_scheduler_type")
    if kind in ("reduce_lr_on_plateau", "greedy") and (not evaluates(cfg) or cfg.get("eval_strategy") == "no"):
        return [  # HF's TrainingArguments refuse it in the rank: the schedule steps on the evaluation loss
            Problem(
                f"lr_scheduler_type {kind} steps on the evaluation loss: it needs evaluation during training "
                "(set val_size or eval_dataset)",
                **where("lr_scheduler_type"),
            )
        ]
    need = SCHEDULE_KWARGS.get(str(kind))
    if not need:
        return []
    given = [k for k in need if k in (cfg.get("lr_scheduler_kwargs") or {})]
    if len(given) == 1:
        return []
    which = " or ".join(need)
    example = {"num_decay_steps": "{num_decay_steps: 100}", "min_lr": "{min_lr_rate: 0.1}"}.get(need[0], "")
    why = "set only one of" if given else "needs"
    return [
        Problem(
            f"lr_scheduler_type {kind} {why} {which} in lr_scheduler_kwargs (e.g. lr_scheduler_kwargs: {example})",
            **where("lr_scheduler_kwargs" if given else "lr_scheduler_type"),
        )
    ]


def _vocab_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """add_tokens / add_special_tokens: non-empty, no spaces, each once; not with QLoRA or stage rm."""
    out: list[Problem] = []
    seen: set[str] = set()
    for key in ("add_tokens", "add_special_tokens"):
        tokens = token_list(cfg.get(key))
        bad = [t for t in tokens if not t or any(c.isspace() for c in t)]
        again = sorted({t for t in tokens if t in seen or tokens.count(t) > 1})
        seen.update(tokens)
        if bad:
            out.append(Problem(f"expected comma-separated tokens without spaces, got {cfg[key]!r}", **where(key)))
        elif again:
            out.append(Problem(f"token(s) given twice: {', '.join(again)}", **where(key)))
    if not (adds_tokens(cfg) or cfg.get("resize_vocab")) or out:
        return out
    key = (
        "add_special_tokens"
        if cfg.get("add_special_tokens")
        else ("add_tokens" if cfg.get("add_tokens") else "resize_vocab")
    )
    if cfg.get("quantization_bit"):
        out.append(
            Problem(
                "the embeddings of a quantized (QLoRA) model cannot be resized; unset quantization_bit", **where(key)
            )
        )
    if cfg.get("stage") == "rm":
        out.append(
            Problem(
                "stage rm builds its value-head model without resizing the embeddings; not supported yet", **where(key)
            )
        )
    if cfg.get("stage") in ("dpo", "kto", "grpo") and cfg.get("finetuning_type", "lora") == "lora" and adds_tokens(cfg):
        out.append(
            Problem(
                f"stage {cfg['stage']} with LoRA: TRL's fused LM head reads the head's weight directly, past PEFT's "
                "trainable rows of the new tokens (the run fails); use finetuning_type full or freeze, or add the "
                "tokens in an sft run first",
                **where(key),
            )
        )
    return out


def interleave_probs(text: Any) -> list[float]:
    """``interleave_probs`` as floats ("0.7,0.3" or a YAML list); ValueError when one is not a number."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return [float(x) for x in items if str(x).strip()]


def _mix_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """interleave_probs: numbers in [0, 1] summing to 1, one per dataset, for an interleaving mix."""
    if cfg.get("interleave_probs") in (None, ""):
        return []
    if not str(cfg.get("mix_strategy", "concat")).startswith("interleave"):
        return [
            Problem(
                "interleave_probs applies to mix_strategy interleave_under / interleave_over",
                **where("interleave_probs"),
            )
        ]
    try:
        probs = interleave_probs(cfg["interleave_probs"])
    except ValueError:
        return [
            Problem(f"expected comma-separated numbers, got {cfg['interleave_probs']!r}", **where("interleave_probs"))
        ]
    n = len([d for d in str(cfg.get("dataset") or "").split(",") if d.strip()])
    if len(probs) != n:
        return [
            Problem(f"{len(probs)} probabilities for {n} dataset(s); give one per dataset", **where("interleave_probs"))
        ]
    if any(not 0 <= p <= 1 for p in probs) or abs(sum(probs) - 1) > 1e-6:
        return [
            Problem(
                f"probabilities must lie in [0, 1] and sum to 1, got {probs} (sum {sum(probs):g})",
                **where("interleave_probs"),
            )
        ]
    return []


def _lora_variant_problems(
    raw: Mapping[str, Any], cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]
) -> list[Problem]:
    """LoRA variants (DoRA, rsLoRA, PiSSA, LoRA+, ...) outside a LoRA run or with a clashing key."""
    out: list[Problem] = []
    method = cfg["finetuning_type"]
    for key in LORA_ONLY:
        if key in raw and cfg.get(key) and method != "lora" and not (key == "additional_target" and method == "oft"):
            out.append(Problem(f"a LoRA variant: needs finetuning_type: lora, got {method}", **where(key)))
    if cfg.get("pissa_init") and cfg.get("adapter_name_or_path"):
        out.append(
            Problem(
                "PiSSA initialises a new adapter; adapter_name_or_path loads an existing one: choose one",
                **where("pissa_init"),
            )
        )
    out += _pissa_convert_problems(cfg, where)
    if cfg.get("loraplus_lr_ratio") and (cfg.get("deepspeed") or cfg.get("zero_stage") or cfg.get("fsdp")):
        out.append(
            Problem(
                "LoRA+ builds its own optimizer before training; with DeepSpeed or FSDP the strategy builds it: not supported together yet",
                **where("loraplus_lr_ratio"),
            )
        )
    return out


def _pissa_convert_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """pissa_convert: a PiSSA adapter whose whole state PEFT can rewrite as lora_A / lora_B (stage rm's value
    head cannot be: ``config/stages.py`` declares it)
    (the conversion keeps only those: no DoRA magnitudes, fully trained modules or new token rows),
    held whole on rank 0 (not sharded by ZeRO-3 / FSDP)."""
    if not cfg.get("pissa_convert"):
        return []
    clash = next(
        (
            k
            for k in ("use_dora", "additional_target", "add_tokens", "add_special_tokens", "resize_vocab")
            if cfg.get(k)
        ),
        None,
    )
    if not cfg.get("pissa_init"):
        why = "converts a PiSSA adapter: needs pissa_init: true"
    elif clash:
        why = f"the converted adapter holds only lora_A / lora_B, so {clash}'s weights would be lost; not together"
    elif cfg.get("fsdp") or str(cfg.get("zero_stage") or "") == "3" or cfg.get("deepspeed"):
        why = (
            "the conversion needs the whole adapter on rank 0: not with FSDP, ZeRO-3 or a DeepSpeed file "
            "(DDP and zero_stage 1 / 2 work)"
        )
    else:
        return []
    return [Problem(why, **where("pissa_convert"))]


def low_rank_optim(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """``use_galore`` / ``use_apollo`` as HF TrainingArguments (``optim``, ``optim_target_modules``,
    ``optim_args``), LLaMA-Factory's way: the base optimizer (``optim``: adamw_torch, adamw_8bit or
    adafactor for GaLore) with its low-rank projection, per layer when ``*_layerwise``."""
    for kind in ("galore", "apollo"):
        if not cfg.get(f"use_{kind}"):
            continue
        base = {"adamw_8bit": "adamw_8bit", "adafactor": "adafactor"}.get(str(cfg.get("optim")), "adamw")
        name = f"{kind}_{base if kind == 'galore' else 'adamw'}" + (
            "_layerwise" if cfg.get(f"{kind}_layerwise") else ""
        )
        target = str(cfg.get(f"{kind}_target") or "all")
        args = {
            "rank": cfg[f"{kind}_rank"],
            "update_proj_gap": cfg[f"{kind}_update_interval"],
            "scale": cfg[f"{kind}_scale"],
            "proj_type": cfg[f"{kind}_proj_type"],
        }
        if kind == "apollo":
            args.update(proj=cfg["apollo_proj"], scale_type=cfg["apollo_scale_type"])
        return {
            "optim": name,
            "optim_target_modules": "all-linear"
            if target == "all"
            else [m.strip() for m in target.split(",") if m.strip()],
            "optim_args": ",".join(f"{k}={v}" for k, v in args.items()),
        }
    return None


def _low_rank_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """GaLore / APOLLO rules (LLaMA-Factory's): not with LoRA, not both, per layer without accumulation."""
    out = []
    if cfg.get("use_galore") and cfg.get("use_apollo"):
        out.append(Problem("use_galore and use_apollo are both true; choose one", **where("use_apollo")))
    for kind in ("galore", "apollo"):
        if not cfg.get(f"use_{kind}"):
            continue
        if cfg["finetuning_type"] == "lora":
            out.append(
                Problem(
                    f"{kind} projects full-rank gradients: finetuning_type full or freeze, not lora",
                    **where(f"use_{kind}"),
                )
            )
        if cfg.get(f"{kind}_layerwise") and cfg["gradient_accumulation_steps"] > 1:
            out.append(
                Problem(
                    f"per-layer {kind} does not accumulate gradients; set gradient_accumulation_steps: 1",
                    **where(f"{kind}_layerwise"),
                )
            )
        if cfg.get(f"{kind}_layerwise") and (cfg.get("deepspeed") or cfg.get("zero_stage") or cfg.get("fsdp")):
            out.append(
                Problem(
                    f"per-layer {kind} updates in backward hooks, which DeepSpeed / FSDP own; unset one",
                    **where(f"{kind}_layerwise"),
                )
            )
    if cfg.get("apollo_scale_front"):
        out.append(
            Problem("HF's APOLLO optimizer has no scale_front option; leave it false", **where("apollo_scale_front"))
        )
    return out


# the optim names BAdam's layer mode wraps (LLaMA-Factory builds HF's optimizer class, then BlockOptimizer)
BADAM_BASE_OPTIMS = (None, "adamw_torch", "adamw_torch_fused")


def badam_problems(
    cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]], installed: Callable[[str], bool] | None = None
) -> list[Problem]:
    """use_badam (LLaMA-Factory's rules, and Cockpit's): full fine-tuning of stage sft in one process,
    not with GaLore / APOLLO / DeepSpeed / FSDP, torch's AdamW underneath, the badam package installed."""
    installed = installed or has_module  # looked up at the call (tests replace has_module)
    if not cfg.get("use_badam"):
        return []
    out = []
    rules = (
        (
            cfg.get("finetuning_type") != "full",
            "use_badam",
            f"BAdam trains the whole model block by block: finetuning_type full, got {cfg.get('finetuning_type')}",
        ),
        (
            bool(cfg.get("use_galore") or cfg.get("use_apollo")),
            "use_badam",
            "BAdam, GaLore and APOLLO are each an optimizer: choose one (unset use_galore / use_apollo)",
        ),
        (
            bool(cfg.get("deepspeed") or cfg.get("zero_stage") or cfg.get("fsdp")),
            "use_badam",
            "BAdam switches the trainable block inside its own optimizer, which DeepSpeed / FSDP own; "
            "unset deepspeed / zero_stage / fsdp",
        ),
        (
            world_size_of(cfg) > 1,
            "use_badam",
            "BAdam trains in one process (LLaMA-Factory's layer mode across ranks needs ZeRO-3, its ratio mode "
            "is single-GPU): nproc_per_node 1 and nnodes 1",
        ),
        (
            cfg.get("stage", "sft") != "sft",
            "use_badam",
            f"BAdam is wired into stage sft's trainer; stage {cfg.get('stage')} is not supported with it yet",
        ),
        (
            cfg.get("optim") not in BADAM_BASE_OPTIMS,
            "optim",
            f"BAdam runs torch's AdamW on the active block: optim adamw_torch or adamw_torch_fused, got {cfg.get('optim')}",
        ),
        (
            cfg.get("badam_switch_interval") == 0,
            "badam_switch_interval",
            "steps per block: >= 1, or -1 (never switch); got 0",
        ),
        (
            not installed("badam"),
            "use_badam",
            "BAdam needs the badam package; it is not installed here: pip install 'cockpit-tune[badam]'",
        ),
    )
    for broken, key, why in rules:
        if broken:
            out.append(Problem(why, **where(key)))
    return out


def _optim_problems(
    cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]], installed: Callable[[str], bool] | None = None
) -> list[Problem]:
    """An optimizer whose package is not installed here, or that needs a GPU on a CPU run."""
    installed = installed or has_module  # looked up at the call (tests replace has_module)
    low_rank = low_rank_optim(cfg)
    optim = low_rank["optim"] if low_rank else cfg.get("optim")
    key = ("use_galore" if cfg.get("use_galore") else "use_apollo") if low_rank else "optim"
    need = optim_requirement(optim) if optim else None
    if need and low_rank:  # has_module: off sys.path in the side folder is installed too (the ranks get it)
        if installed(need[0]):
            return []
        why = f"{optim} needs the {need[1]} package, not installed here; install it with: {side_site.install_command()}"
        return [Problem(why, **where(key))]
    if need and not installed(need[0]):
        gpu = " and a GPU" if need[2] else ""
        return [
            Problem(
                f"{optim} needs the {need[1]} package{gpu}; it is not installed here (adamw_torch, adamw_torch_fused, adafactor, sgd, adagrad, rmsprop need nothing)",
                **where(key),
            )
        ]
    if need and need[2] and cfg.get("use_cpu"):
        return [Problem(f"{optim} ({need[1]}) runs on a GPU only; on the CPU use adamw_torch", **where(key))]
    return []


def _model_setup_problems(
    cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]], installed: Callable[[str], bool] | None = None
) -> list[Problem]:
    """Attention kernel, gradient checkpointing and create_new_adapter keys that cannot hold together."""
    installed = installed or has_module  # looked up at the call (tests replace has_module)
    out: list[Problem] = []
    for key in ("quantization_bit", "ref_model_quantization_bit"):
        if cfg.get(key) and not installed("bitsandbytes"):
            out.append(
                Problem(
                    f"{cfg[key]}-bit weights need bitsandbytes, installed neither on sys.path nor in "
                    f"{side_site.folder()}: pip install 'cockpit-tune[qlora]', or {side_site.install_command()}",
                    **where(key),
                )
            )
    if cfg.get("flash_attn") == "fa2":
        if cfg.get("use_cpu"):
            out.append(
                Problem("fa2 (FlashAttention-2) is a GPU kernel; on the CPU use sdpa or eager", **where("flash_attn"))
            )
        elif not installed("flash_attn"):
            out.append(
                Problem(
                    "fa2 needs the flash-attn package (on ROCm: AMD's ROCm/flash-attention build); not installed here, use sdpa",
                    **where("flash_attn"),
                )
            )
    if cfg.get("disable_gradient_checkpointing") and cfg.get("gradient_checkpointing"):
        out.append(
            Problem(
                "gradient_checkpointing is true and disable_gradient_checkpointing too; keep one",
                **where("disable_gradient_checkpointing"),
            )
        )
    if cfg.get("use_unsloth_gc") and (
        cfg.get("disable_gradient_checkpointing") or not cfg.get("gradient_checkpointing")
    ):
        out.append(
            Problem(
                "offloads the gradient checkpoints, and gradient checkpointing is off here; turn it on or drop use_unsloth_gc",
                **where("use_unsloth_gc"),
            )
        )
    if cfg.get("create_new_adapter") and not cfg.get("adapter_name_or_path"):
        out.append(
            Problem(
                "needs adapter_name_or_path (the adapter merged into the base before a new one is trained)",
                **where("create_new_adapter"),
            )
        )
    elif cfg.get("create_new_adapter") and cfg.get("quantization_bit"):
        out.append(
            Problem(
                "an adapter cannot be merged into quantized (QLoRA) weights; unset quantization_bit or create_new_adapter",
                **where("create_new_adapter"),
            )
        )
    return out


def _freeze_modules_problems(
    raw: Mapping[str, Any], cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]
) -> list[Problem]:
    """freeze_trainable_modules: not 'all' or a comma list of names, or set outside a freeze run."""
    out: list[Problem] = []
    modules = str(cfg.get("freeze_trainable_modules") or "all")
    if modules != "all" and not all(
        m.strip() and m.strip().replace("_", "").replace(".", "").isalnum() for m in modules.split(",")
    ):
        out.append(
            Problem(
                f"expected 'all' or a comma list of module names, got {modules!r}", **where("freeze_trainable_modules")
            )
        )
    if "freeze_trainable_modules" in raw and modules != "all" and cfg["finetuning_type"] != "freeze":
        out.append(
            Problem(
                f"applies to finetuning_type: freeze, got {cfg['finetuning_type']}", **where("freeze_trainable_modules")
            )
        )
    extra = cfg.get("freeze_extra_modules")
    if extra and not all(m.strip() and m.strip().replace("_", "").isalnum() for m in str(extra).split(",")):
        out.append(Problem(f"expected a comma list of module names, got {extra!r}", **where("freeze_extra_modules")))
    elif extra and cfg["finetuning_type"] != "freeze":
        out.append(
            Problem(
                f"applies to finetuning_type: freeze, got {cfg['finetuning_type']} (LoRA: additional_target)",
                **where("freeze_extra_modules"),
            )
        )
    return out


def _compile_mode_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """``torch_compile_mode`` is the mode of the compile ``torch_compile: true`` asks for (HF's TrainingArguments
    would turn compilation on for it alone; Cockpit asks for the switch: its planner and rules read it)."""
    if cfg.get("torch_compile_mode") is None or cfg.get("torch_compile"):
        return []
    return [Problem("sets the mode of torch.compile: needs torch_compile: true", **where("torch_compile_mode"))]


def pure_bf16_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """``pure_bf16``: bf16 weights, gradients and optimizer states without autocast. Not with fp16 (another
    precision), nor under DeepSpeed (LLaMA-Factory refuses ZeRO-3; DeepSpeed's bf16 mode keeps fp32 master
    weights) or FSDP2 (its mixed-precision policy is what bf16 sets)."""
    if not cfg.get("pure_bf16"):
        return []
    if cfg.get("fp16"):
        return [Problem("pure_bf16 trains in bf16 and fp16 is another precision; choose one", **where("fp16"))]
    for key in ("deepspeed", "zero_stage", "fsdp"):
        if cfg.get(key):
            return [
                Problem(
                    f"pure_bf16 is not supported with {key} (DeepSpeed's and FSDP2's bf16 modes keep their own fp32 "
                    "copies or policies); use bf16: true (mixed precision) there",
                    **where("pure_bf16"),
                )
            ]
    return []


# LLaMA-Factory's optimizers built by Cockpit itself (train/variants.trainer_kwargs), one per run: why each
# needs the whole, named parameters (DDP: DeepSpeed's ZeRO flattens them, FSDP2 shards them)
CUSTOM_OPTIMIZERS = {
    "use_muon": "Muon orthogonalises each whole 2-D update",
    "use_adam_mini": "Adam-mini partitions each named weight by head and neuron",
}
_OTHER_OPTIMIZER_KEYS = ("use_galore", "use_apollo", "use_badam", "loraplus_lr_ratio", "optim")


def custom_optimizer_problems(
    cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]], installed: Callable[[str], bool] | None = None
) -> list[Problem]:
    """``use_muon`` / ``use_adam_mini``: the optimizer itself, so not with another optimizer key (LLaMA-Factory
    would take the first of its list silently); under DDP only. Adam-mini over a whole model only: its
    per-head blocks of q_proj / k_proj do not fit an adapter's matrices."""
    out = []
    chosen = [key for key in CUSTOM_OPTIMIZERS if cfg.get(key)]
    for key in chosen:
        out += [
            Problem(f"{key} is the optimizer and {other} picks another; choose one", **where(other))
            for other in (*_OTHER_OPTIMIZER_KEYS, *chosen[1:])
            if cfg.get(other) and other != key
        ][: 1 if key != chosen[0] else None]
        out += [
            Problem(
                f"{key} under {strategy}: {CUSTOM_OPTIMIZERS[key]}, and DeepSpeed's ZeRO flattens the parameters, "
                "FSDP2 shards them; train it under DDP",
                **where(key),
            )
            for strategy in ("deepspeed", "zero_stage", "fsdp")
            if cfg.get(strategy)
        ][:1]
    if cfg.get("use_adam_mini") and cfg["finetuning_type"] in ("lora", "oft"):
        out.append(
            Problem(
                f"use_adam_mini with finetuning_type {cfg['finetuning_type']}: Adam-mini splits q_proj / k_proj by "
                "attention head, and an adapter's matrices are not head-shaped; use finetuning_type full or freeze",
                **where("use_adam_mini"),
            )
        )
    if cfg.get("use_adam_mini") and not (installed or has_module)("adam_mini"):
        out.append(
            Problem(
                "Adam-mini needs the adam-mini package; it is not installed here: pip install 'cockpit-tune[adam-mini]'",
                **where("use_adam_mini"),
            )
        )
    return out


OFT_KEYS = ("oft_rank", "oft_block_size", "oft_target", "module_dropout")


def oft_problems(
    raw: Mapping[str, Any], cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]
) -> list[Problem]:
    """``finetuning_type: oft`` (PEFT's OFTConfig, as LLaMA-Factory builds it): one of oft_rank /
    oft_block_size; sft under DDP; a new adapter (LLaMA-Factory loads adapters for LoRA only). Its keys
    without it do nothing: refused."""
    if cfg["finetuning_type"] != "oft":
        return [
            Problem(f"an OFT key: needs finetuning_type: oft, got {cfg['finetuning_type']}", **where(key))
            for key in OFT_KEYS
            if raw.get(key, SCHEMA[key].default) != SCHEMA[key].default  # a resolved config holds every key
        ]
    out = []
    if (cfg["oft_rank"] == 0) == (cfg["oft_block_size"] == 0):
        out.append(
            Problem(
                f"OFT needs exactly one of oft_rank ({cfg['oft_rank']}) and oft_block_size ({cfg['oft_block_size']}) "
                "non-zero (rank x block size = each target's inputs); set the other to 0",
                **where("oft_rank" if "oft_rank" in raw else "oft_block_size"),
            )
        )
    why_not = {
        "adapter_name_or_path": "an existing adapter is loaded for LoRA only (as in LLaMA-Factory)",
        "use_galore": "GaLore projects full-rank gradients, and OFT trains its blocks only",
        "use_apollo": "APOLLO projects full-rank gradients, and OFT trains its blocks only",
        "use_badam": "BAdam trains the base's layers block by block, and OFT trains its blocks only",
        "deepspeed": "not built for OFT yet: DeepSpeed / FSDP2 runs are LoRA, freeze or full (OFT trains under DDP)",
        "zero_stage": "not built for OFT yet: DeepSpeed / FSDP2 runs are LoRA, freeze or full (OFT trains under DDP)",
        "fsdp": "not built for OFT yet: DeepSpeed / FSDP2 runs are LoRA, freeze or full (OFT trains under DDP)",
    }
    out += [Problem(f"finetuning_type oft: {why}", **where(key)) for key, why in why_not.items() if cfg.get(key)]
    if cfg.get("stage", "sft") != "sft":
        out.append(
            Problem(
                f"finetuning_type oft is built for sft; stage {cfg.get('stage')} trains lora, freeze or full (its "
                "reference model and value head are LoRA's)",
                **where("finetuning_type"),
            )
        )
    return out


def token_weighting_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """``use_dft_loss`` / ``use_eaft_loss`` weigh each token's loss inside the model's loss function
    (cockpit/train/token_weights.py): not both (LLaMA-Factory silently takes DFT), and not with Liger's
    kernels, whose fused loss never reaches that function."""
    chosen = [key for key in ("use_dft_loss", "use_eaft_loss") if cfg.get(key)]
    if len(chosen) > 1:
        return [
            Problem(
                "use_dft_loss and use_eaft_loss are two weightings of the same loss; choose one", **where(chosen[1])
            )
        ]
    if cfg.get("eaft_alpha", 1.0) != 1.0 and not cfg.get("use_eaft_loss"):  # a resolved config holds the default
        return [Problem("the EAFT loss's exponent: applies with use_eaft_loss: true", **where("eaft_alpha"))]
    if chosen and cfg.get("enable_liger_kernel"):
        return [
            Problem(
                f"{chosen[0]} weighs the loss Cockpit computes, and Liger's fused cross-entropy computes its own; "
                "turn one off",
                **where(chosen[0]),
            )
        ]
    return []


# (import name, pip name) of the packages that score predictions (cockpit/data/similarity.py)
METRICS_PACKAGES = (("jieba", "jieba"), ("nltk", "nltk"), ("rouge_chinese", "rouge-chinese"))


def predict_problems(
    cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]], installed: Callable[[str], bool] | None = None
) -> list[Problem]:
    """do_predict / predict_with_generate (LLaMA-Factory's prediction): both set, the scoring
    packages installed, data to predict on, an SFT model; a run that does not train predicts only."""
    installed = installed or has_module  # looked up at the call (tests replace has_module)
    out: list[Problem] = []
    if cfg.get("predict_with_generate") and not cfg.get("do_predict"):
        out.append(
            Problem(
                "applies with do_predict: true (evaluation during training measures the loss; it never generates)",
                **where("predict_with_generate"),
            )
        )
    if not cfg.get("do_train", True):
        out += predict_only_problems(cfg, where)
    if not cfg.get("do_predict"):
        return out
    if not cfg.get("predict_with_generate"):
        out.append(
            Problem(
                "needs predict_with_generate: true (the predictions are generated and scored by BLEU-4 / ROUGE; "
                "LLaMA-Factory's token accuracy without generation is not supported)",
                **where("do_predict"),
            )
        )
    missing = [pip for module, pip in METRICS_PACKAGES if not installed(module)]
    if missing:
        out.append(
            Problem(
                f"scoring the predictions needs the {', '.join(missing)} package(s), not installed here: "
                "pip install 'cockpit-tune[metrics]' (jieba, nltk, rouge-chinese)",
                **where("do_predict"),
            )
        )
    if cfg.get("stage", "sft") != "sft":
        out.append(Problem(f"prediction answers with an SFT model; stage is {cfg.get('stage')}", **where("do_predict")))
    if cfg.get("do_train", True) and not (cfg.get("eval_dataset") or cfg.get("val_size")):
        out.append(
            Problem(
                "needs data to predict on: set eval_dataset (or val_size to hold out a split)", **where("do_predict")
            )
        )
    if cfg.get("do_train", True) and (cfg.get("fsdp") or cfg.get("zero_stage") == 3):
        out.append(
            Problem(
                "rank 0 generates alone, which sharded parameters (fsdp, zero_stage 3) do not allow: predict in a "
                "second run with do_train: false and adapter_name_or_path: <this run>/adapter",
                **where("do_predict"),
            )
        )
    return out
