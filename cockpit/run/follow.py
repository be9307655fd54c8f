"""Follow a run in a plain terminal: replay its event log, then tail it live.

Used by ``cockpit train`` (without --detach) and ``cockpit attach``. A line per logging step,
a progress line with ETA (``cockpit.run.pace``: the steps' own rate, the wrap-up allowed for) and
what the ranks do between steps ("asking probes before training 8/20"), alerts and the final state.
No torch, no textual.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from cockpit.run.pace import Pace, activity_words
from cockpit.store.events import EventReader, as_float
from cockpit.store.rundir import TERMINAL_STATES, RunDir

PLAIN_EVERY_S = 5.0  # a pipe or a log: a progress line at most this often when what the ranks do changes,
PLAIN_QUIET_S = 30.0  # and this often when nothing else was printed


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


def fmt_loss(value: Any) -> str:
    """A loss for people: 4 decimals (3 significant digits under 0.001); ``?`` when missing."""
    v = as_float(value)
    if v is None:
        return "?"
    return f"{v:.4f}" if v != v or abs(v) >= 0.001 or v == 0 else f"{v:.3g}"


def loss_words(ev: dict[str, Any]) -> str:
    """``run_finished``'s losses: first -> last, or the one value when a single step was logged
    (``logging_steps`` above the steps run: the first and the last are the same logging step)."""
    first, last = ev.get("first_loss"), ev.get("last_loss")
    if first is None and last is None:
        return "no training loss logged"
    at_first, at_last = ev.get("first_loss_step"), ev.get("last_loss_step")
    if at_last is not None and at_first == at_last:
        return f"loss {fmt_loss(last)} (one logged step: step {at_last})"
    return f"loss {fmt_loss(first)} -> {fmt_loss(last)}"


def percent(value: Any) -> str:
    """A 0..1 share as a percentage: ``41.3%`` (two decimals under 1%: a CPU run's MFU)."""
    v = as_float(value)
    if v is None:
        return "?"
    return f"{100 * v:.1f}%" if abs(v) >= 0.01 else f"{100 * v:.2f}%"


def per_device_words(fields: dict[str, Any], flops: dict[str, Any] | None = None, sep: str = "  ") -> str:
    """A step event's (or summary.json's) per-device throughput and utilisation: ``1,234 tok/s  3.21
    samples/s  MFU 41.3% (HFU 52.0%)``; ``MFU: peak unknown`` when the device has no known peak
    (``flops``: train_begin's, which says so); "" before any figure."""
    parts = []
    tps, sps = as_float(fields.get("tokens_per_s_per_device")), as_float(fields.get("samples_per_s_per_device"))
    if tps is not None:
        parts.append(f"{tps:,.0f} tok/s")
    if sps is not None:
        parts.append(f"{sps:.2f} samples/s")
    mfu, hfu = fields.get("mfu"), fields.get("hfu")
    if mfu is not None:
        parts.append(f"MFU {percent(mfu)}" + (f" (HFU {percent(hfu)})" if hfu is not None else ""))
    elif (flops or fields).get("peak_tflops", 0) is None:
        parts.append("MFU: peak unknown")
    return sep.join(parts)


def flops_rate(tflops: Any) -> str:
    """A FLOPs/s figure in its unit: ``989.4 TFLOPS``, a CPU's ``32.1 GFLOPS``."""
    v = as_float(tflops)
    if v is None:
        return "?"
    return f"{v:,.4g} TFLOPS" if v >= 1 else f"{1000 * v:,.3g} GFLOPS"


def mfu_convention(fields: dict[str, Any]) -> str:
    """What an MFU counts: ``model FLOPs`` (6 N a token plus attention, cockpit.plan.flops), ``frozen base``
    when only some weights train (LoRA, freeze: the frozen weights' gradient GEMMs are not counted)."""
    share = as_float(fields.get("trainable_share"))
    return "model FLOPs" + (", frozen base" if share is not None and share < 1 else "")


def peak_short(fields: dict[str, Any]) -> str:
    """``· model FLOPs, frozen base; H200 989.4 TFLOPS bf16``, ``· model FLOPs; CPU 32.1 GFLOPS fp32``: what an
    MFU counts and the peak it is a share of (summary.json's peak_* and trainable_share, or train_begin's
    flops); "" without a peak."""
    if fields.get("peak_tflops") is None:
        return ""
    device = "CPU" if fields.get("peak_source") in ("measured", "cached") else fields.get("peak_device")
    dtype = fields.get("dtype") or fields.get("peak_dtype") or ""
    return f"· {mfu_convention(fields)}; {device} {flops_rate(fields['peak_tflops'])} {dtype}".rstrip()


def peak_words(flops: dict[str, Any] | None) -> str:
    """train_begin's ``flops``: the peak MFU is measured against, or why there is none."""
    if not flops:
        return ""
    if flops.get("peak_tflops") is None:
        return f"MFU: peak unknown ({flops.get('why') or flops.get('peak_device')})"
    if flops.get("model_flops_per_token") is None:
        return f"no MFU: {flops.get('why')}"
    how = {"measured": "measured here", "cached": "measured here before", "table": "data sheet"}.get(
        str(flops.get("peak_source")), str(flops.get("peak_source"))
    )
    return (
        f"peak {flops_rate(flops['peak_tflops'])} {flops.get('dtype')} per device ({flops.get('peak_device')}, {how});"
        f" MFU counts {mfu_convention(flops)}, HFU adds the recompute"
    )


def held_out_line(ev: dict[str, Any]) -> str:
    """``held_out``: the held-out pairs' accuracy and mean margin (grpo: the prompts' mean reward)."""
    if ev.get("mean_reward") is not None:
        per = ", ".join(f"{k} {as_float(v):.3f}" for k, v in (ev.get("rewards") or {}).items() if v is not None)
        return (
            f"held-out {ev.get('phase')}: {ev.get('prompts')} prompts, mean reward {as_float(ev['mean_reward']):.3f}"
            + (f" ({per})" if per else "")
        )
    accuracy = as_float(ev.get("accuracy"))
    parts = [f"{ev.get('pairs')} pairs", f"accuracy {100 * accuracy:.1f}%" if accuracy is not None else "accuracy ?"]
    for key, words in (("mean_logp_margin", "mean log-prob margin"), ("mean_reward_margin", "mean reward margin")):
        if ev.get(key) is not None:
            parts.append(f"{words} {as_float(ev[key]):.4f}")
    return f"held-out {ev.get('phase')}: " + ", ".join(parts)


def grpo_step_words(ev: dict[str, Any]) -> str:
    """A grpo step's rewards: ``reward 0.412 (contains_answer 0.50±0.29, concise_answer 0.33±0.40) kl 0.0120
    len 5.2``: the total, each function's mean ± spread, KL and the mean completion length."""
    per = []
    for name, v in (ev.get("rewards") or {}).items():
        mean, std = as_float((v or {}).get("mean")), as_float((v or {}).get("std"))
        if mean is not None:
            per.append(f"{name} {mean:.2f}" + (f"±{std:.2f}" if std is not None else ""))
    words = f"reward {as_float(ev['reward']):.3f}" + (f" ({', '.join(per)})" if per else "")
    if as_float(ev.get("kl")) is not None:
        words += f" kl {as_float(ev['kl']):.4f}"
    if as_float(ev.get("completion_len_mean")) is not None:
        words += f" len {as_float(ev['completion_len_mean']):.1f}"
    return words


def completion_line(ev: dict[str, Any], prompt_chars: int = 40, completion_chars: int = 60) -> str | None:
    """``completions`` (grpo): the latest sample in a line, ``sample at step 4: 'prompt' -> 'completion'
    reward 0.42 (contains_answer 1.00, length_penalty 0.17)``, its texts on one line and shortened."""
    samples = [s for s in ev.get("samples") or [] if isinstance(s, dict)]
    if not samples:
        return None
    s = samples[-1]

    def one_line(text: Any, most: int) -> str:
        flat = " ".join(str(text or "").split())
        return flat if len(flat) <= most else flat[: most - 1] + "…"

    total = as_float(s.get("reward"))
    per = ", ".join(f"{k} {as_float(v):.2f}" for k, v in (s.get("rewards") or {}).items() if as_float(v) is not None)
    return (
        f"sample at step {ev.get('step')}: {one_line(s.get('prompt'), prompt_chars)!r}"
        f" -> {one_line(s.get('completion'), completion_chars)!r}"
        + (f"  reward {total:.2f}" if total is not None else "")
        + (f" ({per})" if per else "")
    )


def format_event(ev: dict[str, Any], start_t: float | None) -> str | None:
    kind = ev.get("kind")
    if kind == "step":
        loss = as_float(ev.get("loss"))
        parts = [f"step {ev.get('step')}/{ev.get('total_steps') or '?'}", f"epoch {ev.get('epoch', 0):.2f}"]
        parts.append(f"loss {loss:.4f}" if loss is not None else "loss ?")
        if ev.get("aux_loss") is not None:  # an MoE model's router loss (moe_aux_loss_coef)
            parts.append(f"aux {as_float(ev['aux_loss']):.4f}")
        if ev.get("lr") is not None:
            parts.append(f"lr {as_float(ev['lr']):.2e}")
        if ev.get("grad_norm") is not None:
            parts.append(f"gnorm {as_float(ev['grad_norm']):.3f}")
        if ev.get("tokens_per_s") is not None:
            per = as_float(ev.get("tokens_per_s_per_device"))
            parts.append(
                f"{ev['tokens_per_s']:.0f} tok/s"
                + (f" ({per:,.0f}/device)" if per not in (None, ev["tokens_per_s"]) else "")
            )
        if ev.get("mfu") is not None:
            parts.append(f"MFU {percent(ev['mfu'])}")
        if ev.get("reward") is not None:  # grpo
            parts.append(grpo_step_words(ev))
        return "  ".join(parts)
    if kind == "run_started":
        return f"run {ev.get('run_id')} started: {ev.get('model')} on {ev.get('dataset')} ({ev.get('method')}, world size {ev.get('world_size')})"
    if kind == "train_begin":
        epochs = as_float(ev.get("epochs"))
        peak = peak_words(ev.get("flops"))
        return (
            f"training: {ev.get('total_steps')} steps, {f'{epochs:.2f}' if epochs is not None else '?'} epochs, "
            f"global batch {ev.get('global_batch')}" + (f"; {peak}" if peak else "")
        )
    if kind == "progress":  # the start of the work; how far it is: the progress line
        starts = not ev.get("done") and ev.get("tokens") is None
        return activity_words(ev).rsplit(" ", 1)[0] + f" ({ev.get('total')})" if starts else None
    if kind == "held_out":
        return held_out_line(ev)
    if kind == "completions":
        return completion_line(ev)
    if kind == "probe_results":
        line = (
            f"probes {ev.get('phase')}: {ev.get('passed')}/{ev.get('total')} pass ({100 * (ev.get('rate') or 0):.0f}%)"
        )
        if ev.get("stopped"):  # a stop ended the answers early: the count is of the probes answered
            line = f"probes {ev.get('phase')}: stopped after {ev.get('total')} answered ({ev.get('passed')} pass)"
        return line
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
        mfu = f", MFU {percent(ev['mfu'])}" if ev.get("mfu") is not None else ""
        return f"finished: {ev.get('steps')} steps in {fmt_duration(ev.get('runtime_s'))}, {loss_words(ev)}{mfu}"
    if kind == "stop_requested":
        return f"stop requested ({ev.get('by') or 'control/stop'}): the run saves a checkpoint at the end of this step and ends"
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
        self.plain = show_progress is None and not self.tty  # a pipe or a log: plain progress lines, no \r
        self._plain_said: tuple[str | None, float] = (None, float("-inf"))  # (what, when) the last one said
        self.start_t: float | None = None
        self.pace = Pace()
        self.steps_seen: list[int] = []
        self._progress_shown = False

    def _clear_progress(self) -> None:
        if self._progress_shown:
            self.out.write("\r\033[K")
            self._progress_shown = False

    @property
    def step(self) -> int:
        return self.pace.step

    @property
    def total(self) -> int | None:
        return self.pace.total

    def progress_line(self, now: float) -> str:
        """``[####----] 3/36  elapsed 04:34  ETA 12:05``, and what the ranks do between steps."""
        pace = self.pace
        elapsed = now - self.start_t if self.start_t is not None else None
        line = f"{pace.step}/{pace.total or '?'}  elapsed {fmt_duration(elapsed)}  ETA {fmt_duration(pace.eta(now))}"
        doing = pace.activity_text(now)  # in the bar's place: the line stays within 80 columns
        return f"{line}  {doing}" if doing else f"{progress_bar(pace.step, pace.total)} {line}"

    def _plain_progress(self, now: float) -> None:
        """Stdout is no terminal: a plain ``progress:`` line when what the ranks do changes (at most
        every PLAIN_EVERY_S), and every PLAIN_QUIET_S while nothing else is printed."""
        if self.total is None and self.pace.activity is None and not self.pace.stopping:
            return
        doing, said_t = self.pace.activity_text(), self._plain_said[1]
        if (doing != self._plain_said[0] and now - said_t >= PLAIN_EVERY_S) or now - said_t >= PLAIN_QUIET_S:
            self.out.write(f"progress: {self.progress_line(now)}\n")
            self._plain_said = (doing, now)

    def _progress(self) -> None:
        if self.plain:
            self._plain_progress(time.time())
            return
        if not self.tty or (self.total is None and self.pace.activity is None):
            return
        self.out.write(f"\r\033[K{self.progress_line(time.time())}")
        self.out.flush()
        self._progress_shown = True

    def pump(self) -> list[dict[str, Any]]:
        events = self.reader.read_new()
        for ev in events:
            kind = ev.get("kind")
            if self.start_t is None:
                self.start_t = ev.get("t")
            self.pace.observe(ev)
            if kind == "step":
                self.steps_seen.append(self.pace.step)
            line = format_event(ev, self.start_t)
            if line:
                self._clear_progress()
                self.out.write(line + "\n")
                self._plain_said = (self._plain_said[0], time.time())  # a line was printed: no heartbeat due
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
