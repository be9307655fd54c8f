"""The experiment trackers of a rank: HF Trainer's own integration callbacks (``report_to``) and
SwanLab's own transformers callback (as LLaMA-Factory adds it for ``use_swanlab``), each writing under
``RUN_DIR/trackers`` so ``cockpit rm`` removes them with the run:

    trackers/tensorboard/     TensorBoard event files (TENSORBOARD_LOGGING_DIR)
    trackers/wandb/           W&B's offline run (WANDB_DIR; WANDB_MODE offline)
    trackers/mlflow.db        MLflow's SQLite tracking store (MLFLOW_TRACKING_URI)
    trackers/trackio/         Trackio's project databases (TRACKIO_DIR)
    trackers/swanlog/         SwanLab's run files (offline mode), or swanlab_logdir

A variable the user set (``env:`` in the config, or the launching shell) wins over these defaults:
``WANDB_MODE: online`` in ``env:`` syncs to W&B, ``MLFLOW_TRACKING_URI`` names a server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.config.trackers import trackers

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def tracker_environment(cfg: RunConfig, trackers_dir: Path) -> dict[str, str]:
    """The variables the trackers of ``cfg`` read, with their defaults under ``trackers_dir``."""
    names = trackers(cfg.report_to, cfg.use_swanlab)
    defaults = {
        "tensorboard": {"TENSORBOARD_LOGGING_DIR": str(trackers_dir / "tensorboard")},
        "wandb": {"WANDB_MODE": "offline", "WANDB_DIR": str(trackers_dir)},
        "mlflow": {"MLFLOW_TRACKING_URI": f"sqlite:///{trackers_dir / 'mlflow.db'}"},
        "trackio": {"TRACKIO_DIR": str(trackers_dir / "trackio")},
    }
    out: dict[str, str] = {}
    for name in names:
        out.update(defaults.get(name, {}))
    return out


def report_to(cfg: RunConfig, trackers_dir: Path) -> list[str]:
    """TrainingArguments' ``report_to``, with the trackers' variables set in this process (the user's own
    kept) before their callbacks read them; swanlab goes through :func:`tracker_callbacks` instead."""
    names = trackers(cfg.report_to, cfg.use_swanlab)
    if names:
        trackers_dir.mkdir(parents=True, exist_ok=True)
    for key, value in tracker_environment(cfg, trackers_dir).items():
        os.environ.setdefault(key, value)
    return [n for n in names if n != "swanlab"]


def tracker_callbacks(cfg: RunConfig, trackers_dir: Path, run_name: str) -> list[Any]:
    """SwanLab's own transformers callback with LLaMA-Factory's ``swanlab_*`` keys (its mode: swanlab_mode,
    else SWANLAB_MODE, else offline); none when SwanLab is off. Its API key: env SWANLAB_API_KEY."""
    if "swanlab" not in trackers(cfg.report_to, cfg.use_swanlab):
        return []
    from swanlab.integration.transformers import SwanLabCallback

    logdir = cfg.swanlab_logdir or str(trackers_dir / "swanlog")
    return [
        SwanLabCallback(
            project=cfg.swanlab_project,
            workspace=cfg.swanlab_workspace,
            experiment_name=cfg.swanlab_run_name or run_name,
            mode=cfg.swanlab_mode or os.environ.get("SWANLAB_MODE") or "offline",
            log_dir=logdir,
            tags=["cockpit"],
        )
    ]
