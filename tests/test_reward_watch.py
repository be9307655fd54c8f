"""Issue 52: the reward-hacking watch (cockpit/train/reward_watch.py) on both sides, and the held-out fall marks.
Step fields as the grpo recipe's step events carry them (recipes/grpo.GRPO_FIELDS)."""

from __future__ import annotations

from cockpit.config.run_config import RunConfig
from cockpit.run.notify import notification
from cockpit.train.reward_watch import DEFAULTS, RewardWatch, fell_rewards


def step(total, per, kl=0.01, length=8.0, truncated=0.2):
    return {
        "reward": total,
        "rewards": {n: {"mean": m, "std": 0.3} for n, m in per.items()},
        "kl": kl,
        "completion_len_mean": length,
        "completion_truncated": truncated,
    }


def run(watch, points):
    out = []
    for i, p in enumerate(points, 1):
        out += [(i, a) for a in watch.observe(i, p)]
    return out


def hacking_points(n=8):
    # cpu-grpo-hack's weights (0.3 contains_answer, 0.7 length_penalty): brevity rises, correctness falls
    points = []
    for i in range(n):
        contains, length = 0.45 - 0.05 * i, 0.15 + 0.12 * i
        points.append(step(0.3 * contains + 0.7 * length, {"contains_answer": contains, "length_penalty": length}))
    return points


def test_a_reward_that_falls_while_the_total_rises_is_named_with_its_numbers_once():
    alerts = run(RewardWatch(RunConfig()), hacking_points())
    assert len(alerts) == 1, alerts
    at, alert = alerts[0]
    assert at == DEFAULTS["reward_hack_window"]  # as soon as a window is full: before the run ends
    assert alert["code"] == "reward_hacking" and alert["sign"] == "fall" and alert["reward"] == "contains_answer"
    assert alert["level"] == "warn" and alert["policy"] == "warn"
    assert "contains_answer fell 0.400 -> 0.250" in alert["message"], alert["message"]
    assert "reward_hack_drop 0.15" in alert["message"] and "steps 1-3 to 4-6" in alert["message"]
    assert any("concise_answer" in r for r in alert["remedies"]) and any("beta" in r for r in alert["remedies"])


def test_a_healthy_run_raises_nothing():
    points = []  # both rewards rise (the gated demo), with noise; KL grows with the reward
    for i in range(12):
        wobble = 0.08 if i % 2 else -0.08
        contains, concise = 0.4 + 0.02 * i + wobble, 0.05 + 0.05 * i
        points.append(
            step(0.3 * contains + 0.7 * concise, {"contains_answer": contains, "concise_answer": concise}, kl=0.05 * i)
        )
    assert run(RewardWatch(RunConfig()), points) == []


def test_the_thresholds_are_the_config_keys():
    assert run(RewardWatch(RunConfig(reward_hack_drop=0.3)), hacking_points()) == []  # a fall of 0.15 is under 0.3
    alerts = run(RewardWatch(RunConfig(reward_hack_window=4, reward_hack_drop=0.08)), hacking_points())
    assert alerts[0][0] == 4 and "steps 1-2 to 3-4" in alerts[0][1]["message"]


def test_length_collapse_truncation_jump_and_kl_drift():
    collapse = [step(0.5 + 0.01 * i, {"r": 0.5}, length=8.0 - 2.5 * i) for i in range(4)]
    ((at, alert),) = run(RewardWatch(RunConfig()), collapse)
    assert at == 4 and alert["sign"] == "length" and "collapsed to 0.50 tokens at step 4 (from 8.00" in alert["message"]
    jump = [step(0.5, {"r": 0.5}, truncated=0.1 if i < 3 else 0.9) for i in range(6)]
    ((_, alert),) = run(RewardWatch(RunConfig()), jump)
    assert alert["sign"] == "truncation" and "jumped 0.10 -> 0.90" in alert["message"]
    drift = [step(0.5 + 0.005 * (i % 2), {"r": 0.5}, kl=0.4 * i) for i in range(6)]
    ((at, alert),) = run(RewardWatch(RunConfig()), drift)
    assert at == 6 and alert["sign"] == "kl", alert
    assert "KL 1.600 (median of steps 4-6) is past reward_hack_kl 1" in alert["message"], alert["message"]
    spike = [step(0.5, {"r": 0.5}, kl=3.0 if i == 5 else 0.3) for i in range(6)]
    assert run(RewardWatch(RunConfig()), spike) == []  # one step's KL spike (the gated demo had one of 3.0) is no drift
    rising = [step(0.2 + 0.1 * i, {"r": 0.2 + 0.1 * i}, kl=0.4 * i) for i in range(6)]
    assert run(RewardWatch(RunConfig()), rising) == []  # KL spent on a rising reward is learning


def test_the_alert_is_a_notification_and_held_out_falls_are_marked():
    (_, alert), *_ = run(RewardWatch(RunConfig()), hacking_points())
    note = notification({"kind": "alert", "t": 1.0, **alert}, "run-1")
    assert note is not None and note["event"] == "reward_hacking" and note["title"] == "run-1: reward hacking"
    fell = fell_rewards(
        {"rewards": {"contains_answer": 0.4583, "length_penalty": 0.1378}},
        {"rewards": {"contains_answer": 0.1667, "length_penalty": 1.0}},
    )
    assert fell == [{"reward": "contains_answer", "before": 0.4583, "after": 0.1667, "fell_by": 0.2916}]
    assert fell_rewards({"rewards": {"a": 0.5}}, {"rewards": {"a": 0.46}}) == []  # within one prompt of 24


def test_a_slow_slide_is_caught_against_the_run_start():
    """0.01 a logged step: never 0.15 within one window, more than 0.15 below the run's start by step 19."""
    points = [
        step(0.3 + 0.01 * i, {"contains_answer": 0.5 - 0.01 * i, "length_penalty": 0.2 + 0.03 * i}) for i in range(30)
    ]
    alerts = run(RewardWatch(RunConfig()), points)
    assert [(at, a["reward"]) for at, a in alerts] == [(19, "contains_answer")], alerts
    assert "steps 1-3 to 17-19" in alerts[0][1]["message"]


def test_the_live_state_keeps_a_series_per_reward_function():
    from cockpit.ui.state import REWARD_SLOTS, STAGE_METRICS, RunState

    state = RunState()
    state.apply([{"kind": "step", "step": s, "loss": 0.1, **p} for s, p in enumerate(hacking_points(3), 1)])
    assert state.reward_names == ["contains_answer", "length_penalty"] and set(REWARD_SLOTS) <= set(STAGE_METRICS)
    assert state.series["reward_fn1"].means() == [0.45, 0.4, 0.35]
    assert state.series["reward_fn2"].means() == [0.15, 0.27, 0.39]
    assert state.metric_label("reward_fn1") == ("contains_answer", "0.350±0.30")
    assert state.metric_label("reward_fn3") is None and state.metric_label("kl") is None
