"""LLaMA-Factory's v1 trainer YAML (``USE_V1=1 llamafactory-cli train``; ``llamafactory/v1/config`` in 0.9.5):
``model:``, ``peft_config: {name: lora, r: ...}``, ``dist_config: {name: fsdp2}``, ``micro_batch_size:``,
``train_dataset:`` (a v1 dataset YAML). Cockpit reads v0 configs; a v1 file is recognised by its keys, and
either translated to v0 (every key it holds has one exact v0 form; v1's own defaults, which differ from
v0's, written out) with a note, or refused once with the table of v0 keys. Also the Megatron-Core keys of
LLaMA-Factory's ``USE_MCA=1`` mode (``MCORE_KEYS``), refused by name. Pure: no torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

# every field of LLaMA-Factory 0.9.5's v1 ModelArguments, DataArguments, TrainingArguments, SampleArguments
# (tests/fixtures/llamafactory/lf_v1_keys.json, bench/lf_key_list.py)
V1_KEYS = (
    "model", "template", "trust_remote_code", "flash_attn", "model_class", "init_config", "peft_config",
    "kernel_config", "quant_config", "train_dataset", "eval_dataset", "output_dir", "micro_batch_size",
    "global_batch_size", "cutoff_len", "learning_rate", "num_train_epochs", "max_steps", "max_grad_norm", "bf16",
    "batching_strategy", "batching_workers", "enable_activation_checkpointing", "dist_config", "optim_config",
    "lr_scheduler_config", "seed", "full_determinism", "resume_from_checkpoint", "save_steps", "save_epochs",
    "save_ckpt_as_hf", "save_total_limit", "logging_steps", "sample_backend", "max_new_tokens",
)  # fmt: skip
# the same name and meaning in v0
SAME = frozenset(
    {"template", "trust_remote_code", "output_dir", "cutoff_len", "learning_rate", "num_train_epochs", "max_grad_norm",
     "bf16", "seed", "resume_from_checkpoint", "save_steps", "save_total_limit", "logging_steps", "max_new_tokens"}
)  # fmt: skip
# what a v1 trainer does when a key is absent, where v0 (Cockpit) would do otherwise: written into the
# translation unless the file sets the v0 key itself (llamafactory/v1/config/*.py, core/base_trainer.py:
# torch AdamW (weight decay 0.01) at a constant rate when optim_config / lr_scheduler_config are unset)
V1_DEFAULTS: dict[str, Any] = {
    "model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507",
    "template": "qwen3_nothink",
    "finetuning_type": "full",
    "learning_rate": 1.0e-4,
    "cutoff_len": 2048,
    "num_train_epochs": 3.0,
    "per_device_train_batch_size": 1,
    "bf16": True,
    "gradient_checkpointing": True,
    "logging_steps": 1,
    "optim": "adamw_torch",
    "weight_decay": 0.01,
    "lr_scheduler_type": "constant",
    "warmup_ratio": 0.0,
    "max_new_tokens": 128,
}

# mcore_adapter's parallelism and fusion arguments that LLaMA-Factory 0.9.5's examples/megatron set (USE_MCA=1)
MCORE_KEYS = frozenset(
    {"tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
     "context_parallel_size", "virtual_pipeline_model_parallel_size", "sequence_parallel", "bias_activation_fusion",
     "apply_rope_fusion", "use_distributed_optimizer", "overlap_param_gather", "overlap_grad_reduce",
     "moe_grouped_gemm", "moe_token_dispatcher_type", "recompute_granularity"}
)  # fmt: skip
MCORE_REASON = (
    "a Megatron-Core key (LLaMA-Factory's USE_MCA=1 mode, mcore_adapter): not supported; Cockpit shards with "
    "DeepSpeed ZeRO (deepspeed) or FSDP2 (fsdp)"
)

Translated = dict[str, Any] | str  # the v0 keys, or why there is no exact v0 form


# the v1 keys that are no v0 key (tests/test_lf_v1.py holds them apart from tests/fixtures/llamafactory/lf_keys.json)
V1_ONLY = frozenset(
    {"model", "model_class", "init_config", "peft_config", "kernel_config", "quant_config", "train_dataset",
     "micro_batch_size", "global_batch_size", "batching_strategy", "batching_workers",
     "enable_activation_checkpointing", "dist_config", "optim_config", "lr_scheduler_config", "save_epochs",
     "save_ckpt_as_hf", "sample_backend"}
)  # fmt: skip


def is_v1(raw: Mapping[str, Any]) -> bool:
    """A v1 file: it holds a key that only v1 has (``model``, ``micro_batch_size``, ``dist_config``, ...)."""
    return any(k in V1_ONLY for k in raw)


def _plugin(value: Any, key: str) -> dict[str, Any] | str:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or "name" not in value:
        return f"expected a mapping with a name, as v1's {key}"
    return dict(value)


def _names(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)


def _extra(conf: Mapping[str, Any], known: set[str]) -> str | None:
    extra = sorted(set(conf) - known - {"name"})
    return f"no v0 form for {', '.join(extra)}" if extra else None


def _peft(value: Any, _bases: list[Path]) -> Translated:
    conf = _plugin(value, "peft_config")
    if isinstance(conf, str) or not conf:
        return conf if isinstance(conf, str) else {"finetuning_type": "full"}
    if conf["name"] == "lora":
        lora = {"r": "lora_rank", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout", "use_rslora": "use_rslora",
                "use_dora": "use_dora", "adapter_name_or_path": "adapter_name_or_path"}  # fmt: skip
        out: dict[str, Any] = {"finetuning_type": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.05}
        out.update({lora[k]: v for k, v in conf.items() if k in lora})
        if "target_modules" in conf:
            out["lora_target"] = _names(conf["target_modules"])
        if conf.get("modules_to_save"):
            out["additional_target"] = _names(conf["modules_to_save"])
        why = _extra(conf, {*lora, "target_modules", "modules_to_save"})
        return f"{why} (export: cockpit export)" if why else out
    if conf["name"] == "freeze":
        keys = {"freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules"}
        out = {"finetuning_type": "freeze", **{k: _names(v) if k != "freeze_trainable_layers" else v
                                               for k, v in conf.items() if k in keys and v is not None}}  # fmt: skip
        if conf.get("cast_trainable_params_to_fp32") is False:
            return "cast_trainable_params_to_fp32: false has no v0 form"
        return _extra(conf, {*keys, "cast_trainable_params_to_fp32"}) or out
    return f"no v0 form for the {conf['name']!r} plugin"


def _dist(value: Any, _bases: list[Path]) -> Translated:
    conf = _plugin(value, "dist_config")
    if isinstance(conf, str) or not conf:
        return conf
    if conf["name"] == "fsdp2":
        if conf.get("dcp_path") or int(conf.get("cp_size") or 1) > 1:
            return "dcp_path / cp_size (a DCP checkpoint, context parallelism) have no v0 form"
        opts = "full_shard" if conf.get("reshard_after_forward", True) else "shard_grad_op"
        opts += " auto_wrap" + (" offload" if conf.get("offload_params") else "")
        return _extra(
            conf, {"dcp_path", "cp_size", "cp_mode", "reshard_after_forward", "offload_params", "pin_memory"}
        ) or {"fsdp": opts}
    if conf["name"] == "deepspeed" and conf.get("config_file"):
        return _extra(conf, {"config_file"}) or {"deepspeed": conf["config_file"]}
    return f"no v0 form for the {conf['name']!r} plugin"


def _quant(value: Any, _bases: list[Path]) -> Translated:
    conf = _plugin(value, "quant_config")
    if isinstance(conf, str) or not conf:
        return conf
    if conf["name"] != "bnb" or "quantization_bit" not in conf:
        return "only {name: bnb, quantization_bit: 4|8} has one v0 form (auto picks the method by the model)"
    keys = {
        "quantization_bit": "quantization_bit",
        "quantization_type": "quantization_type",
        "double_quantization": "double_quantization",
    }
    return _extra(conf, set(keys)) or {
        "quantization_method": "bnb",
        **{keys[k]: v for k, v in conf.items() if k in keys},
    }


def _kernel(value: Any, _bases: list[Path]) -> Translated:
    conf = _plugin(value, "kernel_config")
    if isinstance(conf, str) or not conf:
        return conf
    include = conf.get("include_kernels")
    if conf["name"] == "auto":  # the device's fused RMSNorm / SwiGLU / RoPE / MoE ops: the same maths
        return {}
    if conf["name"] == "liger_kernel" and include in ("auto", True):
        return {"enable_liger_kernel": True}
    return "only name auto, or liger_kernel with include_kernels auto, has one v0 form"


def _dataset(key: str) -> Callable[[Any, list[Path]], Translated]:
    """v1's dataset: a v1 dataset YAML (entries with a path, source and converter) or a file in v1's own
    messages format. One local entry with the alpaca or sharegpt converter is that file in v0."""

    def translate(value: Any, bases: list[Path]) -> Translated:
        target = "dataset" if key == "train_dataset" else "eval_dataset"
        why = f"{target} names a .json/.jsonl file or dataset_info.json entries: write them there"
        found = [b / str(value) for b in bases if (b / str(value)).is_file()]
        if Path(str(value)).suffix not in (".yaml", ".yml") or not found:
            return why
        path = found[0]
        try:
            entries = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            return why
        if not isinstance(entries, Mapping) or len(entries) != 1:
            return why
        (entry,) = entries.values()
        if (
            not isinstance(entry, Mapping)
            or entry.get("source") != "local"
            or entry.get("converter") not in ("alpaca", "sharegpt")
        ):
            return why
        if set(entry) - {"path", "source", "converter"}:
            return why + " (size / weight / split have no v0 form)"
        return {target: str(entry["path"])}

    return translate


def _choice(v0_key: str, values: Mapping[Any, Any]) -> Callable[[Any, list[Path]], Translated]:
    def translate(value: Any, _bases: list[Path]) -> Translated:
        if value in values:
            return {v0_key: values[value]} if values[value] is not None else {}
        return f"{value!r} has no v0 form"

    return translate


def _renamed(v0_key: str) -> Callable[[Any, list[Path]], Translated]:
    return lambda value, _bases: {v0_key: value}


def _dropped(value: Any, _bases: list[Path]) -> Translated:
    return {}


def _refused(why: str) -> Callable[[Any, list[Path]], Translated]:
    return lambda value, _bases: {} if value in (None, False) else why


def _save_epochs(value: Any, _bases: list[Path]) -> Translated:
    return {"save_strategy": "epoch"} if value == 1 else "save_strategy: epoch saves every whole epoch only"


# v1 key -> (the v0 key(s) it stands for, the translation)
TABLE: dict[str, tuple[str, Callable[[Any, list[Path]], Translated]]] = {
    "model": ("model_name_or_path", _renamed("model_name_or_path")),
    "flash_attn": (
        "flash_attn (eager / sdpa / fa2)",
        _choice(
            "flash_attn", {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "fa2", "fa2": "fa2", "auto": "auto"}
        ),
    ),
    "model_class": ("— (llm: a causal LM, v0's only kind)", _choice("model_class", {"llm": None})),
    "init_config": ("— (where weights are first placed; Cockpit's strategy decides)", _dropped),
    "peft_config": (
        "finetuning_type + lora_rank, lora_alpha, lora_dropout, lora_target, additional_target / freeze_*",
        _peft,
    ),
    "kernel_config": ("enable_liger_kernel (auto: the device's fused ops, no key)", _kernel),
    "quant_config": ("quantization_bit, quantization_method, quantization_type, double_quantization", _quant),
    "train_dataset": ("dataset (+ dataset_dir)", _dataset("train_dataset")),
    "eval_dataset": ("eval_dataset", _dataset("eval_dataset")),
    "micro_batch_size": ("per_device_train_batch_size", _renamed("per_device_train_batch_size")),
    "global_batch_size": (
        "gradient_accumulation_steps = global_batch_size / (micro_batch_size x processes)",
        _refused("depends on the processes the launcher starts; set gradient_accumulation_steps"),
    ),
    "max_steps": ("max_steps", lambda value, _bases: {"max_steps": -1 if value is None else value}),
    "batching_strategy": (
        "packing (normal: false, padding_free: true)",
        _choice("packing", {"normal": False, "padding_free": True}),
    ),
    "batching_workers": ("dataloader_num_workers", _renamed("dataloader_num_workers")),
    "enable_activation_checkpointing": ("gradient_checkpointing", _renamed("gradient_checkpointing")),
    "dist_config": ("fsdp (fsdp2) / deepspeed (config_file)", _dist),
    "optim_config": (
        "optim + its args",
        _refused("LLaMA-Factory 0.9.5's v1 trainer has no optimizer plugin; set optim"),
    ),
    "lr_scheduler_config": (
        "lr_scheduler_type + lr_scheduler_kwargs",
        _refused("LLaMA-Factory 0.9.5's v1 trainer has no scheduler plugin; set lr_scheduler_type"),
    ),
    "full_determinism": ("full_determinism (refused by Cockpit)", _refused("Cockpit refuses full_determinism")),
    "save_epochs": ("save_strategy: epoch (1 only)", _save_epochs),
    "save_ckpt_as_hf": ("— (Cockpit's checkpoints are HF's format)", _dropped),
    "sample_backend": ("— (v1's chat sampler, not training)", _dropped),
}


def table_lines(raw: Mapping[str, Any], why_not: Mapping[str, str]) -> list[str]:
    """One line per key of the file: v1 key -> its v0 key, and why it has no exact v0 form where it has none."""
    width = max((len(k) for k in raw), default=0)
    out = []
    for key in raw:
        v0 = key if key in SAME else TABLE[key][0] if key in TABLE else "(a v0 key, not a v1 one)"
        out.append(f"  {key:<{width}} -> {v0}" + (f"   [not read: {why_not[key]}]" if key in why_not else ""))
    return out


def translate(
    raw: Mapping[str, Any], bases: list[Path] | None = None
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """(the v0 mapping, v0 key -> the v1 key it came from ("" for v1's defaults), v1 key -> why it has no
    exact v0 form). ``bases``: where a relative dataset YAML is looked for (the working dir first)."""
    bases = bases or [Path.cwd()]
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    why_not: dict[str, str] = {}
    for key, value in raw.items():
        if key in SAME or key not in TABLE:
            got: Translated = {key: value}
        else:
            got = TABLE[key][1](value, bases)
        if isinstance(got, str):
            why_not[key] = got
            continue
        for v0_key, v0_value in got.items():
            out[v0_key] = v0_value
            origin[v0_key] = key
    for v0_key, default in V1_DEFAULTS.items():
        if v0_key not in out:
            out[v0_key] = default
            origin[v0_key] = ""  # v1's default
    return out, origin, why_not


def note(raw: Mapping[str, Any], out: Mapping[str, Any], origin: Mapping[str, str]) -> str:
    """The note of a translated file: its v1 keys as read, and v1's defaults written out."""
    read = [f"{k} -> {', '.join(v0 for v0, o in origin.items() if o == k) or '(nothing)'}" for k in raw if k in TABLE]
    defaults = [f"{k}: {out[k]}" for k, o in origin.items() if o == ""]
    return (
        "a LLaMA-Factory v1 config (USE_V1=1), read as v0: " + "; ".join(read)
        + (". v1's defaults, where v0's differ: " + ", ".join(defaults) if defaults else "")
    )  # fmt: skip


def _count(why_not: Mapping[str, str]) -> str:
    return "1 of its keys has" if len(why_not) == 1 else f"{len(why_not)} of its keys have"


def refusal(raw: Mapping[str, Any], why_not: Mapping[str, str]) -> str:
    """The one message of a v1 file that cannot be read as v0: every key with its v0 key."""
    return "\n".join(
        [
            f"a LLaMA-Factory v1 config (USE_V1=1): Cockpit reads v0 configs, and {_count(why_not)} no exact v0 "
            "form. Each key and its v0 key:",
            *table_lines(raw, why_not),
            "Write the file with the v0 keys (the keys not marked translate as shown).",
        ]
    )
