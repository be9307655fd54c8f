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
    step = next(e for e in events if e["kind"] == "step")
    assert step["tokens_per_s"] > 0 and step["lr"] is not None and "0" in step["mem"]
    probes = [e for e in events if e["kind"] == "probe_results"]
    assert [p["phase"] for p in probes] == ["before", "after"] and probes[0]["total"] == 10
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == 6 and summary["first_loss"] > 0
    assert (run / "adapter" / "adapter_config.json").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-3", "checkpoint-6"]
    assert (run / "loss.png").stat().st_size > 1000
    assert (run / "config.yaml").exists() and (run / "logs" / "rank0.log").exists()
    # the stdout of `cockpit train` followed the run
    assert "step 6/6" in res.stdout and "finished" in res.stdout
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


@pytest.mark.slow
def test_detached_run_stops_gracefully_and_leaves_no_process(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=100000, save_steps=100000, probes=None, logging_steps=1)
    run = start_detached(tmp_path, cfg)
    wait_for(lambda: has_step(run), 120, "the first step")
    status = json.loads((run / "status.json").read_text())
    pids = set(status["pids"]) | {status["supervisor_pid"]}
    assert all(psutil.pid_exists(p) for p in pids)
    stop = cockpit("stop", run.name, "--runs-dir", str(runs), "--wait", "120")
    assert stop.returncode == 0, stop.stdout
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped"
    time.sleep(1.0)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive
    kinds = [e["kind"] for e in read_events(run)]
    assert "run_stopped" in kinds and "checkpoint_saved" in kinds
    assert (run / "adapter" / "adapter_config.json").exists()
