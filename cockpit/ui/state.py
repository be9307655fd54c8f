"""A run's state, folded from its event log incrementally (no textual, no torch).

``RunState.apply(events)`` takes the events :class:`cockpit.store.events.EventReader` returned since
the last call. Everything kept is bounded: metric series are :class:`BucketSeries`, alerts and
checkpoints are short deques, telemetry keeps only the latest sample.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cockpit.run.follow import fmt_duration  # noqa: F401 - re-exported for the screens
from cockpit.run.pace import Pace
from cockpit.store import node_grid
from cockpit.store.events import EventReader, as_float
from cockpit.store.rundir import TERMINAL_STATES, RunDir
from cockpit.ui.logtail import EVENT_KINDS
from cockpit.ui.series import BucketSeries

METRICS = ("loss", "lr", "grad_norm", "tokens_per_s")
METRIC_TITLES = {"loss": "loss", "lr": "learning rate", "grad_norm": "grad norm", "tokens_per_s": "tokens/s"}
# A training stage's own step fields (cockpit/store/events.py: dpo / kto rewards, rm pairwise accuracy,
# grpo's reward, KL, clipping, entropy, completion length);
# the Live screen shows the rows of those a run reports.
# grpo: each reward function's mean, a row per function in the order the run reports them (the label its
# name, the value mean±std), beside the total, KL and completion length; four at most
REWARD_SLOTS = ("reward_fn1", "reward_fn2", "reward_fn3", "reward_fn4")
STAGE_METRICS = (
    "reward_margin",
    "reward_accuracy",
    "reward_chosen",
    "reward_rejected",
    "pairwise_accuracy",
    "mean_reward",
    "reward",
    "reward_fn1",
    "reward_fn2",
    "kl",
    "completion_len_mean",
    "reward_fn3",
    "reward_fn4",
    "reward_std",
    "completion_truncated",
    "clip_ratio",
    "entropy",
)
STAGE_TITLES = {
    "reward_margin": "margin",
    "reward_accuracy": "rwd acc",
    "reward_chosen": "r chosen",
    "reward_rejected": "r reject",
    "pairwise_accuracy": "pair acc",
    "mean_reward": "mean rwd",
    "reward": "reward",
    "reward_std": "rwd std",
    **{slot: f"reward {i}" for i, slot in enumerate(REWARD_SLOTS, 1)},
    "kl": "kl",
    "clip_ratio": "clipped",
    "entropy": "entropy",
    "completion_len_mean": "compl len",
    "completion_truncated": "truncd",
}


PER_DEVICE_FIELDS = ("tokens_per_s_per_device", "samples_per_s_per_device", "mfu", "hfu")
COMPLETIONS_KEPT = 8  # grpo's sampled completions kept for the Live screen's pane: the latest two logging steps


def fmt_num(value: float | None, metric: str = "") -> str:
    if value is None:
        return "-"
    if metric == "lr":
        return f"{value:.2e}"
    if metric == "tokens_per_s":
        return f"{value:,.0f}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"


@dataclass
class RunState:
    run_id: str = ""
    capacity: int = 512
    state: str = "starting"
    reason: str | None = None
    model: str | None = None
    dataset: str | None = None
    method: str | None = None
    world_size: int | None = None
    step: int = 0
    total: int | None = None
    epoch: float | None = None
    t0: float | None = None
    end_t: float | None = None
    train_t0: float | None = None
    tokens_seen: int | None = None
    # the latest step's per-device throughput and utilisation (tokens_per_s_per_device, samples_per_s_per_device,
    # mfu, hfu) and train_begin's ``flops`` (the peak they are measured against)
    per_device: dict[str, Any] = field(default_factory=dict)
    flops: dict[str, Any] | None = None
    mem: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] | None = None  # the latest sample of node 0 (the supervisor's own node)
    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)  # node_rank -> its latest telemetry
    nodes_version: int = 0  # bumped whenever ``nodes`` changed (the devices map is redrawn only then)
    comm: dict[str, Any] | None = None
    alerts: deque = field(default_factory=lambda: deque(maxlen=100))
    checkpoints: deque = field(default_factory=lambda: deque(maxlen=20))
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    held_out: dict[str, dict[str, Any]] = field(default_factory=dict)  # phase -> held_out event (dpo / rm / grpo)
    evals: BucketSeries | None = None
    finished: dict[str, Any] | None = None
    failed: dict[str, Any] | None = None
    stopped: dict[str, Any] | None = None
    events_seen: int = 0
    log_seq: int = 0  # events with a log line so far (cockpit.ui.logtail.ReadableLog orders by it)
    recent: deque = field(default_factory=lambda: deque(maxlen=400))  # (log_seq, event): the log pane's events
    # grpo: the latest sampled completions, oldest first ({step, prompt, completion, reward, rewards, advantage})
    completions: deque = field(default_factory=lambda: deque(maxlen=COMPLETIONS_KEPT))
    # a mixture-of-experts run: the latest step's expert load (cockpit/store/expert_load.py) and its step
    expert_load: dict[str, Any] | None = None
    expert_load_step: int | None = None
    version: int = 0  # bumped by every apply() that changed something
    series: dict[str, BucketSeries] = field(default_factory=dict)
    pace: Pace = field(default_factory=Pace)  # ETA and what the ranks do between steps (cockpit.run.pace)
    # grpo: the reward functions in the order the run reported them (REWARD_SLOTS' series), each one's last spread
    reward_names: list[str] = field(default_factory=list)
    reward_std: dict[str, float | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.series:
            self.series = {m: BucketSeries(self.capacity) for m in METRICS + STAGE_METRICS}
        if self.evals is None:
            self.evals = BucketSeries(self.capacity)

    # -- folding events -------------------------------------------------------------------
    def apply(self, events: list[dict[str, Any]]) -> bool:
        for ev in events:
            self._apply_one(ev)
        if events:
            self.events_seen += len(events)
            self.version += 1
        return bool(events)

    def _add_rewards(self, step: int, rewards: dict[str, Any]) -> None:
        for name, figures in rewards.items():
            if name not in self.reward_names and len(self.reward_names) < len(REWARD_SLOTS):
                self.reward_names.append(name)
            if name in self.reward_names and isinstance(figures, dict):
                self.series[REWARD_SLOTS[self.reward_names.index(name)]].add(step, as_float(figures.get("mean")))
                self.reward_std[name] = as_float(figures.get("std"))

    def metric_label(self, metric: str) -> tuple[str, str] | None:
        """A reward slot's (name, "mean±std") for its sparkline's label; None for any other metric."""
        if metric not in REWARD_SLOTS:
            return None
        i = REWARD_SLOTS.index(metric)
        if i >= len(self.reward_names):
            return None
        name, last, std = self.reward_names[i], self.series[metric].last, self.reward_std.get(self.reward_names[i])
        value = "-" if last is None else f"{last:.3f}" + (f"±{std:.2f}" if std is not None else "")
        return name, value

    def _apply_one(self, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        if kind in EVENT_KINDS:
            self.log_seq += 1
            self.recent.append((self.log_seq, ev))
        t = as_float(ev.get("t"))
        if self.t0 is None and t is not None:
            self.t0 = t
        self.pace.observe(ev)
        if kind == "step":
            step = int(ev.get("step") or 0)
            self.step = step
            self.total = ev.get("total_steps") or self.total
            epoch = as_float(ev.get("epoch"))
            self.epoch = epoch if epoch is not None else self.epoch
            if ev.get("tokens_seen") is not None:
                self.tokens_seen = ev.get("tokens_seen")
            for m in METRICS:
                self.series[m].add(step, as_float(ev.get(m)))
            for m in STAGE_METRICS:
                if m in ev:
                    self.series[m].add(step, as_float(ev[m]))
            if isinstance(ev.get("rewards"), dict):  # grpo: each reward function's mean and spread
                self._add_rewards(step, ev["rewards"])
            if isinstance(ev.get("mem"), dict):
                self.mem = ev["mem"]
            if isinstance(ev.get("expert_load"), dict):  # an MoE model's routers (cockpit/train/moe.py)
                self.expert_load, self.expert_load_step = ev["expert_load"], step
            if "samples_per_s_per_device" in ev:
                self.per_device = {k: ev.get(k) for k in PER_DEVICE_FIELDS}
            if self.state in ("starting",):
                self.state = "running"
        elif kind == "run_started":
            self.run_id = ev.get("run_id") or self.run_id
            self.model, self.dataset, self.method = ev.get("model"), ev.get("dataset"), ev.get("method")
            self.world_size = ev.get("world_size")
            self.total = ev.get("total_steps") or self.total
            self.end_t = None
        elif kind == "state":
            self.state = ev.get("state") or self.state
            self.reason = ev.get("reason")
            if self.state in TERMINAL_STATES:
                self.end_t = t
        elif kind == "train_begin":
            self.total = ev.get("total_steps") or self.total
            self.train_t0 = t
            self.world_size = ev.get("world_size") or self.world_size
            self.flops = ev.get("flops") if isinstance(ev.get("flops"), dict) else None
        elif kind == "telemetry":
            node = int(ev.get("node_rank") or 0)
            self.nodes[node] = ev
            self.nodes_version += 1
            if node == 0:
                self.telemetry = ev
        elif kind == "node_telemetry":  # the other nodes' GPUs, compact (cockpit/store/node_grid.py)
            node_grid.fold(self.nodes, ev)
            self.nodes_version += 1
        elif kind == "comm":
            self.comm = ev
        elif kind == "alert":
            self.alerts.append(ev)
        elif kind == "checkpoint_saved":
            self.checkpoints.append(ev)
        elif kind == "probe_results":
            self.probes[str(ev.get("phase"))] = ev
        elif kind == "held_out":
            self.held_out[str(ev.get("phase"))] = ev
        elif kind == "completions":
            samples = ev.get("samples")
            for sample in samples[-COMPLETIONS_KEPT:] if isinstance(samples, list) else ():
                if isinstance(sample, dict):
                    self.completions.append({**sample, "step": ev.get("step")})
        elif kind == "eval":
            self.evals.add(ev.get("step") or 0, as_float(ev.get("eval_loss")))
        elif kind == "run_finished":
            self.finished = ev
            self.end_t = t
            self.step = max(self.step, int(ev.get("steps") or 0))  # the last step need not be a logging step
        elif kind == "run_failed":
            self.failed = ev
            self.reason = ev.get("reason") or self.reason
            self.end_t = t
        elif kind == "run_stopped":
            self.stopped = ev
            self.end_t = t

    # -- derived --------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_STATES

    def elapsed(self, now: float) -> float | None:
        if self.t0 is None:
            return None
        return (self.end_t if self.end_t is not None else now) - self.t0

    def eta(self, now: float) -> float | None:
        """Seconds left: the steps' own rate (timed from the first step, after the probes) plus
        the wrap-up after them (``cockpit.run.pace``); None when unknown."""
        if self.ended:
            return 0.0 if self.state == "finished" else None
        return self.pace.eta(now)

    def activity(self, now: float | None = None) -> str | None:
        """What the ranks do between steps, while they do it: ``asking probes before training 8/20``,
        ``first step running 12 s`` (``now``: the seconds counted), ``stopping: saving checkpoint-3``."""
        return None if self.ended else self.pace.activity_text(now)

    def last(self, metric: str) -> float | None:
        return self.series[metric].last


class RunFollower:
    """A run dir + its incremental reader + state. ``poll()`` reads only new bytes."""

    def __init__(self, run: RunDir, capacity: int = 512, chunk_bytes: int = 2 << 20):
        self.run = run
        self.reader = EventReader(run.events_path)
        self.state = RunState(run_id=run.run_id, capacity=capacity)
        self.chunk_bytes = chunk_bytes
        self.skipped_steps = 0

    def poll(self, max_chunks: int | None = None) -> bool:
        """Fold every new event, in chunks, so a huge log never sits in memory at once.
        ``max_chunks``: stop after that many chunks (the caller polls again later)."""
        changed = False
        chunks = 0
        while True:
            before = self.reader.offset
            changed |= self.state.apply(self.reader.read_new(self.chunk_bytes))
            chunks += 1
            if self.reader.offset - before < self.chunk_bytes:
                return changed
            if max_chunks is not None and chunks >= max_chunks:
                return changed

    def replay_chunk(self, stride: int = 1) -> bool:
        """Fold the next chunk of history; True at the end of the file (see :meth:`read_chunk`)."""
        events, done = self.read_chunk(stride)
        self.state.apply(events)
        return done

    def read_chunk(self, stride: int = 1) -> tuple[list[dict[str, Any]], bool]:
        """Parse the next chunk of history: (events, at the end of the file). With ``stride`` > 1 only
        every stride-th ``step`` line is parsed (other kinds always are): a million-step log
        folds in seconds, and the bucketed series it feeds hold ~stride-sampled means."""
        import json

        r = self.reader
        try:
            with open(r.path, "rb") as fh:
                fh.seek(r.offset)
                chunk = fh.read(self.chunk_bytes)
        except FileNotFoundError:
            return [], True
        r.offset += len(chunk)
        lines = (r._pending + chunk).split(b"\n")
        r._pending = lines.pop()
        events = []
        for line in lines:
            if stride > 1 and b'"kind":"step"' in line:
                self.skipped_steps += 1
                if self.skipped_steps % stride:
                    continue
            try:
                ev = json.loads(line)
            except ValueError:
                if line.strip():
                    r.bad_lines += 1
                continue
            if isinstance(ev, dict) and "kind" in ev:
                events.append(ev)
        return events, len(chunk) < self.chunk_bytes

    def peek(self, head_bytes: int = 64 << 10, tail_bytes: int = 256 << 10) -> RunState:
        """A quick look at a big log: its first and last events only (the run's identity and
        where it is now), for the header while the full history loads."""
        import json
        import os

        st = RunState(run_id=self.run.run_id, capacity=8)
        try:
            size = os.path.getsize(self.run.events_path)
            with open(self.run.events_path, "rb") as fh:
                head = fh.read(head_bytes)
                fh.seek(max(0, size - tail_bytes))
                tail = fh.read(tail_bytes)
        except OSError:
            return st
        events = []
        for chunk, drop_first in ((head, False), (tail, size > tail_bytes)):
            lines = chunk.split(b"\n")
            lines = lines[1:-1] if drop_first else lines[:-1]
            for line in lines:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict):
                    events.append(ev)
        st.apply(events)
        return st


Clock = Callable[[], float]
system_clock: Clock = time.time


# -- "relaunch with these settings" after a hang alert -------------------------------------------
def hang_alert(state: RunState) -> dict[str, Any] | None:
    """The latest ``hang`` alert while it still stands (no step arrived after it)."""
    for a in reversed(state.alerts):
        if a.get("code") == "hang":
            return a if int(a.get("last_step") or 0) >= state.step else None
    return None


def memory_alert(state: RunState) -> dict[str, Any] | None:
    """The latest ``memory_pressure`` alert while the run goes on and no later attempt began."""
    if state.ended:
        return None
    for a in reversed(state.alerts):
        if a.get("code") == "memory_pressure":
            return (
                a
                if as_float(a.get("t")) is None or state.train_t0 is None or as_float(a["t"]) >= state.train_t0
                else None
            )
    return None


def memory_remedy_args(alert: dict[str, Any]) -> list[str]:
    """``cockpit resume --set`` items for the alert's remedy: the micro-batch change, else the
    allocator setting (added to the config's env)."""
    change = alert.get("remedy_set") or {}
    if change:
        return [f"{k}={v}" for k, v in change.items()]
    env = alert.get("remedy_env") or {}
    return ["env={" + ", ".join(f"{k}: '{v}'" for k, v in env.items()) + "}"] if env else []


def remedy_env(alert: dict[str, Any]) -> dict[str, str]:
    """The alert's relaunch environment (NCCL INFO logging of init and collectives) plus the
    network plugin ruled out (cockpit.run.watchdog: the first two remedies)."""
    from cockpit.run.watchdog import DEBUG_ENV, NO_PLUGIN_ENV

    env = {str(k): str(v) for k, v in (alert.get("relaunch_env") or DEBUG_ENV).items()}
    env.update(NO_PLUGIN_ENV)
    return env


def relaunch_config(run: RunDir, env_add: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The run's resolved config with ``env_add`` merged into ``env``; (config, notes).

    Secrets are redacted in the run dir's config.yaml: they are taken back from the config file
    the run was started from when it still says them, else left out (a note says so). A
    single-node run gets a fresh master port (0: picked at launch)."""
    from cockpit.config.load import REDACTED, read_yaml
    from cockpit.errors import InputError

    saved, _lines = read_yaml(run.config_path)
    notes: list[str] = []
    source_env: dict[str, Any] = {}
    source = run.read_status().get("config_source")
    if source:
        try:
            source_env = dict(read_yaml(source)[0].get("env") or {})
        except (InputError, OSError, AttributeError, TypeError, ValueError):
            source_env = {}
    env: dict[str, Any] = {}
    for k, v in (saved.get("env") or {}).items():
        if v == REDACTED:
            if source_env.get(k) not in (None, REDACTED):
                env[k] = source_env[k]
            else:
                notes.append(f"{k} was redacted in the run dir and {source or 'its config'} no longer has it: left out")
            continue
        env[k] = v
    env.update(env_add)
    saved["env"] = env
    if int(saved.get("nnodes") or 1) == 1:
        saved["master_port"] = 0
    return saved, notes
