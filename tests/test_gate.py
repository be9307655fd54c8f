"""A run started before its data check ends (``cockpit.run.gate``): the ranks wait until the
command releases the run; a failed check kills the run and removes its run dir; a holder that is
gone, or a kill, never lets a held run train."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from conftest import cockpit, tiny_config

from cockpit.run import gate
from cockpit.store.rundir import create_run_dir


def test_wait_released_blocks_until_the_holder_releases(tmp_path):
    run = create_run_dir(tmp_path, "held")
    assert gate.wait_released(run) < 0.05  # never held: no wait
    gate.hold(run)
    assert gate.holder(run)["pid"] > 0
    threading.Timer(0.4, gate.release, args=(run,)).start()
    waited = gate.wait_released(run, poll_s=0.02)
    assert 0.3 < waited < 5 and gate.holder(run) is None


def test_a_held_run_never_trains_after_a_kill_or_without_its_holder(tmp_path):
    run = create_run_dir(tmp_path, "held")
    gate.hold(run)
    run.request("kill", "invalid input: cutoff_len")
    with pytest.raises(gate.NotReleased, match="data check failed"):
        gate.wait_released(run)
    other = create_run_dir(tmp_path, "orphan")
    gate.hold(other)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (other.control_dir / gate.HOLD).write_text(f'{{"pid": {gone.pid}, "start": 1.0, "t": {time.time()}}}\n')
    with pytest.raises(gate.NotReleased, match=f"pid {gone.pid}"):
        gate.wait_released(other)


def test_train_whose_tokenizer_check_fails_leaves_no_run(tmp_path, tiny_model_dir):
    """Bad rows fail before any run exists; a problem only the model's files show (a LoRA rank over the
    model's hidden size, 64) is found while the held run starts: exit 2, the run killed, its run dir
    gone, no process left. (A cutoff_len that empties every answer was the case before LLaMA-Factory's
    truncation rule, which always keeps part of the answer.)"""
    runs = tmp_path / "runs"
    cfg = tiny_config(tmp_path, tiny_model_dir, lora_rank=128)
    res = cockpit("train", str(cfg), "--runs-dir", str(runs), timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "exceeds the model's hidden size" in res.stderr and "Traceback" not in res.stderr
    assert not any(runs.iterdir())
    assert str(runs) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
