"""A rank's private memory: ``RssAnon`` (anonymous pages: its heap and tensors), sampled by a
thread from the rank's start, with its peak so far.

VmHWM counts the pages of memory-mapped checkpoint files too, which are page cache shared by every
rank of a node (and dropped under pressure), so it overstates what a sharded load saves; RssAnon
is what fills a node. The kernel keeps no high-water mark for it, hence the sampling
(every ``INTERVAL_S``: a read of /proc/self/status, some tens of microseconds).
"""

from __future__ import annotations

import threading

INTERVAL_S = 0.02


def status_mb(field: str, status_path: str = "/proc/self/status") -> float | None:
    """A memory field of /proc's status file (``VmHWM``, ``RssAnon``...) in MiB, or None where absent."""
    try:
        with open(status_path, encoding="ascii") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        return None
    return None


def rss_anon_mb(status_path: str = "/proc/self/status") -> float | None:
    """This process's anonymous resident memory (``RssAnon``) in MiB."""
    return status_mb("RssAnon", status_path)


class PrivatePeak:
    """The highest RssAnon seen since :meth:`start` (None before, or without /proc)."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.peak_mb: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> float | None:
        now = rss_anon_mb()
        if now is not None and (self.peak_mb is None or now > self.peak_mb):
            self.peak_mb = now
        return self.peak_mb

    def start(self) -> PrivatePeak:
        if self._thread is None and self.sample() is not None:
            self._thread = threading.Thread(target=self._run, name="cockpit-rss-anon", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


PEAK = PrivatePeak()  # the rank's own, started by the worker


def trace(label: str) -> None:
    """With ``COCKPIT_TRACE_RSS=FILE`` set, append this rank's RssAnon now and its sampled peak so
    far at ``label`` to FILE (a debugging aid for load-memory work: bench/sharded_load_memory.py)."""
    import os

    path = os.environ.get("COCKPIT_TRACE_RSS")
    if not path:
        return
    rank = os.environ.get("RANK", "0")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"rank {rank} {label:<32} now {rss_anon_mb()} peak {PEAK.sample()}\n")


def return_freed_memory() -> None:
    """Collect garbage, then ask glibc to hand its free heap pages back to the system
    (``malloc_trim``): memory freed in small blocks (a tokenizer's, say) otherwise stays this
    rank's private memory. Nothing happens where glibc is absent."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
