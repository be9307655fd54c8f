"""Preference stages through TRL: ``dpo`` (pref_loss sigmoid / ipo / hinge with DPOTrainer,
orpo with ORPOTrainer, simpo with CPOTrainer) and ``kto`` (KTOTrainer, with LLaMA-Factory's KL pairs:
``cockpit/train/kto_pairs.py``).

The reference model: none for ORPO / SimPO; with LoRA and no ``ref_model``, the base with the
adapter disabled (TRL does this itself when ``ref_model`` is None and the policy is a PEFT
model: no second copy in memory); otherwise ``ref_model`` (+ ``ref_model_adapters``, merged)
or, for full / freeze training, a frozen copy of the base.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, ClassVar

from cockpit.config.stages import uses_reference
from cockpit.train.model import build_model
from cockpit.train.progress import OnProgress, silent
from cockpit.train.recipes.base import (
    Recipe,
    RecipeContext,
    StageData,
    cockpit_trainer,
    held_out_stage_data,
    stage_arguments,
)
from cockpit.train.variants import trainer_kwargs

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

PREF_FIELDS = {
    "rewards/margins": "reward_margin",
    "rewards/chosen": "reward_chosen",
    "rewards/rejected": "reward_rejected",
    "rewards/accuracies": "reward_accuracy",
}


def _dataset(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> Any:
    """A datasets.Dataset in TRL's conversational form (answers as one assistant turn)."""
    from datasets import Dataset

    def conv(row: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt": row["prompt"]}
        for k in keys:
            v = row[k]
            out[k] = [{"role": "assistant", "content": v}] if isinstance(v, str) else v
        return out

    return Dataset.from_list([conv(r) for r in rows])


def build_reference(ctx: RecipeContext) -> Any:
    """A frozen reference: ``ref_model`` (+ adapters, merged) or a copy of the base; or None."""
    cfg = ctx.cfg
    if not uses_reference(cfg.mapping()) or (cfg.finetuning_type == "lora" and not cfg.ref_model):
        return None
    from cockpit.models.resolve import resolve_model

    ref_cfg = cfg.replace(
        finetuning_type="full", quantization_bit=cfg.ref_model_quantization_bit, adapter_name_or_path=None
    )
    path = cfg.ref_model or cfg.model_name_or_path
    revision = None if cfg.ref_model else cfg.model_revision  # the policy's base: its revision
    model = build_model(ref_cfg, resolve_model(path, log=ctx.log, revision=revision), ctx.use_cpu, ctx.local_rank)
    if cfg.ref_model_adapters:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, cfg.ref_model_adapters).merge_and_unload()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class DPORecipe(Recipe):
    stage = "dpo"
    step_fields: ClassVar[dict[str, str]] = PREF_FIELDS

    def build_data(self, ctx: RecipeContext) -> StageData:
        return held_out_stage_data(ctx, "pair")

    def build_models(self, ctx: RecipeContext) -> tuple[Any, Any]:
        policy = build_model(ctx.cfg, ctx.model_ref, ctx.use_cpu, ctx.local_rank)
        return policy, build_reference(ctx)

    def trl_classes(self, cfg: RunConfig) -> tuple[type, type, dict[str, Any]]:
        """(trainer class, config class, the config's stage keys) for the run's pref_loss."""
        loss, beta, ftx = cfg.pref_loss, cfg.pref_beta, cfg.pref_ftx
        common = {"max_length": cfg.cutoff_len, "disable_dropout": True}
        if loss == "orpo":
            from trl.experimental.orpo import ORPOConfig, ORPOTrainer

            return ORPOTrainer, ORPOConfig, {**common, "beta": beta}
        if loss == "simpo":
            from trl.experimental.cpo import CPOConfig, CPOTrainer

            return (
                CPOTrainer,
                CPOConfig,
                {**common, "loss_type": "simpo", "beta": beta, "simpo_gamma": cfg.simpo_gamma, "cpo_alpha": ftx},
            )
        from trl import DPOConfig, DPOTrainer

        main = "robust" if loss == "sigmoid" and cfg.dpo_label_smoothing else loss
        types, weights = ([main, "sft"], [1.0, ftx]) if ftx else ([main], None)
        return (
            DPOTrainer,
            DPOConfig,
            {
                **common,
                "loss_type": types,
                "loss_weights": weights,
                "beta": beta,
                "label_smoothing": cfg.dpo_label_smoothing,
            },
        )

    def build_trainer(
        self, ctx: RecipeContext, model: Any, ref_model: Any, data: StageData, callbacks: list[Any]
    ) -> Any:
        trainer_cls, config_cls, keys = self.trl_classes(ctx.cfg)
        args = stage_arguments(config_cls, ctx, data, **keys)
        kwargs = {"ref_model": ref_model} if trainer_cls.__name__ == "DPOTrainer" else {}
        kwargs.update(trainer_kwargs(ctx.cfg, model, args))  # loraplus_lr_ratio: a LoRA+ optimizer
        return cockpit_trainer(trainer_cls)(
            model=model,
            args=args,
            train_dataset=_dataset(data.train, ("chosen", "rejected")),
            eval_dataset=_dataset(data.held_out, ("chosen", "rejected")) if data.held_out else None,
            processing_class=ctx.tokenizer,
            callbacks=callbacks,
            **kwargs,
        )

    def held_out(
        self, ctx: RecipeContext, model: Any, data: StageData, on_progress: OnProgress = silent
    ) -> dict[str, Any] | None:
        from cockpit.train.recipes.heldout import policy_preference

        return policy_preference(model, ctx.tokenizer, data.held_out, on_progress)

    def summary(self, ctx: RecipeContext, trainer: Any, data: StageData) -> dict[str, Any]:
        return {"pref_loss": ctx.cfg.pref_loss, "pref_beta": ctx.cfg.pref_beta}


class KTORecipe(DPORecipe):
    stage = "kto"
    step_fields: ClassVar[dict[str, str]] = {**PREF_FIELDS, "kl": "kl"}

    def build_trainer(
        self, ctx: RecipeContext, model: Any, ref_model: Any, data: StageData, callbacks: list[Any]
    ) -> Any:
        from trl import KTOConfig

        from cockpit.train.kto_pairs import DatasetKLTrainer

        cfg = ctx.cfg
        args = stage_arguments(
            KTOConfig,
            ctx,
            data,
            beta=cfg.pref_beta,
            desirable_weight=cfg.kto_chosen_weight,
            undesirable_weight=cfg.kto_rejected_weight,
            max_length=cfg.cutoff_len,
            disable_dropout=True,
            train_sampling_strategy="sequential",  # TRL asks it of its KL term; the rows are shuffled here
        )
        random.Random(cfg.seed).shuffle(data.train)
        # each prompt's KL answer is another row's, paired over the dataset as LLaMA-Factory does (any batch size)
        return cockpit_trainer(DatasetKLTrainer)(
            model=model,
            ref_model=ref_model,
            args=args,
            train_dataset=_dataset(data.train, ("completion",)).map(
                lambda r, i: {"label": data.train[i]["label"]}, with_indices=True
            ),
            eval_dataset=_dataset(data.held_out, ("completion",)).map(
                lambda r, i: {"label": data.held_out[i]["label"]}, with_indices=True
            )
            if data.held_out
            else None,
            processing_class=ctx.tokenizer,
            callbacks=callbacks,
            **trainer_kwargs(cfg, model, args),  # loraplus_lr_ratio: a LoRA+ optimizer
        )

    def held_out(
        self, ctx: RecipeContext, model: Any, data: StageData, on_progress: OnProgress = silent
    ) -> dict[str, Any] | None:
        return None

    def summary(self, ctx: RecipeContext, trainer: Any, data: StageData) -> dict[str, Any]:
        return {
            "pref_beta": ctx.cfg.pref_beta,
            "kto_desirable": sum(1 for r in data.train if r["label"]),
            "kto_undesirable": sum(1 for r in data.train if not r["label"]),
        }
