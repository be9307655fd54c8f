"""Trials that cannot differ, and trials that tie (issue 62 item 7).

A sweep's trials differ only through the updates their runs make before the objective is measured.
With ``max_steps: 2`` and ``warmup_ratio: 0.1`` the only update before the last ``loss`` is the first,
taken at learning rate 0 (HF's linear warm-up starts at 0), so every trial's loss is the same and the
"best" is a tie. :func:`flat_reason` says so at the sweep's check, before any trial runs;
:func:`tied_with` finds, in a study's results, the completed trials whose objective equals the best's.
Pure: no torch, no Optuna.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# HF's schedules that ramp linearly from 0 over the warm-up (transformers.optimization); the others
# (constant, reduce_lr_on_plateau, inverse_sqrt, ...) take no update at 0
WARMS_FROM_ZERO = frozenset(
    {
        "linear",
        "cosine",
        "cosine_with_restarts",
        "polynomial",
        "constant_with_warmup",
        "cosine_with_min_lr",
        "cosine_warmup_with_min_lr",
        "warmup_stable_decay",
    }
)
SMALL_LR = 0.1  # a warm-up that never lets the rate above this share of learning_rate swallows it
TIE_REL = 1e-6  # objectives equal to this relative tolerance tie (six significant digits)


def warmup_updates(cfg: Mapping[str, Any], total: int) -> int:
    """The run's warm-up in optimizer steps, as HF's ``TrainingArguments.get_warmup_steps`` counts it
    from what ``cockpit.train.arguments`` hands it (``warmup_steps`` when > 0, else ``warmup_ratio``)."""
    if str(cfg.get("lr_scheduler_type") or "cosine") not in WARMS_FROM_ZERO:
        return 0
    steps = int(cfg.get("warmup_steps") or 0)
    if steps > 0:
        return steps
    ratio = float(cfg.get("warmup_ratio") or 0.0)
    return int(ratio) if ratio >= 1 else math.ceil(total * ratio)


def last_measured(objective: str, total: int) -> tuple[int, int]:
    """(the step of the objective's last value in a run of ``total`` steps, the updates that value
    sees). The run's last value is its last step's: HF evaluates at the last step whatever
    ``eval_steps`` says, and Cockpit logs the last step's loss whatever ``logging_steps`` says. A
    training loss (a step event's field) is computed before its step's update; an evaluation
    (``eval_*``) after it; a ``kind.field`` (probes, held-out measures) after training."""
    if "." in objective or objective.startswith("eval_"):
        return total, total
    return total, total - 1


def flat_reason(objective: str, cfg: Mapping[str, Any]) -> str | None:
    """Why no trial of this config can move ``objective`` (no update before its last value, or every
    such update inside the warm-up, at a rate near 0), or None. Needs ``max_steps`` (an epoch-based
    run's length depends on the data: not judged)."""
    total = int(cfg.get("max_steps") or -1)
    if total <= 0:
        return None
    step, updates = last_measured(objective, total)
    if updates <= 0:
        return f"{objective} is last measured at step {step}, before any update"
    warm = warmup_updates(cfg, total)
    if updates > warm:
        return None
    top = (updates - 1) / max(warm, 1)  # HF's warm-up: update u at (u - 1) / warm of learning_rate
    if top >= SMALL_LR:
        return None
    seen = "the only update" if updates == 1 else f"all {updates} updates"
    rate = "at learning rate 0" if top == 0 else f"at most {top:.0%} of learning_rate"
    return (
        f"{seen} before {objective}'s last value (step {step} of {total}) "
        f"{'is' if updates == 1 else 'are'} in the warm-up of {warm} steps, {rate}"
    )


def flat_warning(objective: str, corners: Sequence[tuple[dict[str, Any], Mapping[str, Any]]]) -> str | None:
    """The check's warning when the space's corner configs (params, flat config mapping) cannot move
    the objective: every trial (all corners), or the trials with the values named."""
    flat = [(params, why) for params, cfg in corners if (why := flat_reason(objective, cfg))]
    if not flat:
        return None
    keys = ", ".join(dict.fromkeys(k for params, _ in corners for k in params))
    params, why = flat[0]
    if len(flat) == len(corners):
        who = "in every trial"
    else:
        who = "with " + ", ".join(f"{k}={v!r}" for k, v in params.items())
    return (
        f"{who}, {why}: the swept values ({keys}) cannot change {objective} (only what they do to the data "
        f"could), so trials will tie; raise max_steps or shorten the warm-up (warmup_steps / warmup_ratio)"
    )


def tied_with(best: Any, done: Sequence[Any]) -> list[int]:
    """The numbers of the completed trials (``done``, Optuna's FrozenTrials) other than ``best`` whose
    objective equals the best's (to :data:`TIE_REL`)."""
    if best is None or best.value is None:
        return []
    return [
        t.number
        for t in done
        if t.number != best.number and t.value is not None and math.isclose(t.value, best.value, rel_tol=TIE_REL)
    ]


def tie_note(objective: str, tied: Sequence[int], completed: int) -> str | None:
    """What ``status``, ``best`` and the Sweep screen say of a best trial tied with ``tied``
    (``completed``: the completed trials, the best included), or None without a tie."""
    if not tied:
        return None
    if len(tied) + 1 >= completed:
        return (
            f"a tie: every completed trial has the same {objective} (to 6 digits), so the swept values made no "
            "difference; the lowest-numbered trial is shown (see docs/sweeps.md, trials that tie)"
        )
    others = ", ".join(str(n) for n in tied)
    return (
        f"a tie: trial{'s' if len(tied) > 1 else ''} {others} {'have' if len(tied) > 1 else 'has'} the same "
        f"{objective} (to 6 digits); the lowest-numbered is shown"
    )
