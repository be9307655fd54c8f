"""Host RAM at model load, per node: the planner's ``host`` line (pure, no torch).

What each rank holds in host memory while the model is built, before training moves on:

- DDP, ZeRO-1/2, no strategy, QLoRA: every rank builds the whole model on the host first, so a
  node needs ``ranks_per_node x model``.
- ZeRO-3 and FSDP2 (``full_shard`` / ``hybrid_shard``), as cockpit loads them
  (:mod:`cockpit.train.sharded_load`): the model is built partitioned (zero.Init) or on the meta
  device, and rank 0 streams the checkpoint in groups of ``GROUP_BYTES``; each rank keeps only
  its shard, on the host when the run is on the CPU or offloads parameters, else on its GPU. A
  node needs at most one copy: ``ranks_per_node / world x model`` of shards plus one group.

Plus ``PROCESS_BYTES`` per rank for the process itself (Python, torch, the GPU runtime's host
side; measured here: 0.6 GiB for a CPU torch + transformers process, more with ROCm's libraries).
The figure is a resident-set count (what ``VmHWM`` measures): pages of a memory-mapped
checkpoint count in every rank that reads them, although the kernel shares them between ranks
when the file's dtype is the training dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cockpit.plan.verdict import verdict

GiB = 1024**3
GROUP_BYTES = 64 * 2**20  # cockpit.train.sharded_load.GROUP_BYTES (kept equal by tests/test_plan_host.py)
PROCESS_BYTES = 1.0 * GiB


def machine_ram_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20  # kB -> GiB
    except OSError:
        return None
    return None


def load_bytes_per_param(cfg: Mapping[str, Any], use_cpu: bool) -> int:
    """The dtype the ranks load the base weights in (cockpit.train.model.base_load_kwargs's rule)."""
    half = bool(cfg.get("bf16") or cfg.get("fp16"))
    if cfg.get("quantization_bit"):
        return 2  # read in 16 bits, quantized as it moves to the GPU
    return 2 if (cfg.get("finetuning_type", "lora") == "lora" and half and not use_cpu) else 4


def sharded_load(run: Any) -> bool:
    """Does cockpit load this run partitioned (ZeRO-3 / FSDP2 full or hybrid shard, several ranks)?"""
    if run.world < 2 or run.quantization_bit:
        return False
    if run.zero is not None:
        return run.zero.stage == 3
    return run.fsdp is not None and run.fsdp.strategy in ("full_shard", "hybrid_shard")


def host_load(
    cfg: Mapping[str, Any], run: Any, total_params: int, *, use_cpu: bool, host_memory_gib: float | None
) -> dict[str, Any]:
    """The load-time host peak per node for the run's strategy, and its verdict."""
    model = total_params * load_bytes_per_param(cfg, use_cpu)
    ranks = int(run.nproc_per_node)
    if sharded_load(run):
        on_host = (
            use_cpu or (run.zero is not None and run.zero.offload_param) or (run.fsdp is not None and run.fsdp.offload)
        )
        weights = (model * ranks / run.world if on_host else 0.0) + GROUP_BYTES
        pattern = f"sharded: rank 0 streams the checkpoint, each of {ranks} ranks keeps 1/{run.world}" + (
            " on the host" if on_host else " on its GPU"
        )
    else:
        weights = float(model * ranks)
        pattern = f"every one of {ranks} ranks builds the whole model on the host"
    peak = weights + ranks * PROCESS_BYTES
    out: dict[str, Any] = {
        "peak_bytes": int(peak),
        "peak_gib": round(peak / GiB, 2),
        "model_bytes": int(model),
        "ranks_per_node": ranks,
        "pattern": pattern,
        "capacity_gib": host_memory_gib,
        "verdict": None,
    }
    if host_memory_gib:
        out["verdict"] = verdict(peak, host_memory_gib * GiB)
    return out
