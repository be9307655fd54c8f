"""How many optimizer steps a run makes, and the note when ``logging_steps`` leaves nothing between
the first and the last step to log. Pure (no torch): validation (``max_steps``), ``cockpit check``
(the epochs over the data it counted) and the ranks (``train_begin``'s planned epochs) share it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def steps_per_epoch(batches: int | None, accumulation: int) -> int | None:
    """Optimizer steps in one pass over the data (the HF Trainer's rule: micro-batches per rank /
    accumulation, rounded up, at least 1); None when the data has no length."""
    if not batches:
        return None
    return max(-(-int(batches) // max(int(accumulation), 1)), 1)


def planned_steps(cfg: Mapping[str, Any], samples: int, world_size: int) -> int:
    """``max_steps`` when set, else epochs x steps per epoch over ``samples`` rows split over the ranks."""
    if int(cfg.get("max_steps") or -1) > 0:
        return int(cfg["max_steps"])
    per_rank = -(-int(samples) // max(int(world_size), 1))
    batches = -(-per_rank // max(int(cfg.get("per_device_train_batch_size") or 1), 1))
    per_epoch = steps_per_epoch(batches, int(cfg.get("gradient_accumulation_steps") or 1)) or 1
    return math.ceil(float(cfg.get("num_train_epochs") or 1.0) * per_epoch)


def logging_note(cfg: Mapping[str, Any], total_steps: int | None = None) -> str | None:
    """A note when ``logging_steps`` exceeds the run's steps (``total_steps``, else ``max_steps``):
    only the first and the last step are logged, no loss curve between."""
    total = total_steps if total_steps is not None else int(cfg.get("max_steps") or -1)
    every = int(cfg.get("logging_steps") or 1)
    if total <= 0 or every <= total:
        return None
    return (
        f"logging_steps {every} > the run's {total} steps: only the first and the last step are logged "
        f"(no loss curve between); set logging_steps to {max(1, total // 10)} or so"
    )
