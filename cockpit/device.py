"""Where a config trains: one decision, shared by preflight, the ranks, the planner, the doctor's
launch gate and the UI (pure: no torch, no I/O; callers pass the number of visible GPUs).

- ``use_cpu: true``: the CPU, always.
- ``use_cpu: false`` (every GPU preset says so), or 4/8-bit base weights (``quantization_bit``,
  a QLoRA config written for GPUs; ``use_cpu: true`` trains it on the CPU, bitsandbytes has CPU
  kernels): GPUs, and **never** a silent fall back to the CPU. With no GPU visible (hidden by ``HIP_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES``, a CPU
  build of torch, a missing ROCm) :func:`resolve_device` raises :class:`NoGPU`, an
  ``InputError`` (exit 2) that the preflight completes with the doctor's reasons.
- ``use_cpu`` unset and nothing GPU-only asked for: a GPU when one is visible, else the CPU.

Below ``cockpit.config``: the functions take the two keys they decide by (``use_cpu``,
``quantization_bit``), as a ``RunConfig`` holds them or as a raw YAML value (``"false"``, ``"auto"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def needs_gpu(use_cpu: Any, quantization_bit: Any) -> bool:
    """True when the config asked for GPUs: ``use_cpu: false``, or 4/8-bit base weights with
    ``use_cpu`` unset. Such a config never trains on the CPU."""
    flag = _flag(use_cpu)
    if flag is not None:
        return not flag
    return quantization_bit not in (None, "", 0, "0")


def why_gpu(use_cpu: Any, quantization_bit: Any) -> str:
    """Which key asked for GPUs (for messages)."""
    return "use_cpu: false" if _flag(use_cpu) is False else f"quantization_bit: {quantization_bit}"


def resolve_device(use_cpu: Any, quantization_bit: Any, gpus_visible: int, reasons: list[str] | None = None) -> str:
    """``cpu`` or ``gpu`` for a config with these keys on a machine with ``gpus_visible`` GPUs (torch's
    view). Raises :class:`NoGPU` (exit 2) when the config needs GPUs and none is visible; ``reasons``
    (the doctor's findings) are added to its message."""
    if _flag(use_cpu) is True:
        return CPU
    if needs_gpu(use_cpu, quantization_bit):
        if gpus_visible > 0:
            return GPU
        why = (
            f"this config needs GPUs ({why_gpu(use_cpu, quantization_bit)}) but torch sees none; "
            "it will not fall back to the CPU"
        )
        problems = [Problem(why, key="use_cpu")]
        problems += [Problem(f"doctor: {r}", key="use_cpu") for r in reasons or []]
        problems.append(Problem("train on the CPU on purpose with use_cpu: true (--set use_cpu=true)", key="use_cpu"))
        raise NoGPU(problems)
    return GPU if gpus_visible > 0 else CPU


def device_problems(
    use_cpu: Any, quantization_bit: Any, nproc_per_node: Any, gpus_visible: int, reasons: list[str] | None = None
) -> list[Problem]:
    """What ``cockpit check`` refuses about where a config trains, on a machine with ``gpus_visible``
    GPUs: :func:`resolve_device`'s refusal of a config that needs GPUs where none is visible (``reasons``
    added), or more GPU ranks than GPUs. The preflight and Setup's problems pane both ask it."""
    try:
        on_cpu = resolve_device(use_cpu, quantization_bit, gpus_visible, reasons=reasons) == CPU
    except NoGPU as exc:
        return list(exc.problems)
    ranks = int(nproc_per_node or 1)
    if not on_cpu and ranks > gpus_visible:
        return [Problem(f"nproc_per_node {ranks} but only {gpus_visible} GPU(s) visible", key="nproc_per_node")]
    return []


def trains_on_cpu(use_cpu: Any, quantization_bit: Any, gpus_visible: int) -> bool:
    """Whether a config with these keys trains on the CPU on a host with ``gpus_visible`` GPUs: the rule of
    :func:`resolve_device` (a config that needs GPUs and has none is not a CPU run: it is refused).
    ``cockpit plan`` and Setup's fit line compare the planned peak with the host's RAM by it."""
    try:
        return resolve_device(use_cpu, quantization_bit, gpus_visible) == CPU
    except NoGPU:
        return False


FP16_ON_CPU = (
    "fp16 mixed precision needs a GPU: on the CPU this run trains in fp32 "
    "(fp16 applies where a GPU trains it; bf16 is the CPU's mixed precision)"
)


# what makes bf16 matmuls fast on an x86 CPU (/proc/cpuinfo's names): AVX512-BF16's dot products, AMX's tiles
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")
BF16_SLOW = (
    "measured ~190 s against ~7 s a step in fp32 on a CPU without them (docs/benchmarks.md: bench/step_overhead.py)"
)


def cpu_flags(cpuinfo: str) -> set[str] | None:
    """An x86 CPU's feature flags, from the text of /proc/cpuinfo (its first ``flags`` line); None without one."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return None


def bf16_on_cpu_warning(cpuinfo: str | None) -> str | None:
    """``bf16: true`` on the CPU against what the CPU has (the text of /proc/cpuinfo): None when it
    has AVX512-BF16 and AMX; else which of them it lacks, by their flag names."""
    flags = cpu_flags(cpuinfo or "")
    if flags is None:
        return (
            f"bf16 on a CPU whose flags are unknown (no flags line in /proc/cpuinfo): without "
            f"{', '.join(BF16_CPU_FLAGS)} bf16 is much slower than fp32 ({BF16_SLOW})"
        )
    lacks = [f for f in BF16_CPU_FLAGS if f not in flags]
    if not lacks:
        return None
    if "avx512_bf16" in lacks:
        return f"bf16 on this CPU is much slower than fp32: it lacks {', '.join(lacks)} ({BF16_SLOW}); set bf16: false"
    return (
        f"bf16 on this CPU: it has avx512_bf16 but lacks {', '.join(lacks)} (AMX, the tiles that make bf16 "
        "matmuls fast); compare a few steps with bf16: false"
    )


def cpu_precision(precision: Mapping[str, Any], device: str) -> tuple[dict[str, Any], str | None]:
    """The config a rank trains with on ``device``, and what changed, in words: ``fp16`` on the
    CPU (a GPU guide's ``--fp16`` pasted with ``--use_cpu true``) trains in fp32 rather than
    failing. The run's saved config keeps what the user asked for."""
    if device == CPU and precision.get("fp16"):
        return {**precision, "fp16": False}, FP16_ON_CPU
    return dict(precision), None


def describe(use_cpu: Any, quantization_bit: Any) -> str:
    """One line for the planner and the UI: what a config with these keys asks for."""
    if _flag(use_cpu) is True:
        return "cpu (use_cpu: true)"
    if needs_gpu(use_cpu, quantization_bit):
        return f"gpu, required ({why_gpu(use_cpu, quantization_bit)})"
    return "gpu when one is visible, else cpu (use_cpu unset)"


# The variables that hide GPUs from a process. ROCR_VISIBLE_DEVICES masks first (ROCm's runtime);
# HIP_VISIBLE_DEVICES, then CUDA_VISIBLE_DEVICES, index what is left (torch on ROCm reads HIP's first).
VISIBLE_VARS = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
INDEX_VARS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")  # what a launcher sets to give a process some GPUs


def listed(value: str) -> list[str]:
    """'0, 1,' -> ['0', '1']: the entries of a *_VISIBLE_DEVICES value (indices or UUIDs)."""
    return [p.strip() for p in value.split(",") if p.strip()]


def visible_env(gpus: Sequence[str]) -> dict[str, str]:
    """The environment that shows a process only ``gpus`` (indices as this host's processes see
    them): HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES, the same list (ROCm reads the first,
    CUDA the second; equal, they never clash)."""
    value = ",".join(gpus)
    return {name: value for name in INDEX_VARS}


def visible_gpus(env: Mapping[str, str], pci_gpus: int) -> list[str]:
    """The GPUs a process started with ``env`` may use, as the values a launcher can put in
    HIP/CUDA_VISIBLE_DEVICES: the list HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES) gives,
    else indices 0..n-1 over the ``pci_gpus`` on the bus, or over ROCR_VISIBLE_DEVICES' list."""
    for name in INDEX_VARS:
        if name in env:
            return listed(env[name])
    count = pci_gpus if "ROCR_VISIBLE_DEVICES" not in env else min(pci_gpus, len(listed(env["ROCR_VISIBLE_DEVICES"])))
    return [str(i) for i in range(count)]
