"""``stage: pt``: continued pretraining on raw text. Every text gets the EOS token, the token
stream is packed into ``cutoff_len`` blocks (LLaMA-Factory's packing, in
:func:`cockpit.data.stage_data.pack_texts`), and the loss is on every token.
The trainer is Cockpit's own (HF Trainer + atomic checkpoints): pretraining needs nothing TRL adds.
"""

from __future__ import annotations

from typing import Any

from cockpit.train.arguments import ListDataset
from cockpit.train.model import build_model
from cockpit.train.recipes.base import (
    Recipe,
    RecipeContext,
    StageData,
    eval_dataset_prepared,
    split_held_out,
    stage_arguments,
)
from cockpit.train.variants import trainer_kwargs


class PretrainRecipe(Recipe):
    stage = "pt"

    def build_data(self, ctx: RecipeContext) -> StageData:
        from cockpit.data.stage_data import prepare_stage_data

        prepared = prepare_stage_data(ctx.cfg, ctx.tokenizer)
        rows = [{"input_ids": b, "labels": list(b)} for b in prepared.blocks]
        train, held = split_held_out(ctx.cfg, rows) if len(rows) > 1 else (rows, [])
        evaluation = eval_dataset_prepared(ctx)
        if evaluation is not None:
            held = [{"input_ids": b, "labels": list(b)} for b in evaluation.blocks]
        return StageData(train, held, prepared.report)

    def build_models(self, ctx: RecipeContext) -> tuple[Any, Any]:
        return build_model(ctx.cfg, ctx.model_ref, ctx.use_cpu, ctx.local_rank), None

    def build_trainer(
        self, ctx: RecipeContext, model: Any, ref_model: Any, data: StageData, callbacks: list[Any]
    ) -> Any:
        from transformers import DataCollatorForSeq2Seq, TrainingArguments

        from cockpit.train.trainer import CockpitTrainer

        args = stage_arguments(TrainingArguments, ctx, data)
        return CockpitTrainer(
            model=model,
            args=args,
            train_dataset=ListDataset(data.train),
            eval_dataset=ListDataset(data.held_out) if data.held_out else None,
            data_collator=DataCollatorForSeq2Seq(ctx.tokenizer, padding=True, label_pad_token_id=-100),
            processing_class=ctx.tokenizer,
            callbacks=callbacks,
            **trainer_kwargs(ctx.cfg, model, args),  # loraplus_lr_ratio: a LoRA+ optimizer
        )

    def summary(self, ctx: RecipeContext, trainer: Any, data: StageData) -> dict[str, Any]:
        return {"blocks": len(data.train), "block_tokens": ctx.cfg.cutoff_len}
