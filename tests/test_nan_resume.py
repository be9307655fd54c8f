"""No poisoned state after a NaN, and resume semantics that say what they do (issue 14, 3 and 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cockpit, read_events, tiny_config


def _ckpt(root: Path, step: int, finite: bool | None) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text("{}")
    if finite is not None:
        (d / "cockpit_checkpoint.json").write_text(json.dumps({"step": step, "loss_finite": finite}))
    return d


def test_last_checkpoint_never_picks_one_saved_after_a_nan(tmp_path):
    from cockpit.train.outcome import last_checkpoint

    _ckpt(tmp_path, 2, None)  # saved before records existed: counts as finite
    good = _ckpt(tmp_path, 4, True)
    _ckpt(tmp_path, 6, False)
    _ckpt(tmp_path, 8, False)
    (tmp_path / ".staging" / "checkpoint-10").mkdir(parents=True)
    assert last_checkpoint(tmp_path) == str(good)


@pytest.mark.slow
def test_nan_stop_keeps_the_last_good_checkpoint_as_the_adapter_and_resume_uses_it(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    from cockpit.train.outcome import last_checkpoint

    cfg = tiny_config(tmp_path, tiny_model_dir, finetuning_type="full", learning_rate=1e6, weight_decay=10.0, max_grad_norm=0.0,
                      max_steps=30, probes=None, nan_policy="stop", save_steps=1, telemetry_interval_s=0)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=300)
    assert res.returncode == 1, res.stdout[-2000:]
    run = next((tmp_path / "runs").iterdir())
    events = read_events(run)
    alert = next(e for e in events if e["kind"] == "alert" and e["code"] == "nan_loss")
    nan_step = int(alert["message"].rsplit(" at step ", 1)[1])
    ckpts = run / "checkpoints"
    saved = sorted(int(p.name.split("-")[1]) for p in ckpts.glob("checkpoint-*"))
    assert saved and max(saved) < nan_step, (saved, nan_step)  # the state after the NaN is not saved
    good = max(saved)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["adapter_from"] == f"checkpoint-{good}" and summary["nan_step"] == nan_step
    assert f"stopped on NaN at step {nan_step}; adapter = checkpoint-{good}" in summary["reason"]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and f"adapter = checkpoint-{good}" in status["reason"]
    adapter = load_file(str(run / "adapter" / "model.safetensors"))
    kept = load_file(str(ckpts / f"checkpoint-{good}" / "model.safetensors"))
    assert adapter.keys() == kept.keys() and all((adapter[k] == kept[k]).all() for k in kept)
    assert all(t.isfinite().all() for t in adapter.values())
    assert last_checkpoint(ckpts) == str(ckpts / f"checkpoint-{good}")
    ev = next(e for e in events if e["kind"] == "checkpoint_saved" and e["step"] == good)
    assert ev["loss_finite"] is True
    exp = cockpit("export", str(run), "--json", "--out", str(tmp_path / "exported"), timeout=300)
    assert exp.returncode == 0, exp.stdout[-2000:] + exp.stderr[-2000:]
    exported = load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert all((exported[k] == kept[k]).all() for k in kept)  # export gives the last good weights
    assert f"weights of checkpoint-{good}" in " ".join(json.loads(exp.stdout)["notes"])


@pytest.mark.slow
def test_resume_last_without_a_checkpoint_warns(tmp_path, tiny_model_dir):
    # logging_steps 3 of 2 steps: step 1 (logging_first_step) and the last step (always logged) only
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=2, logging_steps=3, probes=None, resume_from_checkpoint="last", telemetry_interval_s=0)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:]
    run = next((tmp_path / "runs").iterdir())
    warn = [e for e in read_events(run) if e["kind"] == "alert" and e["code"] == "no_checkpoint"]
    assert warn and warn[0]["level"] == "warn" and "starts from step 0" in warn[0]["message"]
    assert "warning: resume_from_checkpoint: last found no complete checkpoint" in (run / "logs" / "rank0.log").read_text()
    assert "no_checkpoint" in res.stdout  # the follow output shows the alert

    # issue 19, 1: a finished run is at its last step, 100 % (issue 29: the last step is logged too,
    # whatever logging_steps says, so the run's last loss is its last step's)
    assert [e["step"] for e in read_events(run) if e["kind"] == "step"] == [1, 2]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == status["total_steps"] == 2
    runs = cockpit("runs", "--runs-dir", str(tmp_path / "runs"))
    assert " 2/2 " in runs.stdout, runs.stdout
    from cockpit.ui.state import RunState

    state = RunState()
    state.apply(read_events(run))
    assert (state.step, state.total, state.state) == (2, 2, "finished")


def test_live_header_of_a_finished_run_is_at_its_last_step():
    from cockpit.ui.state import RunState

    state = RunState()
    state.apply([
        {"kind": "train_begin", "t": 1.0, "total_steps": 27, "start_step": 0},
        {"kind": "step", "t": 2.0, "step": 26, "total_steps": 27, "loss": 1.0},
        {"kind": "run_finished", "t": 3.0, "steps": 27},
        {"kind": "state", "t": 3.0, "state": "finished"},
    ])
    assert (state.step, state.total) == (27, 27)
    from cockpit.ui.formatting import header

    assert "step 27/27" in header(state, 4.0).plain


@pytest.mark.slow
def test_resume_from_a_checkpoint_at_max_steps_trains_no_more_steps(tmp_path, tiny_model_dir):
    """A checkpoint saved at max_steps has nothing left to train (a run lost after its last save, then
    resumed): HF's loop checks max_steps only after a step, so it trained one step more (step 5 of 4).
    Now the resumed run trains none, finishes at 4/4, and its adapter is the checkpoint's."""
    from safetensors.torch import load_file

    first = tiny_config(tmp_path, tiny_model_dir, name="first", max_steps=4, save_steps=2, probes=None, telemetry_interval_s=0)
    res = cockpit("train", str(first), "--runs-dir", str(tmp_path / "runs1"), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:]
    checkpoint = next((tmp_path / "runs1").iterdir()) / "checkpoints" / "checkpoint-4"
    assert checkpoint.is_dir()
    again = tiny_config(tmp_path, tiny_model_dir, name="again", max_steps=4, save_steps=2, probes=None,
                        telemetry_interval_s=0, resume_from_checkpoint=str(checkpoint))
    res = cockpit("train", str(again), "--runs-dir", str(tmp_path / "runs2"), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:]
    run = next((tmp_path / "runs2").iterdir())
    events = read_events(run)
    assert [e["step"] for e in events if e["kind"] == "step"] == [], [e for e in events if e["kind"] == "step"]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == status["total_steps"] == 4, status
    saved = load_file(str(checkpoint / "adapter_model.safetensors"))
    final = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    assert saved.keys() == final.keys() and all((saved[k] == final[k]).all() for k in saved)
