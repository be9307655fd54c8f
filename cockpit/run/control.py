"""Ending a run from outside, the same way from the CLI and the cockpit.

:func:`stop_escalating` asks the supervisor to stop (the ranks save a checkpoint), then to kill
the ranks when the stop is not consumed within a grace, then kills the supervisor's session
(ranks with it) when it does not answer either: what ``cockpit stop --kill-after S`` and the
Live screen's relaunch after a hang both do. No torch, no textual.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from cockpit.store.rundir import TERMINAL_STATES, RunDir


def ended_within(run: RunDir, seconds: float, poll_s: float = 0.2) -> bool:
    """Whether the run's status reaches a terminal state within ``seconds`` (0: already there)."""
    deadline = time.monotonic() + seconds
    while True:
        if run.read_status().get("state") in TERMINAL_STATES:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def stop_escalating(run: RunDir, why: str, stop_grace_s: float, kill_grace_s: float) -> str:
    """Stop, then kill, then the supervisor's session. Returns how it ended: ``already``,
    ``stopped``, ``killed``, ``supervisor killed`` or ``not ended``."""
    if ended_within(run, 0):
        return "already"
    run.request("stop", why)
    if ended_within(run, stop_grace_s):
        return "stopped"
    run.request("kill", f"{why} (stop not consumed within {stop_grace_s:g} s)")
    if ended_within(run, kill_grace_s):
        return "killed"
    return kill_supervisor_session(run.read_status())


def kill_supervisor_session(status: dict) -> str:
    """SIGKILL the run's supervisor and its session, only when the recorded supervisor is the process
    that is alive now (pid and start time, on this host: the liveness rule). A pid reused by an
    unrelated process, or a pid recorded on another host (a Slurm job's supervisor on a compute node,
    looked up here on the login node), is never signalled."""
    from cockpit.run.liveness import on_this_host, supervisor_alive

    pid = int(status.get("supervisor_pid") or 0)
    if pid <= 1:
        return "not ended"
    if not on_this_host(status):
        return f"not ended: its supervisor runs on {status.get('supervisor_host')} (cancel the job with the scheduler)"
    if not supervisor_alive(status):  # gone, or the pid is another process now
        return "not ended: the recorded supervisor is no longer running (its pid is not its own any more)"
    try:  # the supervisor does not answer either: its session goes (ranks with it)
        os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
    except OSError:
        return "not ended"
    return "supervisor killed"


def relaunch_config_path(run: RunDir) -> Path:
    """Where a relaunch of ``run`` keeps its config: the runs dir's ``.ui-configs/``, named after the
    run's config stem (run ids are ``DATE-TIME-STEM-HASH``) and the time."""
    stem = "-".join(run.run_id.split("-")[2:-1]) or "run"
    folder = run.path.parent / ".ui-configs"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / f"{stem}-relaunch-{time.strftime('%Y%m%d-%H%M%S')}.yaml"
