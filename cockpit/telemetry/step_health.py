"""Two Live alerts of the ROCm field guide (docs/rocm.md, items 6 and 7): pure logic over the figures
rank 0's ``step`` events already carry (no torch, no I/O). Each raises one ``alert`` per run attempt.

- :class:`SlowStep` (code ``slow_step``): on a GPU whose peak comes from the device table (the CPU's
  MFU is low by nature: never there), the step's MFU after warm-up below ``threshold`` (5 %) on
  ``persist`` logging steps in a row: the step takes more than 1/threshold times what the device needs
  at its peak. Likely causes: hipBLASLt's full solution scan (~600 ms per bf16 GEMM on gfx942 with ROCm
  >= 7.1: ROCm/rocm-systems#4084), an attention kernel regression (ROCm/TheRock#7696), a rank on the
  wrong NUMA node, host syncs.
- :class:`EarlyGradNorm` (code ``early_grad_norm``): a gradient norm in the first ``early`` logging
  steps at or above ``bound`` (1000), or, once ``later`` more norms are logged, the early maximum over
  ``ratio`` (50) times their median (and at least ``floor``): what hiyouga/LlamaFactory#7890 saw on
  MI300X (grad_norm in the thousands from the first step, with or without FlashAttention).

Usage (rank 0, at each logging step)::

    alert = slow.observe(step, mfu, peak_source="table", device="MI300X")
    alert = early.observe(step, grad_norm)
    if alert:
        events.emit("alert", **alert)
"""

from __future__ import annotations

import math
import statistics
from typing import Any

SLOW_STEP_MFU = 0.05
EARLY_GRAD_NORM = 1000.0
GUIDE = "docs/rocm.md"

SLOW_REMEDIES = (
    "TORCH_BLAS_PREFER_HIPBLASLT=0 in env (rocBLAS instead of hipBLASLt: its full solution scan costs ~600 ms "
    "per bf16 GEMM on some ROCm releases, ROCm/rocm-systems#4084)",
    "PyTorch TunableOp: PYTORCH_TUNABLEOP_ENABLED=1 in env (tunes each GEMM once, then reuses it)",
    "another attention backend: flash_attn: sdpa or fa2 (an attention kernel regression costs 9-25 %, ROCm/TheRock#7696)",
    "numa_bind: auto (a rank on the wrong NUMA node starves its GPU); cockpit doctor shows each GPU's node",
    "fewer host syncs: a larger logging_steps, no callback that reads tensors every step",
)
EARLY_REMEDIES = (
    "max_grad_norm: 1.0 (clip the gradient; it bounds the update, not the norm)",
    "a lower learning_rate with warmup (warmup_ratio: 0.03 or more)",
    "another attention backend: flash_attn: sdpa, eager or fa2 (users saw exploding first-step norms go away "
    "with another attention implementation, hiyouga/LlamaFactory#7890, #9631, #8088)",
    "check the data around the first steps (a sample of one repeated token, a label on every token)",
)


class SlowStep:
    def __init__(self, threshold: float = SLOW_STEP_MFU, persist: int = 2):
        self.threshold = threshold
        self.persist = persist
        self.below = 0
        self.told = False

    def observe(self, step: int, mfu: float | None, peak_source: str, device: str) -> dict[str, Any] | None:
        """``mfu``: the step event's (None in the warm-up or where MFU is unknown); ``peak_source``: the
        peak's (``table`` for a GPU in the device table)."""
        if self.told or peak_source != "table" or mfu is None or not math.isfinite(mfu):
            return None
        self.below = self.below + 1 if mfu < self.threshold else 0
        if self.below < self.persist:
            return None
        self.told = True
        return {
            "level": "warn",
            "code": "slow_step",
            "message": (
                f"MFU {mfu:.1%} on {device} at step {step} ({self.persist} logging steps below {self.threshold:.0%}): "
                f"a step takes {1 / max(mfu, 1e-6):.0f}x what the device needs at its peak; likely the GEMM "
                f"library, the attention backend, a rank on the wrong NUMA node or host syncs ({GUIDE} item 6)"
            ),
            "remedies": list(SLOW_REMEDIES),
            "mfu": mfu,
            "threshold": self.threshold,
            "source": "ROCm/rocm-systems#4084; ROCm/TheRock#7696",
            "policy": "warn",
        }


class EarlyGradNorm:
    def __init__(
        self, bound: float = EARLY_GRAD_NORM, early: int = 3, later: int = 5, ratio: float = 50.0, floor: float = 100.0
    ):
        self.bound, self.early, self.later, self.ratio, self.floor = bound, early, later, ratio, floor
        self.early_norms: list[float] = []
        self.later_norms: list[float] = []
        self.told = False

    def observe(self, step: int, grad_norm: Any) -> dict[str, Any] | None:
        if self.told or not isinstance(grad_norm, (int, float)) or not math.isfinite(grad_norm):
            return None
        norm = float(grad_norm)
        if len(self.early_norms) < self.early:
            self.early_norms.append(norm)
            if norm >= self.bound:
                return self._alert(step, f"gradient norm {norm:.4g} at step {step}, at or over {self.bound:g}")
            return None
        if len(self.later_norms) >= self.later:
            return None
        self.later_norms.append(norm)
        if len(self.later_norms) < self.later:
            return None
        first, median = max(self.early_norms), statistics.median(self.later_norms)
        if first >= self.floor and first > self.ratio * median:
            why = f"first-steps gradient norm {first:.4g} is {first / max(median, 1e-12):.0f}x the later median {median:.4g}"
            return self._alert(step, why)
        return None

    def _alert(self, step: int, why: str) -> dict[str, Any]:
        self.told = True
        return {
            "level": "warn",
            "code": "early_grad_norm",
            "message": f"{why}: the first updates may already have damaged the weights ({GUIDE} item 7)",
            "remedies": list(EARLY_REMEDIES),
            "source": "hiyouga/LlamaFactory#7890",
            "policy": "warn",
        }
