"""Not part of the suite (no ``test_`` prefix, so pytest does not collect it): tests/test_interrupt.py
runs it through ``scripts/test.sh`` and interrupts that. It starts a detached run, waits for its first
step, says so in the file ``$COCKPIT_INTERRUPT_READY`` (the run dir and this pytest's pid), then waits
to be interrupted."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import has_step, start_detached, tiny_config, wait_for

READY = os.environ.get("COCKPIT_INTERRUPT_READY")


@pytest.mark.skipif(not READY, reason="run by tests/test_interrupt.py through scripts/test.sh")
def test_detached_run_then_wait_for_the_interrupt(tmp_path):
    model = Path(os.environ["COCKPIT_INTERRUPT_MODEL"])
    cfg = tiny_config(tmp_path, model, max_steps=100_000, save_steps=100_000, probes=None)
    run = start_detached(tmp_path, cfg)
    wait_for(lambda: has_step(run), 300, "the run's first step")
    Path(READY).write_text(json.dumps({"run_dir": str(run), "pytest_pid": os.getpid()}))
    time.sleep(600)
