"""Communication health probe, run inside every training rank at run start.

Call on all ranks after ``torch.distributed.init_process_group`` (collective: every rank must
call it with the same arguments)::

    from cockpit.comm.health import allreduce_probe, backend_info
    info = backend_info()          # {"backend", "library", "version", "hip", "world_size", "rank", ...}
    probe = allreduce_probe()      # {"ok", "world_size", "backend", "results": [...]}
    if rank == 0: events.emit("comm", backend=..., version=..., world_size=..., status=...,
                              details={"probe": probe, "info": info})

Bandwidths follow the nccl-tests definitions (nccl-tests doc/PERFORMANCE.md), in GB/s
(10**9 bytes per second):

- ``algbw = size_bytes / time_s``
- ``busbw = algbw * 2 * (n - 1) / n`` for all-reduce (n = world size): the per-link traffic
  of an optimal ring, comparable with the hardware's link bandwidth.

``time_us`` is the mean time of one all-reduce, taken as the slowest rank's (MAX over
ranks), so every rank reports the same numbers. Each size is checked once for correctness
(every rank contributes rank+1; the sum must be n(n+1)/2) before timing.

torch is imported inside the functions only: this module is importable by the supervisor.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

MB = 2**20
DEFAULT_SIZES = (1 * MB, 4 * MB, 16 * MB, 64 * MB)


def busbw_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(n-1)/n (0 for a single rank)."""
    return 2.0 * (world_size - 1) / world_size if world_size > 0 else 0.0


def bandwidths(size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one all-reduce of ``size_bytes`` that took ``time_s``."""
    if time_s <= 0:
        return 0.0, 0.0
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * busbw_factor(world_size)


def backend_info() -> dict[str, Any]:
    """What carries the collectives of the default process group."""
    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {
        "initialized": dist.is_available() and dist.is_initialized(),
        "backend": None,
        "library": None,
        "version": None,
        "hip": getattr(torch.version, "hip", None),
        "cuda": getattr(torch.version, "cuda", None),
        "world_size": None,
        "rank": None,
        "torch": torch.__version__,
    }
    if not info["initialized"]:
        return info
    backend = str(dist.get_backend()).lower()
    info["backend"], info["world_size"], info["rank"] = backend, dist.get_world_size(), dist.get_rank()
    if "nccl" in backend:
        info["library"] = "rccl" if info["hip"] else "nccl"  # ROCm builds link RCCL under the nccl name
        try:
            version = torch.cuda.nccl.version()
            info["version"] = ".".join(str(p) for p in version) if isinstance(version, tuple) else str(version)
        except Exception:  # noqa: BLE001 - the NCCL version is informational; any torch build may lack it
            info["version"] = None
    else:
        info["library"] = backend
    return info


def allreduce_probe(
    sizes_bytes: Sequence[int] = DEFAULT_SIZES, iters: int = 10, warmup: int = 2, group: Any = None
) -> dict[str, Any]:
    """Time float32 all-reduces (SUM) of each size over the default (or given) group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {"ok": False, "error": "torch.distributed is not initialized", "results": []}
    backend = str(dist.get_backend(group)).lower()
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    results = []
    all_ok = True
    for size in sizes_bytes:
        numel = max(1, int(size) // 4)
        buf = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(buf, group=group)
        sync()
        expected = world * (world + 1) / 2
        ok = bool(torch.all(buf == expected).item())
        all_ok = all_ok and ok
        for _ in range(warmup):
            dist.all_reduce(buf, group=group)
        sync()
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf, group=group)
        sync()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        per_op = float(elapsed.item()) / max(1, iters)
        size_bytes = numel * 4
        algbw, busbw = bandwidths(size_bytes, per_op, world)
        results.append(
            {
                "size_bytes": size_bytes,
                "time_us": round(per_op * 1e6, 1),
                "algbw_gbps": round(algbw, 3),
                "busbw_gbps": round(busbw, 3),
                "ok": ok,
            }
        )
    return {"ok": all_ok, "backend": backend, "world_size": world, "iters": iters, "results": results}
