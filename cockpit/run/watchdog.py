"""Hang watchdog: notices when training steps stop arriving while the ranks are still alive.

Pure logic (no clock, no I/O, no torch): the supervisor feeds it times. Usage::

    dog = HangWatchdog(floor_s=300, factor=5.0, start_t=time.time())
    dog.observe_step(step, t)                           # for every ``step`` event
    alert = dog.check(now, ranks_alive=True, last_lines={0: "...", 1: "..."})
    if alert:
        events.emit("alert", **alert)                   # level, code, message, remedies, ranks, ...

A stall is declared when no step arrived for longer than ``max(factor * median step time,
floor_s)``, counted from the last step. Model loading, strategy setup and the probes before the
first step (and the save and probes after the last, once ``observe_train_end`` was called) are
not hangs: there the threshold is ``load_timeout_s`` (default: ``floor_s``), counted from
``start_t`` / the first ``check`` (or from the end of training). The median is over the last ``window`` step intervals, so one slow step (an eval, a
checkpoint) does not mask or cause an alert. One alert per stall: the next alert needs a new
step first. ``ranks_alive=False`` never alerts (a dead rank is its own alert, not a hang).

Node heartbeats (several nodes): ``observe_heartbeat(node_rank, t, host, step)`` for every
node a ``heartbeats`` event names (a host only the first time: the last one is kept); ``expected_nodes`` says how many there are. An alert names each node whose
last heartbeat is older than ``heartbeat_silent_s`` (or that never sent one) as silent, and each
node whose last reported step is behind the others'; the ``nodes`` field lists them all.

``relaunch_env()`` is the environment for "relaunch with these settings": NCCL INFO logging
of init and collectives, optionally with the network plugin disabled and a socket interface.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

from cockpit.comm.flight import FLIGHT_ENV

# NCCL's INFO log of init and collectives, and PyTorch's flight recorder (each rank's last collectives,
# dumped into logs/ when one times out: cockpit.comm.flight; docs/rocm.md item 10)
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL", **FLIGHT_ENV}
NO_PLUGIN_ENV = {"NCCL_NET_PLUGIN": "none", "RCCL_NET_PLUGIN": "none"}

REMEDIES = (
    "Relaunch with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL and look at the last NCCL lines of each rank "
    "(the rank that never logged its collective is the one holding the others); the relaunch also keeps "
    "PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE): at the collective timeout the Comm line shows "
    "which collective each rank was in.",
    "Rule out the network plugin: relaunch with NCCL_NET_PLUGIN=none RCCL_NET_PLUGIN=none.",
    "Pin the network interface with NCCL_SOCKET_IFNAME (e.g. NCCL_SOCKET_IFNAME=eth0; see `ip -br addr`).",
    "Disable NUMA balancing, a known cause of ROCm stalls: echo 0 > /proc/sys/kernel/numa_balancing (as root).",
)


def relaunch_env(disable_plugin: bool = False, socket_ifname: str | None = None) -> dict[str, str]:
    env = dict(DEBUG_ENV)
    if disable_plugin:
        env.update(NO_PLUGIN_ENV)
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = socket_ifname
    return env


class HangWatchdog:
    def __init__(
        self,
        floor_s: float,
        factor: float = 5.0,
        window: int = 50,
        start_t: float | None = None,
        load_timeout_s: float | None = None,
        expected_nodes: int = 1,
        heartbeat_silent_s: float = 60.0,
    ):
        if floor_s <= 0 or factor <= 0 or (load_timeout_s is not None and load_timeout_s <= 0):
            raise ValueError("floor_s, factor and load_timeout_s must be positive")
        self.floor_s = float(floor_s)
        self.factor = float(factor)
        self.load_timeout_s = float(load_timeout_s) if load_timeout_s is not None else self.floor_s
        self.expected_nodes = int(expected_nodes)
        self.heartbeat_silent_s = float(heartbeat_silent_s)
        self._intervals: deque[float] = deque(maxlen=window)
        self.last_step: int | None = None
        self.last_step_t: float | None = None
        self._reference_t = start_t
        self._alerted_for: float | None = None
        self.training_ended = False
        self.heartbeats: dict[int, dict[str, Any]] = {}  # node_rank -> {t, host, step}

    def observe_heartbeat(self, node_rank: int, t: float, host: str | None = None, step: int | None = None) -> None:
        last = self.heartbeats.get(int(node_rank))
        if last is not None and t < last["t"]:
            return  # replayed
        host = host if host is not None else (last or {}).get("host")  # heartbeats name a host once
        self.heartbeats[int(node_rank)] = {"t": float(t), "host": host, "step": step}

    def observe_train_end(self, t: float) -> None:
        """Training is over (save, probes after): back to the load timeout, from ``t``."""
        self.training_ended = True
        self._reference_t = t

    @property
    def phase(self) -> str:
        if self.training_ended:
            return "wrapup"
        return "train" if self.last_step is not None else "load"

    def observe_step(self, step: int, t: float) -> None:
        if self.last_step is not None and step <= self.last_step:
            return  # a replayed or duplicate step event
        self.training_ended = False
        if self.last_step_t is not None and t > self.last_step_t:
            self._intervals.append(t - self.last_step_t)
        self.last_step, self.last_step_t = step, t
        self._reference_t = t

    def median_step_s(self) -> float | None:
        return statistics.median(self._intervals) if self._intervals else None

    def threshold_s(self) -> float:
        if self.phase != "train":
            return self.load_timeout_s
        median = self.median_step_s()
        return max(self.factor * median, self.floor_s) if median is not None else self.floor_s

    def check(
        self, now: float, ranks_alive: bool, last_lines: Mapping[int, str] | None = None
    ) -> dict[str, Any] | None:
        if self._reference_t is None:
            self._reference_t = now
        if not ranks_alive:
            return None
        stalled = now - self._reference_t
        threshold = self.threshold_s()
        if stalled <= threshold or self._alerted_for == self._reference_t:
            return None
        self._alerted_for = self._reference_t
        return self._alert(now, stalled, threshold, last_lines or {})

    def node_report(self, now: float) -> tuple[list[dict[str, Any]], list[str]]:
        """Every expected node's heartbeat age and step, and sentences naming the silent ones
        and those behind the others (empty with one node and no heartbeats)."""
        nodes_seen = set(self.heartbeats)
        if self.expected_nodes <= 1 and not nodes_seen:
            return [], []
        steps = [h["step"] for h in self.heartbeats.values() if h.get("step") is not None]
        lead = max(steps) if steps else None
        report, words = [], []
        for node in sorted(set(range(self.expected_nodes)) | nodes_seen):
            hb = self.heartbeats.get(node)
            if hb is None:
                report.append({"node_rank": node, "host": None, "heartbeat_age_s": None, "step": None, "silent": True})
                words.append(f"node {node} silent: no heartbeat at all")
                continue
            age = max(0.0, now - hb["t"])
            silent = age > self.heartbeat_silent_s
            host = f" ({hb['host']})" if hb.get("host") else ""
            at = f", last at step {hb['step']}" if hb.get("step") is not None else ""
            report.append(
                {
                    "node_rank": node,
                    "host": hb.get("host"),
                    "heartbeat_age_s": round(age, 1),
                    "step": hb.get("step"),
                    "silent": silent,
                }
            )
            if silent:
                words.append(f"node {node}{host} silent: no heartbeat for {age:.0f} s{at}")
            elif lead is not None and hb.get("step") is not None and hb["step"] < lead:
                words.append(f"node {node}{host} behind: at step {hb['step']} while another node is at {lead}")
        return report, words

    def _alert(self, now: float, stalled: float, threshold: float, last_lines: Mapping[int, str]) -> dict[str, Any]:
        median = self.median_step_s()
        if self.phase != "train":
            why = f"load timeout {self.load_timeout_s:g} s: loading, setup and probes are not hangs"
        elif median is not None:
            why = f"max({self.factor:g} x median step {median:.1f} s, floor {self.floor_s:g} s)"
        else:
            why = f"floor {self.floor_s:g} s, no step timing yet"
        since = {
            "load": "since the start, before any step",
            "wrapup": f"since training ended at step {self.last_step}",
            "train": f"since step {self.last_step}",
        }[self.phase]
        ranks = [{"rank": r, "last_line": (last_lines[r] or "").strip()[-300:]} for r in sorted(last_lines)]
        lines = "; ".join(f"rank {e['rank']}: {e['last_line'] or '(nothing logged)'}" for e in ranks)
        nodes, node_words = self.node_report(now)
        what = "No training step" if self.phase != "wrapup" else "No progress"
        message = f"{what} for {stalled:.0f} s {since} (threshold {threshold:.0f} s = {why}) while all ranks are alive."
        if node_words:
            message += " " + "; ".join(node_words) + "."
        if lines:
            message += f" Last lines: {lines}"
        alert = {
            "level": "error",
            "code": "hang",
            "message": message,
            "remedies": list(REMEDIES),
            "ranks": ranks,
            "stalled_s": round(stalled, 1),
            "threshold_s": round(threshold, 1),
            "last_step": self.last_step,
            "phase": self.phase,
            "relaunch_env": relaunch_env(),
        }
        if nodes:
            alert["nodes"] = nodes
            alert["silent_nodes"] = [n["node_rank"] for n in nodes if n["silent"]]
        return alert
