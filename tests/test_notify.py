"""Notifications (``cockpit/run/notify.py``, ``cockpit/ui/notifications.py``).

The supervisor side runs the real supervisor process (``python -m cockpit.run.supervisor``'s
``main``) over a real run dir; only its rank command is a few lines of Python that write the events
a rank writes and exit (no torch: each run takes about a second). The notify command is a shell
line that appends its stdin to a file. The cockpit side is the real app under Textual's Pilot,
with a run that ends while it watches.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

RANK = """
import os, sys
from cockpit.store.events import EventWriter

mode = sys.argv[1]
with EventWriter(os.path.join(os.environ["COCKPIT_RUN_DIR"], "events.jsonl")) as w:
    w.emit("rank_started", rank=0, local_rank=0, pid=os.getpid(), node_rank=0, host="here")
    w.emit("train_begin", total_steps=3, start_step=0, world_size=1, global_batch=2)
    if mode == "hang":  # one step, then silent past hang_timeout_s (1 s), then it ends well
        w.emit("step", step=1, total_steps=3, loss=2.0)
        import time
        time.sleep(4)
        w.emit("run_finished", steps=3, runtime_s=4.5, first_loss=2.0, last_loss=2.0)
        sys.exit(0)
    if mode == "finish":
        w.emit("alert", level="warn", code="memory_pressure", message="rank 0's peak 1400 MiB swung 40 %",
               trigger="swing", remedies=["halve per_device_train_batch_size"], rank=0)
        w.emit("step", step=3, total_steps=3, loss=1.5)
        w.emit("run_finished", steps=3, runtime_s=0.5, first_loss=2.0, last_loss=1.5)
        sys.exit(0)
    print("Traceback: boom in rank 0", flush=True)
    w.emit("run_failed", reason="RuntimeError: boom in rank 0", rank=0, log_tail=["boom in rank 0"])
    sys.exit(1)
"""


def make_run(runs: Path, name: str = "notify-demo", **over):
    from cockpit.config.load import dump_resolved, validate
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import create_run_dir

    cfg = validate({"dataset": "cockpit_identity", "use_cpu": True, "hang_timeout_s": 600, **over}, check_paths=False)
    run = create_run_dir(runs, name)
    run.config_path.write_text(dump_resolved(cfg), encoding="utf-8")
    run.update_status(state="starting", run_id=run.run_id, attempt=1, step=0, total_steps=None, events_offset=0)
    EventWriter(run.events_path).close()
    return run


def supervise(tmp_path: Path, mode: str, command: str | None, extra_env: dict | None = None, **over):
    """A run dir and its real supervisor, whose rank is RANK in ``mode``; waits for the end."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    rank = tmp_path / "rank.py"
    rank.write_text(RANK)
    run = make_run(tmp_path / "runs", **over)
    code = (
        "import sys; import cockpit.run.supervisor as s; "
        f"s.rank_command = lambda run, cfg, python=sys.executable: ([python, {str(rank)!r}, {mode!r}], {{}}); "
        f"sys.exit(s.main([{str(run.path)!r}]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCKPIT_NOTIFY")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if command is not None:
        env["COCKPIT_NOTIFY_COMMAND"] = command
    env.update(extra_env or {})
    t0 = time.time()
    with open(run.supervisor_log, "ab") as log:
        res = subprocess.run([sys.executable, "-c", code], env=env, stdout=log, stderr=subprocess.STDOUT, timeout=120)
    return run, res.returncode, time.time() - t0


def received(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_notify_command_gets_the_finished_run_and_its_memory_alert_as_json(tmp_path):
    out = tmp_path / "received.jsonl"
    run, rc, _ = supervise(tmp_path, "finish", f"cat >> {out}")
    assert rc == 0 and run.read_status()["state"] == "finished"
    notes = received(out)
    by_event = {n["event"]: n for n in notes}
    assert sorted(by_event) == ["memory_pressure", "run_finished"] and len(notes) == 2  # told once each
    end = by_event["run_finished"]
    assert end["v"] == 1 and end["run_id"] == run.run_id and end["run_dir"] == str(run.path)
    assert end["state"] == "finished" and end["level"] == "info" and end["details"]["step"] == 3
    assert end["message"] == f"run {run.run_id} finished"
    mem = by_event["memory_pressure"]
    assert mem["state"] == "running" and mem["level"] == "warn" and "1400 MiB" in mem["message"]
    assert mem["details"]["code"] == "memory_pressure" and mem["details"]["remedies"]
    # kept for an adopter started without the variable: 0600 (a webhook's token may be in it)
    kept = run.path / "notify.json"
    assert json.loads(kept.read_text())["command"] == f"cat >> {out}"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert "notify_command: run_finished sent" in run.supervisor_log.read_text()


def test_notify_command_gets_the_failed_run_with_its_reason_and_log_tail(tmp_path):
    out = tmp_path / "received.jsonl"
    run, rc, _ = supervise(tmp_path, "fail", f"cat >> {out}")
    assert rc == 1 and run.read_status()["state"] == "failed"
    (note,) = received(out)  # the failure's two state events make one notification
    assert note["event"] == "run_failed" and note["state"] == "failed" and note["level"] == "error"
    assert "boom in rank 0" in note["reason"] and "boom in rank 0" in note["message"]
    assert any("boom in rank 0" in line for line in note["details"]["log_tail"])


def test_notify_command_gets_the_hang_alert_while_the_run_goes_on(tmp_path):
    out = tmp_path / "received.jsonl"
    run, rc, _ = supervise(tmp_path, "hang", f"cat >> {out}", hang_timeout_s=1.0, load_timeout_s=60.0)
    assert rc == 0 and run.read_status()["state"] == "finished"
    hang, end = received(out)
    assert hang["event"] == "hang" and hang["state"] == "running" and hang["details"]["code"] == "hang"
    assert hang["details"]["phase"] == "train" and hang["message"].startswith(f"run {run.run_id}: ")
    assert end["event"] == "run_finished" and end["t"] > hang["t"]


def test_a_failing_or_hanging_notify_command_is_logged_and_the_run_still_ends_well(tmp_path):
    run, rc, _ = supervise(tmp_path / "a", "finish", "echo no route to the webhook >&2; exit 7")
    assert rc == 0 and run.read_status()["state"] == "finished"
    log = run.supervisor_log.read_text()
    assert "notify_command failed for run_finished" in log and "exited 7: no route to the webhook" in log

    run, rc, took = supervise(tmp_path / "b", "finish", "sleep 60", {"COCKPIT_NOTIFY_TIMEOUT_S": "1"})
    assert rc == 0 and run.read_status()["state"] == "finished" and took < 30
    assert "notify_command failed for run_finished ('sleep 60'): timed out after 1 s (killed)" in run.supervisor_log.read_text()


def test_no_command_no_notification_and_no_file(tmp_path):
    run, rc, _ = supervise(tmp_path, "finish", None)
    assert rc == 0 and not (run.path / "notify.json").exists()
    assert "notify_command" not in run.supervisor_log.read_text()


def test_an_adopter_without_the_variable_uses_the_run_dirs_command(tmp_path):
    from cockpit.run.notify import configured_command

    assert configured_command(tmp_path, {}) == (None, 30.0)
    assert configured_command(tmp_path, {"COCKPIT_NOTIFY_COMMAND": "mail -s run me", "COCKPIT_NOTIFY_TIMEOUT_S": "5"}) == (
        "mail -s run me",
        5.0,
    )
    assert configured_command(tmp_path, {}) == ("mail -s run me", 5.0)


def test_which_events_notify():
    from cockpit.run.notify import notification

    assert notification({"kind": "state", "state": "running"}, "r") is None
    assert notification({"kind": "state", "state": "stopped", "reason": "stop requested"}, "r") is None
    assert notification({"kind": "alert", "code": "loss_spike", "message": "x"}, "r") is None
    assert notification({"kind": "step", "step": 1}, "r") is None
    hang = notification({"kind": "alert", "code": "hang", "level": "error", "message": "no step for 600 s"}, "r")
    assert hang["event"] == "hang" and hang["level"] == "error" and hang["title"] == "r: hang"


def test_terminal_sequences_osc9_osc777_and_tmux():
    from cockpit.ui.notifications import osc_kinds, osc_sequences

    assert osc_sequences("t", "b", {"TERM": "xterm-256color"}) == ""  # unknown terminal: the bell only
    assert osc_sequences("t", "b", {"TERM_PROGRAM": "iTerm.app"}) == "\x1b]9;t: b\x07"
    assert osc_sequences("t;x", "b\x07\x1bc", {"VTE_VERSION": "7600"}) == "\x1b]777;notify;t,x;b c\x07"
    wrapped = osc_sequences("t", "b", {"KITTY_WINDOW_ID": "1", "TMUX": "/tmp/tmux-0/default,1,0"})
    assert wrapped == "\x1bPtmux;\x1b\x1b]9;t: b\x07\x1b\\"
    assert osc_kinds({"COCKPIT_TERMINAL_NOTIFY": "osc9,osc777", "TERM": "dumb"}) == ("osc9", "osc777")
    assert osc_kinds({"COCKPIT_TERMINAL_NOTIFY": "off", "TERM_PROGRAM": "iTerm.app"}) == ()


def test_the_cockpit_tells_a_run_that_ends_while_it_watches(tmp_path, monkeypatch):
    """Pilot: a run running when the cockpit starts (its earlier alert is not news), then it fails:
    a toast, the bell, and the OSC 777 sequence for this (VTE) terminal, through tmux."""
    from cockpit.store.events import EventWriter
    from cockpit.ui.app import CockpitApp
    from tests.test_ui_pilot import wait_for
    from tests.test_ui_setup_live import DOCTOR

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("VTE_VERSION", "7600")
    monkeypatch.setenv("TMUX", "/tmp/tmux-0/default,1,0")
    monkeypatch.delenv("COCKPIT_TERMINAL_NOTIFY", raising=False)
    run = make_run(tmp_path / "runs")
    with EventWriter(run.events_path) as w:
        w.emit("state", state="running", reason=None)
        w.emit("alert", level="warn", code="memory_pressure", message="old news")
    written: list[str] = []
    bells: list[int] = []
    monkeypatch.setattr(CockpitApp, "write_terminal", lambda self, data: written.append(data))
    monkeypatch.setattr(CockpitApp, "bell", lambda self: bells.append(1))

    async def scenario() -> None:
        app = CockpitApp(tmp_path / "runs", start="runs", doctor_checks=DOCTOR, follow=False, notify_poll_s=0.2)
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await wait_for(pilot, lambda: app.run_watch is not None and app.run_watch.polled, 20, "the first poll")
            await pilot.pause(0.5)
            assert not app._notifications and not bells  # what happened before the cockpit started
            with EventWriter(run.events_path) as w:
                w.emit("run_failed", reason="RuntimeError: boom", rank=0, log_tail=["boom"])
                w.emit("state", state="failed", reason="RuntimeError: boom", log_tail=["boom"])
                w.emit("state", state="failed", reason="RuntimeError: boom")
            await wait_for(pilot, lambda: app._notifications, 20, "the failure's toast")
            await pilot.pause(0.6)  # a few more polls: still one toast
            (note,) = list(app._notifications)
            assert note.severity == "error" and run.run_id in note.title and "RuntimeError: boom" in note.message
            await wait_for(pilot, lambda: app.screen.query("Toast"), 10, "the toast drawn")
            assert "RuntimeError: boom" in str(app.screen.query_one("Toast").render())
            assert bells == [1]
            (seq,) = written
            assert seq.startswith("\x1bPtmux;\x1b\x1b]777;notify;cockpit: ") and "RuntimeError: boom" in seq

    asyncio.run(scenario())


def test_on_the_runs_own_live_screen_no_toast_covers_the_log(tmp_path, monkeypatch):
    """Issue 29: the Live screen of the run says the end in its header (and rings); the watch adds no
    toast there, only the desktop notification (the person may be in another window)."""
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import RunDir
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.screens.live import LiveScreen
    from tests.test_ui_pilot import wait_for
    from tests.test_ui_setup_live import DOCTOR

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("COCKPIT_TERMINAL_NOTIFY", "osc9")
    monkeypatch.delenv("TMUX", raising=False)
    run = make_run(tmp_path / "runs")
    run.update_status(state="running")
    with EventWriter(run.events_path) as w:
        w.emit("state", state="running", reason=None)
    written: list[str] = []
    monkeypatch.setattr(CockpitApp, "write_terminal", lambda self, data: written.append(data))

    async def scenario() -> None:
        app = CockpitApp(tmp_path / "runs", start="runs", doctor_checks=DOCTOR, notify_poll_s=0.2, poll_s=0.1)
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await wait_for(pilot, lambda: app.run_watch is not None and app.run_watch.polled, 20, "the first poll")
            app.open_live(RunDir(run.path))
            await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen), 10, "the live screen")
            with EventWriter(run.events_path) as w:
                w.emit("run_finished", steps=3, runtime_s=1.0)
                w.emit("state", state="finished", reason=None)
            run.update_status(state="finished")
            await wait_for(pilot, lambda: written, 20, "the desktop notification")
            await pilot.pause(0.5)
            assert written == [f"\x1b]9;cockpit: {run.run_id} finished: run {run.run_id} finished\x07"]
            assert not app._notifications

    asyncio.run(scenario())


def test_a_note_that_arrives_while_the_cockpit_closes_is_dropped(tmp_path, monkeypatch):
    """The watch worker's notes can reach the app after its screens are gone (the app closing: a
    Pilot test ending, Ctrl+Q): they are dropped, not an exception ("No screens on stack")."""
    from textual.app import ScreenStackError

    from cockpit.ui.app import CockpitApp
    from cockpit.ui.notifications import RunNotes
    from tests.test_ui_setup_live import DOCTOR

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    make_run(tmp_path / "runs")
    app = CockpitApp(tmp_path / "runs", start="runs", doctor_checks=DOCTOR, notify_poll_s=0)

    async def scenario() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()

    asyncio.run(scenario())
    with pytest.raises(ScreenStackError):
        app.screen  # noqa: B018 - the stack is gone, as while the app closes
    note = {"run_id": "r", "level": "error", "title": "r failed", "message": "run r failed"}
    app.on_run_notes(RunNotes([note]))
    assert not app._notifications
