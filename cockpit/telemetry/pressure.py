"""The memory-pressure alert: pure logic over the ranks' own allocator figures (no torch, no I/O).

Fed with the ``mem`` mapping of every ``step`` event (rank -> ``{peak_mb, reserved_mb,
capacity_mb, ...}``, see ``cockpit/store/events.py``), it raises one ``alert`` (code
``memory_pressure``) per run attempt when a rank

- comes within ``headroom`` (a fraction, default 0.08) of its device's capacity: its per-step
  peak (``max_memory_allocated`` since the previous logging step) or its reserved memory
  (``memory_reserved``: what the caching allocator holds, fragmentation included) is above
  ``(1 - headroom) x capacity``; or
- swings: its per-step peak changes by more than ``swing`` (a fraction of the previous step's
  peak, default 0.25) from one logging step to the next. The first logged step of an attempt
  is not compared (it creates the optimizer states; its peak differs from the next by design).

The alert names the rank and the numbers, and carries the remedies as data the Live screen and
``cockpit resume RUN --set`` apply: ``remedy_set`` (half the micro-batch, double the
accumulation: the same global batch) and ``remedy_env`` (the caching allocator's
``expandable_segments:True``, which reduces fragmentation; ROCm and CUDA spell it differently).

Usage::

    watch = MemoryPressure(headroom=0.08, swing=0.25)
    alert = watch.observe(step, mem_by_rank, micro_batch=4, accumulation=2, rocm=False)
    if alert:
        events.emit("alert", **alert)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ALLOC_CONF_ENV = {"rocm": "PYTORCH_HIP_ALLOC_CONF", "cuda": "PYTORCH_CUDA_ALLOC_CONF"}
EXPANDABLE = "expandable_segments:True"


def remedy_set(micro_batch: int, accumulation: int) -> dict[str, int] | None:
    """Half the micro-batch and the accumulation that keeps the global batch (double it for an
    even micro-batch); None at micro-batch 1."""
    if micro_batch < 2:
        return None
    half = micro_batch // 2
    if (micro_batch * accumulation) % half:
        half = 1
    return {"per_device_train_batch_size": half, "gradient_accumulation_steps": micro_batch * accumulation // half}


def remedies(micro_batch: int, accumulation: int, env_name: str) -> list[str]:
    out = []
    change = remedy_set(micro_batch, accumulation)
    if change:
        out.append(
            f"halve per_device_train_batch_size ({micro_batch} -> {change['per_device_train_batch_size']}) and double "
            f"gradient_accumulation_steps ({accumulation} -> {change['gradient_accumulation_steps']}): the same global batch"
        )
    out.append(f"set {env_name}={EXPANDABLE} (fewer fragmented blocks when sequence lengths vary)")
    out.append("a shorter cutoff_len, or gradient_checkpointing: true")
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class MemoryPressure:
    def __init__(self, headroom: float = 0.08, swing: float = 0.25):
        self.headroom = float(headroom)
        self.swing = float(swing)
        self.alerted = False
        self._peaks: dict[str, list[float]] = {}  # rank -> its last two per-step peaks
        self._counts: dict[str, int] = {}  # rank -> how many peaks it reported this attempt

    def observe(
        self,
        step: int,
        mem: Mapping[str, Mapping[str, Any]],
        micro_batch: int,
        accumulation: int,
        rocm: bool = False,
    ) -> dict[str, Any] | None:
        """The alert dict (once), or None."""
        found = None
        for rank, m in sorted(mem.items(), key=lambda kv: int(kv[0])):
            found = found or self._check_rank(str(rank), m or {})
        if found is None or self.alerted:
            return None
        self.alerted = True
        rank, trigger, message, figures = found
        env_name = ALLOC_CONF_ENV["rocm" if rocm else "cuda"]
        return {
            "level": "warn",
            "code": "memory_pressure",
            "message": f"{message} at step {step}",
            "remedies": remedies(micro_batch, accumulation, env_name),
            "rank": int(rank),
            "trigger": trigger,
            "figures": figures,
            "remedy_set": remedy_set(micro_batch, accumulation),
            "remedy_env": {env_name: EXPANDABLE},
        }

    def _check_rank(self, rank: str, m: Mapping[str, Any]) -> tuple[str, str, str, dict[str, Any]] | None:
        peak, reserved, capacity = _num(m.get("peak_mb")), _num(m.get("reserved_mb")), _num(m.get("capacity_mb"))
        history = self._peaks.setdefault(rank, [])
        previous = history[-1] if history else None
        if peak is not None:
            history.append(peak)
            del history[:-2]
            self._counts[rank] = self._counts.get(rank, 0) + 1
        where = f"rank {rank}" + (f" (node {m['node_rank']})" if m.get("node_rank") is not None else "")
        figures = {"peak_mb": peak, "reserved_mb": reserved, "capacity_mb": capacity}
        if self.headroom > 0 and capacity:
            high = max(v for v in (peak, reserved, 0.0) if v is not None)
            if high > (1.0 - self.headroom) * capacity:
                which = "reserved" if reserved is not None and reserved >= (peak or 0) else "peak"
                free = 100 * (1 - high / capacity)
                return (
                    rank,
                    "near_capacity",
                    (
                        f"{where}: {which} memory {high / 1024:.1f} GiB of {capacity / 1024:.1f} GiB, "
                        f"{free:.1f} % left (alert under {100 * self.headroom:g} %)"
                    ),
                    figures,
                )
        # the first peak of the attempt is not compared (optimizer states are created in it)
        if self.swing > 0 and peak is not None and previous is not None and previous > 0 and self._counts[rank] > 2:
            change = (peak - previous) / previous
            if abs(change) > self.swing:
                figures["previous_peak_mb"] = previous
                return (
                    rank,
                    "swing",
                    (
                        f"{where}: per-step peak memory swung {100 * change:+.0f} % "
                        f"({previous:.0f} -> {peak:.0f} MiB; alert above {100 * self.swing:g} %)"
                    ),
                    figures,
                )
        return None
