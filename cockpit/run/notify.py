"""Notifications: a run finished or failed, hangs, or hit a memory-pressure alert.

Two receivers, one rule (:func:`notification`, pure: an event in, the notification or None out):

- the cockpit (``cockpit/ui/notifications.py``): a toast, the terminal bell, and OSC 9 / OSC 777
  desktop notifications where the terminal has them, for every run it sees in its runs dir;
- ``notify_command``: the user's own command (a webhook, mail or chat script), run by the run's
  detached supervisor, so it fires with no cockpit open. A setting of the user, not of the run:
  ``$COCKPIT_NOTIFY_COMMAND`` (or ``cockpit train --notify-command CMD``), a shell command line,
  run with the notification as one JSON object on its stdin, in its own process group, killed
  after ``$COCKPIT_NOTIFY_TIMEOUT_S`` (default 30 s). Its failure (an exit status, a timeout, a
  command not found) is a line in ``logs/supervisor.log``; it never touches the run. The
  supervisor keeps the command in the run dir (``notify.json``, 0600: it may hold a webhook's
  token) so a supervisor that adopts the run later, from another shell, uses the same one.

The JSON (``v`` 1): ``event`` (run_finished | run_failed | hang | memory_pressure), ``run_id``,
``run_dir``, ``state`` (the run's state: finished, failed, or running for an alert), ``reason``,
``title`` and ``message`` (one line each, for a chat message or a mail subject), ``level``
(info | warn | error), ``t`` (unix seconds), ``host``, and ``details``: the event itself as the
event log holds it (``cockpit/store/events.py``: an alert's code, figures and remedies; a failure's
log tail).

No torch, no textual: the supervisor and the UI both import it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ENV_COMMAND = "COCKPIT_NOTIFY_COMMAND"
ENV_TIMEOUT = "COCKPIT_NOTIFY_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0
NOTIFY_FILE = "notify.json"
END_STATES = ("finished", "failed")
ALERT_CODES = ("hang", "memory_pressure", "reward_hacking")
ALERT_TITLES = {"hang": "hang", "memory_pressure": "memory pressure", "reward_hacking": "reward hacking"}


def notification(ev: Mapping[str, Any], run_id: str, run_dir: str | os.PathLike[str] | None = None) -> dict | None:
    """The notification ``ev`` (an event of the run's log) makes, or None: a ``state`` event of
    an end in :data:`END_STATES`, an ``alert`` whose code is in :data:`ALERT_CODES`."""
    kind = ev.get("kind")
    if kind == "state" and ev.get("state") in END_STATES:
        state = str(ev["state"])
        reason = ev.get("reason")
        event = f"run_{state}"
        level = "info" if state == "finished" else "error"
        title = f"{run_id} {state}"
        message = f"run {run_id} {state}" + (f": {reason}" if reason else "")
    elif kind == "alert" and ev.get("code") in ALERT_CODES:
        event = str(ev["code"])
        state = "running"
        reason = ev.get("message")
        level = str(ev.get("level") or "warn")
        title = f"{run_id}: {ALERT_TITLES[event]}"
        message = f"run {run_id}: {reason or event}"
    else:
        return None
    return {
        "v": 1,
        "event": event,
        "run_id": run_id,
        "run_dir": str(run_dir) if run_dir is not None else None,
        "state": state,
        "reason": reason,
        "title": title,
        "message": " ".join(str(message).split()),
        "level": level,
        "t": ev.get("t") or time.time(),
        "host": socket.gethostname(),
        "details": dict(ev),
    }


def timeout_s(env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    try:
        value = float(env.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT_S)
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def run_command(command: str, note: Mapping[str, Any], timeout: float, cwd: str | None = None) -> str | None:
    """Run ``command`` (a shell command line) with ``note`` as JSON on its stdin; None when it
    exited 0, else why not (its exit status or the timeout, and the end of what it printed). A
    command past ``timeout`` is killed with its process group."""
    data = (json.dumps(note, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    try:
        proc = subprocess.Popen(
            command,
            shell=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # its own group: a timeout kills what it started too
            close_fds=True,
        )
    except OSError as exc:
        return f"could not start: {exc}"
    try:
        out, _ = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return f"timed out after {timeout:g} s (killed)"
    if proc.returncode != 0:
        tail = out.decode("utf-8", "replace").strip().splitlines()[-3:]
        return f"exited {proc.returncode}" + (f": {' | '.join(tail)}" if tail else "")
    return None


def configured_command(run_path: Path, env: Mapping[str, str] | None = None) -> tuple[str | None, float]:
    """The run's notify command and timeout: the environment's (kept in the run dir's
    ``notify.json`` for a later adopter), else the run dir's."""
    env = os.environ if env is None else env
    path = Path(run_path) / NOTIFY_FILE
    command = (env.get(ENV_COMMAND) or "").strip() or None
    if command:
        wait = timeout_s(env)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"command": command, "timeout_s": wait}, fh)
        except OSError:
            pass
        return command, wait
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        return (str(kept["command"]) or None), float(kept.get("timeout_s") or DEFAULT_TIMEOUT_S)
    except (OSError, ValueError, KeyError, TypeError):
        return None, DEFAULT_TIMEOUT_S


class Notifier:
    """The supervisor's side: each notification runs the command in a thread (the supervisor's
    loop never waits on it); :meth:`drain` waits for those still running, up to their timeout,
    before the supervisor exits."""

    def __init__(self, command: str | None, timeout: float, cwd: str | None, log: Callable[[str], None]):
        self.command = command
        self.timeout = timeout
        self.cwd = cwd
        self.log = log
        self.threads: list[threading.Thread] = []

    def send(self, note: Mapping[str, Any] | None) -> None:
        if not note or not self.command:
            return
        self.threads = [t for t in self.threads if t.is_alive()]
        thread = threading.Thread(target=self._run, args=(dict(note),), name="notify", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _run(self, note: dict[str, Any]) -> None:
        why = run_command(self.command or "", note, self.timeout, cwd=self.cwd)
        if why is None:
            self.log(f"notify_command: {note['event']} sent")
        else:
            self.log(f"notify_command failed for {note['event']} ({self.command!r}): {why}")

    def drain(self) -> None:
        deadline = time.time() + self.timeout + 5.0
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.time()))
