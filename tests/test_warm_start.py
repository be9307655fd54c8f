"""The warm start server (cockpit/train/warm_start.py) and its client (cockpit/run/warm_start.py): a
process it forks is a process of its own (its session, environment, directory, output, exit code and
signals), and a request it cannot serve as a cold start would (another import-time environment) is
refused, the caller then starting it cold."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import WARM_START_ENV, wait_for

from cockpit.run import warm_start

HERE = str(Path(__file__).resolve().parent)


@pytest.fixture
def server(warm_start_server) -> str:
    """This test process's server, once it listens."""
    if warm_start_server is None:
        pytest.skip("COCKPIT_TEST_WARM_START=0: no warm start server")
    wait_for(lambda: Path(warm_start_server).exists(), 60, "the warm start server's socket")
    return warm_start_server


def _start(tmp_path: Path, server: str, *args: str, **env: str) -> warm_start.WarmProcess | None:
    full = dict(WARM_START_ENV, COCKPIT_WARM_START=server, **env)  # not os.environ: another test may have leaked into it
    return warm_start.start([sys.executable, "-m", "warm_child", *args], full, HERE, str(tmp_path / "out"), str(tmp_path / "err"))


def test_a_warm_child_is_its_own_process_and_says_its_exit_code(tmp_path, server):
    proc = _start(tmp_path, server, "3", "an argument", WARM_CHILD_MARKER="mine")
    assert proc is not None, warm_start.last_refusal
    assert proc.pid != os.getpid()
    assert proc.wait(60) == 3
    seen = json.loads((tmp_path / "out").read_text().splitlines()[0])
    assert seen == {
        "argv": ["3", "an argument"],
        "cwd": HERE,
        "own_session": True,
        "marker": "mine",
        "torch_imported": True,  # forked from the server: torch was imported before
        "name": "__main__",
    }
    assert (tmp_path / "err").read_text() == "to stderr\n"


def test_a_signal_ends_a_warm_child_as_it_ends_a_popen(tmp_path, server):
    proc = _start(tmp_path, server, "wait")
    assert proc is not None, warm_start.last_refusal
    assert proc.poll() is None
    wait_for(lambda: (tmp_path / "out").exists() and (tmp_path / "out").read_text(), 30, "the child's first line")
    os.killpg(proc.pid, signal.SIGTERM)  # the supervisor's stop: its process group
    assert proc.wait(30) == -signal.SIGTERM


def test_another_import_time_environment_is_refused_by_name(tmp_path, server):
    assert _start(tmp_path, server, "0", PYTHONPATH="/elsewhere") is None
    assert "PYTHONPATH" in (warm_start.last_refusal or "")
    assert _start(tmp_path, server, "0", HF_HOME=str(tmp_path)) is None
    assert "HF_HOME" in (warm_start.last_refusal or "")
    # read when used, not at import: served
    proc = _start(tmp_path, server, "0", PYTORCH_NVML_BASED_CUDA_CHECK="1")
    assert proc is not None and proc.wait(60) == 0


def test_without_a_server_nothing_is_started_warm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COCKPIT_WARM_START"}
    assert warm_start.start([sys.executable, "-m", "warm_child", "0"], env, HERE, str(tmp_path / "out")) is None
    gone = dict(env, COCKPIT_WARM_START=str(tmp_path / "no-such.sock"))
    assert warm_start.start([sys.executable, "-m", "warm_child", "0"], gone, HERE, str(tmp_path / "out")) is None
    assert "no warm start server" in (warm_start.last_refusal or "")
    assert not (tmp_path / "out").exists()
