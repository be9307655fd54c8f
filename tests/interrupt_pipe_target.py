"""Not part of the suite (no ``test_`` prefix): tests/test_interrupt.py runs it through
``scripts/test.sh 2>&1 | tee LOG`` and interrupts that. The first test passes at once (its progress
must reach the log through the pipe); the second starts a detached process in its own session (as a
test's detached run is), says so in ``$COCKPIT_INTERRUPT_READY`` (its pid and this pytest's), then
waits to be interrupted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

READY = os.environ.get("COCKPIT_INTERRUPT_READY")
pytestmark = pytest.mark.skipif(not READY, reason="run by tests/test_interrupt.py through scripts/test.sh")


def test_passes_at_once():
    pass


def test_detached_process_then_wait_for_the_interrupt():
    time.sleep(1.0)  # after the first test's progress
    detached = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    Path(READY).write_text(json.dumps({"detached_pid": detached.pid, "pytest_pid": os.getpid()}))
    time.sleep(600)
