"""Interrupting ``scripts/test.sh`` ends everything it started (issue 29, item 6): pytest, and the
tests' detached runs, whose supervisors and ranks live in their own sessions (setsid), where
neither the terminal's Ctrl-C nor pytest's end reaches them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, wait_for

from cockpit.run.liveness import is_alive, start_time


def alive(procs: dict[int, float | None]) -> list[int]:
    return [pid for pid, started in procs.items() if is_alive(pid, started)]


def end_all(procs: dict[int, float | None], group: subprocess.Popen) -> None:
    """What a test leaves running: the processes it watched, then the process group it started (its own session)."""
    for pid in alive(procs):
        os.kill(pid, signal.SIGKILL)
    if group.poll() is None:
        os.killpg(group.pid, signal.SIGKILL)
        group.wait()


@pytest.mark.slow
@pytest.mark.serial  # a time window: everything gone within seconds of the signal
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupting_the_test_script_ends_pytest_and_the_detached_runs(tmp_path, tiny_model_dir, how):
    """ctrl-c: the suite as README runs it (no arguments: xdist workers, then the serial part, which
    must not start), limited to the one file by PYTEST_ADDOPTS; sigterm: with a file argument."""
    ready = tmp_path / "ready.json"
    env = dict(
        os.environ,
        COCKPIT_NO_BOOTSTRAP="1",
        COCKPIT_INTERRUPT_READY=str(ready),
        COCKPIT_INTERRUPT_MODEL=str(tiny_model_dir),
        COCKPIT_TEST_WORKERS="1",
    )
    target = "tests/interrupt_target.py"
    if how == "ctrl-c":
        env["PYTEST_ADDOPTS"] = target
    script = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "test.sh"), *([target] if how == "sigterm" else [])],
        cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    procs: dict[int, float | None] = {}
    try:
        wait_for(lambda: ready.exists() or script.poll() is not None, 300, "the inner test's detached run")
        assert ready.exists(), script.communicate()[0].decode()[-3000:]
        said = json.loads(ready.read_text())
        status = json.loads((Path(said["run_dir"]) / "status.json").read_text())
        procs = {int(pid): started for pid, started in status.get("procs") or []}
        procs[int(status["supervisor_pid"])] = status["supervisor_start"]
        for child in psutil.Process(script.pid).children(recursive=True):  # pytest (its xdist workers)
            procs[child.pid] = start_time(child.pid)
        assert said["pytest_pid"] in procs
        assert len(alive(procs)) == len(procs) >= 3  # pytest, the supervisor, a rank

        if how == "ctrl-c":
            os.killpg(script.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        else:
            os.kill(script.pid, signal.SIGTERM)  # the script alone
        t0 = time.monotonic()
        code = script.wait(timeout=30)
        gone_after = time.monotonic() - t0
        deadline = time.monotonic() + 2
        while alive(procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        out = script.stdout.read().decode() if script.stdout else ""
        assert not alive(procs), f"still running after the script ended: {alive(procs)}\n{out[-3000:]}"
        assert code == (130 if how == "ctrl-c" else 143), out[-3000:]
        assert gone_after < 10, f"the script took {gone_after:.1f} s to end\n{out[-3000:]}"
    finally:
        end_all(procs, script)


@pytest.mark.slow  # about 15 s: the script, pytest and an xdist worker start
@pytest.mark.serial  # a time window: the script ends after what it started, not before
def test_ctrl_c_through_a_pipe_ends_pytest_before_the_script(tmp_path):
    """Issue 62 item 5: `bash scripts/test.sh 2>&1 | tee log`, then Ctrl-C: the signal reaches the
    whole foreground group, tee included, and the script's next line to the dead pipe killed it by
    SIGPIPE within a second while pytest and the tests' detached processes ran on. Now the script
    ends last: pytest and a detached process in its own session are gone when it exits. Through the
    pipe, xdist's progress reaches the log before the first result (each worker's collected count).
    A tiny suite (tests/interrupt_pipe_target.py: one test that passes, one that waits) on one worker."""
    ready, log = tmp_path / "ready.json", tmp_path / "log"
    env = dict(
        os.environ,
        COCKPIT_NO_BOOTSTRAP="1",
        COCKPIT_INTERRUPT_READY=str(ready),
        COCKPIT_TEST_WORKERS="1",
        PYTEST_ADDOPTS="tests/interrupt_pipe_target.py",
    )
    shell = subprocess.Popen(
        ["bash", "-c", f"bash scripts/test.sh 2>&1 | tee {log}"],
        cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a terminal's foreground job (the pipeline)
    )
    procs: dict[int, float | None] = {}
    try:
        wait_for(lambda: ready.exists() or shell.poll() is not None, 120, "the inner test's detached process")
        assert ready.exists(), log.read_text()[-3000:]
        said = json.loads(ready.read_text())
        procs[said["detached_pid"]] = start_time(said["detached_pid"])
        (script,) = [p for p in psutil.Process(shell.pid).children() if "scripts/test.sh" in " ".join(p.cmdline())]
        for child in script.children(recursive=True):  # pytest and its xdist worker
            procs[child.pid] = start_time(child.pid)
        assert said["pytest_pid"] in procs and len(alive(procs)) == len(procs) >= 3
        assert "[gw0] collected 2 tests" in log.read_text()  # progress through the pipe, before any result

        os.killpg(shell.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group, tee included
        script.wait(timeout=30)
        left = [pid for pid in alive(procs) if pid != said["detached_pid"]]  # pytest: reaped by the script
        assert not left, f"pytest still ran when the script ended: {left}\n{log.read_text()[-3000:]}"
        wait_for(lambda: not alive(procs), 5, "the detached process's end")
        shell.wait(timeout=30)
    finally:
        end_all(procs, shell)
