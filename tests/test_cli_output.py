"""The CLI's output into a pipe whose reader stopped early (``cockpit compare A B | head``): a quiet
end, no BrokenPipeError traceback (issue 50 item 10)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import ROOT
from cockpit.store.rundir import create_run_dir


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """The real CLI with stdout a pipe whose reading end is already closed (what ``| head`` leaves)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "cockpit", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=str(ROOT),
        )
    finally:
        os.close(write_end)


def test_output_into_a_closed_pipe_ends_without_a_traceback(tmp_path):
    runs = tmp_path / "runs"
    ids = []
    for name in ("a", "b"):
        run = create_run_dir(runs, name)
        run.update_status(state="finished", run_id=run.run_id, ended=time.time())
        (run.path / "config.yaml").write_text("learning_rate: 0.0001\n")
        ids.append(run.run_id)
    for argv in (["compare", *ids], ["runs"]):
        res = run_into_closed_pipe(*argv, "--runs-dir", str(runs))
        assert "Traceback" not in res.stderr and "BrokenPipeError" not in res.stderr, res.stderr
        assert res.returncode == 1
