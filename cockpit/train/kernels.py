"""Opt-in faster kernels: ``enable_liger_kernel`` and ``torch_compile`` (LLaMA-Factory's keys).

Each becomes the HF Trainer's own switch (``use_liger_kernel``: Liger's Triton RMSNorm,
SwiGLU, RoPE and fused linear cross-entropy patched into the model; ``torch_compile``:
``torch.compile`` through accelerate, regionally: each decoder layer compiled on its own, the layers
sharing one compiled graph, as torchtune and torchtitan compile them, so the warm-up compiles one layer
instead of the whole model; ``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION``, which a run's ``env:`` can
set to false; ``torch_compile_mode``, HF's key, the mode each region compiles with), or an :class:`InputError` saying what is missing, before any model is loaded. Liger's kernels are Triton: they need a GPU (CUDA or ROCm) and the
``liger-kernel`` package. ``torch.compile`` on the CPU needs a C++ compiler for inductor.
The refusals are the gate's (``cockpit.preflight.environment``), asked before any run dir exists;
the rank asks them again.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError, Problem
from cockpit.preflight.environment import compile_refusal, liger_refusal

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

__all__ = ["REGIONAL", "compile_refusal", "kernel_arguments", "liger_refusal"]


def kernel_arguments(cfg: RunConfig, use_cpu: bool) -> dict[str, Any]:
    """TrainingArguments for the opted-in kernels; refuses with the reason when one cannot run."""
    kwargs: dict[str, Any] = {}
    if cfg.enable_liger_kernel:
        reason = liger_refusal(use_cpu)
        if reason:
            raise InputError(Problem(reason, key="enable_liger_kernel"))
        kwargs["use_liger_kernel"] = True
    if cfg.torch_compile:
        reason = compile_refusal(use_cpu)
        if reason:
            raise InputError(Problem(reason, key="torch_compile"))
        kwargs["torch_compile"] = True
        if cfg.torch_compile_mode is not None:  # the Trainer's TorchDynamoPlugin(mode=...): torch.compile(mode=...)
            kwargs["torch_compile_mode"] = cfg.torch_compile_mode
        os.environ.setdefault(REGIONAL, "true")  # read by accelerate's TorchDynamoPlugin, which the Trainer makes
    return kwargs


REGIONAL = "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"
