"""A rank's part in a multi-process run: the strategy's config (DeepSpeed filled and validated,
FSDP checked) before the model exists, the communication probe, and every rank's peak memory."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError
from cockpit.store.events import EventWriter
from cockpit.store.rundir import RunDir, atomic_write_json

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def apply_strategy(
    run: RunDir,
    cfg: RunConfig,
    model: Any,
    rank: int,
    world_size: int,
    local_rank: int,
    use_cpu: bool,
    n_rows: int,
    log: Callable[[str], object],
) -> tuple[RunConfig, bool]:
    """DeepSpeed: the config (user file or generated) filled as HF fills it, validated by DeepSpeed,
    written to RUN_DIR/ds_config.json. FSDP: a torch check. Returns (cfg, parameters sharded?)."""
    if cfg.fsdp:
        from cockpit.strategy.fsdp import check_torch

        if world_size < 2:
            raise InputError("fsdp: FSDP shards over several processes; set nproc_per_node (or nnodes) above 1")
        reason = check_torch()
        if reason:
            raise InputError(f"fsdp: {reason}")
        return cfg, True
    if not (cfg.deepspeed or cfg.zero_stage):
        return cfg, False
    from cockpit.strategy import deepspeed as ds

    source, name = ds.source({**cfg.keys_only(), "use_cpu": use_cpu})
    assert source is not None and name is not None  # deepspeed or zero_stage is set (above)
    micro, gas = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    steps = (
        cfg.max_steps
        if cfg.max_steps > 0
        else max(1, math.ceil(math.ceil(n_rows / (micro * world_size)) / gas * cfg.num_train_epochs))
    )
    hidden = getattr(getattr(model, "config", None), "hidden_size", None) or ds.hidden_size_of(cfg.model_name_or_path)
    filled = ds.effective(
        source, cfg.keys_only(), file=name, hidden_size=hidden, num_training_steps=steps, ws=world_size
    )
    if rank == 0:
        atomic_write_json(run.path / "ds_config.json", filled)
        log(
            f"DeepSpeed ZeRO-{(filled.get('zero_optimization') or {}).get('stage', 0)} config ({name}) validated; written to ds_config.json"
        )
    stage = int((filled.get("zero_optimization") or {}).get("stage", 0))
    return cfg.replace(deepspeed=source), stage == 3  # the config dict itself: HF's TrainingArguments take either


def skip_deepspeed_shm_build() -> None:
    """On the CPU, DeepSpeed's comm backend JIT-compiles its shared-memory all-reduce op
    (deepspeed_shm_comm) on first use: 154 s of C++ compile on a 2-core machine, before the first
    step. That op serves only ``inference_all_reduce`` (DeepSpeed's inference engine); training's
    collectives go through torch.distributed (gloo) either way. So a training rank does not build it.
    tests/test_strategy_deepspeed.py pins the DeepSpeed function this replaces."""
    import importlib

    # importlib: `import deepspeed.comm.torch as m` binds the torch package (deepspeed.comm re-exports it)
    ds_torch_comm: Any = importlib.import_module("deepspeed.comm.torch")
    ds_torch_comm.build_shm_op = lambda: None


def comm_health_probe(writer: EventWriter | None, use_cpu: bool, log: Callable[[str], object]) -> None:
    """All ranks: a timed all-reduce at a few sizes (the process group exists once the
    TrainingArguments are built); rank 0 records backend, version and bus bandwidth."""
    from cockpit.comm.env import comm_env
    from cockpit.comm.health import MB, allreduce_probe, backend_info

    info = backend_info()
    sizes = (1 * MB, 4 * MB, 16 * MB) if use_cpu else (1 * MB, 4 * MB, 16 * MB, 64 * MB)
    probe = allreduce_probe(sizes_bytes=sizes, iters=5)
    best = max((r.get("busbw_gbps") or 0.0 for r in probe.get("results", [])), default=0.0)
    log(
        f"comm probe: {info.get('library') or info.get('backend')} world {info.get('world_size')}, best bus bandwidth {best:.2f} GB/s"
    )
    if writer is not None:
        writer.emit(
            "comm",
            backend=info.get("library") or info.get("backend"),
            version=info.get("version"),
            world_size=info.get("world_size"),
            status="ok" if probe.get("ok") else "probe failed",
            details={"probe": probe, "info": info, "env": comm_env()},
        )


def report_peak_memory(
    run: RunDir, writer: EventWriter | None, rank: int, local_rank: int, phase: str, model: Any = None
) -> None:
    """Every rank: a ``rank_memory`` event with its peak resident memory so far: VmHWM, and the
    sampled peak of its private memory (RssAnon: :mod:`cockpit.train.private_memory`); with a
    vision-language ``model``, the parameters it holds per part (:func:`cockpit.train.vlm_ranks.parameters_held`)."""
    from cockpit.train.private_memory import PEAK
    from cockpit.train.sharded_load import peak_rss_mb

    fields = {
        "rank": rank,
        "local_rank": local_rank,
        "node_rank": int(os.environ.get("GROUP_RANK", "0")),
        "phase": phase,
        "vmhwm_mb": peak_rss_mb(),
        "rss_anon_peak_mb": PEAK.sample(),
    }
    if model is not None:
        from cockpit.train.vlm_ranks import parameters_held

        held = parameters_held(model)
        if held is not None:
            fields["parameters_held"] = held
    if writer is not None:
        writer.emit("rank_memory", **fields)
    else:
        with EventWriter(run.events_path) as own:
            own.emit("rank_memory", **fields)
