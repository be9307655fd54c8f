"""Liveness is checked, not assumed: every reader of a run calls :func:`reconcile`.

``status.json`` names the supervisor (``supervisor_pid`` + ``supervisor_start``, its start time
in clock ticks since boot) and the rank processes (``procs``: ``[[pid, start], ...]``, the launcher
and every rank). A
pid counts as alive only when a process with that pid exists, is not a zombie, and started at
the recorded time (so a reused pid does not count). When the supervisor is gone while the
status still says the run is active, :func:`cockpit.run.runstate.decide` says what happens:

- ranks still running: a new supervisor adopts them (``python -m cockpit.run.supervisor RUN --adopt``);
- ranks gone and the attempt's final event exists: that end state (``finished`` ...);
- otherwise ``lost``, with the reason; ``cockpit resume`` continues it.

The whole check runs under the status lock, so two readers never adopt a run twice.
No torch, no textual.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil

from cockpit.run.runstate import FINAL_KINDS, attempt_outcome, decide
from cockpit.store.events import EventWriter, scan_kinds
from cockpit.store.rundir import ACTIVE_STATES, RunDir


def start_time(pid: int) -> float | None:
    """The process's start time, or None when no live (non-zombie) process has ``pid``.

    On Linux: clock ticks since boot (``/proc/PID/stat`` field 22), which never moves; a unix
    time derived from it would move with the wall clock (``btime`` is recomputed from it). Elsewhere
    psutil's create_time."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return None if fields[0] in (b"Z", b"X") else float(fields[19])
    except FileNotFoundError:
        return None
    except (OSError, IndexError, ValueError, TypeError):
        pass
    try:
        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.Error, ValueError, TypeError):
        return None


def is_alive(pid: Any, started: Any) -> bool:
    """``pid`` is alive and is the process that started at ``started`` (None: any start time)."""
    if not pid:
        return False
    actual = start_time(int(pid))
    if actual is None:
        return False
    return started is None or actual == float(started)


def identity(pid: int) -> list[Any]:
    """``[pid, start_time]`` as recorded in status.json."""
    return [int(pid), start_time(pid)]


def supervisor_alive(status: dict[str, Any]) -> bool:
    return is_alive(status.get("supervisor_pid"), status.get("supervisor_start"))


def ranks_alive(status: dict[str, Any]) -> bool:
    return any(is_alive(pid, started) for pid, started in status.get("procs") or [])


def attempt_final_events(run: RunDir, status: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The current attempt's final events (from the offset its supervisor recorded), streamed."""
    return scan_kinds(run.events_path, FINAL_KINDS, offset=int(status.get("events_offset") or 0))


def on_this_host(status: dict[str, Any]) -> bool:
    """The supervisor runs here (a Slurm run's may run on a compute node: its pid means nothing
    here, and the scheduler's word, ``cockpit.slurm.queue``, covers it)."""
    host = status.get("supervisor_host")
    return not host or host == socket.gethostname()


def reconcile(
    run: RunDir, adopt: bool = True, supervisor_gone: bool = False, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Check a run's liveness and act on it; returns the (possibly updated) status.

    Cheap for a run that is not active (one status read). ``adopt`` False: report only
    (an active run with live ranks and a dead supervisor stays as it is). ``status``: the status a
    reader already has (e.g. with the scheduler's word); read here when None. ``supervisor_gone``:
    the caller is the supervisor named in status.json and is about to exit without a verdict."""
    status = run.read_status() if status is None else status
    if status.get("state") not in ACTIVE_STATES or not on_this_host(status):
        return status
    try:
        with run.status_lock():
            return _reconcile_locked(run, adopt, supervisor_gone)
    except OSError:  # a run dir we cannot write (another user's): report what it says
        return status


def _reconcile_locked(run: RunDir, adopt: bool, supervisor_gone: bool = False) -> dict[str, Any]:
    status = run.read_status()
    if (
        status.get("state") not in ACTIVE_STATES
        or not on_this_host(status)
        or (not supervisor_gone and supervisor_alive(status))
    ):
        return status
    live = ranks_alive(status)
    outcome = None if live else attempt_outcome(attempt_final_events(run, status))
    verdict = decide(status, supervisor_alive=False, ranks_alive=live, outcome=outcome, now=time.time())
    if verdict.action == "adopt" and adopt:
        proc = spawn_adopter(run)
        gone = [*(status.get("adopted_from") or []), status.get("supervisor_pid")]
        return run.update_status(
            supervisor_pid=proc.pid,
            supervisor_start=start_time(proc.pid),
            supervisor_host=socket.gethostname(),
            adopted_at=time.time(),
            adopted_from=gone,
        )
    if verdict.action != "end":
        return status
    step = max(
        int(status.get("step") or 0), verdict.step or 0
    )  # run_finished's steps: the last step need not be logged
    fields: dict[str, Any] = {"state": verdict.state, "reason": verdict.reason, "step": step, "ended": time.time()}
    EventWriter(run.events_path).emit("state", state=verdict.state, reason=verdict.reason, by="liveness check")
    status = run.update_status(**fields)
    _settle_summary(run, verdict.state, verdict.reason, step)
    return status


def _settle_summary(run: RunDir, state: str, reason: str | None, step: int) -> None:
    from cockpit.store.rundir import atomic_write_json

    summary = run.read_summary()
    if summary.get("state") == state:
        return
    if not summary or state == "lost":
        summary = {**summary, "run_id": run.run_id, "steps": summary.get("steps") or step}
    summary.update(state=state, reason=reason)
    atomic_write_json(run.summary_path, summary)


def spawn_adopter(run: RunDir) -> subprocess.Popen:
    """A new supervisor for ranks whose supervisor died (its own session, like the first)."""
    log = open(run.supervisor_log, "ab", buffering=0)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "cockpit.run.supervisor", str(run.path), "--adopt"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(run.path),
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()
