"""Memory seen from inside a training rank through torch (the ``torch`` backend).

These functions run in the ranks (which import torch anyway); torch is imported inside them
so that importing ``cockpit.telemetry`` stays torch-free for the supervisor and the UI.

- :func:`rank_memory_stats` -> ``{allocated_mb, reserved_mb, peak_mb, rss_mb, capacity_mb,
  source}``: the caching allocator's ``memory_allocated`` / ``memory_reserved`` /
  ``max_memory_allocated`` (bytes -> MiB) for the rank's device, the device's total memory and
  the process RSS; ``source`` "torch.cuda" (ROCm's HIP devices answer the same calls). With
  ``reset_peak`` the peak is reset after reading, so ``peak_mb`` is the peak since the previous
  call (the previous logging step). On the CPU there is no device allocator: ``source`` "rss"
  (allocator values None, capacity the host's RAM), or "live_tensors" when a
  ``plan/measure.py`` tracker is given: allocated = live tensor bytes, peak = their high-water
  mark since the previous call, reserved None (no caching allocator), capacity the host's RAM.
  This is the per-rank ``mem`` entry of the ``step`` event.
- :func:`torch_device_memory` -> one device record (``base.DEVICE_KEYS``) from
  ``torch.cuda.mem_get_info`` (free/total bytes for the whole device, all processes), for the
  supervisor to show when neither amdsmi nor NVML works. Only the rank's own device is
  queried: touching another device would create a context (hundreds of MiB) on it.
"""

from __future__ import annotations

import os
from typing import Any

from cockpit.telemetry.base import empty_device, mib


def _rss_mb() -> float | None:
    try:
        import psutil

        return mib(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:
        return None


def _host_ram_mb() -> float | None:
    try:
        import psutil

        return mib(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - a figure we may not get is None
        return None


def rank_memory_stats(device: Any = None, tracker: Any = None, reset_peak: bool = False) -> dict[str, Any]:
    import torch

    stats: dict[str, Any] = {
        "allocated_mb": None,
        "reserved_mb": None,
        "peak_mb": None,
        "rss_mb": _rss_mb(),
        "capacity_mb": None,
        "source": "rss",
    }
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        stats["allocated_mb"] = mib(torch.cuda.memory_allocated(device))
        stats["reserved_mb"] = mib(torch.cuda.memory_reserved(device))
        stats["peak_mb"] = mib(torch.cuda.max_memory_allocated(device))
        index = (
            torch.cuda.current_device()
            if device is None or torch.device(device).index is None
            else torch.device(device).index
        )
        stats["capacity_mb"] = mib(torch.cuda.get_device_properties(index).total_memory)
        stats["source"] = "torch.cuda"
        if reset_peak:
            torch.cuda.reset_peak_memory_stats(device)
        return stats
    stats["capacity_mb"] = _host_ram_mb()
    if tracker is not None:
        stats["allocated_mb"] = mib(tracker.live)
        stats["peak_mb"] = mib(tracker.peak)
        stats["source"] = "live_tensors"
        if reset_peak:
            tracker.reset_peak()
    return stats


def torch_device_memory(device: Any = None) -> dict[str, Any] | None:
    """The rank's GPU as a device record, or None on a CPU-only torch."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device is None else torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    props = torch.cuda.get_device_properties(index)
    record = empty_device(index, props.name)
    record["vram_used_mb"] = mib(total - free)
    record["vram_total_mb"] = mib(total)
    record["gfx_target"] = getattr(props, "gcnArchName", None) or None  # ROCm builds only
    record["compute_units"] = getattr(props, "multi_processor_count", None)
    return record


def start_node_telemetry(
    interval_s: float | None, nnodes: int | None, rank: int, local_rank: int, node_rank: int, host: str, emit: Any
) -> Any:
    """In local rank 0 of every node of a torchrun job: the node's reporter thread (and in global
    rank 0 its collector, emitting through ``emit``), over a client of the rendezvous store at
    ``MASTER_ADDR:MASTER_PORT`` (see :mod:`cockpit.telemetry.node`). None when telemetry is off,
    for other local ranks and for single-process runs; never raises. ``interval_s`` and ``nnodes``: the run config's
    ``telemetry_interval_s`` and ``nnodes``."""
    from datetime import timedelta

    from cockpit.telemetry import node, select_backend

    interval = float(interval_s or 0)
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if interval <= 0 or local_rank != 0 or not addr or not port or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    try:
        from torch.distributed import TCPStore

        store = TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=60))
        backend, unavailable = select_backend() if node_rank != 0 else (None, {})  # node 0: the supervisor samples
        if backend is not None and backend.name == "cpu":
            backend = None
        reporter = node.NodeReporter(store, node_rank, host, backend, unavailable)
        collector = node.NodeCollector(store, int(nnodes or 1), own_node=node_rank) if rank == 0 else None
        node.ACTIVE = node.NodeThread(reporter, collector, emit if rank == 0 else None, interval).start()
    except Exception as exc:  # noqa: BLE001 - telemetry must never take a run down
        print(f"node telemetry disabled: {type(exc).__name__}: {exc}", flush=True)
        return None
    return node.ACTIVE
