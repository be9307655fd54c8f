"""Follow a run in a plain terminal: replay its event log, then tail it live.

Used by ``cockpit train`` (without --detach) and ``cockpit attach``. A line per logging step,
a progress line with ETA, alerts and the final state. No torch, no textual.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from cockpit.run.events import EventReader, as_float
from cockpit.run.rundir import TERMINAL_STATES, RunDir


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def progress_bar(step: int, total: int | None, width: int = 24) -> str:
    if not total or total <= 0:
        return "[" + " " * width + "]"
    done = int(width * min(step, total) / total)
    return "[" + "#" * done + "-" * (width - done) + "]"


def format_event(ev: dict[str, Any], start_t: float | None) -> str | None:
    kind = ev.get("kind")
    if kind == "step":
        loss = as_float(ev.get("loss"))
        parts = [f"step {ev.get('step')}/{ev.get('total_steps') or '?'}", f"epoch {ev.get('epoch', 0):.2f}"]
        parts.append(f"loss {loss:.4f}" if loss is not None else "loss ?")
        if ev.get("lr") is not None:
            parts.append(f"lr {as_float(ev['lr']):.2e}")
        if ev.get("grad_norm") is not None:
            parts.append(f"gnorm {as_float(ev['grad_norm']):.3f}")
        if ev.get("tokens_per_s") is not None:
            parts.append(f"{ev['tokens_per_s']:.0f} tok/s")
        return "  ".join(parts)
    if kind == "run_started":
        return f"run {ev.get('run_id')} started: {ev.get('model')} on {ev.get('dataset')} ({ev.get('method')}, world size {ev.get('world_size')})"
    if kind == "train_begin":
        return (
            f"training: {ev.get('total_steps')} steps, {ev.get('epochs')} epochs, global batch {ev.get('global_batch')}"
        )
    if kind == "probe_results":
        return (
            f"probes {ev.get('phase')}: {ev.get('passed')}/{ev.get('total')} pass ({100 * (ev.get('rate') or 0):.0f}%)"
        )
    if kind == "checkpoint_saved":
        return f"checkpoint saved at step {ev.get('step')}: {ev.get('path')}"
    if kind == "eval":
        accuracy = as_float(ev.get("eval_accuracy"))
        text = f"eval at step {ev.get('step')}: loss {as_float(ev.get('eval_loss')):.4f}"
        return text + (f", accuracy {100 * accuracy:.1f}%" if accuracy is not None else "")
    if kind == "alert":
        lines = [f"ALERT [{ev.get('level')}] {ev.get('code')}: {ev.get('message')}"]
        lines += [f"  - {r}" for r in ev.get("remedies") or []]
        return "\n".join(lines)
    if kind == "run_finished":
        return f"finished: {ev.get('steps')} steps in {fmt_duration(ev.get('runtime_s'))}, loss {ev.get('first_loss')} -> {ev.get('last_loss')}"
    if kind == "run_stopped":
        return f"stopped at step {ev.get('step')}: {ev.get('reason')}"
    if kind == "state" and ev.get("state") in ("queued", "cancelled"):  # a Slurm run waits / the scheduler ended it
        return f"{ev['state']}: {ev.get('reason')}" + (
            " (attach follows the run once the job starts)" if ev["state"] == "queued" else ""
        )
    if kind == "run_failed":
        lines = [f"FAILED: {ev.get('reason')}"]
        lines += [f"  | {ln}" for ln in ev.get("log_tail") or []]
        return "\n".join(lines)
    return None


class Follower:
    """Reads the event log incrementally; prints events; knows when the run has ended."""

    def __init__(self, run: RunDir, out: TextIO = sys.stdout, show_progress: bool | None = None):
        self.run = run
        self.reader = EventReader(run.events_path)
        self.out = out
        self.tty = out.isatty() if show_progress is None else show_progress
        self.start_t: float | None = None
        self.step = 0
        self.total: int | None = None
        self.train_t0: float | None = None
        self.train_step0 = 0
        self.steps_seen: list[int] = []
        self._progress_shown = False

    def _clear_progress(self) -> None:
        if self._progress_shown:
            self.out.write("\r\033[K")
            self._progress_shown = False

    def _progress(self) -> None:
        if not self.tty or self.total is None:
            return
        now = time.time()
        eta = None
        if self.train_t0 and self.step > self.train_step0:
            rate = (now - self.train_t0) / (self.step - self.train_step0)
            eta = rate * max(self.total - self.step, 0)
        elapsed = now - self.start_t if self.start_t else None
        self.out.write(
            f"\r\033[K{progress_bar(self.step, self.total)} {self.step}/{self.total}  elapsed {fmt_duration(elapsed)}  ETA {fmt_duration(eta)}"
        )
        self.out.flush()
        self._progress_shown = True

    def pump(self) -> list[dict[str, Any]]:
        events = self.reader.read_new()
        for ev in events:
            kind = ev.get("kind")
            if self.start_t is None:
                self.start_t = ev.get("t")
            if kind == "train_begin":
                self.total = ev.get("total_steps")
                self.train_t0 = ev.get("t")
                self.train_step0 = ev.get("start_step") or 0
            if kind == "step":
                self.step = int(ev.get("step") or 0)
                self.total = ev.get("total_steps") or self.total
                self.steps_seen.append(self.step)
            line = format_event(ev, self.start_t)
            if line:
                self._clear_progress()
                self.out.write(line + "\n")
        self._progress()
        self.out.flush()
        return events

    def ended(self) -> str | None:
        from cockpit.run.liveness import reconcile
        from cockpit.slurm.queue import effective_status

        # a Slurm job the scheduler ended counts; a dead supervisor: its ranks adopted, or the run ended
        state = reconcile(self.run, status=effective_status(self.run)).get("state")
        return state if state in TERMINAL_STATES else None

    def follow(self, poll_s: float = 0.5) -> str:
        while True:
            self.pump()
            state = self.ended()
            if state:
                self.pump()
                self._clear_progress()
                status = self.run.read_status()
                msg = f"run {self.run.run_id}: {state}"
                if status.get("reason"):
                    msg += f" ({status['reason']})"
                self.out.write(msg + "\n")
                self.out.flush()
                return state
            time.sleep(poll_s)
