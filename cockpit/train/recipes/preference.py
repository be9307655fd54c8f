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


IMAGE_PATHS = "image_paths"  # a pair's images; not "images", which TRL takes for its own processor's vision path


def _dataset(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> Any:
    """A datasets.Dataset in TRL's conversational form (answers as one assistant turn); pairs with images
    (their prompt's image tokens already expanded) carry their image paths for :class:`PairImages`."""
    from datasets import Dataset

    images = any(r.get("images") for r in rows)

    def conv(row: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt": row["prompt"]}
        for k in keys:
            v = row[k]
            out[k] = [{"role": "assistant", "content": v}] if isinstance(v, str) else v
        if images:
            out[IMAGE_PATHS] = [i["path"] for i in row.get("images") or ()]
        return out

    return Dataset.from_list([conv(r) for r in rows])


class PairImages:
    """TRL's pair collator's batch (the chosen rows, then the rejected rows) plus the pixel_values of each
    pair's images for both halves, in that order: TRL's own DataCollatorForVisionPreference repeats the
    images so (``images * 2``), as LLaMA-Factory's PairwiseDataCollatorWithPadding gives both halves the
    pair's images. DPOTrainer forwards every batch key to the policy and to the reference (or to the
    policy with its adapter disabled). TRL's vision collator itself is not used: it renders with the
    processor's chat template and expands ``<image>`` by the processor, where Cockpit renders
    LLaMA-Factory's template and expands as its mm_plugin does (cockpit.data.stage_data.with_image_tokens)."""

    def __init__(self, images: Any) -> None:
        self.images = images  # a cockpit.train.vlm.ImageCollator around TRL's DataCollatorForPreference

    def inputs_for(self, paths: list[str], input_ids: Any) -> dict[str, Any]:
        """The model's image inputs for these rows: the images' pixel_values (and the plugin's keys: Qwen2-VL's
        image_grid_thw), and the image tokens marked per token where the plugin wants it, as SFT's collator."""
        out = self.images.image_inputs(paths) if paths else {}
        if self.images.plugin.token_type_key:
            out[self.images.plugin.token_type_key] = (input_ids == self.images.token_id).long()
        return out

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        batch = self.images.inner(features)
        paths = [p for f in features for p in f.get(IMAGE_PATHS) or ()]
        batch.update(self.inputs_for(paths * 2, batch["input_ids"]))  # the chosen half's images, then the rejected's
        return batch


def with_pair_images(trainer: Any, cfg: RunConfig, model: Any, data: StageData) -> Any:
    """The trainer, its collator wrapped in :class:`PairImages` when the pairs have images (a vision-language
    model: its image processor, as SFT's collator)."""
    if not any(r.get("images") for r in (*data.train, *data.held_out)):
        return trainer
    from cockpit.train.vlm import ImageCollator, with_images

    images = with_images(trainer.data_collator, cfg, model)
    if isinstance(images, ImageCollator):
        trainer.data_collator = PairImages(images)
    return trainer


def held_out_images(cfg: RunConfig, model: Any, pairs: list[dict[str, Any]]) -> Any:
    """(image paths, input_ids) -> the model's image inputs, for held-out pairs with images; else None."""
    from cockpit.train.vlm import ImageCollator, with_images

    images = with_images(None, cfg, model) if any(p.get("images") for p in pairs) else None
    return PairImages(images).inputs_for if isinstance(images, ImageCollator) else None


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
        trainer = cockpit_trainer(trainer_cls)(
            model=model,
            args=args,
            train_dataset=_dataset(data.train, ("chosen", "rejected")),
            eval_dataset=_dataset(data.held_out, ("chosen", "rejected")) if data.held_out else None,
            processing_class=ctx.tokenizer,
            callbacks=callbacks,
            **kwargs,
        )
        return with_pair_images(trainer, ctx.cfg, model, data)

    def held_out(
        self, ctx: RecipeContext, model: Any, data: StageData, on_progress: OnProgress = silent
    ) -> dict[str, Any] | None:
        from cockpit.train.recipes.heldout import policy_preference

        images = held_out_images(ctx.cfg, model, data.held_out)
        return policy_preference(model, ctx.tokenizer, data.held_out, on_progress, images)

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
