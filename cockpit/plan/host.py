"""Host RAM at model load, per node: the planner's ``host`` line (pure, no torch).

What each rank holds in host memory while the model is built, before training moves on:

- DDP, ZeRO-1/2, no strategy, QLoRA: every rank builds the whole model on the host first, so a
  node needs ``ranks_per_node x model``.
- ZeRO-3 and FSDP2 (``full_shard`` / ``hybrid_shard``), as cockpit loads them
  (:mod:`cockpit.train.sharded_load`): the model is built partitioned (zero.Init) or on the meta
  device, and each rank reads its own part of every tensor from the checkpoint, ``READ_BYTES`` at
  a time; each rank keeps only its shard, on the host when the run is on the CPU or offloads
  parameters, else on its GPU. A node needs at most one copy: ``ranks_per_node / world x model``
  of shards plus a read buffer per rank. Under FSDP2 an adapter whose init reads the base (DoRA,
  PiSSA, a trained adapter, modules_to_save) is made by rank 0 building the whole model once.

Plus ``PROCESS_BYTES`` per rank for the process itself (Python, torch, the GPU runtime's host
side; measured here: 0.6 GiB for a CPU torch + transformers process, more with ROCm's libraries).
The figure is a resident-set count (what ``VmHWM`` measures): pages of a memory-mapped
checkpoint count in every rank that reads them, although the kernel shares them between ranks
when the file's dtype is the training dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cockpit.config.schema import ADAPTER_METHODS
from cockpit.models.weights import (
    Weights,
    adapter_init_reads_base,
    planned_weights,
    sharded_load_mode,
    strategy_shards_load,
)
from cockpit.plan.verdict import verdict

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

GiB = 1024**3
READ_BYTES = 16 * 2**20  # cockpit.train.sharded_load.READ_BYTES (kept equal by tests/test_plan_host.py)
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


def load_bytes_per_param(cfg: RunConfig, use_cpu: bool) -> int:
    """The dtype the ranks load the base weights in (cockpit.train.model.base_load_kwargs's rule)."""
    half = bool(cfg.bf16 or cfg.fp16)
    if cfg.pure_bf16:
        return 2  # every weight in bf16
    if cfg.quantization_bit:
        return 2  # read in 16 bits, quantized as it moves to the GPU
    return 2 if (cfg.finetuning_type in ADAPTER_METHODS and half and not use_cpu) else 4


def strategy_facts(run: Any) -> dict[str, Any]:
    """What the load rule (:mod:`cockpit.models.weights`) asks of a run, from the planner's view of it."""
    return {
        "world_size": run.world,
        "quantized": bool(run.quantization_bit),
        "fsdp": run.fsdp is not None,
        "zero3": run.zero is not None and run.zero.stage == 3,
    }


def shard_count(run: Any) -> int:
    """Over how many ranks one copy of the model is split at load: hybrid_shard splits it within a node."""
    if run.fsdp is not None and run.fsdp.strategy == "hybrid_shard" and run.nnodes > 1:
        return int(run.nproc_per_node)
    return int(run.world)


def host_load(
    cfg: RunConfig,
    run: Any,
    total_params: int,
    *,
    use_cpu: bool,
    host_memory_gib: float | None,
    weights: Weights | None = None,
) -> dict[str, Any]:
    """The load-time host peak per node for the run's strategy, and its verdict; ``weights``: where
    the model's files are (default: :func:`cockpit.models.weights.planned_weights`)."""
    weights = weights if weights is not None else planned_weights(cfg)
    model = total_params * load_bytes_per_param(cfg, use_cpu)
    ranks = int(run.nproc_per_node)
    mode = sharded_load_mode(weights, **strategy_facts(run))
    if mode != "full":
        on_host = (
            use_cpu or (run.zero is not None and run.zero.offload_param) or (run.fsdp is not None and run.fsdp.offload)
        )
        shards = shard_count(run)
        weights_bytes = (model * ranks / shards if on_host else 0.0) + ranks * READ_BYTES
        pattern = f"sharded: each of {ranks} ranks reads and keeps its 1/{shards} of the checkpoint" + (
            " on the host" if on_host else " on its GPU"
        )
        if mode == "fsdp_meta" and adapter_init_reads_base(cfg):
            weights_bytes += model
            pattern += "; rank 0 builds the whole model once for the adapter's init (it reads the base)"
        if weights.pending:
            pattern += " (the ranks fetch the hub id's safetensors first)"
    else:
        weights_bytes = float(model * ranks)
        pattern = f"every one of {ranks} ranks builds the whole model on the host"
        if strategy_shards_load(**strategy_facts(run)) and weights.why_whole:
            pattern += f" ({weights.why_whole})"
    peak = weights_bytes + ranks * PROCESS_BYTES
    out: dict[str, Any] = {
        "peak_bytes": int(peak),
        "peak_gib": round(peak / GiB, 2),
        "model_bytes": int(model),
        "ranks_per_node": ranks,
        "pattern": pattern,
        "load": mode,
        "capacity_gib": host_memory_gib,
        "verdict": None,
    }
    if host_memory_gib:
        out["verdict"] = verdict(peak, host_memory_gib * GiB)
    return out
