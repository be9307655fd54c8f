"""The gate: every reason a rank would refuse a config for that the config and this machine
already tell, as functions of (config, environment), asked before any run dir exists.

``cockpit check`` (so Setup's validation, which runs it), ``cockpit train``, ``cockpit queue add``
and ``cockpit train --slurm`` reach it through :func:`cockpit.preflight.checks.static_checks`;
the ranks ask the same functions again (``cockpit.train.kernels``, ``cockpit.train.recipes.base``)
and then fail only for what could not be known (a GPU that died, a full disk).

- ``enable_liger_kernel``: Liger's kernels are Triton kernels: a GPU and the liger-kernel package.
- ``torch_compile``: on the CPU, inductor needs a C++ compiler.
- ``output_dir``: a folder that is, or can be made, writable (not a file, not under one).
- the ROCm field guide's config rules (:mod:`cockpit.preflight.rocm`, docs/rocm.md): allocator settings,
  4-bit on CDNA, CUDA graphs under torch.compile, contradicting GPU masks, GRPO's colocated vLLM, fa2.

The device (CPU or GPU) is decided as the ranks decide it (:func:`cockpit.device.resolve_device`),
with torch's GPU count, counted only when a device-dependent key is set (importing torch costs
seconds), or the count the caller knows (a Slurm job's nodes are not this machine).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

DEVICE_KEYS = ("enable_liger_kernel", "torch_compile")  # whose refusal depends on CPU vs GPU


def liger_refusal(use_cpu: bool) -> str | None:
    if use_cpu:
        return (
            "Liger's kernels are Triton kernels and need a GPU (CUDA or ROCm); this run trains on the CPU "
            "(set enable_liger_kernel: false)"
        )
    if importlib.util.find_spec("liger_kernel") is None:
        return "needs the liger-kernel package (pip install liger-kernel), which is not installed"
    if importlib.util.find_spec("triton") is None:
        return "needs Triton (pytorch-triton-rocm on ROCm, triton on CUDA), which is not installed"
    return None


def compile_refusal(use_cpu: bool) -> str | None:
    if use_cpu and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return (
            "torch.compile on the CPU needs a C++ compiler (g++ or clang++) for inductor; none is on PATH "
            "(install one, or set torch_compile: false)"
        )
    return None


def kernel_problems(cfg: RunConfig, use_cpu: bool) -> list[Problem]:
    problems = []
    if cfg.enable_liger_kernel and (reason := liger_refusal(use_cpu)):
        problems.append(Problem(reason, key="enable_liger_kernel"))
    if cfg.torch_compile and (reason := compile_refusal(use_cpu)):
        problems.append(Problem(reason, key="torch_compile"))
    return problems


def output_dir_refusal(cfg: RunConfig) -> str | None:
    """Why ``output_dir`` cannot hold the run's checkpoints and adapter; None when it can (it is
    created when missing)."""
    out = cfg.output_dir
    if not out:
        return None
    path = Path(str(out)).expanduser()
    if path.exists() and not path.is_dir():
        return f"{out} is a file, not a folder; name a folder (created when missing)"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot create {out}: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        return f"{out} {what} by this user; choose a folder you can write"
    return None


def torch_gpu_count() -> int:
    """The GPUs torch sees here, as the ranks count them (imports torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gate_problems(cfg: RunConfig, gpus: int | None = None) -> list[Problem]:
    """What the ranks would refuse ``cfg`` for on a machine with ``gpus`` GPUs (None: count this
    machine's, only when a device-dependent key is set). A config that needs GPUs where none is
    visible gives :class:`cockpit.device.NoGPU`'s problems."""
    from cockpit.device import CPU, resolve_device
    from cockpit.preflight.rocm import field_problems

    problems = field_problems(cfg)  # the ROCm field guide's config rules (docs/rocm.md)
    if reason := output_dir_refusal(cfg):
        problems.append(Problem(reason, key="output_dir"))
    if any(getattr(cfg, k) for k in DEVICE_KEYS):
        try:
            use_cpu = (
                resolve_device(cfg.use_cpu, cfg.quantization_bit, torch_gpu_count() if gpus is None else gpus) == CPU
            )
        except InputError as exc:
            return problems + exc.problems
        problems += kernel_problems(cfg, use_cpu)
    return problems
