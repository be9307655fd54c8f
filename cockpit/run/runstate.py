"""What state a run is in: pure decisions from ``status.json``, the attempt's events and liveness.

No I/O here (``cockpit/run/liveness.py`` gathers the facts and acts on the verdict), so every rule
is a unit test away and other states (a Slurm ``queued``, per-node facts) plug in here:

- :func:`attempt_outcome`: how the ranks said this attempt ended (``run_finished`` /
  ``run_stopped`` / ``run_failed`` events), or None;
- :func:`final_state`: the supervisor's end state from the launcher's exit code and those events
  (``killed`` when a kill request ended the ranks: a user's act, not a failure);
- :func:`decide`: what a reader does about a run whose status says it is active: keep it, adopt
  its still-running ranks with a new supervisor, or end it (finished / stopped / failed / lost).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cockpit.store.rundir import ACTIVE_STATES

# a launched run whose supervisor has not recorded itself yet is left alone this long
START_GRACE_S = 60.0


@dataclass(frozen=True)
class Outcome:
    state: str  # finished | stopped | failed
    reason: str | None
    step: int | None
    event: dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    action: str  # keep | adopt | end
    state: str | None = None
    reason: str | None = None
    step: int | None = None


FINAL_KINDS = ("run_finished", "run_stopped", "run_failed")  # the events attempt_outcome reads


def attempt_outcome(events: Iterable[dict[str, Any]]) -> Outcome | None:
    """The last final event of one attempt's events (a node's run_finished counts too)."""
    found: Outcome | None = None
    failed: Outcome | None = None
    for ev in events:
        kind = ev.get("kind")
        if kind == "run_finished":
            found = Outcome("finished", None, _int(ev.get("steps")), ev)
        elif kind == "run_stopped":
            found = Outcome("stopped", ev.get("reason"), _int(ev.get("step")), ev)
        elif kind == "run_failed":
            failed = Outcome("failed", ev.get("reason"), None, ev)
    return failed or found  # one rank's failure outranks another node's clean end


def final_state(
    code: int | None,
    *,
    killing: bool,
    kill_reason: str | None,
    outcome: Outcome | None,
    exit_text: str,
    kill_requested: bool = False,
) -> tuple[str, str | None]:
    """The end state the supervisor records. ``code``: the launcher's exit code (None when an
    adopting supervisor could not see it); ``exit_text``: how it exited, in words; ``killing``:
    the supervisor ended the ranks, ``kill_requested`` because someone asked (``control/kill``:
    ``killed``), else for its own reasons (SIGTERM, a full disk: ``failed``)."""
    if killing:
        return ("killed" if kill_requested else "failed"), kill_reason
    if outcome is not None and outcome.state == "failed":
        return "failed", outcome.reason
    if code not in (0, None):
        return "failed", f"training process {exit_text}"
    if outcome is None:
        if code is None:
            return (
                "failed",
                "the ranks exited without a final state (watched by an adopting supervisor: exit code unknown)",
            )
        return "failed", "the ranks exited without finishing (no run_finished event)"
    return outcome.state, outcome.reason


def decide(
    status: dict[str, Any], *, supervisor_alive: bool, ranks_alive: bool, outcome: Outcome | None, now: float
) -> Verdict:
    """What to do about a run, given whether its supervisor (pid + start time) and any of its
    rank processes are alive, and how the ranks said the current attempt ended."""
    state = status.get("state")
    if state not in ACTIVE_STATES or supervisor_alive:
        return Verdict("keep")
    pid = status.get("supervisor_pid")
    if not pid and now - max(float(status.get("updated") or 0), float(status.get("started") or 0)) < START_GRACE_S:
        return Verdict("keep")  # just launched: the supervisor records itself in a moment
    if ranks_alive:
        return Verdict("adopt")
    if outcome is not None:
        return Verdict("end", outcome.state, outcome.reason, outcome.step)
    step = status.get("step") or 0
    who = f"supervisor pid {pid}" if pid else "the supervisor"
    return Verdict("end", "lost", f"{who} exited without a final state; last step {step}")


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
