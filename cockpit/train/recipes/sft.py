"""``stage: sft``: supervised fine-tuning, the first recipe and the one with every strategy.

The data are chat-rendered samples with the loss on the assistant's tokens
(:func:`cockpit.data.prepare.prepare_dataset`), held out by ``val_size`` or read from
``eval_dataset``; the trainer is Cockpit's (HF Trainer + atomic checkpoints, FSDP2's saving
variant when sharded) with the padded or packed collator. SFT runs the flow every stage runs
(:meth:`Recipe.run`) and fills its hooks for what only it does: the strategy before the model
(DeepSpeed / FSDP2 across ranks and nodes, sharded loading: ``prepare``), its trainer and probes
asked on the training device by every rank (``start``), probes after with sharded parameters
(``measure_after``) and prediction (``final_summary``). :func:`sft_trainer` is also ``cockpit
tune``'s trial trainer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cockpit.config.run_config import RunConfig
from cockpit.data.packing import resolve_for_run
from cockpit.data.padding import batching_words
from cockpit.errors import InputError
from cockpit.train.arguments import ListDataset, training_arguments
from cockpit.train.distributed import apply_strategy, comm_health_probe, report_peak_memory
from cockpit.train.model import config_only, placed_model
from cockpit.train.recipes.base import (
    Attempt,
    Recipe,
    RecipeContext,
    StageData,
    run_summary,
    save_pissa_initial,
    skipped_after_stop,
    split_held_out,
)


def sft_trainer(
    trainer_cls: type,
    cfg: RunConfig,
    model: Any,
    args: Any,
    tokenizer: Any,
    train_rows: list[dict[str, Any]],
    eval_rows: list[dict[str, Any]] | None = None,
    callbacks: list[Any] | None = None,
) -> Any:
    """The SFT trainer: rendered rows, the padded or packed collator, a LoRA+ optimizer when set,
    token accuracy in the evaluation when ``compute_accuracy`` is set, DFT / EAFT token weights when set."""
    from cockpit.data.packing import build_collator
    from cockpit.data.padding import padding_free
    from cockpit.train.token_weights import token_weighting
    from cockpit.train.variants import accuracy_kwargs, trainer_kwargs
    from cockpit.train.vlm import with_images
    from cockpit.train.vlm_ranks import every_rank_sees_an_image

    text_collator = build_collator(cfg, tokenizer, model)
    collator = with_images(text_collator, cfg, model)  # a VLM: pixel_values
    if collator is not text_collator:  # several ranks: each micro-batch carries an image
        collator = every_rank_sees_an_image(collator, cfg, tokenizer, int(args.world_size))
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=ListDataset(train_rows),
        eval_dataset=ListDataset(eval_rows) if eval_rows else None,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=list(callbacks or []),
        **trainer_kwargs(cfg, model, args),  # a LoRA+ optimizer
        **(accuracy_kwargs(cfg) if eval_rows else {}),  # compute_accuracy: eval_accuracy
    )
    trainer.token_weighting = token_weighting(cfg)
    if eval_rows and cfg.compute_accuracy and padding_free(cfg):  # accuracy is per sample: padded rows
        trainer.eval_data_collator = build_collator(cfg.replace(packing=False), tokenizer, model)
    return trainer


class SFTRecipe(Recipe):
    stage = "sft"

    def build_data(self, ctx: RecipeContext) -> StageData:
        from cockpit.data.prepare import prepare_dataset

        prepared = prepare_dataset(ctx.cfg, ctx.tokenizer)
        rows = prepared.rows()  # a sample's images too
        if not rows:
            raise InputError(
                f"cutoff_len {ctx.cfg.cutoff_len}: every sample loses all its assistant tokens; nothing to train on"
            )
        train, held_out = split_held_out(ctx.cfg, rows)
        if ctx.cfg.eval_dataset:
            from cockpit.train.variants import eval_dataset_rows

            held_out = eval_dataset_rows(ctx.cfg, ctx.tokenizer)
        return StageData(train, held_out, prepared.report)

    def summary(self, ctx: RecipeContext, trainer: Any, data: StageData) -> dict[str, Any]:
        return {"samples": len(data.train), "truncation": data.report.as_dict()}

    def predict_only(self, ctx: RecipeContext) -> int:
        """A prediction-only run (``do_predict`` with ``adapter_name_or_path``, ``do_train: false``)."""
        from cockpit.train.predict import predict_only

        return predict_only(ctx)

    def prepare(self, ctx: RecipeContext, data: StageData) -> RecipeContext:
        """The strategy (and so the DeepSpeed config) before the model: ZeRO-3 partitions at load."""
        cfg, sharded = apply_strategy(
            ctx.run,
            ctx.cfg,
            config_only(ctx.model_ref),
            ctx.rank,
            ctx.world_size,
            ctx.local_rank,
            ctx.use_cpu,
            len(data.train),
            ctx.log,
        )
        cfg = resolve_for_run(cfg, ctx.model_ref, ctx.log)  # packing auto: asks the model too
        ctx.log(batching_words(cfg))
        return dataclasses.replace(ctx, cfg=cfg, sharded=sharded)

    def measure_after(self, ctx: RecipeContext, attempt: Attempt, data: StageData) -> dict[str, Any]:
        if skipped_after_stop(ctx, attempt):
            return {}
        probes_after(ctx, attempt, ctx.sharded)  # evaluation: the Trainer's, during training
        return {}

    def final_summary(
        self, ctx: RecipeContext, attempt: Attempt, data: StageData, after: dict[str, Any]
    ) -> dict[str, Any]:
        summary = {**run_summary(ctx, attempt), **self.summary(ctx, attempt.trainer, data)}
        if ctx.cfg.do_predict and not attempt.callback.stop_requested:  # rank 0 alone, after the other ranks
            from cockpit.train.predict import predict_after_training

            summary["predict"] = predict_after_training(ctx, attempt, ctx.sharded)
        return summary

    def start(self, ctx: RecipeContext, data: StageData) -> Attempt:
        """Training arguments (the process group with them), the comm probe, the placed model and
        its trainer with Cockpit's callbacks."""
        from cockpit.train.callbacks import CockpitCallback
        from cockpit.train.placement import ProbesBeforeTraining, stop_pending
        from cockpit.train.probes import probes_of

        cfg = ctx.cfg
        args = training_arguments(cfg, ctx.dirs, ctx.use_cpu, ctx.world_size)
        if ctx.world_size > 1 and cfg.comm_probe:
            comm_health_probe(ctx.writer, ctx.use_cpu, ctx.log)
        model, trainer_cls = placed_model(
            ctx.run, cfg, ctx.model_ref, args, ctx.rank, ctx.local_rank, ctx.use_cpu, ctx.sharded, ctx.log
        )
        report_peak_memory(ctx.run, ctx.writer, ctx.rank, ctx.local_rank, "loaded")
        save_pissa_initial(ctx, model)  # pissa_convert: the initial adapter, before the first step
        probes = probes_of(cfg) if cfg.probes else []
        callback = CockpitCallback(ctx.run, cfg, ctx.rank, ctx.world_size, ctx.writer)
        before = ProbesBeforeTraining(
            ctx.tokenizer,
            probes,
            cfg.probe_max_new_tokens,
            ctx.writer,
            ctx.rank,
            fsdp=bool(cfg.fsdp),
            log=ctx.log,
        )
        from cockpit.train.stopping import early_stopping_callbacks
        from cockpit.train.trackers import tracker_callbacks

        stopping = early_stopping_callbacks(cfg, ctx.writer, ctx.log)  # early_stopping_steps
        tracking = tracker_callbacks(cfg, ctx.dirs["trackers"], ctx.run.run_id)  # use_swanlab / report_to swanlab
        trainer = sft_trainer(
            trainer_cls,
            cfg,
            model,
            args,
            ctx.tokenizer,
            data.train,
            data.held_out,
            [callback, before, *stopping, *tracking],
        )
        before.trainer = trainer
        before.resumed_run = ctx.run if cfg.resume_from_checkpoint else None
        before.should_stop = stop_pending(ctx.run, ctx.world_size)
        return Attempt(trainer, callback, before, probes)


def probes_after(ctx: RecipeContext, attempt: Attempt, sharded: bool) -> None:
    """The trained model's answers; sharded parameters: every rank joins generate's gathers."""
    from contextlib import nullcontext

    from cockpit.strategy.fsdp import gathered_root
    from cockpit.train.probes import run_probes
    from cockpit.train.progress import probes_reporter

    if not attempt.probes or not (ctx.rank == 0 or sharded):
        return
    ctx.log("probes after training")
    model = attempt.trainer.model
    with gathered_root(model) if ctx.cfg.fsdp else nullcontext():
        attempt.probe_after = run_probes(
            model,
            ctx.tokenizer,
            attempt.probes,
            ctx.cfg.probe_max_new_tokens,
            on_progress=probes_reporter(ctx.writer, "after"),
        )
    if ctx.rank == 0:
        ctx.writer.emit("probe_results", phase="after", **attempt.probe_after)
