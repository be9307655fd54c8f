"""Experiment trackers (``report_to``, LLaMA-Factory's ``use_swanlab`` / ``swanlab_*``, HF's ``project``):
which ones a config turns on, the rules between their keys, and ``swanlab_api_key`` moved into ``env``
(``SWANLAB_API_KEY``) so the run dir never holds it (:mod:`cockpit.redact`). Pure: no tracker is imported
here; the ranks set them up in :mod:`cockpit.train.trackers`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cockpit.errors import Problem
from cockpit.redact import REDACTED
from cockpit.side_site import TRACKER_MODULES, folder, trackers

__all__ = ["SWANLAB_KEYS", "TRACKER_MODULES", "tracker_problems", "trackers"]

SWANLAB_KEYS = ("swanlab_project", "swanlab_workspace", "swanlab_run_name", "swanlab_mode", "swanlab_logdir")


def tracker_problems(
    cfg: dict[str, Any], where: Callable[[str], dict[str, Any]], installed: Callable[[str], bool]
) -> list[Problem]:
    """Each tracker installed (``installed``: on sys.path or in ``<venv>/trackers-site``, whose folder the
    ranks then get); a tracker's own keys set only when it is on (they would change nothing);
    ``swanlab_api_key`` moved into ``env`` as ``SWANLAB_API_KEY``."""
    on = trackers(cfg.get("report_to"), cfg.get("use_swanlab"))
    out = [
        Problem(
            f"{name} is not installed here (neither on sys.path nor in {folder(site='trackers')}): "
            f"pip install 'cockpit-tune[trackers]' (or pip install {name}), or bash scripts/bootstrap.sh",
            **where("report_to" if name in str(cfg["report_to"]).split(",") else "use_swanlab"),
        )
        for name in on
        if not installed(TRACKER_MODULES[name])
    ]
    if "trackio" not in on and cfg.get("project") != "huggingface":
        out.append(
            Problem(
                "project names the Trackio project, and report_to has no trackio: add it, or remove project "
                "(wandb: set WANDB_PROJECT in env:; mlflow: MLFLOW_EXPERIMENT_NAME)",
                **where("project"),
            )
        )
    defaults = {"swanlab_project": "llamafactory"}
    for key in (*SWANLAB_KEYS, "swanlab_api_key"):
        if "swanlab" not in on and cfg.get(key) not in (None, defaults.get(key)):
            out.append(
                Problem(f"{key} applies to SwanLab: add swanlab to report_to (or use_swanlab: true)", **where(key))
            )
    out += _move_api_key(cfg, where)
    return out


def _move_api_key(cfg: dict[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """``swanlab_api_key: K`` -> ``env: {SWANLAB_API_KEY: K}`` (the name swanlab's login reads), so the
    run dir's config.yaml and launch.json show it redacted and the ranks get it from their environment."""
    key = cfg.get("swanlab_api_key")
    if key is None:
        return []
    env = dict(cfg.get("env") or {})
    if env.get("SWANLAB_API_KEY") not in (None, key, REDACTED):
        return [Problem("env: SWANLAB_API_KEY is set too, to another value; keep one", **where("swanlab_api_key"))]
    env["SWANLAB_API_KEY"] = key
    cfg["env"], cfg["swanlab_api_key"] = env, None
    return []
