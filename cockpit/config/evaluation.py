"""Evaluation and prediction rules of the run config (do_eval, eval_strategy, the best model, early
stopping, a prediction-only run) and where a run's evaluation and prediction data come from. Pure: no
torch. :func:`cockpit.config.parity.parity_problems` calls the rules."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cockpit.errors import Problem
from cockpit.shape import world_size_of


def eval_problems(raw: Mapping[str, Any], cfg: dict[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    if cfg.get("val_size") and cfg.get("eval_dataset"):
        return [
            Problem("val_size holds out a split and eval_dataset names other data; choose one", **where("eval_dataset"))
        ]
    if cfg.get("compute_accuracy") and cfg.get("stage", "sft") != "sft":
        return [
            Problem(
                f"token accuracy is measured in SFT's evaluation; stage {cfg.get('stage')} reports its own metrics",
                **where("compute_accuracy"),
            )
        ]
    if cfg.get("do_eval") is False and (cfg.get("val_size") or cfg.get("eval_dataset")):
        return _no_eval_problems(cfg, where)
    if cfg.get("val_size") or cfg.get("eval_dataset"):
        return _best_model_problems(cfg, where)
    why = "needs evaluation data: set val_size or eval_dataset"
    out = []
    for key in ("do_eval", "eval_on_start", "load_best_model_at_end", "compute_accuracy"):
        if cfg.get(key):
            out.append(Problem(f"{key} {why}", **where(key)))
    for key in (
        "eval_strategy",
        "eval_steps",
        "per_device_eval_batch_size",
        "metric_for_best_model",
        "greater_is_better",
    ):
        if (
            key in raw
            and cfg.get(key) not in (None, "no")
            and not (key == "per_device_eval_batch_size" and (cfg[key] == 1 or cfg.get("do_predict")))
        ):
            out.append(Problem(f"{key} {why}", **where(key)))
    return out


def early_stopping_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """``early_stopping_steps`` (LLaMA-Factory adds HF's ``EarlyStoppingCallback(early_stopping_patience=N)``):
    what that callback asserts at the start of training, refused here naming the key: an evaluation
    during training (evaluation data, do_eval not false, an eval_strategy other than no; the stages
    other than SFT evaluate during training only when an eval key asks) and a metric to watch
    (``metric_for_best_model``, which ``load_best_model_at_end`` defaults to loss)."""
    if cfg.get("early_stopping_steps") is None:
        return []
    if not (cfg.get("val_size") or cfg.get("eval_dataset")):
        why = "needs evaluation data to watch: set val_size or eval_dataset"
    elif cfg.get("do_eval") is False or cfg.get("eval_strategy") == "no":
        why = "stops on the evaluations during training, and this config has none (do_eval false / eval_strategy no)"
    elif cfg.get("stage", "sft") != "sft" and not (
        cfg.get("eval_strategy") or cfg.get("eval_steps") or cfg.get("load_best_model_at_end")
    ):
        why = (
            f"stage {cfg.get('stage')} evaluates during training only when asked: set eval_strategy (steps or "
            "epoch) or load_best_model_at_end: true"
        )
    elif not (cfg.get("metric_for_best_model") or cfg.get("load_best_model_at_end")):
        why = (
            "needs a metric to watch: set metric_for_best_model (e.g. loss) or load_best_model_at_end: true (which "
            "watches eval loss and ends with the best checkpoint); HF's EarlyStoppingCallback requires one"
        )
    else:
        return []
    return [Problem(why, **where("early_stopping_steps"))]


def predict_only_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """do_train: false is a prediction-only run: one rank, a LoRA adapter, data to predict on."""
    out = []
    if not cfg.get("do_predict"):
        out.append(
            Problem(
                "only a prediction run skips training: set do_predict: true and predict_with_generate: true, "
                "or do_train: true",
                **where("do_train"),
            )
        )
        return out
    if not cfg.get("adapter_name_or_path"):
        out.append(
            Problem(
                "a prediction-only run (do_train: false) predicts with a trained LoRA adapter: set "
                "adapter_name_or_path (a finished run's adapter/ folder)",
                **where("adapter_name_or_path"),
            )
        )
    elif cfg["finetuning_type"] != "lora":
        out.append(
            Problem(
                f"a prediction-only run loads adapter_name_or_path as a LoRA adapter: finetuning_type lora, got "
                f"{cfg['finetuning_type']}",
                **where("finetuning_type"),
            )
        )
    if not (cfg.get("eval_dataset") or cfg.get("dataset")):
        out.append(Problem("a prediction-only run needs data to predict on: set eval_dataset", **where("eval_dataset")))
    if world_size_of(cfg) > 1:
        out.append(
            Problem(
                "a prediction-only run generates in one process: nproc_per_node 1 and nnodes 1",
                **where("nproc_per_node"),
            )
        )
    return out


def predict_data_key(cfg: Mapping[str, Any]) -> str:
    """Where a run's prediction samples come from: ``eval_dataset``, ``val_size`` (the held-out
    split of ``dataset``) or, in a run that does not train, all of ``dataset``."""
    if cfg.get("eval_dataset"):
        return "eval_dataset"
    return "val_size" if cfg.get("val_size") else "dataset"


def eval_schedule(cfg: Mapping[str, Any]) -> tuple[str, int | None]:
    """(eval strategy, eval steps) of a run with evaluation data: steps every logging_steps unless set."""
    strategy = cfg.get("eval_strategy") or "steps"
    steps = (cfg.get("eval_steps") or max(int(cfg.get("logging_steps") or 1), 1)) if strategy == "steps" else None
    return strategy, steps


def evaluates(cfg: Mapping[str, Any]) -> bool:
    """Does the run evaluate (during training for SFT; held-out measures and a final evaluation for the
    other stages)? With evaluation data, unless ``do_eval: false``."""
    return bool(cfg.get("val_size") or cfg.get("eval_dataset")) and cfg.get("do_eval") is not False


def _no_eval_problems(cfg: dict[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """``do_eval: false`` with evaluation data: LLaMA-Factory holds the split out and evaluates nothing
    (eval_strategy unset). Here eval_strategy becomes no; the keys that ask for an evaluation contradict it
    (HF's TrainingArguments would turn do_eval back on for an eval_strategy other than no)."""
    out = [
        Problem(f"{key} asks for an evaluation and do_eval is false; choose one", **where(key))
        for key in ("eval_on_start", "eval_steps", "load_best_model_at_end", "compute_accuracy")
        if cfg.get(key)
    ]
    if cfg.get("eval_strategy") not in (None, "no"):
        out.append(
            Problem(
                f"eval_strategy {cfg['eval_strategy']} evaluates and do_eval is false (HF's TrainingArguments turns "
                "do_eval on for it); choose one",
                **where("eval_strategy"),
            )
        )
    cfg["eval_strategy"] = "no"
    return out


def _best_model_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    strategy, steps = eval_schedule(cfg)
    if cfg.get("eval_strategy") == "no" and (cfg.get("do_eval") or cfg.get("load_best_model_at_end")):
        return [Problem("evaluation is asked for but eval_strategy is no", **where("eval_strategy"))]
    if not cfg.get("load_best_model_at_end"):
        return []
    if cfg["save_strategy"] != strategy:
        return [
            Problem(
                f"load_best_model_at_end needs save_strategy = eval strategy ({strategy}), got {cfg['save_strategy']}",
                **where("load_best_model_at_end"),
            )
        ]
    if strategy == "steps" and steps and cfg["save_steps"] % steps:
        return [
            Problem(
                f"load_best_model_at_end needs save_steps ({cfg['save_steps']}) to be a multiple of eval_steps ({steps})",
                **where("save_steps"),
            )
        ]
    return []
