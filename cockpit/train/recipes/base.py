"""The recipe interface and the flow every stage shares.

A recipe says, for its stage: how to build the data (train / held-out rows and the data
report), the model(s) (policy, and a reference or none), the trainer (a TRL trainer class
with Cockpit's atomic checkpoints mixed in), which of the trainer's logged metrics become
fields of the ``step`` event, how to measure held-out pairs before and after, and what goes
into ``summary.json``; and which keys and strategies it honours (``capabilities``, declared in
``config/stages.py``). Every stage, SFT included, runs the one flow :meth:`Recipe.run` (data ->
prepare -> start -> train -> save -> measure after -> summary) through the same functions:
``train`` (from the resume point, the run's totals over its attempts), ``save_final_model`` (the
NaN rule: never a model trained through a NaN; PiSSA's conversion), ``other_rank_done``,
``run_summary`` (one tokens/s definition) and ``end_run``. SFT overrides hooks of it: ``prepare``
(the strategy before the model: DeepSpeed / FSDP2, sharded loading), ``start`` (its trainer),
``measure_after`` (probes with sharded parameters) and ``final_summary`` (prediction).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cockpit.config.parity import evaluates
from cockpit.config.stages import STAGES, StageCapabilities, reference_words, unhonoured_problems
from cockpit.errors import EXIT_FAILED, EXIT_OK, InputError, Problem
from cockpit.store import output_mark
from cockpit.store.events import EventWriter, read_all, wall_time_s
from cockpit.store.rundir import RunDir, atomic_write_json
from cockpit.train.arguments import artefact_dirs, training_arguments
from cockpit.train.outcome import adapter_from_last_good, mark_poisoned, plot_loss, resume_point
from cockpit.train.progress import OnProgress, probes_reporter, reporter, silent

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from cockpit.config.run_config import RunConfig


@dataclass
class RecipeContext:
    run: RunDir
    cfg: RunConfig
    rank: int
    world_size: int
    local_rank: int
    writer: Any  # EventWriter on rank 0, else None
    t0: float
    use_cpu: bool
    dirs: dict[str, Path]
    model_ref: Any  # cockpit.models.resolve's resolved model (path + load kwargs)
    tokenizer: Any
    log: Callable[[str], None]
    sharded: bool = False  # the strategy shards the model (ZeRO-3, FSDP2): set by Recipe.prepare


@dataclass
class StageData:
    train: list[dict[str, Any]]
    held_out: list[dict[str, Any]]
    report: Any  # cockpit.data.stage_data.StageReport
    extra: dict[str, Any] = field(default_factory=dict)


class Recipe:
    """One training stage behind one flow (:meth:`run`, the same for every stage, the way torchtune's
    recipes sit behind one interface): build the data, ``prepare`` (the strategy), ``start`` (models,
    trainer, Cockpit's callbacks; the base measured at ``on_train_begin`` on the training device),
    train from the resume point with the run's totals, save under the NaN rule, ``measure_after``,
    then rank 0's ``final_summary``. A stage fills in the ``build_*`` methods and overrides a hook
    where it differs (SFT: the strategy before the model, its own trainer, prediction)."""

    stage = ""
    causal_lm = True  # the policy generates text: probes run before / after
    # trainer log key -> step event field (see cockpit/store/events.py)
    step_fields: ClassVar[dict[str, str]] = {}

    @property
    def capabilities(self) -> StageCapabilities:
        """The keys and strategies this stage honours (declared in ``config/stages.py``, where
        ``cockpit check`` and the key table read them)."""
        return STAGES[self.stage]

    def refuse_what_it_does_not_honour(self, cfg: RunConfig) -> None:
        """A config that reached the ranks without ``cockpit check`` (an older run dir's, say) stops here,
        naming the key and the stage, instead of training without it."""
        problems = unhonoured_problems(cfg.mapping(), lambda key: {"key": key}) if cfg.stage == self.stage else []
        if problems:
            raise InputError(problems)

    # -- the flow -----------------------------------------------------------------------------------
    def run(self, ctx: RecipeContext) -> int:
        """Train this stage in this rank; the worker's exit codes. Every stage's flow: not overridden."""
        from cockpit.train.distributed import report_peak_memory

        if not ctx.cfg.do_train:
            return self.predict_only(ctx)
        say_activity(ctx, "preparing the data")
        data = self.build_data(ctx)
        ctx.log("data: " + " | ".join(data.report.lines()))
        ctx = self.prepare(ctx, data)
        say_activity(ctx, "loading the model")
        attempt = self.start(ctx, data)
        train(ctx, attempt)
        report_peak_memory(ctx.run, ctx.writer, ctx.rank, ctx.local_rank, "trained", attempt.trainer.model)
        say_activity(ctx, "saving the model")
        save_final_model(ctx, attempt)
        after = self.measure_after(ctx, attempt, data)
        report_peak_memory(ctx.run, ctx.writer, ctx.rank, ctx.local_rank, "finished")
        if ctx.rank != 0:
            return other_rank_done(ctx, attempt)
        return end_run(
            ctx, self.final_summary(ctx, attempt, data, after), attempt.callback, attempt.trainer.state.global_step
        )

    # -- the hooks ----------------------------------------------------------------------------------
    def predict_only(self, ctx: RecipeContext) -> int:
        """``do_train: false`` (validation lets only SFT's prediction-only runs through)."""
        raise InputError(f"do_train: false: stage {self.stage} has nothing to do without training")

    def prepare(self, ctx: RecipeContext, data: StageData) -> RecipeContext:
        """The strategy before the model (the context it trains with); DDP or one rank: as it is."""
        return ctx

    def start(self, ctx: RecipeContext, data: StageData) -> Attempt:
        """The stage's models and trainer, with Cockpit's callbacks and the base measured at the start."""
        attempt = start_stage(self, ctx, data)
        ctx.log(
            f"{cfg_stage(ctx.cfg)}: {trl_name(attempt.trainer)}, reference model: {reference_words(ctx.cfg.mapping())}"
        )
        return attempt

    def measure_after(self, ctx: RecipeContext, attempt: Attempt, data: StageData) -> dict[str, Any]:
        """After training: the trainer's own evaluation of the held-out rows, the probes, the stage's
        held-out measure (every rank calls it; rank 0 reports)."""
        if skipped_after_stop(ctx, attempt):
            return {"held_out_after": None}
        trainer, stopped = attempt.trainer, attempt.callback.stop_reason is not None
        final_eval = (
            trainer.evaluate()
            if data.held_out and evaluates(ctx.cfg.mapping()) and not (stopped or attempt.poisoned)
            else None
        )  # the trainer's own metrics (an eval event)
        attempt.probe_after = _probes(ctx, trainer.model, "after") if self.causal_lm else None
        held_after = _held_out(self, ctx, trainer.model, data, "after")
        if held_after:
            held_after = {**held_after, "trainer_eval": {k: _num(v) for k, v in (final_eval or {}).items()}}
        return {"held_out_after": held_after}

    def final_summary(
        self, ctx: RecipeContext, attempt: Attempt, data: StageData, after: dict[str, Any]
    ) -> dict[str, Any]:
        """summary.json (rank 0): :func:`run_summary`, the stage's fields, what ``measure_after`` found; a
        held-out check by reward (grpo) adds ``held_out_fell``, the rewards whose held-out mean fell."""
        from cockpit.train.reward_watch import fell_rewards

        before = attempt.probes_before
        by_reward = (before.held or {}).get("rewards") is not None
        fell = {"held_out_fell": fell_rewards(before.held, after.get("held_out_after"))} if by_reward else {}
        return {
            **run_summary(ctx, attempt),
            "stage": ctx.cfg.stage,
            "trainer": trl_name(attempt.trainer),
            "probes_before": _rate(before.probes),
            "probes_after": _rate(attempt.probe_after),
            "held_out_before": before.held,
            "held_out_after": after.get("held_out_after"),
            "samples": len(data.train),
            "data": data.report.as_dict(),
            **self.summary(ctx, attempt.trainer, data),
            **fell,
        }

    # -- what a stage fills in ----------------------------------------------------------------------
    def build_data(self, ctx: RecipeContext) -> StageData:
        raise NotImplementedError

    def build_models(self, ctx: RecipeContext) -> tuple[Any, Any]:
        """(policy, reference model or None)."""
        raise NotImplementedError

    def build_trainer(
        self, ctx: RecipeContext, model: Any, ref_model: Any, data: StageData, callbacks: list[Any]
    ) -> Any:
        raise NotImplementedError

    def step_metrics(self, logs: dict[str, Any]) -> dict[str, Any]:
        """The stage's own fields of a ``step`` (or, with ``eval_`` keys, an ``eval``) event."""
        out = {}
        for key, name in self.step_fields.items():
            if key in logs:
                out[name] = _num(logs[key])
            if f"eval_{key}" in logs:
                out[f"eval_{name}"] = _num(logs[f"eval_{key}"])
        return out

    def held_out(
        self, ctx: RecipeContext, model: Any, data: StageData, on_progress: OnProgress = silent
    ) -> dict[str, Any] | None:
        """A measurement on the held-out rows (run before and after training), or None;
        ``on_progress(done, total)`` as it goes (``progress`` events)."""
        return None

    def summary(self, ctx: RecipeContext, trainer: Any, data: StageData) -> dict[str, Any]:
        """The stage's own fields of summary.json."""
        return {}


def say_activity(ctx: RecipeContext, text: str) -> None:
    """Rank 0: what the ranks do now, as an ``activity`` event (readers show it until the next step)."""
    if ctx.writer is not None:
        ctx.writer.emit("activity", text=text)


def skipped_after_stop(ctx: RecipeContext, attempt: Attempt) -> bool:
    """A stop request ended the training: the run ends after its checkpoint, without the work after
    training (probes, held-out scoring, prediction), which a user who stopped does not wait for."""
    if not attempt.callback.stop_requested:
        return False
    ctx.log(
        "stopped on request: no probes or held-out measure after training "
        f"(ask the probes later: cockpit chat {ctx.run.run_id} --probes, or F5 in the cockpit's chat)"
    )
    return True


def _num(value: Any) -> Any:
    try:
        return round(float(value), 6)
    except (TypeError, ValueError):
        return value


def split_held_out(cfg: RunConfig, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) by ``val_size`` (a fraction or a count), shuffled with the run's seed."""
    if not cfg.val_size:
        return rows, []
    rows = list(rows)
    random.Random(cfg.seed).shuffle(rows)
    n = int(cfg.val_size) if cfg.val_size >= 1 else max(1, int(len(rows) * cfg.val_size))
    return rows[n:], rows[:n]


def held_out_stage_data(ctx: RecipeContext, what: str) -> StageData:
    """The stage's rows that survive cutoff_len, split into train / held-out by ``val_size`` (or held out:
    ``eval_dataset``'s); ``what`` names a row in the error when nothing is left to train on."""
    from cockpit.data.stage_data import prepare_stage_data

    prepared = prepare_stage_data(ctx.cfg, ctx.tokenizer)
    train, held = split_held_out(ctx.cfg, prepared.kept)  # the samples that survive cutoff_len, as check counts
    evaluation = eval_dataset_prepared(ctx)
    if evaluation is not None:
        held = evaluation.kept
    if not train:
        raise InputError(f"val_size leaves no {what} to train on")
    return StageData(train, held, prepared.report)


def eval_dataset_prepared(ctx: RecipeContext) -> Any:
    """``eval_dataset`` read and tokenised as the stage reads ``dataset`` (same template, cutoff,
    max_samples, mixing), or None without one (a :class:`cockpit.data.stage_data.StagePrepared`)."""
    if not ctx.cfg.eval_dataset:
        return None
    from cockpit.data.stage_data import prepare_stage_data

    return prepare_stage_data(ctx.cfg.replace(dataset=ctx.cfg.eval_dataset), ctx.tokenizer)


def evaluates_during_training(cfg: RunConfig) -> bool:
    """Does a non-SFT stage evaluate during training? When the config asks (an eval_strategy other than
    no, eval_steps, eval_on_start, load_best_model_at_end), as LLaMA-Factory does (HF's default
    strategy is no); its held-out rows are measured before and after training either way."""
    keys = ("eval_steps", "eval_on_start", "load_best_model_at_end")
    return cfg.eval_strategy not in (None, "no") or any(getattr(cfg, k) for k in keys)


def stage_arguments(config_cls: type, ctx: RecipeContext, data: StageData, **extra: Any) -> Any:
    """The worker's TrainingArguments (the one place the run config becomes HF arguments), as the
    TRL config class of the stage with the stage's own keys added. Evaluation during training
    (eval_strategy, eval_steps, eval_on_start, the best model) as SFT has it, on ``data.held_out``,
    when asked (:func:`evaluates_during_training`); none without held-out rows or with ``do_eval: false``."""
    from transformers import TrainingArguments

    base = training_arguments(ctx.cfg, ctx.dirs, ctx.use_cpu, ctx.world_size)
    kwargs = {
        f.name: getattr(base, f.name) for f in dataclasses.fields(TrainingArguments) if f.init and hasattr(base, f.name)
    }
    kwargs.pop("logging_dir", None)
    if not (data.held_out and evaluates(ctx.cfg.mapping()) and evaluates_during_training(ctx.cfg)):
        kwargs.update(eval_strategy="no", eval_steps=None, eval_on_start=False, load_best_model_at_end=False)
    if ctx.cfg.preprocessing_num_workers and any(f.name == "dataset_num_proc" for f in dataclasses.fields(config_cls)):
        # TRL tokenises in that many processes (datasets' fork pool), at most one per core
        kwargs["dataset_num_proc"] = min(int(ctx.cfg.preprocessing_num_workers), os.cpu_count() or 1)
    return config_cls(**{**kwargs, **extra})


def cockpit_trainer(trl_cls: type) -> type:
    """``trl_cls`` with Cockpit's atomic checkpoints (CockpitTrainer first in the MRO)."""
    from cockpit.train.trainer import CockpitTrainer

    return type(f"Cockpit{trl_cls.__name__}", (CockpitTrainer, trl_cls), {})


def stage_callback(ctx: RecipeContext, recipe: Recipe) -> Any:
    """CockpitCallback whose step / eval events carry the recipe's metrics."""
    from cockpit.train.callbacks import CockpitCallback

    class StageCallback(CockpitCallback):
        def on_log(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            logs: dict[str, float] | None = None,
            **kwargs: Any,
        ) -> TrainerControl:
            self.extra = recipe.step_metrics(logs or {})
            return super().on_log(args, state, control, logs=logs, **kwargs)

        def emit(self, kind: str, **fields: Any) -> None:
            extra = getattr(self, "extra", {})  # the recipe's metrics of the log being emitted
            if kind == "step":
                fields.update({k: v for k, v in extra.items() if not k.startswith("eval_")})
            elif kind == "eval":
                fields.update({k: v for k, v in extra.items() if k.startswith("eval_")})
            super().emit(kind, **fields)

    return StageCallback(ctx.run, ctx.cfg, ctx.rank, ctx.world_size, ctx.writer)


def _probes(ctx: RecipeContext, model: Any, phase: str) -> dict[str, Any] | None:
    """Rank 0: the probes' answers (``after`` training; before it, :class:`BeforeTraining` asks)."""
    from cockpit.train.probes import probes_of, run_probes

    cfg = ctx.cfg
    if not cfg.probes or ctx.rank != 0:
        return None
    probes = probes_of(cfg)
    ctx.log(f"probes {phase} training ({len(probes)})")
    result = run_probes(
        model, ctx.tokenizer, probes, cfg.probe_max_new_tokens, on_progress=probes_reporter(ctx.writer, phase)
    )
    ctx.writer.emit("probe_results", phase=phase, **result)
    return result


def before_training(recipe: Recipe, ctx: RecipeContext, data: StageData) -> Any:
    """A callback that measures the base at ``on_train_begin``, once the Trainer has placed the
    model on the training device (never on the host first while the other ranks wait): the probes'
    answers with the adapter off, on every rank as SFT's are (rank 0 reports them), and the
    recipe's held-out measure on rank 0. Its ``probes`` and ``held`` hold the results."""
    from transformers import TrainerCallback

    from cockpit.train.placement import ask_before
    from cockpit.train.probes import probes_of

    probes = probes_of(ctx.cfg) if ctx.cfg.probes and recipe.causal_lm else []

    class BeforeTraining(TrainerCallback):  # type: ignore[misc]  # TrainerCallback is Any here (follow_imports = skip)
        def __init__(self) -> None:
            self.probes: dict[str, Any] | None = None
            self.held: dict[str, Any] | None = None
            self._done = False

        def on_train_begin(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            model: Any = None,
            **kwargs: Any,
        ) -> None:
            if self._done or model is None:
                return
            self._done = True
            from cockpit.train.placement import earlier_before, stop_pending

            resumed = ctx.run if ctx.cfg.resume_from_checkpoint else None
            earlier = earlier_before(resumed, ctx.rank, "probe_results", probes) if probes else None
            if earlier is not None:  # a resume: the first attempt's answers stand
                ctx.log("probes before training: an earlier attempt's answers stand (not asked again)")
                if ctx.rank == 0 and earlier:
                    self.probes = earlier
                    ctx.writer.emit("probe_results", phase="before", reused=True, **earlier)
            elif probes:
                ctx.log(f"probes before training ({len(probes)})")
                reported = probes_reporter(ctx.writer if ctx.rank == 0 else None, "before")
                result = ask_before(
                    model,
                    ctx.tokenizer,
                    probes,
                    ctx.cfg.probe_max_new_tokens,
                    fsdp=False,
                    on_progress=reported,
                    should_stop=stop_pending(ctx.run, ctx.world_size),
                )
                if ctx.rank == 0:
                    self.probes = result
                    ctx.writer.emit("probe_results", phase="before", **result)
            held = (
                earlier_before(resumed, ctx.rank, "held_out")
                if data.held_out and evaluates(ctx.cfg.mapping())
                else None
            )
            if held is not None:
                if ctx.rank == 0 and held:
                    self.held = held
                    ctx.writer.emit("held_out", phase="before", stage=ctx.cfg.stage, reused=True, **held)
            else:
                self.held = _held_out(recipe, ctx, model, data, "before")

    return BeforeTraining()


def _held_out(recipe: Recipe, ctx: RecipeContext, model: Any, data: StageData, phase: str) -> dict[str, Any] | None:
    """Rank 0: the recipe's held-out measure (with progress events), logged and as a ``held_out`` event;
    none with ``do_eval: false``."""
    if ctx.rank != 0 or not data.held_out or not evaluates(ctx.cfg.mapping()):
        return None
    on_progress = reporter(ctx.writer, task="held_out", phase=phase, stage=ctx.cfg.stage)  # grpo: prompts, not pairs
    result = recipe.held_out(ctx, model, data, on_progress)
    if result is not None and ctx.writer is not None:
        ctx.log(
            f"held-out {phase}: " + ", ".join(f"{k} {v}" for k, v in result.items() if not isinstance(v, (list, dict)))
        )
        ctx.writer.emit("held_out", phase=phase, stage=ctx.cfg.stage, **result)
    return result


def start_stage(recipe: Recipe, ctx: RecipeContext, data: StageData) -> Attempt:
    """The stage's models and trainer, with Cockpit's callbacks and the base measured at the start."""
    model, ref_model = recipe.build_models(ctx)
    save_pissa_initial(ctx, model)
    callback = stage_callback(ctx, recipe)
    before = before_training(recipe, ctx, data)  # probes and held-out, on the training device
    from cockpit.train.stopping import early_stopping_callbacks
    from cockpit.train.trackers import tracker_callbacks

    stopping = early_stopping_callbacks(ctx.cfg, ctx.writer, ctx.log)  # early_stopping_steps
    tracking = tracker_callbacks(ctx.cfg, ctx.dirs["trackers"], ctx.run.run_id)  # use_swanlab / report_to swanlab
    trainer = recipe.build_trainer(ctx, model, ref_model, data, [callback, before, *stopping, *tracking])
    return Attempt(trainer, callback, before, [])


def cfg_stage(cfg: RunConfig) -> str:
    """The stage in words: ``dpo (pref_loss simpo)``."""
    return f"{cfg.stage} (pref_loss {cfg.pref_loss})" if cfg.stage == "dpo" else str(cfg.stage)


def trl_name(trainer: Any) -> str:
    """The TRL trainer under Cockpit's mixin (``CockpitDPOTrainer`` -> ``DPOTrainer``)."""
    return type(trainer).__name__.removeprefix("Cockpit")


def _rate(p: dict[str, Any] | None) -> dict[str, Any] | None:
    return {k: p[k] for k in ("passed", "total", "rate")} if p else None


def run_summary(ctx: RecipeContext, attempt: Attempt) -> dict[str, Any]:
    """summary.json's part every stage writes (rank 0), loss.png drawn on the way: one tokens/s
    definition (``outcome.throughput``: warm-up left out), the run's totals over its attempts."""
    from cockpit.data.probes import probe_summary
    from cockpit.train.outcome import eval_losses, throughput, utilisation

    cfg, dirs, callback, state = ctx.cfg, ctx.dirs, attempt.callback, attempt.trainer.state
    events = read_all(ctx.run.events_path)  # once, for loss.png and the summary's eval losses
    plotted = bool(cfg.plot_loss) and plot_loss(ctx.run.events_path, dirs["plot"], events)
    tokens_total = int(
        getattr(state, "num_input_tokens_seen", 0) or callback.tokens_total
    )  # the run's (restored on resume)
    speed = throughput(callback, attempt.train_runtime, tokens_total)
    summary = {
        "run_id": ctx.run.run_id,
        "state": "stopped" if callback.stop_reason is not None else "finished",
        "reason": callback.stop_reason,
        "steps": state.global_step,
        "total_steps": state.max_steps,
        "epochs": state.epoch,
        "runtime_s": round(wall_time_s(events, until=time.time()), 2),  # every attempt's
        "train_runtime_s": round(attempt.train_runtime, 2),
        "tokens_seen": tokens_total,
        **speed,
        **utilisation(callback, speed, attempt.train_runtime, tokens_total, state.global_step),
        "first_loss": callback.first_loss,
        "last_loss": callback.last_loss,
        "eval_loss": eval_losses(events),
        "eval_accuracy": eval_losses(events, "eval_accuracy"),
        "probes_before": probe_summary(getattr(attempt.probes_before, "result", None)),
        "probes_after": probe_summary(attempt.probe_after),
        "adapter_dir": str(dirs["adapter"]) if not attempt.poisoned or attempt.adapter_from else None,
        "adapter_from": attempt.adapter_from,
        "nan_step": callback.nan_step,
        "checkpoints_dir": str(dirs["checkpoints"]),
        "loss_plot": str(dirs["plot"]) if plotted else None,
    }
    from cockpit.train.stopping import early_stop_reason

    stopped_early = early_stop_reason(attempt.trainer)  # early_stopping_steps: a finished run, ended early
    if stopped_early and summary["reason"] is None:
        summary["reason"] = stopped_early
    if cfg.include_effective_tokens_per_second:  # LLaMA-Factory's train metric, as it names it
        summary["effective_tokens_per_sec"] = attempt.train_metrics.get("effective_tokens_per_sec")
    if attempt.poisoned:
        summary["reason"] = nan_reason(cfg, callback, attempt, state.global_step)
    if cfg.pissa_convert:  # after a NaN the adapter is a checkpoint's, as trained (PiSSA)
        summary["pissa_converted"] = not attempt.poisoned
    return summary


def nan_reason(cfg: RunConfig, callback: Any, attempt: Attempt, step: int) -> str:
    """summary.json's reason after a NaN: where, and which adapter the run keeps."""
    where = f"adapter = {attempt.adapter_from}" if attempt.adapter_from else "no adapter (no checkpoint before the NaN)"
    what = "stopped on NaN" if cfg.nan_policy == "stop" else "loss not finite since"
    return f"{callback.stop_reason or 'loss became nan'}: {what} at step {callback.nan_step or step}; {where}"


def wait_for_check(ctx: RecipeContext) -> None:
    """Train only once the command that started the run has checked its data
    (``cockpit.run.gate``: the check overlaps the ranks' start-up)."""
    from cockpit.run.gate import wait_released

    waited = wait_released(ctx.run)
    if waited >= 0.5:
        ctx.log(f"waited {waited:.1f} s for the data check of the command that started the run")


def adapter_fingerprint(ctx: RecipeContext, adapter: str | None) -> str | None:
    """Rank 0: the saved adapter's fingerprint for summary.json, and with an ``output_dir`` the
    folder's mark saying this run wrote it (``cockpit.store.output_mark``: readers compare them)."""
    if not adapter or not Path(adapter).is_dir():
        return None
    if ctx.cfg.output_dir:
        return output_mark.stamp(ctx.dirs["out"], ctx.run, Path(adapter))
    return output_mark.fingerprint(Path(adapter))


def end_run(ctx: RecipeContext, summary: dict[str, Any], callback: Any, steps: int) -> int:
    """Rank 0: summary.json and the run's final event. A NaN under ``nan_policy: stop`` fails it."""
    writer = ctx.writer
    summary = {**summary, "adapter_fingerprint": adapter_fingerprint(ctx, summary.get("adapter_dir"))}
    atomic_write_json(ctx.run.summary_path, summary)
    if callback.nan_seen and ctx.cfg.nan_policy == "stop":
        atomic_write_json(ctx.run.summary_path, {**summary, "state": "failed"})
        writer.emit("run_failed", reason=summary["reason"], rank=0)
        return EXIT_FAILED
    if callback.stop_reason is not None:
        writer.emit("run_stopped", reason=callback.stop_reason, step=steps)
    else:
        writer.emit(
            "run_finished",
            steps=steps,
            runtime_s=summary["runtime_s"],
            tokens_per_s=summary["tokens_per_s"],
            mfu=summary.get("mfu"),
            first_loss=callback.first_loss,
            last_loss=callback.last_loss,
            first_loss_step=callback.first_loss_step,
            last_loss_step=callback.last_loss_step,
        )
    return EXIT_OK


# -- the flow every stage shares: an attempt's training, its final model, the other ranks' end ---------------
@dataclasses.dataclass
class Attempt:
    """This attempt's trainer and what it measured."""

    trainer: Any
    callback: Any  # CockpitCallback
    probes_before: Any  # the before-training callback: SFT's ProbesBeforeTraining, else before_training's
    probes: list[dict[str, Any]]
    train_runtime: float = 0.0  # the run's, over its attempts
    poisoned: bool = False
    adapter_from: str | None = None  # after a NaN: the checkpoint the adapter was copied from
    probe_after: dict[str, Any] | None = None
    train_metrics: dict[str, Any] = field(default_factory=dict)  # HF's TrainOutput.metrics of this attempt


class PoisonedWeights(Exception):
    """Raised by a trainer (on every rank, agreed) when the weights updated at ``step`` cannot be
    used (a sampling stage's sampling met non-finite probabilities): the NaN rule ends the run, with
    the last checkpoint before that step as its model."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.step = step


def train(ctx: RecipeContext, attempt: Attempt) -> None:
    """From the resume point (if any) to the end; the run's first loss and training time count
    over its attempts (saved with each checkpoint: ``trainer.run_totals``)."""
    from cockpit.train.callbacks import scaler_skipped

    trainer, callback = attempt.trainer, attempt.callback
    resume, before = resume_point(ctx.cfg, ctx.dirs, ctx.writer, ctx.log)
    callback.first_loss = before.get("first_loss")  # the run's, not this attempt's
    callback.first_loss_step = before.get("first_loss_step")
    wait_for_check(ctx)
    if ctx.rank == 0 and ctx.cfg.output_dir:  # the folder is this run's now (cockpit.store.output_mark)
        output_mark.claim(ctx.dirs["out"], ctx.run)
    train_t0 = time.time()
    callback.update_skipped = lambda: scaler_skipped(trainer.optimizer)
    trainer.run_totals = lambda: {
        "first_loss": callback.first_loss,
        "first_loss_step": callback.first_loss_step,
        "train_time_s": round(before.get("train_time_s", 0.0) + time.time() - train_t0, 3),
        "tokens_seen": callback.tokens_total,
    }
    try:
        output = trainer.train(resume_from_checkpoint=resume or None)
    except PoisonedWeights as exc:  # every rank raises it (the trainer agrees first)
        output = None
        callback.weights_poisoned(trainer, exc.step, str(exc))
        if ctx.rank == 0:
            marked = mark_poisoned(ctx.dirs["checkpoints"], exc.step)
            ctx.log(f"{exc}; checkpoints holding those weights: {', '.join(marked) or 'none'}")
    attempt.train_runtime = before.get("train_time_s", 0.0) + time.time() - train_t0
    attempt.train_metrics = dict(getattr(output, "metrics", None) or {})
    if ctx.cfg.include_effective_tokens_per_second:
        from cockpit.train.stopping import effective_tokens_per_sec

        metrics = attempt.train_metrics
        metrics["effective_tokens_per_sec"] = effective_tokens_per_sec(
            trainer.train_dataset, trainer.state.epoch, metrics.get("train_runtime", 0.0), ctx.world_size
        )
        ctx.log(f"effective tokens/s: {metrics['effective_tokens_per_sec']} (include_effective_tokens_per_second)")


def save_final_model(ctx: RecipeContext, attempt: Attempt) -> None:
    """The final adapter / model, never from weights trained through a NaN: then the last good
    checkpoint's (or none). Sharded strategies save collectively."""
    trainer, callback, cfg = attempt.trainer, attempt.callback, ctx.cfg
    attempt.poisoned = callback.nan_seen or not trainer.loss_finite
    if attempt.poisoned:
        attempt.adapter_from = adapter_from_last_good(ctx.dirs, ctx.rank, ctx.log)
    elif ctx.rank == 0 or cfg.deepspeed or cfg.fsdp:
        trainer.save_model(str(ctx.dirs["adapter"]))
        if ctx.rank == 0:
            ctx.tokenizer.save_pretrained(str(ctx.dirs["adapter"]))
        if ctx.rank == 0 and cfg.pissa_convert:
            from cockpit.train.variants import convert_pissa_adapter

            model = trainer.accelerator.unwrap_model(trainer.model)
            convert_pissa_adapter(model, ctx.dirs["adapter"], pissa_initial_dir(ctx))
            ctx.log("pissa_convert: the adapter is a plain LoRA of the original base (rank 2 x lora_rank)")


def pissa_initial_dir(ctx: RecipeContext) -> Path:
    """``pissa_convert``'s initial adapter: ``pissa_init/`` beside ``adapter/``."""
    return ctx.dirs["out"] / "pissa_init"


def other_rank_done(ctx: RecipeContext, attempt: Attempt) -> int:
    """A rank other than 0 is done; local rank 0 of another node ends its node's run dir too."""
    node_rank = int(os.environ.get("GROUP_RANK", 0))
    if ctx.local_rank == 0 and node_rank > 0:
        state, callback = attempt.trainer.state, attempt.callback
        kind = "run_stopped" if callback.stop_reason is not None else "run_finished"
        EventWriter(ctx.run.events_path).emit(
            kind, steps=state.global_step, node_rank=node_rank, reason=callback.stop_reason
        )
    return EXIT_OK


def save_pissa_initial(ctx: RecipeContext, model: Any) -> None:
    """``pissa_convert``: the initial PiSSA adapter, before the first step (rank 0)."""
    if not ctx.cfg.pissa_convert or ctx.rank != 0:
        return
    from cockpit.train.variants import save_pissa_initial as save

    if save(model, pissa_initial_dir(ctx), resuming=bool(ctx.cfg.resume_from_checkpoint)):
        ctx.log(f"pissa_convert: the initial PiSSA adapter saved to {pissa_initial_dir(ctx)}")


def make_context(
    run: RunDir, cfg: RunConfig, rank: int, world_size: int, local_rank: int, writer: Any, t0: float
) -> RecipeContext:
    import torch

    from cockpit.models.resolve import config_model, load_tokenizer
    from cockpit.preflight.environment import output_dir_refusal
    from cockpit.train.arguments import rank_precision, trains_on_cpu
    from cockpit.train.kernels import kernel_arguments

    def log(msg: str) -> None:
        print(f"[rank{rank}] {msg}", flush=True)

    use_cpu = trains_on_cpu(cfg)
    cfg = rank_precision(cfg, use_cpu, writer, log)
    kernel_arguments(cfg, use_cpu)  # enable_liger_kernel / torch_compile: refused before loading anything
    if not use_cpu and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dirs = artefact_dirs(run, cfg)
    if reason := output_dir_refusal(cfg):  # the gate's refusal, asked again here
        raise InputError(Problem(reason, key="output_dir"))
    dirs["out"].mkdir(parents=True, exist_ok=True)
    ref = config_model(cfg, log=log)
    tok = load_tokenizer(cfg, ref, log=log)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return RecipeContext(run, cfg, rank, world_size, local_rank, writer, t0, use_cpu, dirs, ref, tok, log)
