"""Hang watchdog: notices when training steps stop arriving while the ranks are still alive.

Pure logic (no clock, no I/O, no torch): the supervisor feeds it times. Usage::

    dog = HangWatchdog(floor_s=300, factor=5.0, start_t=time.time())
    dog.observe_step(step, t)                           # for every ``step`` event
    alert = dog.check(now, ranks_alive=True, last_lines={0: "...", 1: "..."})
    if alert:
        events.emit("alert", **alert)                   # level, code, message, remedies, ranks, ...

A stall is declared when no step arrived for longer than ``max(factor * median step time,
floor_s)``, counted from the last step (or from ``start_t`` / the first ``check`` before any
step). The median is over the last ``window`` step intervals, so one slow step (an eval, a
checkpoint) does not mask or cause an alert. One alert per stall: the next alert needs a new
step first. ``ranks_alive=False`` never alerts (a dead rank is its own alert, not a hang).

``relaunch_env()`` is the environment for "relaunch with these settings": NCCL INFO logging
of init and collectives, optionally with the network plugin disabled and a socket interface.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any, Mapping

DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL"}
NO_PLUGIN_ENV = {"NCCL_NET_PLUGIN": "none", "RCCL_NET_PLUGIN": "none"}

REMEDIES = (
    "Relaunch with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL and look at the last NCCL lines of each rank "
    "(the rank that never logged its collective is the one holding the others).",
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
    def __init__(self, floor_s: float, factor: float = 5.0, window: int = 50, start_t: float | None = None):
        if floor_s <= 0 or factor <= 0:
            raise ValueError("floor_s and factor must be positive")
        self.floor_s = float(floor_s)
        self.factor = float(factor)
        self._intervals: deque[float] = deque(maxlen=window)
        self.last_step: int | None = None
        self.last_step_t: float | None = None
        self._reference_t = start_t
        self._alerted_for: float | None = None

    def observe_step(self, step: int, t: float) -> None:
        if self.last_step is not None and step <= self.last_step:
            return  # a replayed or duplicate step event
        if self.last_step_t is not None and t > self.last_step_t:
            self._intervals.append(t - self.last_step_t)
        self.last_step, self.last_step_t = step, t
        self._reference_t = t

    def median_step_s(self) -> float | None:
        return statistics.median(self._intervals) if self._intervals else None

    def threshold_s(self) -> float:
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
        return self._alert(stalled, threshold, last_lines or {})

    def _alert(self, stalled: float, threshold: float, last_lines: Mapping[int, str]) -> dict[str, Any]:
        median = self.median_step_s()
        why = (
            f"max({self.factor:g} x median step {median:.1f} s, floor {self.floor_s:g} s)"
            if median is not None
            else f"floor {self.floor_s:g} s, no step timing yet"
        )
        since = f"since step {self.last_step}" if self.last_step is not None else "since the start, before any step"
        ranks = [{"rank": r, "last_line": (last_lines[r] or "").strip()[-300:]} for r in sorted(last_lines)]
        lines = "; ".join(f"rank {e['rank']}: {e['last_line'] or '(nothing logged)'}" for e in ranks)
        message = f"No training step for {stalled:.0f} s {since} (threshold {threshold:.0f} s = {why}) while all ranks are alive."
        if lines:
            message += f" Last lines: {lines}"
        return {
            "level": "error",
            "code": "hang",
            "message": message,
            "remedies": list(REMEDIES),
            "ranks": ranks,
            "stalled_s": round(stalled, 1),
            "threshold_s": round(threshold, 1),
            "last_step": self.last_step,
            "relaunch_env": relaunch_env(),
        }
