"""Memory planner: per-device peak memory of a fine-tuning run, before launch.

Public API (no torch import at module level; torch/transformers/peft are used lazily, on the
meta device only, and are optional):

    from cockpit.plan import plan
    result = plan({"model_name_or_path": "meta-llama/Llama-3.1-8B", "finetuning_type": "lora",
                   "bf16": True}, gpu_memory_gb=64)
    result.as_dict()   # breakdown terms, peak, verdict, suggestion
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cockpit.config.run_config import RunConfig
from cockpit.models.moe import ROUTER_NAMES
from cockpit.plan.catalogue import CATALOGUE, known_models, resolve_model_config
from cockpit.plan.estimate import Estimate, GiB, estimate
from cockpit.plan.params import count_lora, count_params, dims_of, resolve_targets
from cockpit.plan.spec import RunSpec, parse_run
from cockpit.plan.verdict import find_fix, verdict, worst

__all__ = ["plan", "estimate_config", "PlanResult", "GiB", "CATALOGUE", "known_models", "resolve_model_config"]


@dataclass
class PlanResult:
    model: str
    model_source: str
    run: RunSpec
    estimate: Estimate
    capacity_gib: float | None = None
    verdict: dict[str, Any] | None = None
    suggestion: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = {
            "model": self.model,
            "model_source": self.model_source,
            "precision": self.run.precision,
            "finetuning_type": self.run.finetuning_type,
            "data_parallel": self.run.world,
            **self.estimate.as_dict(),
        }
        d["capacity_gib"] = self.capacity_gib
        d["capacity_source"] = self.extra.get("capacity_source")
        d["host"] = self.extra.get("host")
        d["device"] = self.extra.get("device")
        d["verdict"] = self.verdict
        d["overall"] = self.extra.get("overall")
        d["suggestion"] = self.suggestion
        return d


def planning_config(config: Mapping[str, Any] | RunConfig, base_dir: str | None = None) -> RunConfig:
    """The run config the planner reads: ``config`` validated as ``cockpit check`` validates it, without
    the data (a plan reads none) or the files it names. A validated config is read as it is; a mapping
    spread from one (``{**cfg, **changes}``) is validated again, against its ``_base_dir``."""
    from cockpit.config.load import validate

    if isinstance(config, RunConfig):
        return config
    from cockpit.config.schema import SCHEMA

    raw = {  # a value at its default says nothing (and a default of null is not a value a user may write)
        k: v
        for k, v in config.items()
        if k not in ("_base_dir", "_notes") and (k not in SCHEMA or v != SCHEMA[k].default)
    }
    return validate(raw, base_dir=base_dir or config.get("_base_dir"), check_paths=False, for_plan=True)


def _apply_overrides(config: RunConfig, gpus: int | None) -> RunConfig:
    return config if gpus is None else config.replace(nproc_per_node=int(gpus), nnodes=1)


def estimate_config(
    config: Mapping[str, Any] | RunConfig, *, base_dir: str | None = None, use_meta: bool = True
) -> tuple[RunSpec, Estimate, str]:
    """Validate + estimate one config; returns (run, estimate, model config source)."""
    cfg = planning_config(config, base_dir)
    run = parse_run(cfg, base_dir)
    mcfg, src = resolve_model_config(run.model_name_or_path, revision=cfg.model_revision)
    if mcfg.get("_vlm_type"):  # a LLaVA attends per sample in no packed row: padded batches (data.packing)
        run = dataclasses.replace(run, packing=False)
    d = dims_of(mcfg)
    counts = count_params(mcfg, allow_meta=use_meta)
    lora, n_targets = 0, 0
    if run.finetuning_type == "lora":
        targets = resolve_targets(run.lora_target, counts.linear_names)
        every = str(run.lora_target or "all").strip().lower() == "all"
        if every and counts.experts:  # an MoE model: the experts adapted, the routers not (cockpit.train.moe)
            targets = [t for t in targets if t not in ROUTER_NAMES]
        n_targets = len(targets)
        lora, lsrc = count_lora(mcfg, targets, run.lora_rank, allow_meta=use_meta, experts=every)
    est = estimate(run, d, counts, lora, n_targets)
    if run.finetuning_type == "lora":
        est.params["lora_source"] = lsrc
        est.params["lora_targets"] = targets
    return run, est, src


def host_gpu_count() -> int:
    """This host's GPUs as a process started here sees them (the PCI bus from sysfs, narrowed by
    *_VISIBLE_DEVICES): no torch, no GPU library."""
    import os

    from cockpit.device import visible_gpus
    from cockpit.strategy.numa import sysfs_gpu_nodes

    return len(visible_gpus(os.environ, len(sysfs_gpu_nodes())))


def device_capacity(
    *,
    use_cpu: bool,
    ranks: int,
    gpu_memory_gb: float | None,
    ram_gib: float | None,
    gpus_visible: int,
    detected_gpu_gb: float | None = None,
    config_path: str | None = None,
) -> tuple[float | None, str | None]:
    """The memory the planned peak per device is compared with, and where it came from (None: no verdict).
    In order: the memory given (``--gpu-memory``, Setup's GPU memory field); a CPU run: the host's RAM,
    shared by its ranks; the GPUs of this machine, when it has some and their memory is known; the
    device the config's YAML names in its header (an MI300X preset: 192 GiB, ``cockpit.plan.devices``)."""
    from cockpit.plan.devices import named_device

    if gpu_memory_gb is not None:
        return float(gpu_memory_gb), None
    if use_cpu:
        if not ram_gib:
            return None, None
        share = f", shared by {ranks} ranks)" if ranks > 1 else ")"
        return ram_gib / ranks, "host RAM (a CPU run" + share
    if gpus_visible and detected_gpu_gb:
        return float(detected_gpu_gb), f"the {gpus_visible} GPU(s) of this machine"
    named = named_device(config_path)
    return (named.gib, named.source) if named else (None, None)


def plan(
    config: Mapping[str, Any],
    *,
    gpus: int | None = None,
    gpu_memory_gb: float | None = None,
    base_dir: str | None = None,
    use_meta: bool = True,
    suggest: bool = True,
    host_memory_gb: float | None = None,
    gpus_visible: int | None = None,
    config_path: str | None = None,
    detected_gpu_gb: float | None = None,
    machine_ram_gb: float | None = None,
) -> PlanResult:
    """Estimate per-device peak memory for ``config`` (flat LLaMA-Factory keys).

    ``gpus``: data-parallel size on one node (overrides nproc_per_node/nnodes).
    ``gpu_memory_gb``: device memory in GiB (64 for an MI250 GCD, 192 for an MI300X); without it,
    :func:`device_capacity` picks it (a CPU run: the host's RAM shared by its ranks; this machine's GPUs,
    ``detected_gpu_gb`` each, default KFD's figure; the device ``config_path``'s header names). With a capacity the result carries
    a verdict and, if it does not fit or is tight, the cheapest change that fits.
    ``host_memory_gb``: host RAM of one node in GiB for the load-time host line; without it the line is
    judged against this machine's RAM (``machine_ram_gb``, default /proc/meminfo) only where the run would
    train here (a CPU run, or GPUs here: ``gpus_visible``, default this host's from sysfs).
    ``overall`` (as_dict) is the worst of the verdicts printed: the device's and the host line's.
    Raises ``cockpit.errors.InputError`` (naming the key) on bad input.
    """
    cfg = _apply_overrides(planning_config(config, base_dir), gpus)
    run, est, src = estimate_config(cfg, base_dir=base_dir, use_meta=use_meta)
    res = PlanResult(model=run.model_name_or_path, model_source=src, run=run, estimate=est)
    from cockpit.device import describe, trains_on_cpu
    from cockpit.plan.host import host_load, machine_ram_gib

    if gpus_visible is None:  # this host's GPUs, and their memory where KFD says it
        from cockpit.telemetry.kfd import kfd_gpus

        gpus_visible = host_gpu_count()
        detected_gpu_gb = detected_gpu_gb or (kfd_gpus()[1] if gpus_visible else None)
    if gpu_memory_gb is not None and (not gpu_memory_gb or gpu_memory_gb <= 0):
        from cockpit.errors import InputError, Problem

        raise InputError(Problem("must be a positive number of GiB", key="gpu_memory"))
    use_cpu = trains_on_cpu(cfg.use_cpu, cfg.quantization_bit, gpus_visible)
    here = machine_ram_gb if machine_ram_gb else machine_ram_gib()
    ram = host_memory_gb if host_memory_gb else here
    trains_here = (use_cpu and gpu_memory_gb is None) or gpus_visible > 0  # --gpu-memory: planned for GPUs
    res.extra["device"] = describe(cfg.use_cpu, cfg.quantization_bit)
    host = host_load(
        cfg,
        run,
        int(est.params["total"]),
        use_cpu=use_cpu,
        host_memory_gib=ram if host_memory_gb or trains_here else None,
    )
    if not host["verdict"]:
        host["no_verdict"] = "planned for GPUs and this machine has none; --host-memory GB, its node's RAM, judges it"
    res.extra["host"] = host
    capacity, source = device_capacity(
        use_cpu=use_cpu,
        ranks=max(1, int(run.nproc_per_node)),
        gpu_memory_gb=gpu_memory_gb,
        ram_gib=ram,
        gpus_visible=gpus_visible,
        detected_gpu_gb=detected_gpu_gb,
        config_path=config_path,
    )
    if source:
        res.extra["capacity_source"] = source
    if capacity is not None:
        cap = float(capacity) * GiB
        res.capacity_gib = float(capacity)
        res.verdict = verdict(est.peak, cap)
        if suggest and res.verdict["status"] != "fits":
            res.suggestion = _suggestion(cfg, run, cap, base_dir, use_meta)
    res.extra["overall"] = worst(res.verdict, host["verdict"])
    return res


def _suggestion(cfg: RunConfig, run: RunSpec, cap: float, base_dir: str | None, use_meta: bool) -> dict[str, Any]:
    """The cheapest change that makes the plan fit ``cap`` bytes per device, or why none does."""

    def replan(c: dict[str, Any]) -> float:
        return estimate_config(c, base_dir=base_dir, use_meta=use_meta)[1].peak

    found = find_fix(cfg.mapping(), run, cap, replan)
    if found is None:
        return {
            "why": "nothing the planner can change makes it fit: use more or larger devices, "
            "a shorter cutoff_len, or a smaller model",
            "changes": {},
        }
    found["tried"] = [{k: t[k] for k in ("why", "peak_bytes", "status")} for t in found.get("tried", [])]
    return found
