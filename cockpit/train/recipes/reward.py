"""``stage: rm``: a reward model (the base with a one-output value head, ``score``) trained on
preference pairs with TRL's RewardTrainer (Bradley-Terry loss: chosen scored above rejected).
With LoRA the value head is trained in full beside the adapter (PEFT's ``modules_to_save``), so
the saved adapter folder holds everything a later PPO / GRPO stage needs to load it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from cockpit.errors import InputError
from cockpit.train.progress import OnProgress, silent
from cockpit.train.recipes.base import (
    RecipeContext,
    StageData,
    cockpit_trainer,
    stage_arguments,
)
from cockpit.train.recipes.preference import DPORecipe, _dataset
from cockpit.train.variants import trainer_kwargs


def build_value_model(ctx: RecipeContext):
    import torch
    from transformers import AutoModelForSequenceClassification, set_seed

    cfg = ctx.cfg
    if cfg.get("quantization_bit"):
        raise InputError("stage rm: quantization_bit is not supported for reward models yet")
    set_seed(cfg["seed"])  # the value head's random init
    dtype = torch.bfloat16 if (cfg["bf16"] and not ctx.use_cpu and cfg["finetuning_type"] == "lora") else torch.float32
    from cockpit.train.variants import lora_config_kwargs, model_load_kwargs

    model = AutoModelForSequenceClassification.from_pretrained(
        ctx.model_ref.path,
        num_labels=1,
        dtype=dtype,
        trust_remote_code=bool(cfg["trust_remote_code"]),
        **ctx.model_ref.kwargs(),
        **model_load_kwargs(cfg, ctx.model_ref, ctx.log),  # flash_attn, rope_scaling
    )
    from cockpit.models.vocab import resize_to_tokenizer

    resize_to_tokenizer(model, ctx.tokenizer)  # rows for the chat template's stop words, if it added any
    model.config.pad_token_id = ctx.tokenizer.pad_token_id
    model.config.use_cache = False
    if cfg["finetuning_type"] == "lora":
        from peft import LoraConfig, get_peft_model

        target = cfg["lora_target"]
        lcfg = LoraConfig(
            r=cfg["lora_rank"],
            lora_alpha=cfg["lora_alpha"],
            lora_dropout=cfg["lora_dropout"],
            target_modules="all-linear" if target == "all" else [t.strip() for t in target.split(",") if t.strip()],
            task_type="SEQ_CLS",  # keeps the value head (score) trainable and saved with the adapter
            **lora_config_kwargs(cfg),  # DoRA, rsLoRA, PiSSA init, additional_target (beside the head)
        )
        model = get_peft_model(model, lcfg)
    return model


class RewardRecipe(DPORecipe):
    stage = "rm"
    causal_lm = False
    step_fields: ClassVar[dict[str, str]] = {
        "accuracy": "pairwise_accuracy",
        "margin": "reward_margin",
        "mean_reward": "mean_reward",
    }

    def build_models(self, ctx: RecipeContext) -> tuple[Any, Any]:
        return build_value_model(ctx), None

    def build_trainer(
        self, ctx: RecipeContext, model: Any, ref_model: Any, data: StageData, callbacks: list[Any]
    ) -> Any:
        from trl import RewardConfig, RewardTrainer

        args = stage_arguments(RewardConfig, ctx, data, max_length=ctx.cfg["cutoff_len"], disable_dropout=True)
        return cockpit_trainer(RewardTrainer)(
            model=model,
            args=args,
            train_dataset=_dataset(data.train, ("chosen", "rejected")),
            eval_dataset=_dataset(data.held_out, ("chosen", "rejected")) if data.held_out else None,
            processing_class=ctx.tokenizer,
            callbacks=callbacks,
            **trainer_kwargs(ctx.cfg, model, args),  # loraplus_lr_ratio: a LoRA+ optimizer (value head included)
        )

    def held_out(
        self, ctx: RecipeContext, model: Any, data: StageData, on_progress: OnProgress = silent
    ) -> dict[str, Any] | None:
        from cockpit.train.recipes.heldout import reward_preference

        return reward_preference(model, ctx.tokenizer, data.held_out, on_progress)

    def summary(self, ctx: RecipeContext, trainer: Any, data: StageData) -> dict[str, Any]:
        return {"value_head": "score"}
