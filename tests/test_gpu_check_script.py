"""scripts/gpu_check.sh where no GPU is visible: one line, exit 0 (its GPU path needs a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_gpu_check_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_gpu_check_skips_cleanly_without_a_gpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    res = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: skipped: no GPU visible"), res.stdout
    assert not (tmp_path / "out").exists()  # nothing ran


def test_gpu_check_skips_when_torch_is_missing(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: torch' >&2\nexit 1\n")
    fake.chmod(0o755)
    res = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env={**os.environ, "PYTHON": str(fake)}, timeout=60
    )
    assert (
        res.returncode == 0
        and res.stdout.startswith("gpu_check: skipped")
        and len(res.stdout.strip().splitlines()) == 1
    )


def test_gpu_lent_is_valid_bash():
    """scripts/gpu_lent.sh: what a lent GPU machine runs (the 8B job, the twins, gpu_check.sh)."""
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_lent.sh")], capture_output=True).returncode == 0


@pytest.mark.slow
def test_the_8b_job_bench_runs_its_flow_on_the_cpu(tmp_path):
    """bench/gpu_8b_job.py's flow (a random model of the job's vocabulary, long samples, ``cockpit plan``
    beside ``cockpit train``'s events) with a tiny shape on the CPU: the run finishes its steps, the plan
    and the measured figures are read, the input embedding is in host memory."""
    import json

    out = tmp_path / "job.json"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_8b_job.py"),
            "--out",
            str(tmp_path / "work"),
            "--shape",
            "tiny",
            "--cpu",
            "--steps",
            "2",
            "--variants",
            "lora",
            "--json",
            str(out),
            "--run-timeout",
            "600",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=str(ROOT),
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["state"] == "finished" and row["steps"] == 2, row
    assert row["planned_allocated_gib"] > 0 and row["planned_peak_gib"] > row["planned_allocated_gib"], row
    assert row["tokens_per_s_per_device"] and "input embedding in host memory" in row["host_embedding_line"], row
