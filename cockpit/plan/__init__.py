"""Memory planner: per-device peak memory of a fine-tuning run, before launch.

Public API (no torch import at module level; torch/transformers/peft are used lazily, on the
meta device only, and are optional):

    from cockpit.plan import plan
    result = plan({"model_name_or_path": "meta-llama/Llama-3.1-8B", "finetuning_type": "lora",
                   "bf16": True}, gpu_memory_gb=64)
    result.as_dict()   # breakdown terms, peak, verdict, suggestion
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cockpit.config.run_config import RunConfig
from cockpit.plan.catalogue import CATALOGUE, known_models, resolve_model_config
from cockpit.plan.estimate import Estimate, GiB, estimate
from cockpit.plan.params import count_lora, count_params, dims_of, resolve_targets
from cockpit.plan.spec import RunSpec, parse_run
from cockpit.plan.verdict import find_fix, verdict

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
    d = dims_of(mcfg)
    counts = count_params(mcfg, allow_meta=use_meta)
    lora, n_targets = 0, 0
    if run.finetuning_type == "lora":
        targets = resolve_targets(run.lora_target, counts.linear_names)
        n_targets = len(targets)
        lora, lsrc = count_lora(mcfg, targets, run.lora_rank, allow_meta=use_meta)
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
) -> PlanResult:
    """Estimate per-device peak memory for ``config`` (flat LLaMA-Factory keys).

    ``gpus``: data-parallel size on one node (overrides nproc_per_node/nnodes).
    ``host_memory_gb``: host RAM of one node in GiB for the load-time host line (default: this
    machine's RAM).
    ``gpu_memory_gb``: device memory in GiB (64 for an MI250 GCD, 192 for an MI300X); with it the
    result carries a verdict and, if it does not fit or is tight, the cheapest change that fits.
    A CPU run without it (``use_cpu: true``, or unset on a host without GPUs: ``cockpit.device.trains_on_cpu``
    with ``gpus_visible``, default this host's GPUs from sysfs): the verdict compares with the host's RAM
    (``host_memory_gb``, else this machine's) shared by its ranks, as the cockpit's Setup does.
    Raises ``cockpit.errors.InputError`` (naming the key) on bad input.
    """
    cfg = _apply_overrides(planning_config(config, base_dir), gpus)
    run, est, src = estimate_config(cfg, base_dir=base_dir, use_meta=use_meta)
    res = PlanResult(model=run.model_name_or_path, model_source=src, run=run, estimate=est)
    from cockpit.device import describe, trains_on_cpu
    from cockpit.plan.host import host_load, machine_ram_gib

    if gpus_visible is None:
        gpus_visible = host_gpu_count()
    use_cpu = trains_on_cpu(cfg.use_cpu, cfg.quantization_bit, gpus_visible)
    ram = host_memory_gb if host_memory_gb else machine_ram_gib()
    res.extra["device"] = describe(cfg.use_cpu, cfg.quantization_bit)
    res.extra["host"] = host_load(cfg, run, int(est.params["total"]), use_cpu=use_cpu, host_memory_gib=ram)
    if gpu_memory_gb is not None and (not gpu_memory_gb or gpu_memory_gb <= 0):
        from cockpit.errors import InputError, Problem

        raise InputError(Problem("must be a positive number of GiB", key="gpu_memory"))
    if gpu_memory_gb is None and use_cpu and ram:  # a CPU run's device memory is the host's RAM, per rank
        ranks = max(1, int(run.nproc_per_node))
        gpu_memory_gb = ram / ranks
        res.extra["capacity_source"] = "host RAM (a CPU run" + (f", shared by {ranks} ranks)" if ranks > 1 else ")")
    if gpu_memory_gb is not None:
        cap = float(gpu_memory_gb) * GiB
        res.capacity_gib = float(gpu_memory_gb)
        res.verdict = verdict(est.peak, cap)
        if suggest and res.verdict["status"] != "fits":

            def replan(c: dict[str, Any]) -> float:
                return estimate_config(c, base_dir=base_dir, use_meta=use_meta)[1].peak

            res.suggestion = find_fix(cfg.mapping(), run, cap, replan)
            if res.suggestion is not None:
                res.suggestion["tried"] = [
                    {k: t[k] for k in ("why", "peak_bytes", "status")} for t in res.suggestion.get("tried", [])
                ]
            if res.suggestion is None:
                res.suggestion = {
                    "why": "nothing the planner can change makes it fit: use more or larger devices, "
                    "a shorter cutoff_len, or a smaller model",
                    "changes": {},
                }
    return res
