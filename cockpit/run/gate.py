"""A run that starts before its data check ends: the check and the ranks' start-up overlap.

``cockpit train`` checks the data with the tokenizer (every row rendered and counted) before a run
may train, and the ranks spend their first seconds importing torch and loading the model. The
command therefore starts the run *held* (``control/hold``, naming the process that holds it), runs
the tokenizer part of its check meanwhile, then releases the run, or, when the check fails,
kills it and removes its run dir, so that bad input still leaves no run behind.

The ranks wait just before ``trainer.train`` (``cockpit.train.recipes.base.wait_for_check``: model
loaded, data prepared) while the hold file is there. A holder that dies without deciding (a Ctrl-C, a crash)
must not leave the run waiting: the ranks then stop with that reason.

No torch, no textual: the CLI (``cockpit.commands.train``) and the training ranks import it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable

from cockpit.run.liveness import identity, is_alive, supervisor_alive
from cockpit.store.rundir import TERMINAL_STATES, RunDir, atomic_write_text

HOLD = "hold"


class NotReleased(RuntimeError):
    """A held run that may not train: cancelled (its check failed), or its holder is gone."""


def hold(run: RunDir) -> None:
    """Hold ``run`` for this process (before its supervisor starts)."""
    run.control_dir.mkdir(mode=0o700, exist_ok=True)
    pid, started = identity(os.getpid())
    atomic_write_text(run.control_dir / HOLD, json.dumps({"pid": pid, "start": started, "t": time.time()}) + "\n")


def release(run: RunDir) -> None:
    """Let the ranks train."""
    (run.control_dir / HOLD).unlink(missing_ok=True)


def holder(run: RunDir) -> dict | None:
    """The hold file's contents; None when the run is not held."""
    try:
        return json.loads((run.control_dir / HOLD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # being written: still held


def wait_released(run: RunDir, poll_s: float = 0.05, alive: Callable[[dict], bool] | None = None) -> float:
    """Block while ``run`` is held; the seconds waited. A kill request (the check failed: the
    supervisor is about to end the ranks) or a holder that is gone raises ``NotReleased``."""
    alive = alive or (lambda h: is_alive(h.get("pid"), h.get("start")) if h.get("pid") else True)
    t0 = time.monotonic()
    while (held := holder(run)) is not None:
        if run.pending("kill"):
            raise NotReleased("cancelled before training: its data check failed")
        if not alive(held):
            raise NotReleased(
                f"the command that started this run (pid {held.get('pid')}) exited before its data check finished"
            )
        time.sleep(poll_s)
    return time.monotonic() - t0


def cancel(run: RunDir, why: str, wait_s: float = 60.0) -> bool:
    """Kill a held run whose check failed and remove its run dir once its supervisor has ended;
    False (the dir left in place) when the supervisor does not end within ``wait_s``."""
    run.request("kill", why)
    deadline = time.monotonic() + wait_s
    while True:  # the final state, then the supervisor gone (it writes its last lines after the state)
        status = run.read_status()
        if status.get("state") in TERMINAL_STATES and not supervisor_alive(status):
            shutil.rmtree(run.path, ignore_errors=True)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
