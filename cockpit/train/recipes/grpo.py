"""``stage: grpo``: online reinforcement learning with verifiable rewards, by TRL's GRPOTrainer.

Each step samples ``num_generations`` completions per prompt (HF ``generate``; vLLM with ``use_vllm``),
scores them with the reward functions (:mod:`cockpit.data.rewards`: built-ins and the user's
``file.py:function``, weighted by ``reward_weights``), and moves the policy toward the completions
that beat their group's mean. The reference (``beta`` > 0 only): the base with the LoRA adapter
disabled, or for full / freeze training a frozen copy of the base, which TRL builds itself.

Events: each ``step`` carries the reward (total and per function, mean and spread), KL, clip ratio,
completion lengths and entropy (:data:`GRPO_FIELDS`); a ``completions`` event per logging step holds a
few of the latest sampled prompts, completions and their rewards (truncated). Held out: the mean
reward of greedy completions on the held-out prompts, before and after training.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from cockpit.train.model import build_model
from cockpit.train.progress import OnProgress, silent
from cockpit.train.recipes.base import (
    PoisonedWeights,
    Recipe,
    RecipeContext,
    StageData,
    cockpit_trainer,
    held_out_stage_data,
    stage_arguments,
)
from cockpit.train.variants import trainer_kwargs

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

# TRL GRPOTrainer log key -> step event field (docs: cockpit/store/events.py)
GRPO_FIELDS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "reward_zero_std_frac",
    "kl": "kl",
    "entropy": "entropy",
    "clip_ratio/region_mean": "clip_ratio",
    "clip_ratio/low_mean": "clip_ratio_low",
    "clip_ratio/high_mean": "clip_ratio_high",
    "completions/mean_length": "completion_len_mean",
    "completions/min_length": "completion_len_min",
    "completions/max_length": "completion_len_max",
    "completions/clipped_ratio": "completion_truncated",
}
NON_FINITE_SAMPLING = "probability tensor contains either"  # torch.multinomial's error on nan / inf
_UNSET = object()
_PER_FUNC = re.compile(r"^(eval_)?rewards/(.+)/(mean|std)$")
SAMPLES_PER_LOG = 4  # completions shown per logging step
PROMPT_CHARS, COMPLETION_CHARS = 300, 600


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content", ""))
    return str(prompt)


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL's rows: the conversational prompt and the row's other columns (the reward functions' kwargs)."""
    return [{**r.get("columns", {}), "prompt": r["prompt"]} for r in rows]


def _dataset(rows: list[dict[str, Any]]) -> Any:
    from datasets import Dataset

    return Dataset.from_list(_rows(rows))


def sampled_completions(
    logs: Any, n: int = SAMPLES_PER_LOG, weights: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """The last ``n`` (prompt, completion, rewards) of TRL's bounded ``_logs`` (the latest generation round).
    ``reward``: the weighted total as TRL computes it (``weights``: function name -> weight, 1.0 when absent;
    a function's None reward left out, as TRL's nansum does)."""
    prompts, completions = list(logs.get("prompt", [])), list(logs.get("completion", []))
    rewards = {name: list(values) for name, values in logs.get("rewards", {}).items()}
    advantages = list(logs.get("advantages", []))
    from cockpit.data.rewards import completion_text

    out = []
    for i in range(max(0, len(completions) - n), len(completions)):
        per = {k: _round(v[i]) for k, v in rewards.items() if i < len(v)}
        scored = [(weights or {}).get(k, 1.0) * v for k, v in per.items() if v is not None]
        out.append(
            {
                "prompt": _cut(_prompt_text(prompts[i]) if i < len(prompts) else "", PROMPT_CHARS),
                "completion": _cut(completion_text(completions[i]), COMPLETION_CHARS),
                "reward": round(sum(scored), 4) if scored else None,
                "rewards": per,
                "advantage": _round(advantages[i]) if i < len(advantages) else None,
            }
        )
    return out


def trainer_reward_weights(trainer: Any) -> dict[str, float] | None:
    """Reward function name -> weight, as the trainer applies them (``reward_func_names``, ``reward_weights``)."""
    names = list(getattr(trainer, "reward_func_names", None) or [])
    weights = getattr(trainer, "reward_weights", None)
    if not names or weights is None:
        return None
    values = weights.tolist() if hasattr(weights, "tolist") else list(weights)
    return {name: float(w) for name, w in zip(names, values)}


def _round(value: Any) -> Any:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if f != f else round(f, 4)


class GRPORecipe(Recipe):
    stage = "grpo"
    step_fields: ClassVar[dict[str, str]] = GRPO_FIELDS

    def build_data(self, ctx: RecipeContext) -> StageData:
        return held_out_stage_data(ctx, "prompt")

    def build_models(self, ctx: RecipeContext) -> tuple[Any, Any]:
        return build_model(ctx.cfg, ctx.model_ref, ctx.use_cpu, ctx.local_rank), None

    def grpo_keys(self, ctx: RecipeContext) -> dict[str, Any]:
        """GRPOConfig's stage keys from the run config (TRL's names)."""
        from cockpit.config.grpo import reward_weights

        cfg = ctx.cfg
        return {
            "num_generations": cfg.num_generations,
            "max_completion_length": cfg.max_completion_length,
            "steps_per_generation": cfg.steps_per_generation,
            "num_iterations": cfg.num_iterations,
            "beta": cfg.beta,
            "epsilon": cfg.epsilon,
            "epsilon_high": cfg.epsilon_high,
            "loss_type": cfg.loss_type,
            "scale_rewards": cfg.scale_rewards,
            "mask_truncated_completions": cfg.mask_truncated_completions,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": cfg.top_k,
            "repetition_penalty": cfg.repetition_penalty,
            "use_vllm": cfg.use_vllm,
            "vllm_mode": cfg.vllm_mode,
            "reward_weights": reward_weights(cfg.mapping()),
            "remove_unused_columns": False,  # the rows' other columns are the reward functions' kwargs
            "disable_dropout": True,
            "log_completions": False,  # Cockpit's own completions event instead of rich / wandb
        }

    def build_trainer(
        self, ctx: RecipeContext, model: Any, ref_model: Any, data: StageData, callbacks: list[Any]
    ) -> Any:
        from trl import GRPOConfig

        from cockpit.data.rewards import build_reward_funcs

        args = stage_arguments(GRPOConfig, ctx, data, **self.grpo_keys(ctx))
        samples = completions_callback(ctx)
        trainer = cockpit_grpo_trainer()(
            model=model,
            reward_funcs=build_reward_funcs(ctx.cfg),
            args=args,
            train_dataset=_dataset(data.train),
            processing_class=ctx.tokenizer,
            callbacks=[*callbacks, samples],
            **trainer_kwargs(ctx.cfg, model, args),  # loraplus_lr_ratio / BAdam: the optimizer
        )
        samples.trainer = trainer
        return trainer

    def step_metrics(self, logs: dict[str, Any]) -> dict[str, Any]:
        out = super().step_metrics(logs)
        per: dict[str, dict[str, Any]] = {}
        per_eval: dict[str, dict[str, Any]] = {}
        for key, value in logs.items():
            m = _PER_FUNC.match(key)
            if m:
                (per_eval if m.group(1) else per).setdefault(m.group(2), {})[m.group(3)] = _round(value)
        if per:
            out["rewards"] = per
        if per_eval:
            out["eval_rewards"] = per_eval
        return out

    def held_out(
        self, ctx: RecipeContext, model: Any, data: StageData, on_progress: OnProgress = silent
    ) -> dict[str, Any] | None:
        return held_out_reward(ctx, model, data.held_out, on_progress)

    def summary(self, ctx: RecipeContext, trainer: Any, data: StageData) -> dict[str, Any]:
        from cockpit.config.grpo import reward_names, reward_weights

        cfg = ctx.cfg
        return {
            "reward_funcs": reward_names(cfg.reward_funcs),
            "reward_weights": reward_weights(cfg.mapping()),
            "num_generations": cfg.num_generations,
            "max_completion_length": cfg.max_completion_length,
            "beta": cfg.beta,
            "loss_type": cfg.loss_type,
            "prompts": len(data.train),
        }


def cockpit_grpo_trainer() -> type:
    """TRL's GRPOTrainer with Cockpit's atomic checkpoints; its loss its own (no labelled-logits
    shortcut: its batches have no labels), and no evaluation: the held-out measure is the recipe's
    (greedy completions' mean reward), so evaluate() has nothing to add."""
    from trl import GRPOTrainer

    class CockpitGRPOTrainer(cockpit_trainer(GRPOTrainer)):  # type: ignore[misc]
        _labelled_logits = False
        _flag_group: Any = _UNSET  # the stop flags' host group (callbacks.control_group), made at first use

        def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
            return {} if self.eval_dataset is None else super().evaluate(*args, **kwargs)

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            """TRL's sampling; when it meets non-finite probabilities on any rank (the last update
            poisoned the weights: the advantage-weighted loss, near 0 by construction, never shows
            it), every rank raises :class:`PoisonedWeights` for that update. Sampling runs in the
            training's mixed precision (``generation_autocast``: a half base with fp32 trainable copies)."""
            from cockpit.train.generation import generation_autocast

            failure = None
            try:
                with generation_autocast(self.model):
                    out = super()._generate_single_turn(*args, **kwargs)
            except RuntimeError as exc:
                if NON_FINITE_SAMPLING not in str(exc):
                    raise
                failure, out = exc, None
            if self._failed_anywhere(failure is not None):
                step = self.state.global_step
                raise PoisonedWeights(
                    step,
                    f"sampling after step {step} met non-finite probabilities: the update of step {step} made the weights nan/inf",
                ) from failure
            return out

        def _failed_anywhere(self, failed: bool) -> bool:
            from cockpit.train.callbacks import agreed_flags, control_group, distributed

            dist = distributed()
            if dist is None or dist.get_world_size() == 1:
                return failed
            if self._flag_group is _UNSET:
                self._flag_group = control_group(dist)  # every rank samples here, in step
            return agreed_flags(dist, [failed], self._flag_group)[0]

    return CockpitGRPOTrainer


def completions_callback(ctx: RecipeContext) -> Any:
    """A ``completions`` event at each logging step (rank 0): the latest sampled completions; and the
    reward-hacking watch's alerts (:mod:`cockpit.train.reward_watch`), after the step's event."""
    from transformers import TrainerCallback

    from cockpit.train.reward_watch import RewardWatch

    class CompletionsSample(TrainerCallback):  # type: ignore[misc]  # TrainerCallback is Any here (follow_imports = skip)
        trainer: Any = None
        watch = RewardWatch(ctx.cfg)

        def on_log(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            logs: dict[str, float] | None = None,
            **kwargs: Any,
        ) -> None:
            if ctx.writer is None or self.trainer is None or not logs or "loss" not in logs:
                return
            for alert in self.watch.observe(state.global_step, GRPORecipe().step_metrics(logs)):
                ctx.writer.emit("alert", step=state.global_step, **alert)
            samples = sampled_completions(
                getattr(self.trainer, "_logs", {}), weights=trainer_reward_weights(self.trainer)
            )
            if samples:
                ctx.writer.emit("completions", step=state.global_step, samples=samples)

    return CompletionsSample()


HELD_OUT_BATCH = 16
HELD_OUT_SAMPLES = 3  # completions kept in the held_out event


def held_out_reward(
    ctx: RecipeContext, model: Any, rows: list[dict[str, Any]], on_progress: OnProgress = silent
) -> dict[str, Any] | None:
    """Greedy completions of the held-out prompts (max_completion_length tokens), scored by the run's
    reward functions: the weighted total's mean and each function's mean."""
    if not rows:
        return None
    from cockpit.config.grpo import reward_weights
    from cockpit.data.rewards import build_reward_funcs, total_rewards
    from cockpit.data.stage_data import _ids
    from cockpit.train.generation import generate_new_tokens

    cfg, tok = ctx.cfg, ctx.tokenizer
    funcs = build_reward_funcs(cfg)
    weights = reward_weights(cfg.mapping())
    totals: list[float] = []
    per: dict[str, list[float]] = {}
    shown: list[dict[str, Any]] = []
    on_progress(0, len(rows))
    for start in range(0, len(rows), HELD_OUT_BATCH):
        batch = rows[start : start + HELD_OUT_BATCH]
        new = generate_new_tokens(
            model,
            tok,
            [_ids(tok, r["prompt"], True) for r in batch],
            max_new_tokens=cfg.max_completion_length,
            do_sample=False,
        )
        texts = [tok.decode(ids, skip_special_tokens=True) for ids in new]
        trl_rows = _rows(batch)
        columns = {k: [r.get(k) for r in trl_rows] for k in trl_rows[0] if k != "prompt"}
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        scored = total_rewards(funcs, weights, [r["prompt"] for r in batch], completions, **columns)
        totals += scored["total"]
        for name, values in scored["per_func"].items():
            per.setdefault(name, []).extend(v for v in values if v is not None)
        for i in range(min(len(batch), HELD_OUT_SAMPLES - len(shown))):
            shown.append(
                {
                    "prompt": _cut(_prompt_text(batch[i]["prompt"]), PROMPT_CHARS),
                    "completion": _cut(texts[i], COMPLETION_CHARS),
                    "reward": round(scored["total"][i], 4),
                }
            )
        on_progress(min(start + HELD_OUT_BATCH, len(rows)), len(rows))
    return {
        "prompts": len(totals),
        "mean_reward": round(sum(totals) / len(totals), 4),
        "rewards": {name: round(sum(v) / len(v), 4) if v else None for name, v in per.items()},
        "samples": shown,
    }
