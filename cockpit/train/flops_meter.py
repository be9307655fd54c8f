"""The rank's MFU: FLOPs per token of the model it trains (``cockpit.plan.flops``), the device's peak
(``cockpit.doctor.peak``), and per logging interval the figures a ``step`` event carries: tokens/s and
samples/s per device, achieved model TFLOPS per device, MFU and, under gradient checkpointing, HFU.

Rank 0 builds it at ``on_train_begin`` from the placed model; a model whose dims the planner cannot read
(a multimodal config, say) still gets tokens/s and samples/s, with the reason MFU is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cockpit.doctor.peak import Peak
from cockpit.plan.flops import FlopsPerToken, flops_per_token, utilisation
from cockpit.plan.params import Dims, ParamCounts

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def run_dtype(cfg: RunConfig) -> str:
    """The precision the matmuls run in (the rank's config: fp16 on the CPU already became fp32)."""
    if cfg.bf16 or cfg.pure_bf16:
        return "bf16"
    return "fp16" if cfg.fp16 else "fp32"


def device_peak_here(cfg: RunConfig, use_cpu: bool) -> Peak:
    """This rank's device's peak: the GPU table by torch's name and compute units, or the CPU's
    microbenchmark (cached in the cache dir) on this rank's threads."""
    import torch

    from cockpit.doctor.peak import cpu_peak, device_peak
    from cockpit.store.rundir import cache_dir

    dtype = run_dtype(cfg)
    if use_cpu or not torch.cuda.is_available():
        return cpu_peak(dtype, torch.get_num_threads(), cache_dir())
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return device_peak(str(props.name), int(getattr(props, "multi_processor_count", 0) or 0), dtype)


def _numel(p: Any) -> int:
    return int(getattr(p, "ds_numel", 0) or p.numel())  # ZeRO-3 keeps the full size in ds_numel


def trainable_split(model: Any) -> tuple[float, int]:
    """(the share of the model's parameters that get gradients, the LoRA adapter's parameters)."""
    total = trainable = adapter = 0
    for name, p in model.named_parameters():
        n = _numel(p)
        total += n
        if p.requires_grad:
            trainable += n
            if "lora_" in name:
                adapter += n
    return (trainable / total if total else 1.0), adapter


def base_config(model: Any) -> dict[str, Any]:
    """The base model's config.json as a dict (a PEFT model's base)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config: dict[str, Any] = base.config.to_dict()
    return config


@dataclass(frozen=True)
class FlopsMeter:
    dims: Dims | None
    counts: ParamCounts | None
    trainable_share: float
    adapter_params: int
    recompute: bool
    peak: Peak
    world_size: int
    why: str = ""  # why MFU is missing: the model's dims, or the peak

    @classmethod
    def for_model(cls, model: Any, cfg: RunConfig, peak: Peak, world_size: int) -> FlopsMeter:
        from cockpit.plan.params import count_params, dims_of
        from cockpit.train.variants import gradient_checkpointing

        share, adapter = trainable_split(model)
        recompute = gradient_checkpointing(cfg)[0]
        try:
            config = {k: v for k, v in base_config(model).items() if k != "quantization_config"}
            dims, counts = dims_of(config), count_params(config)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return cls(None, None, share, adapter, recompute, peak, world_size, f"model dims unknown ({exc})")
        return cls(dims, counts, share, adapter, recompute, peak, world_size, peak.why)

    def per_token(self, seq_len: float) -> FlopsPerToken | None:
        if self.dims is None or self.counts is None:
            return None
        return flops_per_token(
            self.dims,
            self.counts,
            seq_len,
            trainable_share=self.trainable_share,
            adapter_params=self.adapter_params,
            recompute=self.recompute,
        )

    def describe(self, seq_len: float) -> dict[str, Any]:
        """``train_begin``'s ``flops``: the peak and the FLOPs per token at ``seq_len`` (cutoff_len)."""
        per = self.per_token(seq_len)
        return {
            "peak_tflops": self.peak.tflops,
            "peak_source": self.peak.source,
            "peak_device": self.peak.device,
            "dtype": self.peak.dtype,
            "model_flops_per_token": round(per.model) if per else None,
            "hardware_flops_per_token": round(per.hardware) if per else None,
            "matmul_params": per.matmul_params if per else None,
            "trainable_share": round(self.trainable_share, 6),
            "recompute": self.recompute,
            "at_seq_len": seq_len,
            "why": self.why or None,
        }

    def figures(self, tokens_per_s: float | None, samples_per_s: float, seq_len: float) -> dict[str, Any]:
        """A step event's per-device throughput and utilisation (``tokens_per_s``: all ranks, None in
        the warm-up; ``seq_len``: the interval's mean trained tokens per sample)."""
        world = max(1, self.world_size)
        out: dict[str, Any] = {
            "samples_per_s_per_device": round(samples_per_s / world, 3),
            "tokens_per_s_per_device": None,
            "model_tflops_per_device": None,
            "mfu": None,
        }
        per = self.per_token(seq_len)
        if tokens_per_s is None:
            return out
        tps_device = tokens_per_s / world
        out["tokens_per_s_per_device"] = round(tps_device, 2)
        if per is None:
            return out
        out["model_tflops_per_device"] = round(per.model * tps_device / 1e12, 6)
        if self.peak.tflops and not self.peak_below(per.model * tps_device):
            out["mfu"] = round(utilisation(per.model, tps_device, self.peak.tflops), 5)
            if self.recompute:
                out["hfu"] = round(utilisation(per.hardware, tps_device, self.peak.tflops), 5)
        return out

    def peak_below(self, achieved_flops: float) -> bool:
        """A CPU peak (a matmul benchmark, measured once and cached) below what this run achieves was
        measured on a busy machine: no MFU against it (it would read above 100 %); tokens/s stay."""
        return self.peak.source in ("measured", "cached") and achieved_flops > (self.peak.tflops or 0) * 1e12
