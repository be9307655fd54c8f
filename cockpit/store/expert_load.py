"""A mixture-of-experts model's expert load: the ``step`` event's compact ``expert_load`` field and the
alert when an expert stays nearly unused or overloaded (pure: no torch; the ranks, the UI and tests use it).

Rank 0 counts, over each logging interval, the tokens every router sent to each expert (top-k
assignments, every rank's batches: ``cockpit.train.moe``) and writes per MoE layer:

- ``rows``: one character per expert, its load as a level of :data:`LEVELS` (``0``: under a tenth of
  its fair share, nearly unused; ``4``: about fair; ``9``: six times fair or more); left out when the
  layers x experts exceed :data:`MAX_CELLS` (a 94-layer, 128-expert model would write 12 KB per log);
- ``hot`` / ``cold``: per layer ``[expert, load]``, the most and least loaded expert and its load as a
  multiple of the fair share (``top_k / experts`` of the assignments; 1.0 = fair), always written.

The field: ``{"experts": E, "top_k": k, "layers": [layer indices], "assignments": n, "hot": [...],
"cold": [...], "rows": [...]}``; about 20 bytes a layer without rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# a level's upper bound, as a multiple of the fair share; the last level has none
BOUNDS = (0.1, 0.25, 0.5, 0.8, 1.25, 2.0, 3.0, 4.0, 6.0)
LEVELS = "0123456789"
MAX_CELLS = 2048
IDLE_BELOW = 0.1  # an expert under a tenth of its fair share is nearly unused
HOT_ABOVE = 4.0  # ... and one over four times it takes a large multiple of it
PERSIST = 3  # logging steps in a row before the alert


def level(load: float) -> str:
    for i, bound in enumerate(BOUNDS):
        if load < bound:
            return LEVELS[i]
    return LEVELS[-1]


def loads(counts: Sequence[float]) -> list[float]:
    """Each expert's assignments as a multiple of the fair share (the mean)."""
    total = float(sum(counts))
    if total <= 0:
        return [0.0 for _ in counts]
    fair = total / len(counts)
    return [c / fair for c in counts]


def encode(counts: Sequence[Sequence[float]], layers: Sequence[int], top_k: int) -> dict[str, Any]:
    """The ``expert_load`` field from per-layer assignment counts (layers x experts)."""
    per = [loads(row) for row in counts]
    experts = len(counts[0]) if counts else 0
    out: dict[str, Any] = {
        "experts": experts,
        "top_k": top_k,
        "layers": list(layers),
        "assignments": int(sum(sum(row) for row in counts)),
        "hot": [[max(range(len(row)), key=row.__getitem__), round(max(row), 2)] for row in per],
        "cold": [[min(range(len(row)), key=row.__getitem__), round(min(row), 2)] for row in per],
    }
    if len(per) * experts <= MAX_CELLS:
        out["rows"] = ["".join(level(x) for x in row) for row in per]
    return out


@dataclass
class LoadWatch:
    """Rank 0's alert state: an expert nearly unused (under :data:`IDLE_BELOW` of its fair share) or
    overloaded (over :data:`HOT_ABOVE` times it) at :data:`PERSIST` logging steps in a row, once per
    (layer, expert, kind)."""

    persist: int = PERSIST
    streak: dict[tuple[int, int, str], int] = field(default_factory=dict)
    told: set[tuple[int, int, str]] = field(default_factory=set)

    def observe(self, counts: Sequence[Sequence[float]], layers: Sequence[int], step: int) -> list[dict[str, Any]]:
        """The alerts (``alert`` events' fields) this logging step's counts raise."""
        now: set[tuple[int, int, str]] = set()
        for layer, row in zip(layers, counts, strict=True):
            for expert, load in enumerate(loads(row)):
                if load < IDLE_BELOW:
                    now.add((layer, expert, "idle"))
                elif load > HOT_ABOVE:
                    now.add((layer, expert, "hot"))
        self.streak = {k: self.streak.get(k, 0) + 1 for k in now}
        due = sorted(k for k, n in self.streak.items() if n >= self.persist and k not in self.told)
        self.told.update(due)
        return _alerts(due, counts, layers, step, self.persist)


REMEDIES = [
    "set moe_aux_loss_coef (the router's load-balancing loss; 0.001 is LLaMA-Factory's usual value)",
    "lower the router's learning rate (or keep the router frozen: lora_target without gate / router)",
]


def _alerts(
    due: list[tuple[int, int, str]], counts: Sequence[Sequence[float]], layers: Sequence[int], step: int, persist: int
) -> list[dict[str, Any]]:
    """One alert per kind: the layers and experts named, the worst first."""
    out: list[dict[str, Any]] = []
    index = {layer: i for i, layer in enumerate(layers)}
    for kind, code in (("hot", "expert_overloaded"), ("idle", "expert_idle")):
        hits = [(layer, expert) for layer, expert, k in due if k == kind]
        if not hits:
            continue
        shares = {(layer, e): loads(counts[index[layer]])[e] for layer, e in hits}
        worst = sorted(hits, key=lambda h: -shares[h] if kind == "hot" else shares[h])
        named = ", ".join(f"layer {layer} expert {e} ({shares[(layer, e)]:.2f}x)" for layer, e in worst[:4])
        more = f" and {len(hits) - 4} more" if len(hits) > 4 else ""
        what = (
            f"nearly unused (under {IDLE_BELOW:g}x a fair share of the tokens)"
            if kind == "idle"
            else f"overloaded (over {HOT_ABOVE:g}x a fair share of the tokens)"
        )
        out.append(
            {
                "level": "warn",
                "code": code,
                "message": f"{len(hits)} expert(s) {what} for {persist} logging steps up to step {step}: {named}{more}",
                "remedies": list(REMEDIES),
            }
        )
    return out
