"""GPU and rank-process telemetry: one probe interface, backends chosen at run time.

For the supervisor (no torch; call from its loop at about 1 Hz)::

    from cockpit.telemetry import Sampler
    sampler = Sampler({0: pid0, 1: pid1}, interval_s=1.0, threaded=True)
    ...
    snap = sampler.maybe_sample()       # None until interval_s has passed since the last one
    if snap is not None:
        events.emit("telemetry", **snap)
    sampler.set_pids({...})             # after ranks restart
    sampler.close()

``Sampler.sample(torch_devices=None) -> dict`` always measures; the dict is the ``telemetry``
event of ``cockpit/store/events.py``::

    {"backend": "amdsmi" | "nvml" | "torch" | "cpu",
     "devices": [{index, name, vram_used_mb, vram_total_mb, util_pct, temp_c, power_w, ...}],
     "ranks":   [{rank, pid, alive, rss_mb, cpu_pct, gpu?, gpu_vram_mb?}],
     "unavailable": {backend: short human reason}}

Units: MiB, percent, degrees Celsius, watts (see each backend's docstring for the source).
``ranks[i].gpu`` / ``gpu_vram_mb``: the device whose process list holds the rank's pid
(amdsmi/NVML only). ``torch_devices``: device records the ranks reported through
:func:`torch_device_memory` (e.g. carried in their events); shown, with backend "torch", only
when neither amdsmi nor NVML works.

``threaded=True`` (the supervisor): the GPU library is called by a :class:`DeviceCollector`
thread, and a sample takes its latest answer without waiting. A driver call that hangs (typical of
the GPU hangs the watchdog exists for) then never freezes the supervisor's loop: stop / kill
handling, status writes and the hang alert go on, and after ``deadline_s`` the sample says the
backend is failing (``unavailable``: "sampling failed: … has not returned for N s").

Backends (``select_backend()``): amdsmi (AMD), then NVML (NVIDIA), then cpu (psutil only).
Import and initialisation failures never raise, hang (init runs with a timeout) or print to
stdout; each one becomes a reason in ``unavailable``.

For the training ranks (these import torch inside the function): :func:`rank_memory_stats`,
:func:`torch_device_memory`, and ``torch_backend.start_node_telemetry`` (every node's GPUs and
heartbeat through the rendezvous store, :mod:`cockpit.telemetry.node`). The memory-pressure
alert over the ranks' figures is :mod:`cockpit.telemetry.pressure` (pure).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from cockpit.telemetry.amd import AmdSmiBackend
from cockpit.telemetry.cpu import CpuBackend, RankProcesses
from cockpit.telemetry.nvml import NvmlBackend
from cockpit.telemetry.torch_backend import rank_memory_stats, torch_device_memory

__all__ = [
    "AmdSmiBackend",
    "CpuBackend",
    "NvmlBackend",
    "RankProcesses",
    "Sampler",
    "rank_memory_stats",
    "select_backend",
    "torch_device_memory",
]

BACKEND_ORDER = ("amdsmi", "nvml")


def select_backend(
    amdsmi_module: Any = None, nvml_module: Any = None, order: tuple[str, ...] = BACKEND_ORDER
) -> tuple[Any, dict[str, str]]:
    """The first GPU backend that works, else :class:`CpuBackend`; plus why the others are not.

    ``amdsmi_module`` / ``nvml_module``: initialised stand-ins (tests); None loads the real
    libraries; ``$COCKPIT_FAKE_GPUS`` (``amdsmi:8``, ``nvml:2``) selects fakes instead
    (:func:`cockpit.telemetry.fakes.fake_from_env`). Returns ``(backend, unavailable)`` with ``unavailable`` mapping each backend
    that was tried and failed, or not tried because an earlier one won, to a short reason.
    """
    import os

    from cockpit.telemetry.fakes import FAKE_ENV, fake_from_env

    fake = fake_from_env(os.environ.get(FAKE_ENV)) if amdsmi_module is None and nvml_module is None else None
    if fake is not None:  # tests and demos without GPUs: fakes pinned to the real APIs
        amdsmi_module, nvml_module = (fake[1], None) if fake[0] == "amdsmi" else (None, fake[1])
        order = (fake[0],)
    openers = {
        "amdsmi": lambda: AmdSmiBackend.open(amdsmi_module),
        "nvml": lambda: NvmlBackend.open(nvml_module),
    }
    unavailable: dict[str, str] = {}
    chosen: Any = None
    for name in order:
        if chosen is not None:
            unavailable[name] = f"not tried: {chosen.name} is active"
            continue
        backend, reason = openers[name]()
        if backend is None:
            unavailable[name] = reason or "unavailable"
        else:
            chosen = backend
    return (chosen or CpuBackend()), unavailable


class DeviceCollector:
    """``backend.devices()`` every ``interval_s`` in a daemon thread; :meth:`latest` never waits.
    A call that has not returned for ``deadline_s`` is reported as a failure (the thread stays
    blocked in the driver; nothing else does)."""

    def __init__(self, backend: Any, interval_s: float, deadline_s: float) -> None:
        self.backend, self.interval_s, self.deadline_s = backend, interval_s, deadline_s
        self._lock = threading.Lock()
        self._latest: tuple[list[dict[str, Any]], str | None] = ([], None)
        self._calling_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry-collector", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._calling_since = time.monotonic()
            try:
                result: tuple[list[dict[str, Any]], str | None] = (self.backend.devices(), None)
            except Exception as exc:  # noqa: BLE001 - a library that worked at start and fails now
                result = ([], f"sampling failed: {type(exc).__name__}: {exc}"[:160])
            with self._lock:
                self._latest, self._calling_since = result, None
            self._stop.wait(self.interval_s)

    def latest(self, now: float | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """(the last devices answered, the failure to report or None)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            devices, error = self._latest
            since = self._calling_since
        if since is not None and now - since > self.deadline_s:
            name = getattr(self.backend, "name", "the GPU library")
            return [], f"sampling failed: {name}'s driver call has not returned for {now - since:.0f} s (a GPU hang?)"
        return devices, error

    @property
    def hung(self) -> bool:
        return self.latest()[1] is not None and self._calling_since is not None

    def stop(self) -> None:
        self._stop.set()


class Sampler:
    def __init__(
        self,
        rank_pids: dict[int, int] | None = None,
        interval_s: float = 1.0,
        backend: Any = None,
        unavailable: dict[str, str] | None = None,
        threaded: bool = False,
        deadline_s: float | None = None,
    ):
        """``backend``/``unavailable``: an already selected backend (tests); otherwise
        :func:`select_backend` runs here (may take up to the amdsmi init timeout once).
        ``threaded``: the GPU library is called by a :class:`DeviceCollector` (the supervisor);
        ``deadline_s`` (default: 5 intervals, at least 10 s) before a call that has not returned
        is reported."""
        if backend is None:
            backend, unavailable = select_backend()
        self.backend = backend
        self.unavailable = dict(unavailable or {})
        self.interval_s = interval_s
        self.ranks = RankProcesses(rank_pids or {})
        self._last_t: float | None = None
        self.collector = (
            DeviceCollector(backend, interval_s, deadline_s or max(10.0, 5 * interval_s))
            if threaded and not isinstance(backend, CpuBackend)
            else None
        )

    def set_pids(self, rank_pids: dict[int, int]) -> None:
        self.ranks.set_pids(rank_pids)

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self._last_t is None or now - self._last_t >= self.interval_s

    def maybe_sample(self, now: float | None = None, torch_devices: list[dict[str, Any]] | None = None) -> dict | None:
        now = time.monotonic() if now is None else now
        if not self.due(now):
            return None
        return self.sample(torch_devices=torch_devices, now=now)

    def sample(self, torch_devices: list[dict[str, Any]] | None = None, now: float | None = None) -> dict[str, Any]:
        self._last_t = time.monotonic() if now is None else now
        backend_name = self.backend.name
        unavailable = dict(self.unavailable)
        devices, failure = self._devices()
        if failure:
            unavailable[backend_name] = failure
        if isinstance(self.backend, CpuBackend):
            if torch_devices:
                backend_name, devices = "torch", [dict(d) for d in torch_devices]
            else:
                unavailable["torch"] = "no device memory reported by the ranks yet"
        ranks = self.ranks.sample()
        owner = {p.get("pid"): (d["index"], p.get("vram_mb")) for d in devices for p in d.get("processes") or []}
        for entry in ranks:
            if entry["pid"] in owner:
                entry["gpu"], entry["gpu_vram_mb"] = owner[entry["pid"]]
        return {"backend": backend_name, "devices": devices, "ranks": ranks, "unavailable": unavailable}

    def _devices(self) -> tuple[list[dict[str, Any]], str | None]:
        if self.collector is not None:
            return self.collector.latest()
        try:
            return self.backend.devices(), None
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # a library that worked at start and fails now
            return [], f"sampling failed: {type(exc).__name__}: {exc}"[:160]

    def close(self) -> None:
        if self.collector is not None:
            self.collector.stop()
            if self.collector.hung:  # its thread is inside the driver: shutting the library down would wait too
                return
        self.backend.close()
