"""scripts/gpu_check.sh where no GPU is visible: one line, exit 0 (its GPU path needs a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_gpu_check_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_gpu_check_skips_cleanly_without_a_gpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    res = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: skipped: no GPU visible"), res.stdout
    assert not (tmp_path / "out").exists()  # nothing ran


def test_gpu_check_skips_when_torch_is_missing(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: torch' >&2\nexit 1\n")
    fake.chmod(0o755)
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env={**os.environ, "PYTHON": str(fake)}, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("gpu_check: skipped") and len(res.stdout.strip().splitlines()) == 1
