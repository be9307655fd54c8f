"""Memory seen from inside a training rank through torch (the ``torch`` backend).

These functions run in the ranks (which import torch anyway); torch is imported inside them
so that importing ``cockpit.telemetry`` stays torch-free for the supervisor and the UI.

- :func:`rank_memory_stats` -> ``{allocated_mb, reserved_mb, peak_mb, rss_mb}``: the caching
  allocator's ``memory_allocated`` / ``memory_reserved`` / ``max_memory_allocated`` (bytes ->
  MiB) for the rank's device, and the process RSS. On CPU the allocator values are None. This
  is the per-rank ``mem`` entry of the ``step`` event.
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


def rank_memory_stats(device: Any = None) -> dict[str, float | None]:
    import torch

    stats: dict[str, float | None] = {"allocated_mb": None, "reserved_mb": None, "peak_mb": None, "rss_mb": _rss_mb()}
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        stats["allocated_mb"] = mib(torch.cuda.memory_allocated(device))
        stats["reserved_mb"] = mib(torch.cuda.memory_reserved(device))
        stats["peak_mb"] = mib(torch.cuda.max_memory_allocated(device))
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
