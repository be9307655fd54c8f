"""Cross-key rules of the training stages (sft | pt | dpo | kto | rm | grpo). No torch imports.

The recipes themselves live in ``cockpit/train/recipes/``; this module only says which
key combinations make sense, so ``cockpit check`` and the TUI's forms refuse them early.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cockpit.config.grpo import grpo_problems
from cockpit.config.schema import SCHEMA
from cockpit.errors import Problem

PREFERENCE_STAGES = ("dpo", "kto")
PAIRWISE_STAGES = ("dpo", "rm")  # datasets with chosen / rejected answers (ranking: true)
REFERENCE_FREE_LOSSES = ("orpo", "simpo")  # no reference model at all


_EFFECTIVE_TPS = (
    "LLaMA-Factory's effective tokens/s counts sft / pt samples' tokens; this stage's step events and summary "
    "carry tokens_per_s (the input tokens the trainer saw)"
)
_PAIR_UNHONOURED = {
    "group_by_length": "TRL's tokenised samples have no input_ids column for the length sampler",
    "include_effective_tokens_per_second": _EFFECTIVE_TPS,
}
_RM_UNHONOURED = {
    "pissa_convert": "the value head (score) is trained in full beside the adapter, and the converted adapter "
    "holds only lora_A / lora_B",
}
_GRPO_PREF = "a dpo / kto key: GRPO's own keys are beta (the KL weight), epsilon, loss_type and the reward keys"
_GRPO_SFT_DATA = "an SFT data key: GRPO trains on completions it samples itself, the prompt never in the loss"
_GRPO_EVAL = (
    "GRPO's held-out measure is the mean reward of greedy completions on the held-out prompts (val_size / "
    "eval_dataset) before and after training; evaluation during training is not wired for grpo yet"
)
_GRPO_UNHONOURED = {
    **{
        key: _GRPO_PREF
        for key in (
            "pref_loss",
            "pref_beta",
            "pref_ftx",
            "simpo_gamma",
            "dpo_label_smoothing",
            "kto_chosen_weight",
            "kto_rejected_weight",
        )
    },
    **{
        key: "TRL's GRPOTrainer builds its reference itself (the base with the LoRA adapter disabled, or a copy of "
        "the base) when beta > 0"
        for key in ("ref_model", "ref_model_adapters", "ref_model_quantization_bit")
    },
    **{
        key: _GRPO_SFT_DATA
        for key in ("train_on_prompt", "mask_history", "packing", "neat_packing", "tokenized_path", "group_by_length")
    },
    **{
        key: _GRPO_EVAL
        for key in (
            "eval_strategy",
            "eval_steps",
            "eval_on_start",
            "load_best_model_at_end",
            "metric_for_best_model",
            "compute_accuracy",
            "early_stopping_steps",
        )
    },
    "include_effective_tokens_per_second": _EFFECTIVE_TPS,
    "max_new_tokens": "prediction's key: GRPO's completions are max_completion_length tokens at most",
    "do_sample": "prediction's key: GRPO always samples its completions (temperature, top_p, top_k)",
}
# LLaMA-Factory's SFT trainer alone weighs its tokens' loss; the other stages' losses are not per-token LM losses
# (pt's is, but LLaMA-Factory's pt trainer has no such key either)
_SFT_LOSS = "DFT / EAFT weigh SFT's token cross-entropy (LLaMA-Factory's SFT trainer); this stage's loss is its own"
_SFT_LOSS_KEYS = {key: _SFT_LOSS for key in ("use_dft_loss", "use_eaft_loss", "eaft_alpha")}
# images are read by sft and dpo only (issue 63): the other stages refuse rows with images, so where to find them
# is moot. dpo shares sft's image plan (image_plan: the pixel bounds, media_dir) and model load (the freeze keys)
_SFT_IMAGES = {
    key: "images train in stages sft and dpo only (issue 63); this stage refuses rows with images"
    for key in (
        "media_dir",
        "image_max_pixels",
        "image_min_pixels",
        "freeze_vision_tower",
        "freeze_multi_modal_projector",
        "freeze_language_model",
        "train_mm_proj_only",
    )
}
STRATEGIES = ("ddp", "deepspeed", "fsdp")  # DDP: one process or several, each with the whole model
# the keys that choose a strategy other than DDP
STRATEGY_KEYS = {"deepspeed": "deepspeed", "zero_stage": "deepspeed", "fsdp": "fsdp"}


@dataclass(frozen=True)
class StageCapabilities:
    """What a stage's recipe honours: every schema key but ``unhonoured`` (key: why), under ``strategies``.
    ``cockpit check`` refuses the rest, naming the key and the stage; each recipe reads its own
    (``Recipe.capabilities``); the key table's per-stage columns are drawn from these."""

    stage: str
    strategies: tuple[str, ...]
    unhonoured: Mapping[str, str] = field(default_factory=dict)

    def honours(self, key: str) -> bool:
        strategy = STRATEGY_KEYS.get(key)
        return key not in self.unhonoured and (strategy is None or strategy in self.strategies)


_DDP_ONLY = ("ddp",)
STAGES: dict[str, StageCapabilities] = {
    "sft": StageCapabilities("sft", STRATEGIES),
    # evaluation (eval_dataset, eval_strategy, the best model), mixing and LoRA+ work in every stage
    "pt": StageCapabilities("pt", _DDP_ONLY, {**_SFT_LOSS_KEYS, **_SFT_IMAGES}),
    "dpo": StageCapabilities("dpo", _DDP_ONLY, {**_PAIR_UNHONOURED, **_SFT_LOSS_KEYS}),
    "kto": StageCapabilities("kto", _DDP_ONLY, {**_PAIR_UNHONOURED, **_SFT_LOSS_KEYS, **_SFT_IMAGES}),
    "rm": StageCapabilities("rm", _DDP_ONLY, {**_PAIR_UNHONOURED, **_RM_UNHONOURED, **_SFT_LOSS_KEYS, **_SFT_IMAGES}),
    "grpo": StageCapabilities("grpo", _DDP_ONLY, {**_GRPO_UNHONOURED, **_SFT_LOSS_KEYS, **_SFT_IMAGES}),
}
# stage -> {key the schema accepts but the stage does not honour yet: why}. validate() refuses a value
# other than the schema's default (or one of HONOURED_VALUES); the key table (docs/configuration.md) names the stages.
UNHONOURED: dict[str, Mapping[str, str]] = {stage: caps.unhonoured for stage, caps in STAGES.items()}
# values of an UNHONOURED key that say what the stage does anyway (none today)
HONOURED_VALUES: dict[str, tuple[Any, ...]] = {}


def refusing_stages(key: str) -> list[str]:
    """The stages that refuse ``key`` (set to a value other than its default), in the schema's order."""
    return [stage for stage, caps in STAGES.items() if not caps.honours(key)]


def unhonoured_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """A key set (not to its default) that the config's stage accepts in the schema and does not honour,
    and a strategy the stage does not run under."""
    stage = cfg.get("stage", "sft")
    caps = STAGES[stage]
    out: list[Problem] = []
    for key, why in caps.unhonoured.items():
        value = cfg.get(key)
        if value == SCHEMA[key].default or value in HONOURED_VALUES.get(key, ()):
            continue
        out.append(Problem(f"not honoured for stage {stage} yet ({why}); remove it or use stage sft", **where(key)))
    sharded = [key for key, strategy in STRATEGY_KEYS.items() if cfg.get(key) and strategy not in caps.strategies]
    if sharded:
        runs = ", ".join(s for s in STRATEGIES if s in caps.strategies)
        out.append(
            Problem(
                f"stage {stage}: sharded strategies (fsdp / deepspeed / zero_stage) are for stage sft so far "
                f"(stage {stage} runs under {runs})",
                **where(sharded[0]),
            )
        )
    return out


def uses_reference(cfg: Mapping[str, Any]) -> bool:
    """Does the stage compare the policy with a reference model?"""
    if cfg.get("stage") == "kto":
        return True
    if cfg.get("stage") == "grpo":
        return bool(cfg.get("beta"))
    return cfg.get("stage") == "dpo" and cfg.get("pref_loss") not in REFERENCE_FREE_LOSSES


def reference_copy(cfg: Mapping[str, Any]) -> bool:
    """Does the reference take a second model in memory? (With LoRA and no ``ref_model`` it is the
    base with the adapter disabled: no copy.)"""
    return uses_reference(cfg) and (bool(cfg.get("ref_model")) or cfg.get("finetuning_type") != "lora")


def reference_words(cfg: Mapping[str, Any]) -> str:
    """What the stage compares the policy with, in words: the rank's log and ``cockpit plan`` say
    the same (TRL disables the LoRA adapter itself when no reference model is given)."""
    if not uses_reference(cfg) and cfg.get("stage") == "grpo":
        return "none (beta 0: no KL term)"
    if not uses_reference(cfg):
        return f"none (pref_loss {cfg.get('pref_loss')} uses none)" if cfg.get("stage") == "dpo" else "none"
    if cfg.get("ref_model"):
        adapters = f" + {cfg['ref_model_adapters']}" if cfg.get("ref_model_adapters") else ""
        return f"{cfg['ref_model']}{adapters} (a frozen second model in memory)"
    if cfg.get("finetuning_type", "lora") == "lora":
        return "the base with the LoRA adapter disabled (no second copy in memory)"
    return "a frozen copy of the base (a second copy in memory)"


def sequences_per_sample(cfg: Mapping[str, Any]) -> int:
    """Sequences one sample puts through the model per step: chosen + rejected for pairs."""
    return 2 if cfg.get("stage") in PAIRWISE_STAGES else 1


def stage_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    stage = cfg.get("stage", "sft")
    out: list[Problem] = unhonoured_problems(cfg, where)
    out += grpo_problems(cfg, where)
    if cfg.get("ref_model_adapters") and not cfg.get("ref_model"):
        out.append(
            Problem(
                "ref_model_adapters needs ref_model (the adapters are applied to it)", **where("ref_model_adapters")
            )
        )
    if cfg.get("ref_model_quantization_bit") and not cfg.get("ref_model"):
        out.append(Problem("ref_model_quantization_bit needs ref_model", **where("ref_model_quantization_bit")))
    if cfg.get("ref_model") and not uses_reference(cfg):
        why = (
            f"pref_loss {cfg.get('pref_loss')} uses no reference model"
            if stage == "dpo"
            else f"stage {stage} uses no reference model"
        )
        out.append(Problem(f"{why}; unset ref_model", **where("ref_model")))
    if stage == "dpo" and cfg.get("dpo_label_smoothing") and cfg.get("pref_loss") != "sigmoid":
        out.append(
            Problem(
                f"dpo_label_smoothing applies to pref_loss sigmoid (robust DPO), not {cfg.get('pref_loss')}",
                **where("dpo_label_smoothing"),
            )
        )
    if stage == "rm" and cfg.get("finetuning_type") == "freeze":
        out.append(
            Problem("stage rm trains a new value head: use finetuning_type lora or full", **where("finetuning_type"))
        )
    return out
