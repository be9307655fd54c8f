"""Progress events of work outside training steps (rank 0's writer; silent on the other ranks).

:func:`reporter` makes the ``on_progress(done, total)`` callback the probes, the held-out scoring
and ``do_predict``'s generation call: an event when the work begins (done 0), when it ends
(done == total) and at most every ``every_s`` seconds between (see ``cockpit/store/events.py``:
``progress``, ``predict_progress``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

PROGRESS_EVERY_S = 2.0

OnProgress = Callable[..., None]  # (done, total, **extra fields of the event)


def reporter(writer: Any, kind: str = "progress", every_s: float = PROGRESS_EVERY_S, **fields: Any) -> OnProgress:
    """``fields``: the event's fixed fields (task, phase). ``writer`` None: a callback that does nothing."""
    last = [float("-inf")]

    def report(done: int, total: int, **extra: Any) -> None:
        if writer is None:
            return
        now = time.monotonic()
        if (done in (0, total) and not extra) or now - last[0] >= every_s:
            last[0] = now
            writer.emit(kind, **fields, done=done, total=total, **extra)

    return report


def probes_reporter(writer: Any, phase: str) -> OnProgress:
    """The probes' progress: an event per batch of answers (a few per phase, none dropped)."""
    return reporter(writer, task="probes", phase=phase, every_s=0.0)


def silent(done: int, total: int, **extra: Any) -> None:
    """The callback of a caller that reports nothing."""
