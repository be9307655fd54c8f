"""The run settings the planner reads, from a flat LLaMA-Factory-style dict, checked.

Bad values raise ``InputError`` naming the key (exit code 2 at the CLI).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from cockpit.config.stages import reference_copy, reference_words
from cockpit.data.padding import padding_free
from cockpit.errors import InputError, Problem

DEFAULTS: dict[str, Any] = {
    "finetuning_type": "lora",
    "lora_rank": 8,
    "lora_target": "all",
    "quantization_bit": None,
    "double_quantization": True,
    "cutoff_len": 1024,
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "bf16": False,
    "fp16": False,
    "gradient_checkpointing": False,
    "flash_attn": "auto",
    "optim": "adamw_torch_fused",
    "deepspeed": None,
    "fsdp": None,
    "nproc_per_node": 1,
    "nnodes": 1,
    "freeze_trainable_layers": 2,
    "packing": None,
    "neat_packing": False,
    "enable_liger_kernel": False,
}

ADAM_32 = {"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw"}
ADAM_8 = {"adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "adamw_torch_8bit"}
ADAM_32_PAGED = {"paged_adamw_32bit"}
FSDP_WORDS = {"full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard", "offload", "auto_wrap"}


@dataclass(frozen=True)
class ZeroSpec:
    stage: int
    offload_optimizer: bool = False
    offload_param: bool = False
    reduce_bucket: float | None = None  # elements; None = "auto" (hidden^2, HF integration)
    allgather_bucket: float | None = None
    source: str = ""


@dataclass(frozen=True)
class FsdpSpec:
    strategy: str  # full_shard | shard_grad_op | hybrid_shard | no_shard
    offload: bool


@dataclass(frozen=True)
class LowRankSpec:
    """GaLore / APOLLO: Adam moments of the targeted linear weights kept in a rank-``rank`` projection."""

    kind: str  # galore | apollo
    rank: int
    target: str  # all (every linear, the LM head too) or comma-separated module names
    proj_type: str  # std | reverse_std | right | left | full


@dataclass(frozen=True)
class BadamSpec:
    """BAdam: layer mode trains one decoder layer at a time, ratio mode a share of every weight."""

    mode: str  # layer | ratio
    update_ratio: float


@dataclass(frozen=True)
class RunSpec:
    model_name_or_path: str
    finetuning_type: str
    lora_rank: int
    lora_target: Any
    quantization_bit: int | None
    double_quantization: bool
    cutoff_len: int
    micro_batch: int
    grad_accum: int
    bf16: bool
    fp16: bool
    gradient_checkpointing: bool
    attn: str  # sdpa | eager | fa2
    optim: str
    zero: ZeroSpec | None
    fsdp: FsdpSpec | None
    nproc_per_node: int
    nnodes: int
    freeze_trainable_layers: int
    freeze_extra_modules: tuple[str, ...] = ()  # modules outside the layers trained fully (freeze)
    deepspeed_path: str | None = None
    fsdp_text: str | None = None
    liger: bool = False  # enable_liger_kernel: fused linear cross-entropy, no full logits
    packing: bool = False  # padding-free: one row of up to micro_batch x cutoff_len tokens per micro-batch
    stage: str = "sft"  # dpo / rm: chosen + rejected per sample; rm: a value head, no vocab logits
    reference_copy: bool = False  # dpo / kto: a frozen second copy of the base (none with LoRA)
    reference: str = "none"  # what dpo / kto compare with, in words (config.stages.reference_words)
    low_rank: LowRankSpec | None = None  # use_galore / use_apollo
    badam: BadamSpec | None = None  # use_badam

    @property
    def world(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def mixed(self) -> bool:
        return self.bf16 or self.fp16

    @property
    def compute_bytes(self) -> int:
        return 2 if self.mixed else 4

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"

    def with_changes(self, **kw: Any) -> RunSpec:
        return replace(self, **kw)


def _bool(cfg: dict, key: str) -> bool:
    v = cfg.get(key, DEFAULTS[key])
    if v is None:
        return bool(DEFAULTS[key])
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    raise InputError(Problem(f"must be true or false, not {v!r}", key=key))


def _optional_bool(cfg: dict, key: str) -> bool | None:
    """A bool key whose unset value means auto (None)."""
    return None if cfg.get(key, DEFAULTS[key]) is None else _bool(cfg, key)


def _int(cfg: dict, key: str, lo: int = 1) -> int:
    v = cfg.get(key, DEFAULTS[key])
    if v is None:
        v = DEFAULTS[key]
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise InputError(Problem(f"must be an integer >= {lo}, not {v!r}", key=key))
    try:
        n = int(v)
    except ValueError:
        raise InputError(Problem(f"must be an integer >= {lo}, not {v!r}", key=key)) from None
    if n < lo:
        raise InputError(Problem(f"must be an integer >= {lo}, not {v!r}", key=key))
    return n


def _bucket(v: Any) -> float | None:
    if v is None or (isinstance(v, str) and v.strip().lower() == "auto"):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def zero_from_name(name: str) -> ZeroSpec | None:
    """LLaMA-Factory's example files: ds_z0_config.json ... ds_z3_offload_config.json."""
    m = re.search(r"z(?:ero)?[_-]?([0-3])", os.path.basename(name).lower())
    if not m:
        return None
    off = "offload" in name.lower()
    stage = int(m.group(1))
    return ZeroSpec(
        stage=stage,
        offload_optimizer=off and stage >= 1,
        offload_param=off and stage == 3,
        source=f"inferred from the file name {os.path.basename(name)}",
    )


def parse_deepspeed(value: Any, base_dir: str | None = None) -> ZeroSpec | None:
    if value is None or value == "" or value is False:
        return None
    if isinstance(value, dict):
        data, where = value, "inline dict"
    else:
        path = os.path.expanduser(str(value))
        candidates = [path] if os.path.isabs(path) else [path] + ([os.path.join(base_dir, path)] if base_dir else [])
        found = next((p for p in candidates if os.path.isfile(p)), None)
        if found is None:
            spec = zero_from_name(path)
            if spec is None:
                raise InputError(
                    Problem(f"file {value!r} not found and its name does not say the ZeRO stage", key="deepspeed")
                )
            return spec
        try:
            with open(found, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError(Problem(f"cannot read {found}: {e}", key="deepspeed")) from e
        where = found
    zo = data.get("zero_optimization") or {}
    if not isinstance(zo, dict):
        raise InputError(Problem("zero_optimization must be a mapping", key="deepspeed"))
    stage = zo.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise InputError(Problem(f"zero_optimization.stage must be 0-3, not {stage!r}", key="deepspeed"))

    def dev(k: str) -> bool:
        d = zo.get(k) or {}
        return isinstance(d, dict) and str(d.get("device", "none")).lower() in ("cpu", "nvme")

    return ZeroSpec(
        stage=int(stage),
        offload_optimizer=dev("offload_optimizer") and stage >= 1,
        offload_param=dev("offload_param") and stage == 3,
        reduce_bucket=_bucket(zo.get("reduce_bucket_size")),
        allgather_bucket=_bucket(zo.get("allgather_bucket_size")),
        source=where,
    )


def parse_fsdp(value: Any) -> FsdpSpec | None:
    if value is None or value == "" or value is False:
        return None
    words = str(value).replace(",", " ").split()
    unknown = [w for w in words if w not in FSDP_WORDS]
    if unknown:
        raise InputError(
            Problem(f"unknown option(s) {', '.join(unknown)}; use {', '.join(sorted(FSDP_WORDS))}", key="fsdp")
        )
    strat = next((w for w in words if w not in ("offload", "auto_wrap")), "full_shard")
    return FsdpSpec(strategy=strat, offload="offload" in words)


def parse_quantization_bit(cfg: dict[str, Any], ft: str) -> int | None:
    """The quantization_bit key: 4, 8 or None (LoRA only)."""
    qb = cfg.get("quantization_bit")
    if qb is not None:
        if isinstance(qb, bool) or str(qb) not in ("4", "8"):
            raise InputError(Problem(f"must be 4, 8 or null, not {qb!r}", key="quantization_bit"))
        qb = int(qb)
        if ft != "lora":
            raise InputError(
                Problem("quantized models can only be trained with finetuning_type: lora", key="quantization_bit")
            )
    return qb


def parse_attention(cfg: dict[str, Any]) -> str:
    """The flash_attn key as the attention implementation: sdpa, eager or fa2."""
    attn_raw = str(cfg.get("flash_attn") or "auto").lower()
    attn = {
        "auto": "sdpa",
        "sdpa": "sdpa",
        "disabled": "eager",
        "eager": "eager",
        "fa2": "fa2",
        "flash_attention_2": "fa2",
    }.get(attn_raw)
    if attn is None:
        raise InputError(Problem(f"must be auto, sdpa, fa2 or disabled, not {attn_raw!r}", key="flash_attn"))
    return attn


def parse_optim(cfg: dict[str, Any]) -> str:
    """The optim key, lower-cased; only the AdamW variants the planner models."""
    optim = str(cfg.get("optim") or DEFAULTS["optim"]).lower()
    if optim not in ADAM_32 | ADAM_8 | ADAM_32_PAGED:
        raise InputError(
            Problem(
                f"the planner knows AdamW variants only ({', '.join(sorted(ADAM_32 | ADAM_8))}), not {optim!r}",
                key="optim",
            )
        )
    return optim


def parse_sharding(cfg: dict[str, Any], base_dir: str | None) -> tuple[ZeroSpec | None, FsdpSpec | None]:
    """DeepSpeed ZeRO (a config file or cockpit's zero_stage/offload keys) and FSDP; at most one of them."""
    zero = parse_deepspeed(cfg.get("deepspeed"), base_dir)
    if zero is None and cfg.get("zero_stage"):  # cockpit generates the DeepSpeed config from these keys
        stage = int(cfg["zero_stage"])
        off = str(cfg.get("offload") or "none")
        zero = ZeroSpec(
            stage=stage, offload_optimizer=off != "none", offload_param=off == "optimizer+params" and stage == 3
        )
    fsdp = parse_fsdp(cfg.get("fsdp"))
    if zero and fsdp:
        raise InputError(Problem("set either deepspeed or fsdp, not both", key="fsdp"))
    return zero, fsdp


def parse_run(cfg: dict[str, Any], base_dir: str | None = None) -> RunSpec:
    """Check and normalise a flat config dict (LLaMA-Factory key names)."""
    if not isinstance(cfg, dict):
        raise InputError("the config must be a mapping of keys to values")
    name = cfg.get("model_name_or_path")
    if not name:
        raise InputError(Problem("is required", key="model_name_or_path"))
    ft = str(cfg.get("finetuning_type") or DEFAULTS["finetuning_type"]).lower()
    if ft not in ("lora", "freeze", "full"):
        raise InputError(Problem(f"must be lora, freeze or full, not {ft!r}", key="finetuning_type"))
    qb = parse_quantization_bit(cfg, ft)
    bf16, fp16 = _bool(cfg, "bf16"), _bool(cfg, "fp16")
    if bf16 and fp16:
        raise InputError(Problem("bf16 and fp16 cannot both be true", key="fp16"))
    attn = parse_attention(cfg)
    optim = parse_optim(cfg)
    zero, fsdp = parse_sharding(cfg, base_dir)
    lt = cfg.get("lora_target", DEFAULTS["lora_target"])
    if lt is None:
        lt = "all"
    ftl = cfg.get("freeze_trainable_layers", DEFAULTS["freeze_trainable_layers"])
    if isinstance(ftl, bool) or not isinstance(ftl, int) or ftl == 0:
        raise InputError(Problem(f"must be a non-zero integer, not {ftl!r}", key="freeze_trainable_layers"))
    return RunSpec(
        model_name_or_path=str(name),
        finetuning_type=ft,
        lora_rank=_int(cfg, "lora_rank"),
        lora_target=lt,
        quantization_bit=qb,
        double_quantization=_bool(cfg, "double_quantization"),
        cutoff_len=_int(cfg, "cutoff_len"),
        micro_batch=_int(cfg, "per_device_train_batch_size"),
        grad_accum=_int(cfg, "gradient_accumulation_steps"),
        bf16=bf16,
        fp16=fp16,
        gradient_checkpointing=_bool(cfg, "gradient_checkpointing"),
        attn=attn,
        optim=optim,
        zero=zero,
        fsdp=fsdp,
        nproc_per_node=_int(cfg, "nproc_per_node"),
        nnodes=_int(cfg, "nnodes"),
        freeze_trainable_layers=ftl,
        freeze_extra_modules=tuple(
            m.strip() for m in str(cfg.get("freeze_extra_modules") or "").split(",") if m.strip()
        ),
        deepspeed_path=None if cfg.get("deepspeed") in (None, "") else str(cfg.get("deepspeed")),
        fsdp_text=None if cfg.get("fsdp") in (None, "") else str(cfg.get("fsdp")),
        packing=str(cfg.get("stage") or "sft") == "sft"
        and padding_free(
            {
                **cfg,
                "packing": _optional_bool(cfg, "packing"),
                "neat_packing": _bool(cfg, "neat_packing"),
                "per_device_train_batch_size": _int(cfg, "per_device_train_batch_size"),
                "cutoff_len": _int(cfg, "cutoff_len"),
                "flash_attn": attn,
            }
        ),
        liger=_bool(cfg, "enable_liger_kernel"),
        stage=str(cfg.get("stage") or "sft"),
        reference_copy=reference_copy({"finetuning_type": ft, **cfg}),
        reference=reference_words({"finetuning_type": ft, **cfg}),
        low_rank=parse_low_rank(cfg),
        badam=parse_badam(cfg),
    )


def _flag(cfg: dict[str, Any], key: str) -> bool:
    v = cfg.get(key)
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes"))


def parse_low_rank(cfg: dict[str, Any]) -> LowRankSpec | None:
    """use_galore / use_apollo with their rank, target and projection (the schema's defaults)."""
    for kind in ("galore", "apollo"):
        if not _flag(cfg, f"use_{kind}"):
            continue
        rank = cfg.get(f"{kind}_rank") or 16
        if isinstance(rank, bool) or not str(rank).isdigit() or int(rank) < 1:
            raise InputError(Problem(f"must be an integer >= 1, not {rank!r}", key=f"{kind}_rank"))
        proj = str(cfg.get(f"{kind}_proj_type") or "std")
        if proj not in ("std", "reverse_std", "right", "left", "full"):
            raise InputError(
                Problem(f"must be std, reverse_std, right, left or full, not {proj!r}", key=f"{kind}_proj_type")
            )
        return LowRankSpec(kind, int(rank), str(cfg.get(f"{kind}_target") or "all"), proj)
    return None


def parse_badam(cfg: dict[str, Any]) -> BadamSpec | None:
    """use_badam with its mode and update ratio (LLaMA-Factory's defaults: layer, 0.05)."""
    if not _flag(cfg, "use_badam"):
        return None
    mode = str(cfg.get("badam_mode") or "layer")
    if mode not in ("layer", "ratio"):
        raise InputError(Problem(f"must be layer or ratio, not {mode!r}", key="badam_mode"))
    try:
        ratio = float(cfg.get("badam_update_ratio") or 0.05)
    except (TypeError, ValueError):
        ratio = -1.0
    if not 0 < ratio <= 1:
        raise InputError(
            Problem(f"must be a number in (0, 1], not {cfg.get('badam_update_ratio')!r}", key="badam_update_ratio")
        )
    return BadamSpec(mode, ratio)
