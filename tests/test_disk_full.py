"""The disk that fills is the run dir's own (issue 14, 4): the whole runs dir on a small tmpfs.
The supervisor survives, the run ends failed with "disk full", no JSON line or status is left
half-written, and what was written before is intact and replayed by ``cockpit attach``."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import cockpit, prerequisite, tiny_config

pytestmark = pytest.mark.slow


@pytest.fixture
def tmpfs_runs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=60m", "tmpfs", str(mnt)], capture_output=True)
    prerequisite(res.returncode == 0, f"cannot mount a tmpfs here (needs root): {res.stderr.decode().strip()}")
    yield mnt / "runs"
    subprocess.run(["umount", "-l", str(mnt)])


def test_full_runs_dir_ends_failed_disk_full_with_everything_before_intact(tmp_path, tiny_model_dir, tmpfs_runs):
    # full fine-tuning: a checkpoint is ~41 MB, so the second one cannot fit beside the first
    cfg = tiny_config(tmp_path, tiny_model_dir, finetuning_type="full", max_steps=40, save_steps=2, probes=None, learning_rate=1e-4, telemetry_interval_s=0.2)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmpfs_runs), timeout=300)
    assert res.returncode == 1, res.stdout[-3000:]
    run = next(tmpfs_runs.iterdir())
    status = json.loads((run / "status.json").read_text())  # complete JSON: never truncated
    assert status["state"] == "failed" and "disk full" in status["reason"], status
    assert status.get("exit_code") is not None and status.get("ended"), "the supervisor lived to record the end"
    lines = (run / "events.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"", "the log ends with a whole line"
    events = [json.loads(line) for line in lines[:-1]]  # every line is whole JSON
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps and steps == list(range(1, max(steps) + 1))
    assert any(e["kind"] == "state" and e["state"] == "failed" for e in events)
    assert any(e["kind"] == "checkpoint_saved" for e in events), "the first checkpoint fit"
    for ckpt in (run / "checkpoints").glob("checkpoint-*"):
        assert (ckpt / "trainer_state.json").exists() and (ckpt / "cockpit_checkpoint.json").exists()
    assert not list((run / "checkpoints").glob(".staging/*")), "no partial checkpoint left"
    from cockpit.train.outcome import last_checkpoint

    ckpts = sorted((run / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert ckpts and last_checkpoint(run / "checkpoints") == str(ckpts[-1])
    json.loads((run / "summary.json").read_text())
    att = cockpit("attach", str(run), "--no-follow", "--runs-dir", str(tmpfs_runs))
    assert att.returncode == 0, att.stdout + att.stderr
    replayed = [int(l.split()[1].split("/")[0]) for l in att.stdout.splitlines() if l.startswith("step ")]
    assert replayed == steps
    assert f"run {run.name}: failed" in att.stdout
