"""Per-rank process statistics with psutil (always available; the ``cpu`` backend).

``RankProcesses(rank_pids).sample()`` -> ``[{rank, pid, alive, rss_mb, cpu_pct}]``:

- ``rss_mb``: resident set size of the rank process itself (``memory_info().rss``, bytes ->
  MiB); data-loader worker children are not added (shared pages would be counted twice).
- ``cpu_pct``: ``psutil.Process.cpu_percent(None)``, percent of one core since the previous
  call on the same Process object (can exceed 100 with several threads). psutil returns a
  meaningless 0.0 on the first call, so the first sample of a pid reports None.
- a pid that is gone reports ``alive: False`` and None values.
"""

from __future__ import annotations

from typing import Any

import psutil

from cockpit.telemetry.base import mib


class CpuBackend:
    """The backend when no GPU library works: no device records."""

    name = "cpu"
    device_count = 0

    def devices(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


class RankProcesses:
    def __init__(self, rank_pids: dict[int, int] | None = None):
        self._procs: dict[int, psutil.Process] = {}
        self._primed: set[int] = set()
        self.rank_pids: dict[int, int] = {}
        self.set_pids(rank_pids or {})

    def set_pids(self, rank_pids: dict[int, int]) -> None:
        """Replace the rank -> pid map (after a restart); keeps state for unchanged pids."""
        self.rank_pids = {int(r): int(p) for r, p in rank_pids.items()}
        live = set(self.rank_pids.values())
        for pid in list(self._procs):
            if pid not in live:
                self._procs.pop(pid, None)
                self._primed.discard(pid)

    def _process(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            proc = psutil.Process(pid)
            self._procs[pid] = proc
        return proc

    def sample_one(self, rank: int, pid: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"rank": rank, "pid": pid, "alive": False, "rss_mb": None, "cpu_pct": None}
        try:
            proc = self._process(pid)
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return entry
                entry["rss_mb"] = mib(proc.memory_info().rss)
                cpu = proc.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError):
            self._procs.pop(pid, None)
            self._primed.discard(pid)
            return entry
        entry["alive"] = True
        if pid in self._primed:
            entry["cpu_pct"] = round(cpu, 1)
        else:
            self._primed.add(pid)
        return entry

    def sample(self) -> list[dict[str, Any]]:
        return [self.sample_one(rank, pid) for rank, pid in sorted(self.rank_pids.items())]
