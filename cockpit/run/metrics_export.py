"""A run's metrics in Prometheus' terms, read from its run dir (``cockpit metrics``).

:class:`RunsCollector` is a prometheus_client custom collector: at each scrape it folds the new
lines of every watched run's ``events.jsonl`` (an incremental :class:`EventReader` per run, so
a long log is read once) into the latest values, and reports them as gauges labelled by run id:
the training metrics of the last ``step`` event (loss, learning rate, grad norm, tokens/s, step),
the last ``eval`` loss, the run's state (``status.json``), and the last ``telemetry`` event's GPUs
(other nodes' from ``node_telemetry`` rows: ``store/node_grid.fold``; per node and device: memory used and total, utilisation, power and temperature where the
backend measured them) and rank processes (resident memory). A value the run never reported
is left out, never exported as 0. No torch, no textual here: only the run dir is read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cockpit.store import node_grid
from cockpit.store.events import EventReader, as_float
from cockpit.store.rundir import RunDir

MIB = 2**20
CHUNK_BYTES = 8 * MIB
# step event field -> (metric name, help, scale)
STEP_METRICS = {
    "loss": ("cockpit_train_loss", "Training loss at the last logged step", 1.0),
    "lr": ("cockpit_learning_rate", "Learning rate at the last logged step", 1.0),
    "grad_norm": ("cockpit_grad_norm", "Gradient norm at the last logged step", 1.0),
    "tokens_per_s": ("cockpit_tokens_per_second", "Trained tokens per second, all ranks (null during warm-up)", 1.0),
    "step": ("cockpit_train_step", "Last logged optimizer step", 1.0),
    "total_steps": ("cockpit_train_total_steps", "Optimizer steps the run will take", 1.0),
    "epoch": ("cockpit_train_epoch", "Epoch at the last logged step (fractional)", 1.0),
}
# telemetry device field -> (metric name, help, scale)
DEVICE_METRICS = {
    "vram_used_mb": ("cockpit_gpu_memory_used_bytes", "GPU memory in use", MIB),
    "vram_total_mb": ("cockpit_gpu_memory_total_bytes", "GPU memory in all", MIB),
    "util_pct": ("cockpit_gpu_utilization_ratio", "GPU utilisation (0-1)", 0.01),
    "power_w": ("cockpit_gpu_power_watts", "GPU power draw", 1.0),
    "temp_c": ("cockpit_gpu_temperature_celsius", "GPU temperature", 1.0),
}


def _number(value: Any) -> float | None:
    """A number as the event log holds it (NaN / inf written as "nan" / "inf": exported as
    Prometheus' NaN / +Inf, a diverged loss is worth seeing); None for null and anything else."""
    return None if isinstance(value, bool) else as_float(value)


@dataclass
class RunLatest:
    """One run's latest values, folded from its event log."""

    run: RunDir
    reader: EventReader
    step: dict[str, Any] = field(default_factory=dict)
    eval_loss: float | None = None
    telemetry: dict[int, dict[str, Any]] = field(default_factory=dict)  # node_rank -> its last telemetry event

    def fold(self) -> None:
        """The lines appended since the last scrape, a few MiB at a time (a million-step log's
        first scrape holds one chunk in memory, not the log)."""
        while events := self.reader.read_new(max_bytes=CHUNK_BYTES):
            self._fold(events)

    def _fold(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            kind = ev.get("kind")
            if kind == "step":
                self.step = ev
            elif kind == "eval" and _number(ev.get("eval_loss")) is not None:  # eval events without a loss: probes
                self.eval_loss = _number(ev.get("eval_loss"))
            elif kind == "telemetry":
                node = ev.get("node_rank")
                self.telemetry[node if isinstance(node, int) else 0] = ev
            elif kind == "node_telemetry":  # the other nodes' GPUs of a multi-node run, compact
                node_grid.fold(self.telemetry, ev)


class RunsCollector(Collector):
    """The runs ``runs()`` names (called at each scrape: a new run appears without a restart)."""

    def __init__(self, runs: Callable[[], Iterable[RunDir]]) -> None:
        self._runs = runs
        self._latest: dict[str, RunLatest] = {}
        self._lock = threading.Lock()  # prometheus_client's HTTP server may scrape from several threads

    def _fold(self) -> list[RunLatest]:
        out = []
        for run in self._runs():
            latest = self._latest.get(run.run_id)
            if latest is None:
                latest = self._latest[run.run_id] = RunLatest(run, EventReader(run.events_path))
            latest.fold()
            out.append(latest)
        return out

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            runs = self._fold()
        yield from self._run_metrics(runs)
        yield from self._device_metrics(runs)
        yield from self._rank_metrics(runs)

    def _run_metrics(self, runs: list[RunLatest]) -> Iterator[GaugeMetricFamily]:
        state = GaugeMetricFamily("cockpit_run_state", "1 for the run's current state", labels=["run", "state"])
        for r in runs:
            state.add_metric([r.run.run_id, str(r.run.read_status().get("state") or "unknown")], 1.0)
        yield state
        for key, (name, help_text, scale) in STEP_METRICS.items():
            family = GaugeMetricFamily(name, help_text, labels=["run"])
            for r in runs:
                value = _number(r.step.get(key))
                if value is not None:
                    family.add_metric([r.run.run_id], value * scale)
            yield family
        evals = GaugeMetricFamily("cockpit_eval_loss", "Loss of the last evaluation", labels=["run"])
        for r in runs:
            if r.eval_loss is not None:
                evals.add_metric([r.run.run_id], r.eval_loss)
        yield evals

    def _device_metrics(self, runs: list[RunLatest]) -> Iterator[GaugeMetricFamily]:
        labels = ["run", "node", "host", "gpu", "name", "backend"]
        for key, (name, help_text, scale) in DEVICE_METRICS.items():
            family = GaugeMetricFamily(name, help_text, labels=labels)
            for r in runs:
                for node, ev in sorted(r.telemetry.items()):
                    for dev in ev.get("devices") or []:
                        value = _number(dev.get(key))
                        if value is not None:
                            where = [str(node), str(ev.get("host") or ""), str(dev.get("index"))]
                            family.add_metric(
                                [r.run.run_id, *where, str(dev.get("name") or ""), str(ev.get("backend") or "")],
                                value * scale,
                            )
            yield family

    def _rank_metrics(self, runs: list[RunLatest]) -> Iterator[GaugeMetricFamily]:
        rss = GaugeMetricFamily(
            "cockpit_rank_resident_memory_bytes", "A rank process's resident set size", labels=["run", "node", "rank"]
        )
        for r in runs:
            for node, ev in sorted(r.telemetry.items()):
                for rank in ev.get("ranks") or []:
                    value = _number(rank.get("rss_mb"))
                    if value is not None and rank.get("alive", True):
                        rss.add_metric([r.run.run_id, str(node), str(rank.get("rank"))], value * MIB)
        yield rss
