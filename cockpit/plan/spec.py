"""What the planner models of a validated run config (``RunSpec``); the config's defaults and checks
are the schema's (``cockpit.config``), this module refuses only what the planner cannot model
(``InputError`` naming the key: exit code 2 at the CLI).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from cockpit.config.run_config import RunConfig
from cockpit.config.stages import reference_copy, reference_words
from cockpit.data.padding import padding_free
from cockpit.errors import InputError, Problem
from cockpit.models.embedding_place import host_embedding_off
from cockpit.models.vlm import frozen_parts

HF_DEFAULT_OPTIM = "adamw_torch_fused"  # TrainingArguments' optim when the config leaves it unset
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
    offload_checkpoints: bool = False  # use_unsloth_gc: the checkpointed layer inputs in host memory
    packing: bool = False  # padding-free: one row of up to micro_batch x cutoff_len tokens per micro-batch
    stage: str = "sft"  # dpo / rm: chosen + rejected per sample; rm: a value head, no vocab logits
    reference_copy: bool = False  # dpo / kto: a frozen second copy of the base (none with LoRA)
    reference: str = "none"  # what dpo / kto compare with, in words (config.stages.reference_words)
    low_rank: LowRankSpec | None = None  # use_galore / use_apollo
    badam: BadamSpec | None = None  # use_badam
    muon: bool = False  # use_muon: Muon for the 2-D weights, AdamW for the rest (counted as AdamW)
    completion_len: int = 0  # grpo: max_completion_length (cutoff_len above is prompt + completion)
    generation_seqs: int = 0  # grpo: sequences one rank generates at once (per-device batch x steps_per_generation)
    # why training keeps the full logits for reasons of the run (not of the model: plan.estimate asks
    # models.lm_head); "" when the chunked loss applies as far as the run goes
    chunked_loss_off: str = ""
    # a vision-language model: the parts full fine-tuning leaves frozen (cockpit.models.vlm.frozen_parts)
    vlm_frozen: tuple[str, ...] = ()
    # LoRA: the input embedding in host memory, only the rows a forward reads on the device
    # (cockpit.models.embedding_place, as far as the config tells; a tied head keeps it: plan.estimate)
    embedding_on_host: bool = False
    router_logits_kept: bool = False  # moe_aux_loss_coef: every MoE layer's router logits kept for the aux loss

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


def parse_attention(cfg: RunConfig) -> str:
    """The flash_attn key as the attention implementation: sdpa, eager or fa2."""
    attn_raw = str(cfg.flash_attn or "auto").lower()
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


def parse_optim(cfg: RunConfig) -> str:
    """The optim key, lower-cased; only the AdamW variants the planner models."""
    optim = str(cfg.optim or HF_DEFAULT_OPTIM).lower()
    if optim not in ADAM_32 | ADAM_8 | ADAM_32_PAGED:
        raise InputError(
            Problem(
                f"the planner knows AdamW variants only ({', '.join(sorted(ADAM_32 | ADAM_8))}), not {optim!r}",
                key="optim",
            )
        )
    return optim


def parse_sharding(cfg: RunConfig, base_dir: str | None) -> tuple[ZeroSpec | None, FsdpSpec | None]:
    """DeepSpeed ZeRO (a config file or cockpit's zero_stage/offload keys) and FSDP; at most one of them."""
    zero = parse_deepspeed(cfg.deepspeed, base_dir)
    if zero is None and cfg.zero_stage:  # cockpit generates the DeepSpeed config from these keys
        stage = int(cfg.zero_stage)
        off = str(cfg.offload or "none")
        zero = ZeroSpec(
            stage=stage, offload_optimizer=off != "none", offload_param=off == "optimizer+params" and stage == 3
        )
    fsdp = parse_fsdp(cfg.fsdp)
    if zero and fsdp:
        raise InputError(Problem("set either deepspeed or fsdp, not both", key="fsdp"))
    return zero, fsdp


def parse_run(cfg: RunConfig, base_dir: str | None = None) -> RunSpec:
    """What the planner models of a validated run config (the checks ``cockpit check`` makes are made;
    here only what the planner cannot model is refused)."""
    attn = parse_attention(cfg)
    zero, fsdp = parse_sharding(cfg, base_dir)
    if cfg.freeze_trainable_layers == 0:
        raise InputError(Problem("must be a non-zero integer, not 0", key="freeze_trainable_layers"))
    return RunSpec(
        model_name_or_path=cfg.model_name_or_path,
        finetuning_type=cfg.finetuning_type,
        lora_rank=cfg.lora_rank,
        lora_target=cfg.lora_target,
        quantization_bit=cfg.quantization_bit,
        double_quantization=cfg.double_quantization,
        # grpo trains on prompt (cutoff_len at most) + completion (max_completion_length) sequences
        cutoff_len=cfg.cutoff_len + (cfg.max_completion_length if cfg.stage == "grpo" else 0),
        micro_batch=cfg.per_device_train_batch_size,
        grad_accum=cfg.gradient_accumulation_steps,
        bf16=cfg.bf16,
        fp16=cfg.fp16,
        gradient_checkpointing=cfg.gradient_checkpointing,
        attn=attn,
        optim=parse_optim(cfg),
        zero=zero,
        fsdp=fsdp,
        nproc_per_node=cfg.nproc_per_node,
        nnodes=cfg.nnodes,
        freeze_trainable_layers=cfg.freeze_trainable_layers,
        freeze_extra_modules=tuple(m.strip() for m in (cfg.freeze_extra_modules or "").split(",") if m.strip()),
        deepspeed_path=cfg.deepspeed or None,
        fsdp_text=cfg.fsdp or None,
        packing=cfg.stage == "sft" and padding_free(cfg),
        liger=cfg.enable_liger_kernel,
        offload_checkpoints=cfg.use_unsloth_gc,
        stage=cfg.stage,
        reference_copy=reference_copy(cfg.mapping()),
        reference=reference_words(cfg.mapping()),
        low_rank=parse_low_rank(cfg),
        badam=parse_badam(cfg),
        muon=cfg.use_muon,
        chunked_loss_off=chunked_loss_off(cfg, zero, fsdp),
        vlm_frozen=frozen_parts(cfg),
        embedding_on_host=not host_embedding_off(cfg, (zero is not None and zero.stage == 3) or fsdp is not None),
        router_logits_kept=cfg.moe_aux_loss_coef is not None,
        completion_len=cfg.max_completion_length if cfg.stage == "grpo" else 0,
        generation_seqs=cfg.per_device_train_batch_size * (cfg.steps_per_generation or cfg.gradient_accumulation_steps)
        if cfg.stage == "grpo"
        else 0,
    )


def chunked_loss_off(cfg: RunConfig, zero: ZeroSpec | None, fsdp: FsdpSpec | None) -> str:
    """Why a run's training keeps the full logits whatever its model (the rank's
    ``CockpitTrainer._chunked_loss_off`` and ``plain_lm_head``, as far as a config tells); "" when
    the chunked loss (cockpit.train.chunked_loss) applies if the model allows it."""
    if cfg.stage not in ("sft", "pt"):
        return f"stage {cfg.stage}'s TRL trainer computes its own loss"
    if cfg.enable_liger_kernel:
        return "Liger's fused linear cross-entropy computes the loss"
    if (zero is not None and zero.stage == 3) or (fsdp is not None and fsdp.strategy != "no_shard"):
        return "the LM head is sharded (ZeRO-3 / FSDP2)"
    if cfg.torch_compile:
        return "torch.compile"
    targets = str(cfg.lora_target or "") + "," + str(cfg.additional_target or "")
    if cfg.finetuning_type == "lora" and "lm_head" in {t.strip() for t in targets.split(",")}:
        return "lm_head is adapted (lora_target / additional_target)"
    return ""


def parse_low_rank(cfg: RunConfig) -> LowRankSpec | None:
    """use_galore / use_apollo with their rank, target and projection."""
    if cfg.use_galore:
        return LowRankSpec("galore", cfg.galore_rank, cfg.galore_target, cfg.galore_proj_type)
    if cfg.use_apollo:
        return LowRankSpec("apollo", cfg.apollo_rank, cfg.apollo_target, cfg.apollo_proj_type)
    return None


def parse_badam(cfg: RunConfig) -> BadamSpec | None:
    """use_badam with its mode and update ratio."""
    return BadamSpec(cfg.badam_mode, cfg.badam_update_ratio) if cfg.use_badam else None
