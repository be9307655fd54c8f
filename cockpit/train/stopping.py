"""LLaMA-Factory's ``early_stopping_steps`` (HF's ``EarlyStoppingCallback``, as LLaMA-Factory's tuner adds it)
and ``include_effective_tokens_per_second`` (its ``calculate_tps``): what a finished training reports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def early_stopping_callbacks(cfg: RunConfig, writer: Any, log: Callable[[str], None]) -> list[Any]:
    """``[EarlyStoppingCallback(early_stopping_patience=N)]`` (HF's, subclassed to say why it stopped:
    its ``stopped`` holds the words, logged and as an info ``alert`` event with code early_stopping),
    or none without ``early_stopping_steps``."""
    if cfg.early_stopping_steps is None:
        return []
    from transformers import EarlyStoppingCallback

    class SaysWhy(EarlyStoppingCallback):  # type: ignore[misc]  # EarlyStoppingCallback is Any here (follow_imports = skip)
        stopped: str | None = None

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float], **kwargs: Any) -> None:
            super().on_evaluate(args, state, control, metrics, **kwargs)
            if control.should_training_stop and self.stopped is None:
                metric = args.metric_for_best_model
                metric = metric if metric.startswith("eval_") else f"eval_{metric}"
                self.stopped = (
                    f"early stopping at step {state.global_step}: {metric} has not improved for "
                    f"{self.early_stopping_patience_counter} evaluation(s) (early_stopping_steps "
                    f"{self.early_stopping_patience}"
                    + (f"; best {state.best_metric:.6g}" if state.best_metric is not None else "")
                    + (f" at {Path(state.best_model_checkpoint).name}" if state.best_model_checkpoint else "")
                    + ")"
                )
                log(self.stopped)
                if writer is not None:
                    writer.emit("alert", level="info", code="early_stopping", message=self.stopped, remedies=[])

    return [SaysWhy(early_stopping_patience=int(cfg.early_stopping_steps))]


def early_stop_reason(trainer: Any) -> str | None:
    """The words of the early stop that ended this training, if one did."""
    stopped: str | None = next(
        (cb.stopped for cb in trainer.callback_handler.callbacks if getattr(cb, "stopped", None)), None
    )
    return stopped


def effective_tokens_per_sec(rows: Any, epoch: float, train_runtime: float, world_size: int) -> float | None:
    """LLaMA-Factory's ``calculate_tps`` for sft / pt: the training samples' tokens (``input_ids``, no
    padding) x the epochs trained / the train runtime, per rank."""
    if not train_runtime:
        return None
    tokens = sum(len(rows[i]["input_ids"]) for i in range(len(rows)))
    return round(tokens * float(epoch or 0.0) / train_runtime / max(world_size, 1), 3)
