"""Every sampler and pruner docs/sweeps.md names, end to end through ``cockpit sweep`` on the tiny
Llama (issue 67): a grid sweep runs each grid point once and ends cleanly (Optuna's GridSampler asks the
study to stop at its last point, which raised out of the driver's ``tell``), a grid larger than
``trials`` ends at the budget, two at a time; TPE past its random start-up and each pruner asked with a
completed trial to judge against. Short runs: two steps, an evaluation at each, ``--skip-check``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cockpit, tiny_config, write_yaml
from test_sweep import ENV, sweep_runs

# two steps, each evaluated on four held-out samples: the pruners' values at steps 1 and 2
FAST = dict(
    max_steps=2, val_size=4, eval_strategy="steps", eval_steps=1, save_steps=1000, probes=None, numa_bind="off",
    telemetry_interval_s=0, warmup_ratio=0.0,
)


def run_sweep(tmp_path: Path, base: Path, name: str, *extra: str, **spec) -> tuple[str, dict]:
    """``cockpit sweep`` of ``spec`` to its end (exit 0 asserted); its output and ``status --json``."""
    runs = tmp_path / "runs"
    path = write_yaml(tmp_path / f"{name}.sweep.yaml", {"name": name, "base": base.name, **spec})
    res = cockpit("sweep", str(path), "--skip-check", "--poll", "0.2", "--runs-dir", str(runs), *extra, env=ENV, timeout=400)
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
    from cockpit.sweep.driver import read_sweep_spec
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
    assert len(sweep_runs(runs, "g")) == 2 and len(read_sweep_spec(runs, "g").space) == 1
    best = cockpit("sweep", "best", "g", "--json", "--runs-dir", str(runs), env=ENV)
    assert best.returncode == 0 and json.loads(best.stdout)["number"] == st["best"]["number"], best.stdout + best.stderr
