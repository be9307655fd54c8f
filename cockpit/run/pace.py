"""How far a run is and how long it has left, folded from its events (pure: no I/O, no torch).

Shared by the terminal follower (``cockpit attach`` / ``cockpit train``) and the cockpit's Live
header (``cockpit.ui.state.RunState``), so both say the same ETA:

- the step rate counts only steps actually trained: from the moment stepping began (after
  ``train_begin`` *and* after whatever ran before the first step: the probes before training,
  DPO's held-out scoring, each reported by ``progress`` events) to the last ``step`` event;
- the wrap-up after the last step (probes after training, held-out scoring after) is allowed for
  with the time the same work took before training (the "before" phase's duration), then, once it
  runs, from its own ``progress`` events;
- ``activity``: what the ranks are doing outside training steps ("asking probes before
  training 8/20", "loading the model", "first step running 12 s"), while they do it; "stopping: ..."
  once a stop was asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cockpit.store.events import as_float

TASK_WORDS = {"probes": "asking probes", "held_out": "scoring held-out pairs"}
STAGE_TASK_WORDS = {("held_out", "grpo"): "scoring held-out prompts' rewards"}  # grpo scores prompts, not pairs


def activity_words(ev: dict[str, Any]) -> str:
    """A ``progress`` event in words: ``asking probes before training 8/20`` (with the batch's tokens while
    a batch generates: ``8/20, token 12/40``); an ``activity`` event's own text."""
    if ev.get("kind") == "activity":
        return str(ev.get("text") or "working")
    if ev.get("tokens") is not None and ev.get("max_tokens"):
        return f"{activity_words({**ev, 'tokens': None})}, token {ev['tokens']}/{ev['max_tokens']}"
    task = str(ev.get("task") or "")
    what = STAGE_TASK_WORDS.get((task, str(ev.get("stage")))) or TASK_WORDS.get(
        task, task.replace("_", " ") or "working"
    )
    return f"{what} {ev.get('phase') or ''} training {ev.get('done', '?')}/{ev.get('total', '?')}".replace("  ", " ")


@dataclass
class Pace:
    """The current attempt's pace. Feed every event to :meth:`observe` in log order."""

    step: int = 0
    total: int | None = None
    begin_t: float | None = None  # train_begin of this attempt
    step0: int = 0  # the step this attempt started at (a resume starts past 0)
    last_step_t: float | None = None
    stepped: bool = False  # a step event arrived in this attempt
    before_t0: float | None = None  # the work before the first step: its first and last event
    before_t1: float | None = None
    end_t: float | None = None  # train_end: the steps are over, the wrap-up runs
    activity: dict[str, Any] | None = None  # the latest progress event while its work goes on
    task_t0: float | None = None  # when the activity's task began (its done=0 event)
    stopping: bool = False  # a stop was asked: the run saves a checkpoint and ends (a "stopping" state event)

    def observe(self, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        t = as_float(ev.get("t"))
        if kind == "run_started":  # a new attempt: what ran before the steps is measured again
            self.before_t0 = self.before_t1 = self.end_t = self.begin_t = None
            self.activity, self.stepped, self.stopping = None, False, False
        elif kind == "state":
            self.stopping = ev.get("state") == "stopping"
        elif kind == "activity":
            self.activity = ev
        elif kind == "train_begin":
            self.total = ev.get("total_steps") or self.total
            self.begin_t, self.step0, self.stepped, self.end_t = t, int(ev.get("start_step") or 0), False, None
            self.step = self.step0
        elif kind == "step":
            self.step = int(ev.get("step") or 0)
            self.total = ev.get("total_steps") or self.total
            self.last_step_t, self.stepped, self.activity = t, True, None
        elif kind == "train_end":
            self.end_t = t
        elif kind == "progress":
            self._progress(ev, t)
        elif kind in ("probe_results", "held_out") and ev.get("phase") == "before" and not self.stepped:
            self._before(t)
        if kind in ("run_finished", "run_stopped", "run_failed"):
            self.activity = None
        elif kind in ("checkpoint_saved", "train_end", "eval") and (self.activity or {}).get("kind") == "activity":
            self.activity = None  # the save, evaluation or step it spoke of is over

    def _progress(self, ev: dict[str, Any], t: float | None) -> None:
        if not ev.get("done") and ev.get("tokens") is None:  # the task's start, not a first batch's tokens
            self.task_t0 = t
        if ev.get("phase") == "before" and not self.stepped:
            self._before(t)
        done, total = ev.get("done"), ev.get("total")
        self.activity = ev if done is None or total is None or done < total else None

    def _before(self, t: float | None) -> None:
        if t is None:
            return
        if self.before_t0 is None:
            self.before_t0 = self.begin_t if self.begin_t is not None and self.begin_t < t else t
        self.before_t1 = t

    # -- derived ----------------------------------------------------------------------------------
    @property
    def steps_from_t(self) -> float | None:
        """When stepping began: after train_begin and after the work before the first step."""
        marks = [x for x in (self.begin_t, self.before_t1) if x is not None]
        return max(marks) if marks else None

    @property
    def wrapup_allowance_s(self) -> float:
        """What the work after the last step is expected to take: what it took before the first."""
        if self.before_t0 is None or self.before_t1 is None:
            return 0.0
        return max(0.0, self.before_t1 - self.before_t0)

    def step_s(self) -> float | None:
        """Seconds per step over the steps this attempt trained, or None before two marks."""
        start = self.steps_from_t
        if start is None or self.last_step_t is None or not self.stepped or self.step <= self.step0:
            return None
        return max(0.0, self.last_step_t - start) / (self.step - self.step0)

    def eta(self, now: float) -> float | None:
        """Seconds left, or None when unknown: before a step was timed, and once the estimate is
        used up while the run goes on (it takes longer than its pace said). Before the last step:
        the steps left at the attempt's rate plus the wrap-up allowance; in the wrap-up (after
        ``train_end``): the running task's own rate, else what is left of the allowance. None once a stop
        was asked: the run ends after this step's checkpoint, not at its last step."""
        if self.stopping:
            return None
        if self.end_t is not None:
            left = self._wrapup_left(now)
        else:
            per_step = self.step_s()
            if per_step is None or not self.total or self.last_step_t is None:
                return None
            left = per_step * max(self.total - self.step, 0) + self.wrapup_allowance_s - (now - self.last_step_t)
        return left if left is not None and left > 0 else None

    def _wrapup_left(self, now: float) -> float | None:
        ev = self.activity
        if ev is not None and self.task_t0 is not None and ev.get("done") and ev.get("total"):
            t = as_float(ev.get("t")) or now
            per_item = (t - self.task_t0) / float(ev["done"])
            return per_item * (float(ev["total"]) - float(ev["done"])) - (now - t)
        return self.wrapup_allowance_s - (now - float(self.end_t or now))

    def activity_text(self, now: float | None = None) -> str | None:
        """What the ranks do now, ``stopping: `` first once a stop was asked; an ``activity`` that has
        gone on for a while counts its seconds (``first step running 12 s``), so the line moves."""
        ev = self.activity
        text = activity_words(ev) if ev is not None else None
        t = as_float(ev.get("t")) if ev is not None else None
        if text and ev is not None and ev.get("kind") == "activity" and now is not None and t is not None:
            text += f" {int(now - t)} s" if now - t >= 1 else ""
        if self.stopping:
            return f"stopping: {text}" if text else "stopping: saving a checkpoint at the end of the step"
        return text
