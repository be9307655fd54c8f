"""Cross-key rules of the LLaMA-Factory parity keys (LoRA variants, optimizer, evaluation, model
options), and the reason each LLaMA-Factory key Cockpit refuses is refused. Pure: no torch; a
package's presence is looked up with importlib.util.find_spec."""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Mapping

from cockpit.errors import Problem

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
    ("paged_", "bitsandbytes", "bitsandbytes", True),
    ("lion_", "bitsandbytes", "bitsandbytes", True),
    ("rmsprop_bnb", "bitsandbytes", "bitsandbytes", True),
    ("ademamix", "bitsandbytes", "bitsandbytes", True),
    ("adamw_bnb_8bit", "bitsandbytes", "bitsandbytes", True),
    ("adamw_8bit", "bitsandbytes", "bitsandbytes", True),
)
LORA_ONLY = ("use_dora", "use_rslora", "pissa_init", "loraplus_lr_ratio", "additional_target")


def optim_requirement(name: str) -> tuple[str, str, bool] | None:
    """(import name, pip name, needs a GPU) of an HF optimizer name, None when torch alone has it."""
    for prefix, module, pip, gpu in _OPTIM_PACKAGES:
        if name.startswith(prefix):
            return module, pip, gpu
    return None


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def parity_problems(raw: Mapping[str, Any], cfg: dict[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    out: list[Problem] = []
    method = cfg["finetuning_type"]
    for key in LORA_ONLY:
        if key in raw and cfg.get(key) and method != "lora":
            out.append(Problem(f"a LoRA variant: needs finetuning_type: lora, got {method}", **where(key)))
    if cfg.get("pissa_init") and cfg.get("adapter_name_or_path"):
        out.append(Problem("PiSSA initialises a new adapter; adapter_name_or_path loads an existing one: choose one", **where("pissa_init")))
    if cfg.get("loraplus_lr_ratio") and (cfg.get("deepspeed") or cfg.get("zero_stage") or cfg.get("fsdp")):
        out.append(Problem("LoRA+ builds its own optimizer before training; with DeepSpeed or FSDP the strategy builds it: not supported together yet", **where("loraplus_lr_ratio")))
    optim = cfg.get("optim")
    need = optim_requirement(optim) if optim else None
    if need and not has_module(need[0]):
        gpu = " and a GPU" if need[2] else ""
        out.append(Problem(f"{optim} needs the {need[1]} package{gpu}; it is not installed here (adamw_torch, adamw_torch_fused, adafactor, sgd, adagrad, rmsprop need nothing)", **where("optim")))
    elif need and need[2] and cfg.get("use_cpu"):
        out.append(Problem(f"{optim} ({need[1]}) runs on a GPU only; on the CPU use adamw_torch", **where("optim")))
    out += _eval_problems(raw, cfg, where)
    if cfg.get("flash_attn") == "fa2":
        if cfg.get("use_cpu"):
            out.append(Problem("fa2 (FlashAttention-2) is a GPU kernel; on the CPU use sdpa or eager", **where("flash_attn")))
        elif not has_module("flash_attn"):
            out.append(Problem("fa2 needs the flash-attn package (on ROCm: AMD's ROCm/flash-attention build); not installed here, use sdpa", **where("flash_attn")))
    if cfg.get("disable_gradient_checkpointing") and cfg.get("gradient_checkpointing"):
        out.append(Problem("gradient_checkpointing is true and disable_gradient_checkpointing too; keep one", **where("disable_gradient_checkpointing")))
    if cfg.get("low_cpu_mem_usage") is False:
        out.append(Problem("transformers 5 always loads weights without a full random init first; it cannot be turned off", **where("low_cpu_mem_usage")))
    return out


def _eval_problems(raw: Mapping[str, Any], cfg: dict[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    if cfg.get("val_size"):
        if cfg.get("eval_strategy") == "no" and cfg.get("do_eval"):
            return [Problem("do_eval is true but eval_strategy is no; keep one", **where("eval_strategy"))]
        return []
    why = "needs a held-out split: set val_size (a separate eval_dataset is not supported yet)"
    out = []
    if cfg.get("do_eval"):
        out.append(Problem(f"do_eval {why}", **where("do_eval")))
    for key in ("eval_strategy", "eval_steps", "per_device_eval_batch_size"):
        if key in raw and cfg.get(key) not in (None, "no") and not (key == "per_device_eval_batch_size" and cfg[key] == 1):
            out.append(Problem(f"{key} {why}", **where(key)))
    return out
