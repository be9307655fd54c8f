"""Stage grpo's reward-hacking watch: the signs that the policy learns the reward's loophole, not the task.

Pure (no torch): :class:`RewardWatch` reads each logged step's fields (the ``step`` event's: ``reward``,
``rewards`` {name: {mean, std}}, ``kl``, ``completion_len_mean``, ``completion_truncated``) and returns the
alerts they raise, each once per run (per reward function for the first):

- ``reward_hacking`` (a reward falls): the total reward rose while one reward function's mean fell by
  ``reward_hack_drop`` or more: the later half of the last ``reward_hack_window`` logged steps against
  their earlier half, or against the run's first half-window (a slow slide);
- ``reward_hacking`` (length collapse): the mean completion length is down to ``reward_hack_min_length``
  tokens (an empty answer and its end token), or the truncated share rose by ``reward_hack_truncation_jump``;
- ``reward_hacking`` (KL drift): KL (the window's later half's median) passed ``reward_hack_kl`` while the total moved less than
  ``reward_hack_flat`` over the window.

Each alert names the numbers that tripped it and what to try.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

CODE = "reward_hacking"
DEFAULTS = {
    "reward_hack_window": 6,
    "reward_hack_drop": 0.15,
    "reward_hack_min_length": 1.5,
    "reward_hack_truncation_jump": 0.5,
    "reward_hack_kl": 1.0,
    "reward_hack_flat": 0.05,
}
REMEDIES_FALL = (
    "reweight reward_weights: the falling reward is the task, the rising one its loophole",
    "a gated reward: brevity / format counts only with the right answer (built-in concise_answer)",
    "lower learning_rate, or raise beta (a stronger pull toward the reference)",
)
REMEDIES_LENGTH = (
    "gate the length reward on the answer (concise_answer) or lower its weight",
    "raise max_completion_length, or set mask_truncated_completions",
    "lower learning_rate, or raise beta",
)
REMEDIES_KL = (
    "raise beta (a stronger pull toward the reference) or lower learning_rate",
    "check the rewards: KL spent for no reward gain is drift, not learning",
)


HELD_OUT_FALL = 0.05  # a held-out reward that fell more than this is marked (one prompt of 24 moves it 0.04)


def fell_rewards(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The reward functions whose held-out mean fell by more than :data:`HELD_OUT_FALL` from ``before`` to
    ``after`` (``held_out`` events' ``rewards``): summary.json's ``held_out_fell``."""
    b, a = (before or {}).get("rewards") or {}, (after or {}).get("rewards") or {}
    out = []
    for name, was in b.items():
        was, now = _num(was), _num(a.get(name))
        if was is not None and now is not None and was - now > HELD_OUT_FALL:
            out.append({"reward": name, "before": was, "after": now, "fell_by": round(was - now, 4)})
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if f == f and abs(f) != float("inf") else None


class RewardWatch:
    def __init__(self, cfg: RunConfig):
        def key(name: str) -> Any:
            value = getattr(cfg, name)
            return DEFAULTS[name] if value is None else value

        self.window = max(2, int(key("reward_hack_window")))
        self.drop = float(key("reward_hack_drop"))
        self.min_length = float(key("reward_hack_min_length"))
        self.truncation_jump = float(key("reward_hack_truncation_jump"))
        self.kl_bound = float(key("reward_hack_kl"))
        self.flat = float(key("reward_hack_flat"))
        self.points: deque[dict[str, Any]] = deque(maxlen=self.window)
        self.raised: set[str] = set()
        self.start: list[dict[str, Any]] = []  # the run's first half-window of logged steps

    def observe(self, step: int, fields: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The alerts this logged step raises (``alert`` event fields), none raised twice."""
        given = fields.get("rewards")
        rewards = given if isinstance(given, Mapping) else {}
        point: dict[str, Any] = {
            "step": step,
            "total": _num(fields.get("reward")),
            "per": {n: _num(v.get("mean")) for n, v in rewards.items() if isinstance(v, Mapping)},
            "kl": _num(fields.get("kl")),
            "length": _num(fields.get("completion_len_mean")),
            "truncated": _num(fields.get("completion_truncated")),
        }
        self.points.append(point)
        if len(self.start) < self.window // 2:
            self.start.append(point)
        out: list[dict[str, Any]] = []
        out += self._length(point)
        if len(self.points) < self.window:
            return out
        half = self.window // 2
        early, late = list(self.points)[:half], list(self.points)[-half:]
        span = f"steps {early[0]['step']}-{early[-1]['step']} to {late[0]['step']}-{late[-1]['step']}"

        def moved(get: Any, before: list[dict[str, Any]] = early) -> tuple[float, float] | None:
            a = [v for p in before if (v := get(p)) is not None]
            b = [v for p in late if (v := get(p)) is not None]
            return (_mean(a), _mean(b)) if a and b else None

        total = moved(lambda p: p["total"])
        # a fall within the window, or since the run's first half-window (a slow, steady slide)
        for before in (early, self.start) if self.start[-1] is not early[-1] else (early,):
            out += self._falls(point, before, late, moved)
        truncated = moved(lambda p: p["truncated"])
        if truncated is not None and truncated[1] - truncated[0] >= self.truncation_jump and "trunc" not in self.raised:
            self.raised.add("trunc")
            out.append(
                self._alert(
                    "truncation",
                    f"reward hacking? the truncated share of completions jumped {truncated[0]:.2f} -> "
                    f"{truncated[1]:.2f} (>= reward_hack_truncation_jump {self.truncation_jump:g}; {span})",
                    REMEDIES_LENGTH,
                )
            )
        kls = [p["kl"] for p in late if p["kl"] is not None]
        kl = statistics.median(kls) if kls else None  # the later half's median: one step's spike is no drift
        if (
            total is not None
            and kl is not None
            and kl > self.kl_bound
            and abs(total[1] - total[0]) < self.flat
            and "kl" not in self.raised
        ):
            self.raised.add("kl")
            out.append(
                self._alert(
                    "kl",
                    f"reward hacking? KL {kl:.3f} (median of steps {late[0]['step']}-{step}) is past reward_hack_kl {self.kl_bound:g} while the "
                    f"total reward barely moved ({total[0]:.3f} -> {total[1]:.3f}, under reward_hack_flat "
                    f"{self.flat:g}; {span}): the policy drifts from the reference for no gain",
                    REMEDIES_KL,
                )
            )
        return out

    def _falls(self, point: dict[str, Any], before: list[Any], late: list[Any], moved: Any) -> list[dict[str, Any]]:
        """The reward functions that fell by reward_hack_drop from ``before`` to ``late`` while the total rose."""
        total = moved(lambda p: p["total"], before)
        if total is None or total[1] <= total[0]:
            return []
        span = f"steps {before[0]['step']}-{before[-1]['step']} to {late[0]['step']}-{late[-1]['step']}"
        out = []
        for name in point["per"]:
            was = moved(lambda p, n=name: p["per"].get(n), before)
            if was is None or was[0] - was[1] < self.drop or f"fall:{name}" in self.raised:
                continue
            self.raised.add(f"fall:{name}")
            out.append(
                self._alert(
                    "fall",
                    f"reward hacking? the total reward rose {total[0]:.3f} -> {total[1]:.3f} while {name} fell "
                    f"{was[0]:.3f} -> {was[1]:.3f} (by {was[0] - was[1]:.3f} >= reward_hack_drop {self.drop:g}; "
                    f"{span}): the policy gains the other rewards at {name}'s cost",
                    REMEDIES_FALL,
                    reward=name,
                    before=round(was[0], 4),
                    after=round(was[1], 4),
                )
            )
        return out

    def _length(self, point: dict[str, Any]) -> list[dict[str, Any]]:
        length = point["length"]
        if length is None or length > self.min_length or "length" in self.raised or len(self.points) < 2:
            return []
        self.raised.add("length")
        first = next((p["length"] for p in self.points if p["length"] is not None), length)
        return [
            self._alert(
                "length",
                f"reward hacking? the mean completion length collapsed to {length:.2f} tokens at step "
                f"{point['step']} (from {first:.2f}; at or under reward_hack_min_length {self.min_length:g}): "
                "empty answers",
                REMEDIES_LENGTH,
            )
        ]

    @staticmethod
    def _alert(sign: str, message: str, remedies: tuple[str, ...], **extra: Any) -> dict[str, Any]:
        return {
            "level": "warn",
            "code": CODE,
            "sign": sign,
            "message": message,
            "remedies": list(remedies),
            "policy": "warn",
            **extra,
        }
