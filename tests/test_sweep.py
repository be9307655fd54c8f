"""Sweeps (``cockpit sweep``, ``cockpit/sweep/``): the spec, the check of the space before any trial,
and a real sweep of the tiny Llama through the real CLI: an Optuna study in SQLite, trials as detached
runs two at a time on two declared GPUs, pruning through the stop request, the driver killed and
resumed, the best trial saved as a preset that trains. No mocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, cockpit, read_events, tiny_config, wait_for, write_yaml
from cockpit.errors import InputError
from cockpit.run import queue as q
from cockpit.store.rundir import TERMINAL_STATES, list_runs
from cockpit.sweep.driver import objective_points, open_study, read_sweep_spec, suggest
from cockpit.sweep.spec import parse_spec

ENV = {"OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}
# eight steps, evaluated every two on four held-out samples: four reports a trial for the pruner
QUICK = dict(
    max_steps=8, val_size=4, eval_strategy="steps", eval_steps=2, save_steps=4, probes=None, numa_bind="off",
    telemetry_interval_s=0,
)
SPACE = {
    "learning_rate": {"type": "float", "low": 1e-5, "high": 5e-2, "log": True},
    "lora_rank": {"type": "choice", "choices": [2, 4, 8]},
}


def spec_file(tmp_path: Path, base: Path, name: str, **over) -> Path:
    spec = {"name": name, "base": base.name, "space": SPACE, "trials": 6, "parallel": 2, **over}
    return write_yaml(tmp_path / f"{name}.sweep.yaml", spec)


# -- the spec (no runs) --


def test_spec_reads_the_space_and_checks_its_corners(tmp_path):
    spec = parse_spec({"base": {"learning_rate": 1e-3}, "space": {**SPACE, "warmup_steps": {"type": "int", "low": 0, "high": 4, "step": 2}}}, tmp_path, "s")
    assert (spec.name, spec.objective, spec.direction, spec.sampler, spec.pruner) == ("s", "eval_loss", "minimize", "tpe", "median")
    corners = spec.corner_params()
    assert {c["learning_rate"] for c in corners} == {1e-5, 5e-2}
    assert {c["lora_rank"] for c in corners} == {2, 4, 8} and {c["warmup_steps"] for c in corners} == {0, 4}
    assert len(corners) == 2 * 3 * 2  # every combination of the bounds, once
    assert [p.grid() for p in spec.space[1:]] == [[2, 4, 8], [0, 2, 4]]
    for raw, key, words in [
        ({"space": {"learning_rate": {"low": 1e-2, "high": 1e-3}}}, "space.learning_rate", "below high"),
        ({"space": {"learning_rate": {"low": 0, "high": 1e-3, "log": True}}}, "space.learning_rate", "low > 0"),
        ({"space": {"lora_rnk": [1, 2]}}, "space.lora_rnk", "not a config key"),
        ({"space": SPACE, "pruner": "asha"}, "pruner", "median, hyperband, none"),
        ({"space": SPACE, "trial": 3}, "trial", "unknown sweep key"),
        ({"space": SPACE, "sampler": "grid"}, "space.learning_rate", "needs step"),
    ]:
        with pytest.raises(InputError) as err:
            parse_spec({"base": {}, **raw}, tmp_path, "s")
        assert err.value.problems[0].key == key and words in str(err.value), str(err.value)


def test_each_trial_writes_its_own_folder_under_the_base_output_dir(tmp_path, monkeypatch):
    """Issue 62: a base config's ``output_dir`` (LLaMA-Factory's relative ``saves/...``, with
    ``overwrite_output_dir``) gives each trial its own folder under it, named after the trial, so no
    trial's adapter is another's; the best preset keeps the base's folder."""
    monkeypatch.chdir(tmp_path)
    base = {"dataset": "cockpit_identity", "output_dir": "saves/smol/lora/sft", "overwrite_output_dir": True}
    spec = parse_spec({"base": base, "space": SPACE}, tmp_path, "s")
    params = {"learning_rate": 1e-4, "lora_rank": 4}
    out = tmp_path / "saves" / "smol" / "lora" / "sft"
    trials = [spec.trial_config(params, run_name=f"s-t{n}").output_dir for n in range(2)]
    assert trials == [str(out / "s-t0"), str(out / "s-t1")]
    assert spec.trial_config(params).output_dir == str(out)  # `sweep best --save-preset`'s config
    assert spec.trial_config(params, run_name="s-t0").run_name == "s-t0"


def test_a_bad_launcher_or_sbatch_option_is_refused_before_any_study(tmp_path, tiny_model_dir, monkeypatch):
    """``launcher`` and its ``slurm:`` options are checked when the spec is read (no Slurm needed):
    a bad value is refused with the field's name, exit 2, and no sweep dir or run exists."""
    for raw, key, words in [
        ({"launcher": "k8s"}, "launcher", "one of local, slurm, not 'k8s'"),
        ({"slurm": {"partition": "gpu"}}, "slurm", "need launcher: slurm"),
        ({"launcher": "slurm", "slurm": {"partiton": "gpu"}}, "slurm.partiton", "unknown sbatch option"),
        ({"launcher": "slurm", "slurm": {"cpus_per_task": 0}}, "slurm.cpus_per_task", "whole number >= 1"),
        ({"launcher": "slurm", "slurm": {"time": "1:00\nrm -rf /"}}, "slurm.time", "cannot go on an #SBATCH line"),
        ({"launcher": "slurm", "slurm": {"sbatch_args": "--hold"}}, "slurm.sbatch_args", "a list of sbatch options"),
    ]:
        with pytest.raises(InputError) as err:
            parse_spec({"base": {}, "space": SPACE, **raw}, tmp_path, "s")
        assert err.value.problems[0].key == key and words in str(err.value), str(err.value)
    spec = parse_spec({"base": {}, "space": SPACE, "launcher": "slurm", "slurm": {"time": 30, "exclusive": False}}, tmp_path, "s")
    assert (spec.slurm_options().time, spec.slurm_options().exclusive) == ("30", False)
    base = tiny_config(tmp_path, tiny_model_dir, "base", **QUICK)
    runs = tmp_path / "runs"
    res = cockpit("sweep", str(spec_file(tmp_path, base, "bad", launcher="k8s")), "--runs-dir", str(runs), env=ENV)
    assert res.returncode == 2 and "launcher: one of local, slurm, not 'k8s'" in res.stderr, res.stdout + res.stderr
    # launcher slurm where there is no sbatch: refused with the reason
    res = cockpit("sweep", str(spec_file(tmp_path, base, "nosb", launcher="slurm")), "--runs-dir", str(runs), env={**ENV, "PATH": str(Path(sys.executable).parent)})
    assert res.returncode == 2 and "launcher: launcher slurm: sbatch is not on PATH" in res.stderr, res.stdout + res.stderr
    assert not list_runs(runs) and not (runs / "sweeps").exists()


def test_the_objective_is_read_from_the_events_at_each_step():
    events = [
        {"kind": "probe_results", "phase": "before", "rate": 0.0},
        {"kind": "step", "step": 1, "loss": 3.0},
        {"kind": "eval", "step": 2, "eval_loss": 2.5},
        {"kind": "checkpoint", "step": 2, "loss": 9.0},
        {"kind": "eval", "step": 4, "eval_loss": 2.25, "eval_accuracy": 0.5},
        {"kind": "probe_results", "phase": "after", "rate": 0.75, "passed": 3},
    ]
    assert objective_points(events, "eval_loss") == ([(2, 2.5), (4, 2.25)], 4)
    assert objective_points(events, "loss") == ([(1, 3.0)], 4)
    assert objective_points(events, "eval_accuracy") == ([(4, 0.5)], 4)
    # a field of one kind of event: the probes after training (not before), after the last step seen
    assert objective_points(events, "probe_results.rate") == ([(5, 0.75)], 4)
    assert objective_points(events[-1:], "probe_results.rate", last_step=8) == ([(9, 0.75)], 8)


def test_values_read_in_a_burst_are_judged_each_at_its_step(tmp_path):
    """A slow turn of the driver (squeue under load) reads a trial's evaluations of steps 2 to 40 at once:
    each is reported and judged at its own step, so the trial worse than the finished one at step 2 is
    pruned (its run asked to stop). Judged only at step 40, where no finished trial has a value, it ran
    on to its end (CI: a 2,000-step Slurm trial was told COMPLETE)."""
    import time

    import optuna

    from cockpit.store.rundir import RunDir
    from cockpit.sweep.driver import Driver

    runs = tmp_path / "runs"
    spec = parse_spec({"base": {"learning_rate": 1e-3}, "space": SPACE, "trials": 2, "pruner_startup_trials": 1}, tmp_path, "b")
    driver = Driver(runs, spec, log=lambda *_: None)
    study = driver.create()
    done = study.ask()
    for step, value in ((2, 2.0), (4, 1.5)):
        done.report(value, step)
    study.tell(done, 1.5)
    ft = study.ask()
    study._storage.set_trial_user_attr(ft._trial_id, "run_id", "r1")
    run = RunDir(runs / "r1")
    run.path.mkdir(parents=True)
    # just launched (no supervisor pid yet): liveness keeps it running
    run.status_path.write_text(json.dumps({"state": "running", "updated": time.time(), "step": 40}), encoding="utf-8")
    run.events_path.write_text(
        "".join(json.dumps({"kind": "eval", "step": s, "eval_loss": 3.0}) + "\n" for s in range(2, 41, 2)), encoding="utf-8"
    )
    (frozen,) = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert driver.step_trial(study, frozen, run)  # still running: asked to stop, told PRUNED once it has
    (frozen,) = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert frozen.user_attrs["prune_requested"] == 2 and len(frozen.intermediate_values) == 20
    assert (run.control_dir / "stop").exists()


def test_the_study_lives_in_sqlite_and_a_resumed_seeded_sampler_draws_new_values(tmp_path):
    """The study is Optuna's RDB storage in the runs dir: a trial asked by one driver is there, RUNNING,
    for the next; the resumed sampler's seed moves on by the trials asked (the same seed again drew the
    first trial's values for the next trial, two runs of one config)."""
    import optuna

    from cockpit.sweep.driver import Driver, pruner_of, sampler_of, sweep_dir

    spec = parse_spec({"base": {"learning_rate": 1e-3}, "space": SPACE, "sampler": "random", "seed": 0}, tmp_path, "s")
    study = Driver(tmp_path / "runs", spec).create()
    first = suggest(study.ask(), spec)
    assert (sweep_dir(tmp_path / "runs", "s") / "optuna.db").is_file()
    again = open_study(tmp_path / "runs", read_sweep_spec(tmp_path / "runs", "s"))
    (ft,) = again.get_trials()
    assert ft.state == optuna.trial.TrialState.RUNNING and ft.params == first
    assert suggest(again.ask(), spec) != first
    made = {
        (name, type(sampler_of(replace(spec, sampler=name))).__name__) for name in ("tpe", "random")
    } | {(name, type(pruner_of(replace(spec, pruner=name))).__name__) for name in ("median", "hyperband", "none")}
    assert made == {
        ("tpe", "TPESampler"), ("random", "RandomSampler"),
        ("median", "MedianPruner"), ("hyperband", "HyperbandPruner"), ("none", "NopPruner"),
    }


def test_a_space_that_gives_an_invalid_config_is_refused_with_the_value(tmp_path, tiny_model_dir):
    base = tiny_config(tmp_path, tiny_model_dir, "base", **QUICK)
    runs = tmp_path / "runs"
    bad = spec_file(tmp_path, base, "bad", space={**SPACE, "lora_dropout": {"type": "float", "low": 0.0, "high": 1.5}})
    res = cockpit("sweep", str(bad), "--runs-dir", str(runs), env=ENV)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "space.lora_dropout" in res.stderr and "lora_dropout=1.5" in res.stderr
    # a value only the model check refuses (rank above the tiny model's hidden size 64): the largest corner's full check
    big = spec_file(tmp_path, base, "big", space={"lora_rank": {"type": "choice", "choices": [4, 128]}})
    res = cockpit("sweep", str(big), "--runs-dir", str(runs), env=ENV)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "space.lora_rank" in res.stderr and "lora_rank=128" in res.stderr and "hidden size 64" in res.stderr
    # the planner: the largest trial (highest rank and micro-batch) over the device's memory, named with its values
    gpu_base = tiny_config(tmp_path, tiny_model_dir, "gpu", **{**QUICK, "use_cpu": None})
    space = {"lora_rank": [2, 16], "per_device_train_batch_size": {"type": "int", "low": 1, "high": 8}}
    res = cockpit("sweep", str(spec_file(tmp_path, gpu_base, "huge", space=space, gpu_memory=0.05)), "--runs-dir", str(runs), env=ENV)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "the largest trial (lora_rank=16, per_device_train_batch_size=8) does not fit" in res.stderr
    assert not list_runs(runs) and not (runs / "sweeps").exists()  # nothing started, no study made


# -- a real sweep --


def gone(pid: int) -> bool:
    """The process has ended (a zombie counts: it holds no lock)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def sweep_runs(runs: Path, name: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for run in list_runs(runs):
        st = run.read_status()
        if st.get("sweep") == name:
            out.setdefault(st["sweep_trial"], []).append(st)
    return out


@pytest.mark.slow
@pytest.mark.budget(240, "six trials of the tiny Llama, two at a time, the driver started twice, then the best preset trained")
def test_a_sweep_prunes_survives_its_driver_killed_and_saves_the_best_as_a_preset(tmp_path, tiny_model_dir):
    """Six trials over learning_rate (log) and lora_rank (choices), two at a time on two declared
    GPUs, median pruner: the detached driver is killed once two trials run, a trial is asked and left unstarted
    (what a driver killed between asking and starting leaves), and ``--resume`` finishes the sweep
    with every trial run exactly once, at least one pruned with its checkpoint, a best trial, and
    the best saved as a preset that passes check and trains. The base names one ``output_dir``
    (issue 62): each trial writes its own folder under it; the best trial's export merges its own adapter."""
    runs = tmp_path / "runs"
    saves = tmp_path / "saves" / "lr"
    base = tiny_config(
        tmp_path, tiny_model_dir, "base", **{**QUICK, "use_cpu": None}, output_dir=str(saves), overwrite_output_dir=True
    )
    spec = spec_file(tmp_path, base, "lr", sampler="random", seed=0, pruner_startup_trials=2)
    env = {**os.environ, **ENV, q.DEVICES_ENV: "0,1"}
    argv = [sys.executable, "-m", "cockpit.cli", "sweep", "--runs-dir", str(runs), "--poll", "0.2"]
    started = subprocess.run([*argv, str(spec), "--detach"], env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0 and "detached" in started.stdout, started.stdout + started.stderr
    driver = int(started.stdout.split("driver ", 1)[1].split()[0])  # its own session: this test's to end
    log = runs / "sweeps" / "lr" / "driver.log"
    try:
        wait_for(lambda: len(sweep_runs(runs, "lr")) >= 2 or gone(driver), 180, "two trials to start")
    finally:
        os.kill(driver, signal.SIGKILL)
    wait_for(lambda: gone(driver), 30, "the driver to end")
    out = log.read_text()
    assert len(sweep_runs(runs, "lr")) == 2, out
    spec_obj = read_sweep_spec(runs, "lr")
    study = open_study(runs, spec_obj)
    orphan = study.ask()  # asked, never started
    orphan_params = suggest(orphan, spec_obj)
    assert orphan.number == 2
    res = subprocess.run([*argv, "--resume", "lr"], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, out + res.stdout + res.stderr
    assert "resumed (3 of 6 trials asked)" in res.stdout

    by_trial = sweep_runs(runs, "lr")
    assert sorted(by_trial) == list(range(6)) and all(len(v) == 1 for v in by_trial.values())  # none lost, none twice
    status = {n: v[0] for n, v in by_trial.items()}
    assert all(st["state"] in ("finished", "stopped") for st in status.values()), status
    assert all(st["run_id"].split("-", 2)[2].startswith(f"lr-t{n}-") for n, st in status.items())
    # two at a time, each on its own GPU
    assert {tuple(status[0]["gpus"]), tuple(status[1]["gpus"])} == {("0",), ("1",)}
    assert status[0]["started"] < status[1]["ended"] and status[1]["started"] < status[0]["ended"]
    for st in status.values():  # every trial's run dir complete
        rd = runs / st["run_id"]
        assert (rd / "summary.json").is_file() and (rd / "config.yaml").is_file()
        kinds = {e["kind"] for e in read_events(rd)}
        assert {"train_begin", "eval"} <= kinds, (st["run_id"], kinds)

    table = json.loads(cockpit("sweep", "status", "lr", "--json", "--runs-dir", str(runs), env=ENV).stdout)
    rows = {t["number"]: t for t in table["trials"]}
    assert rows[2]["params"] == orphan_params and rows[2]["run_id"] == status[2]["run_id"]
    pruned = [n for n, t in rows.items() if t["state"] == "pruned"]
    complete = [n for n, t in rows.items() if t["state"] == "complete"]
    assert pruned and len(pruned) + len(complete) == 6, rows
    for n in pruned:  # stopped cleanly at the stop request, its checkpoint kept in its own folder
        assert status[n]["state"] == "stopped" and status[n]["step"] < 8
        assert status[n]["output_dir"] == str(saves / f"lr-t{n}")
        assert any((saves / f"lr-t{n}" / "checkpoints").glob("checkpoint-*"))
    for n in complete:
        assert status[n]["state"] == "finished" and rows[n]["steps"] == 8
        final = [e for e in read_events(runs / status[n]["run_id"]) if e["kind"] == "eval"][-1]
        assert rows[n]["objective"] == pytest.approx(final["eval_loss"])
    best = table["best"]
    assert best["number"] in complete and best["value"] == min(rows[n]["objective"] for n in complete)
    adapters = {n: json.loads((runs / st["run_id"] / "summary.json").read_text()) for n, st in status.items()}
    assert all(a["adapter_dir"] == str(saves / f"lr-t{n}" / "adapter") for n, a in adapters.items())
    assert len({a["adapter_fingerprint"] for a in adapters.values()}) == 6  # six adapters, none another's
    own = status[best["number"]]["run_id"]
    res = cockpit("export", own, "--merge", "--runs-dir", str(runs), env=ENV)
    assert res.returncode == 0 and f"exported merged of {own}" in res.stdout, res.stdout + res.stderr
    record = json.loads((saves / f"lr-t{best['number']}" / "merged" / "cockpit_export.json").read_text())
    assert record["run_id"] == own and record["adapter_dir"] == adapters[best["number"]]["adapter_dir"]

    preset = tmp_path / "best.yaml"
    res = cockpit("sweep", "best", "lr", "--save-preset", str(preset), "--runs-dir", str(runs), env=ENV)
    assert res.returncode == 0 and f"trial {best['number']}" in res.stdout, res.stdout + res.stderr
    saved = yaml.safe_load(preset.read_text())
    assert saved["learning_rate"] == pytest.approx(best["params"]["learning_rate"])
    assert saved.get("lora_rank", 8) == best["params"]["lora_rank"] and "run_name" not in saved
    assert saved["output_dir"] == str(saves)  # the base's folder, not the trial's
    assert cockpit("check", str(preset), env=ENV).returncode == 0
    trained = cockpit("train", str(preset), "--runs-dir", str(tmp_path / "again"), env=ENV)
    assert trained.returncode == 0, trained.stdout + trained.stderr
