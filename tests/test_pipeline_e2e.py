"""End to end through the real CLI and supervisor: a tiny random Llama with the SmolLM2 tokenizer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from conftest import cockpit, has_step, read_events, start_detached, tiny_config, wait_for


def only_run(runs: Path) -> Path:
    dirs = [d for d in runs.iterdir() if d.is_dir()]
    assert len(dirs) == 1
    return dirs[0]


@pytest.mark.slow
def test_train_through_cli_writes_the_run_dir_contract(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    cfg = tiny_config(tmp_path, tiny_model_dir)
    res = cockpit("train", str(cfg), "--runs-dir", str(runs), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    run = only_run(runs)
    assert (os.stat(run).st_mode & 0o777) == 0o700
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 6
    events = read_events(run)
    assert all(e["v"] == 1 and "t" in e for e in events)
    kinds = [e["kind"] for e in events]
    for k in ("run_started", "rank_started", "train_begin", "step", "checkpoint_saved", "probe_results", "telemetry", "run_finished"):
        assert k in kinds, k
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert [e["warmup"] for e in events if e["kind"] == "step"][:2] == [True, False]  # 6 steps: 1 warm-up step
    step = next(e for e in events if e["kind"] == "step" and not e["warmup"])
    assert step["tokens_per_s"] > 0 and step["lr"] is not None and "0" in step["mem"]
    probes = [e for e in events if e["kind"] == "probe_results"]
    assert [p["phase"] for p in probes] == ["before", "after"] and probes[0]["total"] == 10
    # while the probes run, the ranks say how far they are (10 probes: a batch of 8, then 2), and the
    # steps are timed from after the probes before training
    # (a batch's tokens while it generates, every ~2 s, left out: how many depends on the box's speed)
    progress = [(e["phase"], e["done"], e["total"]) for e in events if e["kind"] == "progress" and "tokens" not in e]
    assert progress == [("before", 0, 10), ("before", 8, 10), ("before", 10, 10), ("after", 0, 10), ("after", 8, 10), ("after", 10, 10)]
    order = [e["kind"] for e in events if e["kind"] in ("train_begin", "progress", "probe_results", "step") and "tokens" not in e]
    assert order[:6] == ["train_begin", "progress", "progress", "progress", "probe_results", "step"]
    begin = next(e for e in events if e["kind"] == "train_begin")  # max_steps 6: the epochs those steps make
    assert begin["epochs"] == pytest.approx(6 / begin["steps_per_epoch"], abs=1e-4) and begin["num_train_epochs"] == 3.0
    finished = next(e for e in events if e["kind"] == "run_finished")
    assert (finished["first_loss_step"], finished["last_loss_step"]) == (1, 6)
    assert "[rank0] model loaded (whole, not sharded)" in (run / "logs" / "rank0.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == 6 and summary["first_loss"] > 0
    assert summary["warmup_steps_excluded"] == 1 and summary["tokens_per_s"] > 0 and summary["tokens_per_s_with_warmup"] > 0
    assert (run / "adapter" / "adapter_config.json").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-3", "checkpoint-6"]
    assert (run / "loss.png").stat().st_size > 1000
    assert (run / "config.yaml").exists() and (run / "logs" / "rank0.log").exists()
    # the stdout of `cockpit train` followed the run
    assert "step 6/6" in res.stdout and "finished" in res.stdout
    assert "asking probes before training (10)" in res.stdout and f"{begin['epochs']:.2f} epochs" in res.stdout
    # runs / attach read the same dir
    listed = json.loads(cockpit("runs", "--json", "--runs-dir", str(runs)).stdout)
    assert listed[0]["state"] == "finished" and listed[0]["step"] == 6
    att = cockpit("attach", run.name, "--runs-dir", str(runs), "--no-follow")
    assert att.returncode == 0 and "step 6/6" in att.stdout
    # merge -> reload -> generate
    out = tmp_path / "merged"
    exp = cockpit("export", run.name, "--runs-dir", str(runs), "--merge", "--out", str(out))
    assert exp.returncode == 0, exp.stderr
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.generate(max_new_tokens=3, input_ids=__import__("torch").tensor([[1, 2, 3]])).shape[1] == 6
    rec = json.loads((out / "cockpit_export.json").read_text())
    assert rec["run_id"] == run.name and len(rec["adapter_sha256"]) == 64


def test_bad_input_exit_2_no_traceback(tmp_path, tiny_model_dir):
    cfg = tiny_config(tmp_path, tiny_model_dir, lora_rnak=3)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"))
    assert res.returncode == 2
    assert "lora_rnak: unknown key (did you mean 'lora_rank'?)" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def endless_run(tmp_path: Path, model_dir: Path) -> tuple[Path, set[int]]:
    """A detached run with no end in sight, after its first step; (run dir, its processes)."""
    cfg = tiny_config(tmp_path, model_dir, max_steps=100000, save_steps=100000, probes=None, logging_steps=1)
    run = start_detached(tmp_path, cfg)
    wait_for(lambda: has_step(run), 120, "the first step")
    status = json.loads((run / "status.json").read_text())
    pids = set(status["pids"]) | {status["supervisor_pid"]}
    assert all(psutil.pid_exists(p) for p in pids)
    return run, pids


def survivors(pids: set[int]) -> list[int]:
    time.sleep(1.0)
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_detached_run_stops_gracefully_and_leaves_no_process(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    run, pids = endless_run(tmp_path, tiny_model_dir)
    stop = cockpit("stop", run.name, "--runs-dir", str(runs), "--wait", "120")
    assert stop.returncode == 0, stop.stdout
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped"
    assert not survivors(pids)
    kinds = [e["kind"] for e in read_events(run)]
    assert "run_stopped" in kinds and "checkpoint_saved" in kinds
    assert (run / "adapter" / "adapter_config.json").exists()


@pytest.mark.slow
def test_a_run_killed_on_request_ends_killed_not_failed(tmp_path, tiny_model_dir):
    """``cockpit stop --kill`` on a real detached run: the run ends ``killed`` (the user's act, not a
    crash) everywhere it is read: status, summary, the event log, ``cockpit runs``, ``attach``."""
    runs = tmp_path / "runs"
    run, pids = endless_run(tmp_path, tiny_model_dir)
    kill = cockpit("stop", run.name, "--kill", "--runs-dir", str(runs), "--wait", "60")
    assert kill.returncode == 0 and f"run {run.name}: killed" in kill.stdout, kill.stdout + kill.stderr
    status = json.loads((run / "status.json").read_text())
    assert (status["state"], status["reason"]) == ("killed", "killed on request")
    assert json.loads((run / "summary.json").read_text())["state"] == "killed"
    events = read_events(run)
    assert events[-1]["kind"] == "state" and events[-1]["state"] == "killed"
    assert not any(e["kind"] == "run_failed" for e in events)
    listed = json.loads(cockpit("runs", "--json", "--runs-dir", str(runs)).stdout)
    assert [r["state"] for r in listed] == ["killed"]
    att = cockpit("attach", run.name, "--runs-dir", str(runs), "--no-follow")
    assert att.returncode == 0 and att.stdout.rstrip().endswith(f"run {run.name}: killed")
    assert not survivors(pids)
