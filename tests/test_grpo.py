"""Issue 36: stage grpo (TRL's GRPOTrainer). Config rules (ranges, refusals named), reward functions
(built-ins, a user's file, a function that raises or returns the wrong shape named with its sample),
the prompts' data, a short real run's events and summary, and the demo preset's held-out reward rise."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, cockpit, read_events, tiny_config

from cockpit.config.load import validate
from cockpit.config.run_config import RunConfig
from cockpit.data.rewards import build_reward_funcs, checked, completion_text, total_rewards
from cockpit.errors import InputError
from cockpit.train.reward_watch import fell_rewards

BASE = {"dataset": "x.jsonl", "stage": "grpo", "reward_funcs": "exact_match", "per_device_train_batch_size": 8}


def problems(raw: dict) -> list:
    with pytest.raises(InputError) as err:
        validate(raw, check_paths=False)
    return err.value.problems


def named(raw: dict, key: str, words: str) -> None:
    found = [p for p in problems(raw) if p.key == key and words in p.message]
    assert found, [str(p) for p in problems(raw)]


def test_a_valid_grpo_config_passes_with_trl_defaults():
    cfg = validate(dict(BASE), check_paths=False)
    assert cfg.num_generations == 8 and cfg.loss_type == "dapo" and cfg.beta == 0.0
    assert cfg.scale_rewards == "group" and cfg.epsilon == 0.2 and cfg.max_completion_length == 256


@pytest.mark.parametrize(
    "over, key, words",
    [
        ({"reward_funcs": None}, "reward_funcs", "stage grpo needs reward_funcs"),
        ({"reward_funcs": "exact_match,bleu"}, "reward_funcs", "unknown reward function 'bleu'"),
        ({"reward_funcs": "exact_match,exact_match"}, "reward_funcs", "named twice"),
        ({"reward_weights": "1,2"}, "reward_weights", "2 weights for 1 reward functions"),
        ({"reward_weights": "one"}, "reward_weights", "comma list of numbers"),
        ({"reward_weights": "0"}, "reward_weights", "not all zero"),
        ({"reward_funcs": "regex"}, "reward_regex", "needs reward_regex"),
        ({"reward_funcs": "regex", "reward_regex": "(["}, "reward_regex", "does not compile"),
        ({"reward_regex": "^a$"}, "reward_regex", "add regex to reward_funcs"),
        ({"reward_funcs": "length_penalty"}, "reward_target_words", "needs reward_target_words"),
        ({"reward_target_words": 3}, "reward_target_words", "add length_penalty"),
        ({"per_device_train_batch_size": 6}, "num_generations", "must be divisible by num_generations (8)"),
        (
            {"per_device_train_batch_size": 2, "num_generations": 4, "steps_per_generation": 3},
            "num_generations",
            "steps_per_generation = 6 completions",
        ),
        ({"num_generations": 1}, "num_generations", ">= 2"),
        ({"loss_type": "ppo"}, "loss_type", "grpo | dr_grpo | dapo"),
        ({"scale_rewards": "yes"}, "scale_rewards", "group | batch | none"),
        ({"epsilon": 0}, "epsilon", "> 0"),
        ({"epsilon": 0.3, "epsilon_high": 0.2}, "epsilon_high", ">= epsilon"),
        ({"beta": -0.1}, "beta", ">= 0"),
        ({"use_vllm": True, "use_cpu": True}, "use_vllm", "trains on the CPU"),
        ({"vllm_mode": "remote"}, "vllm_mode", "colocate | server"),
        ({"pref_beta": 0.5}, "pref_beta", "not honoured for stage grpo"),
        ({"ref_model": "x"}, "ref_model", "not honoured for stage grpo"),
        ({"eval_strategy": "steps"}, "eval_strategy", "not honoured for stage grpo"),
        ({"max_new_tokens": 20}, "max_new_tokens", "max_completion_length"),
    ],
)
def test_grpo_config_rules_name_the_key(over, key, words):
    named({**BASE, **over}, key, words)


@pytest.mark.parametrize("stage", ["sft", "dpo", "pt"])
def test_a_grpo_key_on_another_stage_is_refused(stage):
    named({"dataset": "x.jsonl", "stage": stage, "num_generations": 4}, "num_generations", "stage grpo only")
    named({"dataset": "x.jsonl", "stage": stage, "reward_funcs": "regex"}, "reward_funcs", "stage grpo only")


def test_a_user_reward_file_is_found_and_its_function_checked_without_running_it(tmp_path):
    f = tmp_path / "rw.py"
    f.write_text("raise SystemExit('never run at check')\ndef good(prompts, completions, **kw):\n    return []\n")
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    raw = {**BASE, "dataset": str(data), "reward_funcs": f"{f}:good"}
    cfg = validate(raw, check_paths=True)
    assert cfg.reward_funcs == f"{f}:good"
    with pytest.raises(InputError, match="defines no top-level function 'missing'"):
        validate({**raw, "reward_funcs": f"{f}:missing"}, check_paths=True)
    with pytest.raises(InputError, match="reward file not found"):
        validate({**raw, "reward_funcs": f"{tmp_path}/nope.py:good"}, check_paths=True)


# -- rewards --------------------------------------------------------------------------------------
def conv(*texts: str) -> list:
    return [[{"role": "assistant", "content": t}] for t in texts]


def test_builtin_rewards_score_strings_and_messages():
    cfg = RunConfig(
        reward_funcs="exact_match,numeric_match,regex,length_penalty",
        reward_regex=r"^Answer: \w+$",
        reward_target_words=2,
        reward_answer_column="answer",
    )
    exact, numeric, rx, length = build_reward_funcs(cfg)
    assert [f.__name__ for f in (exact, numeric, rx, length)] == [
        "exact_match",
        "numeric_match",
        "regex",
        "length_penalty",
    ]
    prompts = ["q"] * 4
    assert exact(prompts, conv(" Paris.", "paris", "'PARIS'", "Lyon"), answer=["Paris"] * 4) == [1.0, 1.0, 1.0, 0.0]
    assert numeric(prompts, ["It is 12.", "1,000", "x = -3.5", "none"], answer=["12", "1000", -3.5, "4"]) == [
        1.0,
        1.0,
        1.0,
        0.0,
    ]
    assert rx(prompts, ["Answer: yes", "answer: yes", "Answer: two words", "Answer: x"]) == [1.0, 0.0, 0.0, 1.0]
    assert length(prompts, ["one", "one two", "one two three four", ""]) == [1.0, 1.0, 0.5, 1.0]
    scored = total_rewards([exact, length], [0.5, 0.5], ["q", "q"], conv("Paris", "it is Paris"), answer=["Paris"] * 2)
    assert scored["total"] == [1.0, 0.5 * 2 / 3]
    assert completion_text([{"role": "assistant", "content": "x"}]) == "x"


def test_exact_match_names_a_missing_column():
    (exact,) = build_reward_funcs(RunConfig(reward_funcs="exact_match", reward_answer_column="gold"))
    with pytest.raises(InputError, match=r"reward function exact_match raised KeyError.*'gold'.*columns: answer"):
        exact(["What?"], ["x"], answer=["x"])


def test_a_user_reward_function_is_imported_from_its_file(tmp_path):
    (tmp_path / "helper.py").write_text("BONUS = 0.5\n")
    f = tmp_path / "my_rewards.py"
    f.write_text(
        textwrap.dedent(
            """
            from helper import BONUS

            def starts_yes(prompts, completions, answer, **kwargs):
                return [BONUS + (c[0]["content"].startswith("yes") and a == "y") for c, a in zip(completions, answer)]
            """
        )
    )
    (fn,) = build_reward_funcs(RunConfig(reward_funcs=f"{f}:starts_yes"))
    assert fn.__name__ == "starts_yes"
    assert fn(["p", "p"], conv("yes!", "no"), answer=["y", "y"]) == [1.5, 0.5]


@pytest.mark.parametrize(
    "body, words",
    [
        (
            "raise ValueError('boom')",
            "reward function bad raised ValueError: boom (sample 0: prompt Is it 2?; completion two",
        ),
        ("return [1.0]", "reward function bad returned 1 rewards for 2 completions"),
        ("return 1.0", "reward function bad returned float, not a list of 2 floats"),
        ("return ['a', 1.0]", "reward function bad returned str a for a completion, not a float (or None) (sample 0"),
        (
            "return [1.0, float('nan')]",
            "reward function bad returned nan (not finite) (sample 1: prompt Is it 3?; completion three",
        ),
    ],
)
def test_a_bad_reward_function_is_named_with_its_sample(tmp_path, body, words):
    f = tmp_path / "bad_rewards.py"
    f.write_text(f"def bad(prompts, completions, **kwargs):\n    {body}\n")
    (fn,) = build_reward_funcs(RunConfig(reward_funcs=f"{f}:bad"))
    prompts = [[{"role": "user", "content": "Is it 2?"}], [{"role": "user", "content": "Is it 3?"}]]
    with pytest.raises(InputError) as err:
        fn(prompts, conv("two", "three"))
    assert words in str(err.value), str(err.value)
    assert err.value.problems[0].key == "reward_funcs"


def test_none_rewards_pass_and_bools_are_refused():
    fn = checked(lambda prompts, completions, **kw: [None, 1], "f")
    assert fn(["a", "b"], ["x", "y"]) == [None, 1.0]
    with pytest.raises(InputError, match="returned bool"):
        checked(lambda prompts, completions, **kw: [True], "g")(["a"], ["x"])


# -- data -----------------------------------------------------------------------------------------
def test_grpo_rows_plain_chat_and_alpaca_keep_their_columns_and_bad_rows_are_named(tmp_path, tokenizer):
    from cockpit.data.stage_data import collect_stage_samples, prepare_stage_data

    rows = [
        {"prompt": "What is 2+2?", "answer": "4"},
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of Peru?"}],
            "answer": "Lima",
        },
        {"instruction": "Name a colour", "input": "of the sky", "answer": "blue", "tags": ["x"]},
    ]
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = validate({**BASE, "dataset": str(good)}, check_paths=True)
    loaded = collect_stage_samples(cfg)
    assert [s["prompt"][-1]["content"] for s in loaded.samples] == [
        "What is 2+2?",
        "Capital of Peru?",
        "Name a colour\nof the sky",
    ]
    assert loaded.samples[1]["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert [s["columns"] for s in loaded.samples] == [
        {"answer": "4"},
        {"answer": "Lima"},
        {"answer": "blue", "tags": ["x"]},
    ]
    report = prepare_stage_data(cfg, tokenizer, loaded).report
    assert report.stage == "grpo" and report.samples == 3 and report.lines()[0].startswith("prompts: 3")

    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"prompt": "ok", "answer": 1})
        + "\n"
        + json.dumps({"answer": "no prompt"})
        + "\n"
        + json.dumps({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
        + "\n"
    )
    with pytest.raises(InputError) as err:
        collect_stage_samples(validate({**BASE, "dataset": str(bad)}, check_paths=True))
    lines = {(Path(p.file).name, p.line): p.message for p in err.value.problems}
    assert "missing prompt column" in lines[("bad.jsonl", 2)]
    assert "must end on a user turn" in lines[("bad.jsonl", 3)]


# -- a real run -----------------------------------------------------------------------------------
def prompt_file(path: Path, n: int = 12) -> Path:
    rows = [{"prompt": f"Say a number, {i}?", "answer": str(i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def grpo_config(tmp_path: Path, model_dir: Path, name: str = "tiny", **over) -> Path:
    """A few-step grpo run of the tiny model on :func:`prompt_file`'s prompts, groups of 2, no probes."""
    keys = {"stage": "grpo", "dataset": str(prompt_file(tmp_path / "prompts.jsonl")), "num_generations": 2}
    return tiny_config(tmp_path, model_dir, name, **{**keys, "probes": None, **over})


def train(tmp_path: Path, cfg: Path) -> tuple[object, Path]:
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), env={"OMP_NUM_THREADS": "1"}, timeout=900)
    return res, next((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_a_short_grpo_run_logs_rewards_completions_and_the_held_out_reward(tmp_path, tiny_model_dir):
    rewards = tmp_path / "rw.py"
    rewards.write_text(
        "def short(prompts, completions, **kwargs):\n"
        "    return [1.0 / (1 + len(c[0]['content'])) for c in completions]\n"
    )
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        reward_funcs=f"numeric_match,{rewards}:short",
        reward_weights="1.0,0.5",
        max_completion_length=6,
        per_device_train_batch_size=4,
        max_steps=3,
        save_steps=2,
        val_size=3,
        beta=0.04,  # the reference: the base with the adapter disabled, its KL logged
    )
    res, run = train(tmp_path, cfg)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    events = read_events(run)
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3]
    for e in steps:
        assert set(e["rewards"]) == {"numeric_match", "short"}, e
        assert {"mean", "std"} <= set(e["rewards"]["short"])
        for key in ("reward", "reward_std", "kl", "entropy", "clip_ratio", "completion_len_mean", "completion_len_max"):
            assert isinstance(e[key], (int, float)), (key, e)
        assert 0 <= e["completion_truncated"] <= 1 and e["completion_len_max"] <= 6
        assert e["reward"] == pytest.approx(
            e["rewards"]["numeric_match"]["mean"] + 0.5 * e["rewards"]["short"]["mean"], abs=1e-3
        )
    samples = [e for e in events if e["kind"] == "completions"]
    assert len(samples) == 3 and all(1 <= len(e["samples"]) <= 4 for e in samples)
    first = samples[0]["samples"][0]
    assert first["prompt"].startswith("Say a number") and set(first["rewards"]) == {"numeric_match", "short"}
    for s in first, samples[-1]["samples"][-1]:  # the weighted total, as the step's reward averages it
        rw = s["rewards"]
        assert s["reward"] == pytest.approx((rw["numeric_match"] or 0.0) + 0.5 * rw["short"], abs=1e-3)
    held = {e["phase"]: e for e in events if e["kind"] == "held_out"}
    assert set(held) == {"before", "after"}
    for e in held.values():
        assert e["stage"] == "grpo" and e["prompts"] == 3 and 0 <= e["mean_reward"] <= 1.5
        assert set(e["rewards"]) == {"numeric_match", "short"} and e["samples"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["trainer"] == "GRPOTrainer"
    assert summary["held_out_before"]["mean_reward"] == held["before"]["mean_reward"]
    assert summary["held_out_after"]["mean_reward"] == held["after"]["mean_reward"]
    assert summary["held_out_fell"] == fell_rewards(held["before"], held["after"])  # the rewards that fell, if any
    assert summary["reward_funcs"] == ["numeric_match", f"{rewards}:short"] and summary["reward_weights"] == [1.0, 0.5]
    assert (run / "adapter" / "adapter_config.json").exists()
    assert "reward" in res.stdout and "held-out after: 3 prompts, mean reward" in res.stdout


def test_a_reward_function_that_raises_fails_the_run_naming_it(tmp_path, tiny_model_dir):
    rewards = tmp_path / "rw.py"
    rewards.write_text("def broken(prompts, completions, **kwargs):\n    return {'not': 'a list'}\n")
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        reward_funcs=f"{rewards}:broken",
        max_completion_length=4,
        per_device_train_batch_size=2,
        max_steps=2,
    )
    res, run = train(tmp_path, cfg)
    assert res.returncode != 0
    failed = [e for e in read_events(run) if e["kind"] == "run_failed"]
    assert failed and "reward function broken returned dict" in failed[-1]["reason"], failed
    assert "prompt Say a number" in failed[-1]["reason"]


@pytest.mark.slow
def test_a_bf16_grpo_run_with_additional_target_samples_in_its_mixed_precision(tmp_path, tiny_model_dir):
    """TRL's sampling over a bf16 base with an fp32 ``norm`` copy (``additional_target``) runs under
    bf16 autocast, as training does: outside it the norm's fp32 output met a bf16 linear and the run
    failed at its first sampling (found on the CPU after the probes' same defect on a GPU)."""
    cfg = grpo_config(
        tmp_path, tiny_model_dir, bf16=True, additional_target="norm", reward_funcs="contains_answer",
        max_completion_length=4, per_device_train_batch_size=2, max_steps=2,
    )
    res, run = train(tmp_path, cfg)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    events = read_events(run)
    assert len([e for e in events if e["kind"] == "step"]) == 2
    assert events[-1]["kind"] in ("state", "run_finished") and any(e["kind"] == "run_finished" for e in events)


@pytest.mark.budget(180, reason="the GRPO demo preset on the embedded 135M model: learning is what it asserts (16 steps: 97 s of training, about 150 s in all)")
@pytest.mark.slow
def test_cpu_grpo_demo_preset_raises_the_held_out_reward(tmp_path, embedded_dir):
    """Issue 52: the demo (concise_answer: brevity only with the right answer) learns the task on held-out
    prompts, not the reward's loophole: the total rises, contains_answer rises, no reward function falls."""
    runs = tmp_path / "runs"
    res = cockpit(
        "train",
        str(ROOT / "presets" / "cpu-grpo-demo.yaml"),
        "--runs-dir",
        str(runs),
        env={"OMP_NUM_THREADS": "1"},
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in runs.iterdir() if d.is_dir())
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["held_out_before"], summary["held_out_after"]
    print(json.dumps({"train_runtime_s": summary["train_runtime_s"], "before": before, "after": after}))
    assert summary["state"] == "finished"
    assert summary["train_runtime_s"] <= 360
    assert after["mean_reward"] - before["mean_reward"] >= 0.25
    # the task, not a loophole: correctness rises and no reward function pays for another's rise
    assert after["rewards"]["contains_answer"] > before["rewards"]["contains_answer"], (before, after)
    assert set(after["rewards"]) == set(before["rewards"]) and len(before["rewards"]) >= 2
    for name, was in before["rewards"].items():
        assert after["rewards"][name] >= was - 0.05, (name, before, after)
    events = read_events(run)
    rewards = [e["reward"] for e in events if e["kind"] == "step"]
    assert max(rewards[-3:]) > rewards[0]
    # the healthy side of the reward-hacking alert: a run that learns the task raises none
    assert not [e for e in events if e["kind"] == "alert" and e["code"] == "reward_hacking"], events


@pytest.mark.budget(150, reason="the hacking preset on the embedded 135M model: the alert needs the model to hack")
@pytest.mark.slow
def test_the_hacking_preset_raises_the_reward_hacking_alert_naming_the_falling_reward(tmp_path, embedded_dir):
    """Issue 52: cpu-grpo-hack (a free length reward outweighs correctness) hacks; the watch in the ranks raises
    ``reward_hacking`` naming contains_answer, with its numbers, before the run ends; train's output (attach's
    words) shows it."""
    runs = tmp_path / "runs"
    res = cockpit(
        "train",
        str(ROOT / "presets" / "cpu-grpo-hack.yaml"),
        "--runs-dir",
        str(runs),
        env={"OMP_NUM_THREADS": "1"},
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in runs.iterdir() if d.is_dir())
    events = read_events(run)
    alerts = [e for e in events if e["kind"] == "alert" and e["code"] == "reward_hacking"]
    steps = [e["step"] for e in events if e["kind"] == "step"]
    print(json.dumps({"alerts": alerts, "last_step": steps[-1]}))
    falls = [a for a in alerts if a["sign"] == "fall"]
    assert falls and falls[0]["reward"] == "contains_answer", alerts
    assert falls[0]["step"] < steps[-1] == 10  # raised while the run trained
    assert falls[0]["before"] - falls[0]["after"] >= 0.15
    assert "contains_answer fell" in falls[0]["message"] and falls[0]["remedies"]
    assert "ALERT [warn] reward_hacking: reward hacking? the total reward rose" in res.stdout


@pytest.mark.slow
def test_grpo_on_two_gloo_ranks_groups_completions_across_ranks(tmp_path, tiny_model_dir):
    """DDP on 2 CPU ranks: the generation batch (2 per device x 2 ranks = 4) holds 2 prompts' groups of 2;
    rank 0 reports the rewards of every rank's completions and the held-out measure; both ranks finish."""
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        "grpo2",
        reward_funcs="length_penalty",
        reward_target_words=2,
        max_completion_length=4,
        per_device_train_batch_size=2,
        nproc_per_node=2,
        max_steps=2,
        save_steps=10,
        val_size=2,
    )
    res, run = train(tmp_path, cfg)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    events = read_events(run)
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2] and all(0 < e["reward"] <= 1 for e in steps)
    samples = [e for e in events if e["kind"] == "completions"]
    assert samples and len(samples[0]["samples"]) == 4  # the whole generation batch, both ranks' completions
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["held_out_after"]["prompts"] == 2


def test_sampled_completions_carry_the_weighted_total_reward():
    from cockpit.train.recipes.grpo import sampled_completions, trainer_reward_weights

    logs = {
        "prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(6)],
        "completion": [[{"role": "assistant", "content": f"a{i}"}] for i in range(6)],
        "rewards": {"exact": [1.0, 0.0, 1.0, 0.0, 1.0, float("nan")], "short": [0.5] * 6},
        "advantages": [0.1, -0.1, 0.2, -0.2, 0.3, -0.3],
    }

    class Trainer:  # TRL's attributes: names in reward_funcs' order, a tensor of weights
        reward_func_names = ["exact", "short"]
        reward_weights = [0.3, 0.7]

    weights = trainer_reward_weights(Trainer())
    assert weights == {"exact": 0.3, "short": 0.7}
    out = sampled_completions(logs, 4, weights)
    assert [s["prompt"] for s in out] == ["q2", "q3", "q4", "q5"]
    assert [s["reward"] for s in out] == [0.65, 0.35, 0.65, 0.35]  # a NaN (None) reward left out, as TRL's nansum
    assert out[-1]["rewards"] == {"exact": None, "short": 0.5} and out[0]["advantage"] == 0.2
    assert sampled_completions(logs, 1)[0]["reward"] == 0.5  # no weights: each weighs 1.0
    assert trainer_reward_weights(object()) is None


def test_the_live_state_keeps_grpo_series_from_step_events():
    from cockpit.ui.state import STAGE_METRICS, RunState

    state = RunState()
    fields = {"reward": 0.25, "reward_std": 0.1, "kl": 0.01, "clip_ratio": 0.0, "entropy": 2.5}
    state.apply([{"kind": "step", "step": s, "loss": 0.1, **{k: v * s for k, v in fields.items()}} for s in (1, 2)])
    for key in ("reward", "reward_std", "kl", "clip_ratio", "entropy", "completion_len_mean", "completion_truncated"):
        assert key in STAGE_METRICS
    assert state.series["reward"].means() == [0.25, 0.5] and state.series["kl"].means() == [0.01, 0.02]


def test_cockpit_check_refuses_vllm_without_a_gpu_and_names_a_reward_file_that_fails_to_import(
    tmp_path, tiny_model_dir
):
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM and a GPU are here: use_vllm is not refused")
    cfg = grpo_config(tmp_path, tiny_model_dir, reward_funcs="exact_match", use_cpu=None, use_vllm=True)
    res = cockpit("check", str(cfg))
    assert res.returncode == 2 and "use_vllm" in res.stderr + res.stdout
    assert "unset use_vllm to generate with HF generate" in res.stderr + res.stdout
    bad = tmp_path / "badimp.py"
    bad.write_text(
        "import no_such_module_here\ndef f(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    cfg = grpo_config(tmp_path, tiny_model_dir, reward_funcs=f"{bad}:f")
    res = cockpit("check", str(cfg))
    assert res.returncode == 2
    assert f"importing reward file {bad} failed: ModuleNotFoundError" in res.stderr + res.stdout


@pytest.mark.slow
def test_a_grpo_run_resumes_from_its_checkpoint(tmp_path, tiny_model_dir):
    """Stage grpo's checkpoint (adapter, optimizer, TRL's state) resumes: a second run from checkpoint-2
    trains steps 3 and 4 only."""
    keys = {"reward_funcs": "length_penalty", "reward_target_words": 2, "max_completion_length": 4}
    first = grpo_config(
        tmp_path, tiny_model_dir, "first", per_device_train_batch_size=2, max_steps=2, save_steps=2, **keys
    )
    res, run = train(tmp_path, first)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    checkpoint = run / "checkpoints" / "checkpoint-2"
    assert checkpoint.is_dir()
    (tmp_path / "again").mkdir()
    second = grpo_config(
        tmp_path / "again",
        tiny_model_dir,
        "second",
        per_device_train_batch_size=2,
        max_steps=4,
        save_steps=2,
        resume_from_checkpoint=str(checkpoint),
        **keys,
    )
    res, run2 = train(tmp_path / "again", second)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    steps = [e["step"] for e in read_events(run2) if e["kind"] == "step"]
    assert steps == [3, 4]
    assert json.loads((run2 / "summary.json").read_text())["state"] == "finished"


def start_long_grpo_run(tmp_path: Path, model_dir: Path, **over) -> Path:
    """A detached grpo run of many short steps (groups of 2, 4-token completions): its run dir."""
    from conftest import start_detached

    cfg = grpo_config(
        tmp_path,
        model_dir,
        reward_funcs="length_penalty",
        reward_target_words=2,
        max_completion_length=4,
        per_device_train_batch_size=2,
        **over,
    )
    return start_detached(tmp_path, cfg, env={"OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_a_grpo_run_stopped_with_cockpit_stop_saves_a_checkpoint_and_ends_stopped(tmp_path, tiny_model_dir):
    """``cockpit stop`` during training: the ranks agree at the next step boundary, save a checkpoint
    there (adapter and TRL's trainer state) and the run ends ``stopped`` before its last step."""
    from conftest import wait_for

    run = start_long_grpo_run(tmp_path, tiny_model_dir, max_steps=200, save_steps=1000)
    wait_for(lambda: any(e["kind"] == "completions" for e in read_events(run)), 600, "the first sampled completions")
    res = cockpit("stop", str(run), "--wait", "600")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped", status
    events = read_events(run)
    saved = [e["step"] for e in events if e["kind"] == "checkpoint_saved"]
    assert saved and 1 <= saved[-1] < 200, saved
    assert (run / "checkpoints" / f"checkpoint-{saved[-1]}" / "trainer_state.json").exists()
    assert [e for e in events if e["kind"] == "run_stopped"][-1]["step"] == saved[-1]


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_grpo_run_through_a_nan_stops_naming_it_and_keeps_no_poisoned_adapter(tmp_path, tiny_model_dir, ranks):
    """The shared flow's NaN rule for grpo: full fine-tuning at an absurd learning rate poisons the
    weights, which the advantage-weighted loss (near 0) never shows; the next sampling meets
    non-finite probabilities, every rank agrees to stop, and the run fails naming the update that did
    it, its checkpoint marked poisoned and the one before it as the run's model."""
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        reward_funcs="length_penalty",
        reward_target_words=2,
        max_completion_length=4,
        per_device_train_batch_size=2,
        max_steps=30,
        save_steps=1,
        finetuning_type="full",
        nproc_per_node=ranks,
        learning_rate=1e6,
        weight_decay=10.0,
        max_grad_norm=0.0,
        nan_policy="stop",
    )
    res, run = train(tmp_path, cfg)
    summary = json.loads((run / "summary.json").read_text())
    assert res.returncode != 0 and summary["state"] == "failed", res.stdout[-3000:] + res.stderr[-3000:]
    assert "weights became nan/inf at step" in summary["reason"] and "stopped on NaN" in summary["reason"], summary[
        "reason"
    ]
    events = read_events(run)
    alert = next(e for e in events if e["kind"] == "alert" and e["code"] == "nan_loss")
    nan_step = summary["nan_step"]
    assert f"the update of step {nan_step} made the weights nan/inf" in alert["message"], alert
    assert [e["step"] for e in events if e["kind"] == "step"][-1] == nan_step < 30
    saved = [e["step"] for e in events if e["kind"] == "checkpoint_saved"]
    assert nan_step in saved  # save_steps 1: that update's weights were saved before sampling failed ...
    record = json.loads((run / "checkpoints" / f"checkpoint-{nan_step}" / "cockpit_checkpoint.json").read_text())
    assert record["loss_finite"] is False  # ... and are marked poisoned: never the adapter, never resumed from
    if summary["adapter_from"]:  # the last checkpoint before it is the run's model
        assert summary["adapter_from"] == f"checkpoint-{nan_step - 1}" and summary["adapter_from"] in summary["reason"]
        from safetensors.torch import load_file

        weights = load_file(str(run / "adapter" / "model.safetensors"))
        assert all(bool(t.isfinite().all()) for t in weights.values())


@pytest.mark.slow
@pytest.mark.serial
def test_a_stalled_grpo_rank_is_noticed_as_a_hang_naming_it(tmp_path, tiny_model_dir):
    """A rank that stops making progress mid-generation (SIGSTOP) is a hang alert naming the rank."""
    import os
    import signal

    from conftest import cockpit as run_cockpit
    from conftest import wait_for

    run = start_long_grpo_run(tmp_path, tiny_model_dir, max_steps=100000, save_steps=100000, hang_timeout_s=3.0)
    wait_for(lambda: sum(e["kind"] == "step" for e in read_events(run)) >= 2, 600, "two steps")
    rank_pid = int(json.loads((run / "status.json").read_text())["rank_pids"]["0"])
    assert not [e for e in read_events(run) if e["kind"] == "alert" and e["code"] == "hang"]  # none while it works
    t0 = time.time()
    os.kill(rank_pid, signal.SIGSTOP)
    try:
        alert = wait_for(
            lambda: next((e for e in read_events(run) if e["kind"] == "alert" and e["code"] == "hang"), None),
            60,
            "a hang alert",
        )
        assert "rank 0" in alert["message"] and alert["t"] >= t0, alert
    finally:
        os.kill(rank_pid, signal.SIGCONT)
        run_cockpit("stop", str(run), "--kill", "--wait", "30")
