"""Every sampler and pruner docs/sweeps.md names, end to end through ``cockpit sweep`` on the tiny
Llama (issue 67): a grid sweep runs each grid point once and ends cleanly (Optuna's GridSampler asks the
study to stop at its last point, which raised out of the driver's ``tell``), a grid larger than
``trials`` ends at the budget, two at a time; TPE past its random start-up and each pruner asked with a
completed trial to judge against. Short runs: two steps, an evaluation at each, ``--skip-check``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_CONFIG, cockpit, tiny_config, write_yaml
from test_sweep import ENV, sweep_runs

from cockpit.sweep.driver import suggest

# two steps, each evaluated on four held-out samples: the pruners' values at steps 1 and 2
FAST = dict(
    max_steps=2, val_size=4, eval_strategy="steps", eval_steps=1, save_steps=1000, probes=None, numa_bind="off",
    telemetry_interval_s=0, warmup_ratio=0.0,
)


def run_sweep(tmp_path: Path, base: Path, name: str, check: bool = False, **spec) -> tuple[str, dict]:
    """``cockpit sweep`` of ``spec`` to its end (exit 0 asserted; without its check of the space unless
    ``check``); its output and ``status --json``."""
    runs = tmp_path / "runs"
    path = write_yaml(tmp_path / f"{name}.sweep.yaml", {"name": name, "base": base.name, **spec})
    skip = () if check else ("--skip-check",)
    res = cockpit("sweep", str(path), *skip, "--poll", "0.2", "--runs-dir", str(runs), env=ENV, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    st = cockpit("sweep", "status", name, "--json", "--runs-dir", str(runs), env=ENV)
    assert st.returncode == 0, st.stdout + st.stderr
    return res.stdout, json.loads(st.stdout)


def one_run_each(runs: Path, name: str, count: int) -> dict[int, dict]:
    by_trial = sweep_runs(runs, name)
    assert sorted(by_trial) == list(range(count)) and all(len(v) == 1 for v in by_trial.values()), by_trial
    return {n: v[0] for n, v in by_trial.items()}


@pytest.mark.slow
@pytest.mark.budget(90, "a two-point grid sweep of the tiny Llama, its status, resume and best")
def test_a_grid_sweep_runs_every_point_once_and_ends(tmp_path, tiny_model_dir):
    """The issue's sweep: a two-point grid, one at a time, no pruner, ``trials`` above the grid's size.
    The last point's ``tell`` made Optuna's GridSampler call ``study.stop()`` (a RuntimeError outside
    ``optimize``): the driver died with its trial told. Now each point runs once, the sweep ends (exit 0),
    status and best say so, and ``--resume`` of the ended sweep asks nothing more."""
    from cockpit.ui.screens.sweep import title_text

    runs = tmp_path / "runs"
    base = tiny_config(tmp_path, tiny_model_dir, "base", **FAST)
    grid = [5e-3, 1e-8]
    out, st = run_sweep(tmp_path, base, "g", space={"learning_rate": grid}, trials=3, sampler="grid", pruner="none")
    assert "2 trials (the grid's 2 points; trials: 3)" in out and "the grid is used up" in out, out
    status = one_run_each(runs, "g", 2)
    assert all(s["state"] == "finished" for s in status.values()), status
    assert sorted(t["params"]["learning_rate"] for t in st["trials"]) == sorted(grid)  # each point once
    assert [t["state"] for t in st["trials"]] == ["complete", "complete"] and st["trials_budget"] == 2
    assert st["grid_points"] == 2 and st["best"]["params"] == {"learning_rate": 5e-3}  # the rate that learns
    assert "2/2 trials" in title_text(st).plain
    res = cockpit("sweep", "--resume", "g", "--poll", "0.2", "--runs-dir", str(runs), env=ENV, timeout=120)
    assert res.returncode == 0 and "resumed (2 of 2 trials asked)" in res.stdout, res.stdout + res.stderr
    assert len(sweep_runs(runs, "g")) == 2  # no third run: the budget is the grid's
    best = cockpit("sweep", "best", "g", "--json", "--runs-dir", str(runs), env=ENV)
    assert best.returncode == 0 and json.loads(best.stdout)["number"] == st["best"]["number"], best.stdout + best.stderr


def judged(runs: Path, st: dict, count: int) -> None:
    """Every trial ended (complete or pruned), a best among them, and every trial reported the objective
    at both steps to the study (what the pruner judges: the second trial's against the first's)."""
    from cockpit.sweep.driver import open_study, read_sweep_spec

    states = [t["state"] for t in st["trials"]]
    assert len(states) == count and set(states) <= {"complete", "pruned"} and "complete" in states, st["trials"]
    assert st["best"] is not None and st["best"]["number"] in [t["number"] for t in st["trials"] if t["state"] == "complete"]
    study = open_study(runs, read_sweep_spec(runs, st["name"]))
    assert all(sorted(t.intermediate_values) == [1, 2] for t in study.trials), [t.intermediate_values for t in study.trials]


LR = {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}


@pytest.mark.slow
@pytest.mark.budget(150, "two grid sweeps of the tiny Llama (three trials two at a time, then two of a four-point grid)")
def test_a_grid_two_at_a_time_and_a_grid_larger_than_the_budget(tmp_path, tiny_model_dir):
    """``parallel: 2`` over a three-point grid with the median pruner: the last point's tell (told while
    no other trial runs, as Optuna's GridSampler decides) ends the sweep, each point once. A four-point
    grid with a budget of two and Hyperband: the budget ends it, two distinct points of the grid, no stop
    asked by the sampler."""
    runs = tmp_path / "runs"
    base = tiny_config(tmp_path, tiny_model_dir, "base", **FAST)
    grid = [5e-3, 1e-3, 1e-8]
    out, st = run_sweep(
        tmp_path, base, "gp", space={"learning_rate": grid}, trials=3, parallel=2, sampler="grid", pruner="median",
        pruner_startup_trials=1, seed=0,
    )
    assert "the grid is used up" in out and out.count(": run ") == 3, out
    status = one_run_each(runs, "gp", 3)
    assert status[0]["started"] < status[1]["ended"] and status[1]["started"] < status[0]["ended"]  # two at once
    assert sorted(t["params"]["learning_rate"] for t in st["trials"]) == sorted(grid)
    judged(runs, st, 3)

    space = {"learning_rate": [5e-3, 1e-8], "lora_rank": [2, 4]}
    out, st = run_sweep(tmp_path, base, "gh", space=space, trials=2, sampler="grid", pruner="hyperband", seed=0)
    assert "the grid is used up" not in out and st["trials_budget"] == 2 and st["grid_points"] == 4, out
    one_run_each(runs, "gh", 2)
    points = {tuple(t["params"][k] for k in sorted(space)) for t in st["trials"]}
    assert len(points) == 2 and all(lr in space["learning_rate"] and r in space["lora_rank"] for lr, r in points)
    judged(runs, st, 2)


@pytest.mark.slow
@pytest.mark.budget(180, "four two-trial sweeps of the tiny Llama: TPE with each pruner, random with Hyperband")
def test_tpe_with_each_pruner_and_random_with_hyperband(tmp_path, tiny_model_dir):
    """The combinations no other test runs (random with the median pruner: test_sweep; random with none:
    the tie test below): two trials each, one at a time, so the second is drawn by TPE itself (one
    start-up trial) and judged by the pruner against the first."""
    runs = tmp_path / "runs"
    base = tiny_config(tmp_path, tiny_model_dir, "base", **FAST)
    for name, sampler, pruner in (("tm", "tpe", "median"), ("th", "tpe", "hyperband"), ("tn", "tpe", "none"),
                                  ("rh", "random", "hyperband")):
        extra = {"sampler_startup_trials": 1} if sampler == "tpe" else {}
        extra |= {"pruner_startup_trials": 1} if pruner == "median" else {}
        out, st = run_sweep(tmp_path, base, name, space=LR, trials=2, sampler=sampler, pruner=pruner, seed=1, **extra)
        one_run_each(runs, name, 2)
        judged(runs, st, 2)
        assert f"{sampler} / {pruner}" in out, out


def test_a_resumed_grid_keeps_its_order(tmp_path):
    """Trial N of a grid sweep is the N-th point of the grid shuffled by the seed: a resumed driver
    whose seed had moved on (as the random and TPE samplers' do, not to draw the same values again)
    asked points already run and skipped others. No training: the study alone."""
    from cockpit.sweep.driver import Driver, open_study
    from cockpit.sweep.spec import parse_spec

    space = {"learning_rate": [1e-4, 3e-4, 1e-3], "lora_rank": [2, 4]}
    spec = parse_spec({"base": {}, "space": space, "sampler": "grid", "seed": 3, "trials": 10}, tmp_path, "g")
    assert (spec.grid_points(), spec.budget()) == (6, 6)
    study = Driver(tmp_path / "runs", spec).create()
    points = []
    for _ in range(2):
        trial = study.ask()
        points.append(tuple(suggest(trial, spec).values()))
        study.tell(trial, 1.0)
    again = open_study(tmp_path / "runs", spec)  # a resume: two trials asked
    points += [tuple(suggest(again.ask(), spec).values()) for _ in range(4)]
    assert sorted(points) == sorted((lr, r) for lr in space["learning_rate"] for r in space["lora_rank"])


def test_startup_trials_is_tpe_s_and_refused_with_another_sampler(tmp_path):
    from cockpit.errors import InputError
    from cockpit.sweep.driver import sampler_of
    from cockpit.sweep.spec import parse_spec

    spec = parse_spec({"base": {}, "space": {"lora_rank": [2, 4]}, "sampler_startup_trials": 1}, tmp_path, "t")
    assert sampler_of(spec)._n_startup_trials == 1 and spec.as_dict()["sampler_startup_trials"] == 1
    assert sampler_of(parse_spec({"base": {}, "space": {"lora_rank": [2, 4]}}, tmp_path, "t"))._n_startup_trials == 10
    for sampler in ("random", "grid"):
        with pytest.raises(InputError) as err:
            parse_spec({"base": {}, "space": {"lora_rank": [2, 4]}, "sampler": sampler, "sampler_startup_trials": 2}, tmp_path, "t")
        assert err.value.problems[0].key == "sampler_startup_trials" and "only with sampler: tpe" in str(err.value)
    # a grid's spec.yaml (what a resume reads) carries no start-up
    grid = parse_spec({"base": {}, "space": {"lora_rank": [2, 4]}, "sampler": "grid"}, tmp_path, "t")
    assert parse_spec(grid.as_dict(), tmp_path).sampler == "grid"


# -- trials that cannot differ, trials that tie (issue 62 item 7) --


def test_the_check_warns_when_the_warm_up_swallows_every_update(tmp_path, tiny_model_dir):
    """``max_steps: 2`` with ``warmup_ratio: 0.1``: one warm-up step, and HF's warm-up takes its first
    update at learning rate 0, so the loss logged at step 2 (computed before step 2's update) is the
    same in every trial. The sweep's check says so before any trial runs; an evaluation after step 2's
    update, a constant schedule or no warm-up do not warn; a swept warm-up names the trials it swallows."""
    from cockpit.sweep.spec import parse_spec
    from cockpit.sweep.ties import flat_reason, flat_warning

    def corners(base, space, objective="loss"):
        spec = parse_spec({"base": {**TINY_CONFIG, "model_name_or_path": str(tiny_model_dir), **base}, "space": space}, tmp_path, "w")
        return flat_warning(objective, [(p, spec.trial_config(p).mapping()) for p in spec.corner_params()])

    lr = {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}
    said = corners({"max_steps": 2, "warmup_ratio": 0.1}, lr)
    assert said and said.startswith("in every trial, the only update before loss's last value (step 2 of 2) is in the warm-up of 1 steps, at learning rate 0")
    assert "the swept values (learning_rate) cannot change loss" in said
    # HF evaluates at the last step whatever eval_steps says: after both updates, the second at full rate
    assert corners({"max_steps": 2, "warmup_ratio": 0.1, "val_size": 4, "eval_steps": 5}, lr, "eval_loss") is None
    assert corners({"max_steps": 2, "warmup_ratio": 0.1, "lr_scheduler_type": "constant"}, lr) is None
    assert corners({"max_steps": 2}, lr) is None
    assert "before any update" in corners({"max_steps": 1}, lr)
    # a warm-up far longer than the run: every update at a rate near 0
    assert "all 9 updates before loss's last value (step 10 of 10) are in the warm-up of 100 steps, at most 8% of learning_rate" in corners(
        {"max_steps": 10, "warmup_steps": 100}, lr
    )
    said = corners({"max_steps": 2}, {"warmup_steps": [0, 1], **lr})
    assert said and said.startswith("with warmup_steps=1, learning_rate=0.0001, the only update"), said
    assert flat_reason("probe_results.rate", {"max_steps": 1, "warmup_steps": 1}) == (
        "the only update before probe_results.rate's last value (step 1 of 1) is in the warm-up of 1 steps, at learning rate 0"
    )
    assert flat_reason("loss", {"max_steps": -1, "warmup_steps": 1}) is None  # epochs: the data decides, not judged

    # through cockpit sweep: said at the check, before the full check of the largest corner refuses it (no run)
    base = tiny_config(tmp_path, tiny_model_dir, "base", max_steps=2, warmup_ratio=0.1, probes=None)
    path = write_yaml(tmp_path / "w.sweep.yaml", {"base": base.name, "space": {**lr, "lora_rank": [4, 128]}, "objective": "loss"})
    res = cockpit("sweep", str(path), "--runs-dir", str(tmp_path / "runs"), env=ENV)
    assert res.returncode == 2 and "lora_rank=128" in res.stderr, res.stdout + res.stderr
    assert "warning: in every trial, the only update before loss's last value (step 2 of 2) is in the warm-up" in res.stdout


def test_status_best_and_the_sweep_screen_say_when_trials_tie(tmp_path, capsys):
    """A study whose completed trials share the best value (as the warm-up above makes them): status
    marks the best as a tie and names the others, the table prints it, ``best`` writes it in the
    preset's head and says it, the Sweep screen shows it. Values that differ in the sixth digit do
    not tie. No training: the study's values told directly."""
    from cockpit.commands.sweep import print_table
    from cockpit.sweep.driver import Driver, best_preset, status
    from cockpit.sweep.spec import parse_spec
    from cockpit.ui.screens.sweep import best_text, tie_text

    runs = tmp_path / "runs"
    spec = parse_spec({"base": dict(TINY_CONFIG), "space": {"learning_rate": [1e-4, 1e-3, 1e-2]}, "sampler": "random", "objective": "loss"}, tmp_path, "t")
    study = Driver(runs, spec, log=lambda *_: None).create()
    for value in (2.5, 2.5, 2.6):
        trial = study.ask()
        suggest(trial, spec)
        study.tell(trial, value)
    st = status(runs, "t")
    assert (st["best"]["number"], st["best"]["tied_with"]) == (0, [1])
    assert st["best"]["tie"] == "a tie: trial 1 has the same loss (to 6 digits); the lowest-numbered is shown"
    print_table(st)
    assert "  a tie: trial 1 has the same loss" in capsys.readouterr().out
    assert tie_text(st) == st["best"]["tie"] and "trial 0" in best_text(st).plain
    best, tie, text = best_preset(runs, "t")
    assert best.number == 0 and tie == st["best"]["tie"] and text.splitlines()[1] == f"# {tie}"

    def told(name, values):
        other = parse_spec({**spec.as_dict(), "name": name}, tmp_path)
        study = Driver(runs, other, log=lambda *_: None).create()
        for value in values:
            trial = study.ask()
            suggest(trial, other)
            study.tell(trial, value)
        return status(runs, name)

    st = told("e", (3.0, 3.0000001, 3.01, 3.0))  # 3.0000001 is 3.0 to six digits; 3.01 is not
    assert st["best"]["number"] == 0 and st["best"]["tied_with"] == [1, 3]
    assert st["best"]["tie"] == "a tie: trials 1, 3 have the same loss (to 6 digits); the lowest-numbered is shown"
    st = told("all", (3.0, 3.0))
    assert st["best"]["tie"].startswith("a tie: every completed trial has the same loss (to 6 digits)")
    res = cockpit("sweep", "best", "all", "--json", "--runs-dir", str(runs), env=ENV)
    assert json.loads(res.stdout)["tie"] == st["best"]["tie"], res.stdout + res.stderr
    assert told("none", (3.0, 3.01))["best"]["tie"] is None


@pytest.mark.slow
@pytest.mark.budget(90, "a checked two-trial sweep of the tiny Llama")
def test_trials_the_warm_up_swallows_tie_and_the_sweep_says_so(tmp_path, tiny_model_dir):
    """The issue's sweep, random sampler and no pruner: ``max_steps: 2``, ``warmup_ratio: 0.1``, the
    training loss as the objective. The check warns before the trials run; the two trials' learning
    rates are far apart and their losses are the same, which status and the table say."""
    runs = tmp_path / "runs"
    no_eval = {k: v for k, v in FAST.items() if not k.startswith(("val_", "eval_"))}
    base = tiny_config(tmp_path, tiny_model_dir, "base", **{**no_eval, "warmup_ratio": 0.1})
    out, st = run_sweep(tmp_path, base, "tie", check=True, space=LR, trials=2, sampler="random", pruner="none", seed=0, objective="loss")
    assert "warning: in every trial, the only update before loss's last value (step 2 of 2) is in the warm-up" in out, out
    one_run_each(runs, "tie", 2)
    values = [t["objective"] for t in st["trials"]]
    rates = sorted(t["params"]["learning_rate"] for t in st["trials"])
    assert rates[1] > 2 * rates[0], rates  # seed 0 draws rates far apart
    assert [t["state"] for t in st["trials"]] == ["complete", "complete"] and values[0] == values[1], st["trials"]
    assert st["best"]["tie"].startswith("a tie: every completed trial has the same loss") and st["best"]["number"] == 0
    assert st["best"]["tie"] in out  # the table at the sweep's end
