"""``stage: rm``: a reward model (the base with a one-output value head, ``score``) trained on
preference pairs with TRL's RewardTrainer (Bradley-Terry loss: chosen scored above rejected).
With LoRA the value head is trained in full beside the adapter (PEFT's ``modules_to_save``), so
the saved adapter folder holds everything a later PPO / GRPO stage needs to load it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from cockpit.train.progress import OnProgress, silent
from cockpit.train.recipes.base import (
    RecipeContext,
    StageData,
    cockpit_trainer,
    stage_arguments,
)
from cockpit.train.recipes.preference import DPORecipe, _dataset
from cockpit.train.variants import trainer_kwargs


def build_value_model(ctx: RecipeContext) -> Any:
    """The value model: the shared builder with a one-output head (``score``) in place of the LM
    head, so every model key (quantization, upcasts, flash_attn, rope_scaling, LoRA variants, a
    trained adapter) applies as it does to the other stages."""
    from cockpit.train.model import build_model

    model = build_model(ctx.cfg, ctx.model_ref, ctx.use_cpu, ctx.local_rank, value_head=True)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.pad_token_id = ctx.tokenizer.pad_token_id  # the head scores each sequence's last real token
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

        args = stage_arguments(RewardConfig, ctx, data, max_length=ctx.cfg.cutoff_len, disable_dropout=True)
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
