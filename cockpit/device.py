"""Where a config trains: one decision, shared by preflight, the ranks, the planner, the doctor's
launch gate and the UI (pure: no torch, no I/O; callers pass the number of visible GPUs).

- ``use_cpu: true``: the CPU, always.
- ``use_cpu: false`` (every GPU preset says so), or a config that asks for something only a GPU
  does (``quantization_bit``: 4/8-bit base weights): GPUs, and **never** a silent fall back to the
  CPU. With no GPU visible (hidden by ``HIP_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES``, a CPU
  build of torch, a missing ROCm) :func:`resolve_device` raises :class:`NoGPU`, an
  ``InputError`` (exit 2) that the preflight completes with the doctor's reasons.
- ``use_cpu`` unset and nothing GPU-only asked for: a GPU when one is visible, else the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cockpit.errors import InputError, Problem

CPU, GPU = "cpu", "gpu"


class NoGPU(InputError):
    """The config needs GPUs and none is visible."""


def _flag(value: Any) -> bool | None:
    """``use_cpu`` as a bool, or None when unset (YAML null, empty, "auto")."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "none", "null")):
        return None
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def needs_gpu(cfg: Mapping[str, Any]) -> bool:
    """True when the config asked for GPUs: ``use_cpu: false``, or 4/8-bit base weights with
    ``use_cpu`` unset. Such a config never trains on the CPU."""
    use_cpu = _flag(cfg.get("use_cpu"))
    if use_cpu is not None:
        return not use_cpu
    return cfg.get("quantization_bit") not in (None, "", 0, "0")


def why_gpu(cfg: Mapping[str, Any]) -> str:
    """Which key asked for GPUs (for messages)."""
    return (
        "use_cpu: false" if _flag(cfg.get("use_cpu")) is False else f"quantization_bit: {cfg.get('quantization_bit')}"
    )


def resolve_device(cfg: Mapping[str, Any], gpus_visible: int, reasons: list[str] | None = None) -> str:
    """``cpu`` or ``gpu`` for ``cfg`` on a machine with ``gpus_visible`` GPUs (torch's view).
    Raises :class:`NoGPU` (exit 2) when the config needs GPUs and none is visible; ``reasons``
    (the doctor's findings) are added to its message."""
    if _flag(cfg.get("use_cpu")) is True:
        return CPU
    if needs_gpu(cfg):
        if gpus_visible > 0:
            return GPU
        why = f"this config needs GPUs ({why_gpu(cfg)}) but torch sees none; it will not fall back to the CPU"
        problems = [Problem(why, key="use_cpu")]
        problems += [Problem(f"doctor: {r}", key="use_cpu") for r in reasons or []]
        problems.append(Problem("train on the CPU on purpose with use_cpu: true (--set use_cpu=true)", key="use_cpu"))
        raise NoGPU(problems)
    return GPU if gpus_visible > 0 else CPU


FP16_ON_CPU = (
    "fp16 mixed precision needs a GPU: on the CPU this run trains in fp32 "
    "(fp16 applies where a GPU trains it; bf16 is the CPU's mixed precision)"
)


def cpu_precision(cfg: Mapping[str, Any], device: str) -> tuple[dict[str, Any], str | None]:
    """The config a rank trains with on ``device``, and what changed, in words: ``fp16`` on the
    CPU (a GPU guide's ``--fp16`` pasted with ``--use_cpu true``) trains in fp32 rather than
    failing. The run's saved config keeps what the user asked for."""
    if device == CPU and cfg.get("fp16"):
        return {**cfg, "fp16": False}, FP16_ON_CPU
    return dict(cfg), None


def describe(cfg: Mapping[str, Any]) -> str:
    """One line for the planner and the UI: what the config asks for."""
    use_cpu = _flag(cfg.get("use_cpu"))
    if use_cpu is True:
        return "cpu (use_cpu: true)"
    if needs_gpu(cfg):
        return f"gpu, required ({why_gpu(cfg)})"
    return "gpu when one is visible, else cpu (use_cpu unset)"
