"""Liveness is checked, not assumed (issue 14): a run whose supervisor died is adopted while its
ranks run, ends ``finished`` when they completed, ``lost`` (with the reason) otherwise, and a lost
run resumes; status.json has one writer at a time and loses no field."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cockpit.run.runstate import Outcome, attempt_outcome, decide, final_state
from conftest import ROOT, cockpit, has_step, read_events, start_detached, tiny_config, wait_for

pytestmark = pytest.mark.serial  # timing windows: run alone (scripts/test.sh)


def status(run: Path) -> dict:
    try:
        return json.loads((run / "status.json").read_text())
    except (OSError, ValueError):
        return {}


# -- the pure decision ------------------------------------------------------------------------------
RUNNING = {"state": "running", "supervisor_pid": 4242, "step": 7, "updated": 0.0}


def test_decide_keeps_a_run_whose_supervisor_lives():
    assert decide(RUNNING, supervisor_alive=True, ranks_alive=False, outcome=None, now=100.0).action == "keep"
    assert decide({**RUNNING, "state": "finished"}, supervisor_alive=False, ranks_alive=False, outcome=None, now=100.0).action == "keep"


def test_decide_adopts_live_ranks_of_a_dead_supervisor():
    assert decide(RUNNING, supervisor_alive=False, ranks_alive=True, outcome=None, now=100.0).action == "adopt"


def test_decide_ends_a_completed_run_finished_and_a_dead_one_lost():
    done = Outcome("finished", None, 27, {"kind": "run_finished", "steps": 27})
    v = decide(RUNNING, supervisor_alive=False, ranks_alive=False, outcome=done, now=100.0)
    assert (v.action, v.state, v.step) == ("end", "finished", 27)
    v = decide(RUNNING, supervisor_alive=False, ranks_alive=False, outcome=None, now=100.0)
    assert (v.action, v.state) == ("end", "lost")
    assert v.reason == "supervisor pid 4242 exited without a final state; last step 7"


def test_decide_gives_a_just_launched_run_time_to_name_its_supervisor():
    fresh = {"state": "starting", "started": 90.0}
    assert decide(fresh, supervisor_alive=False, ranks_alive=False, outcome=None, now=100.0).action == "keep"
    assert decide(fresh, supervisor_alive=False, ranks_alive=False, outcome=None, now=1000.0).state == "lost"


def test_attempt_outcome_and_final_state():
    evs = [{"kind": "step", "step": 1}, {"kind": "run_finished", "steps": 3}]
    out = attempt_outcome(evs)
    assert out.state == "finished" and out.step == 3
    assert attempt_outcome([*evs, {"kind": "run_failed", "reason": "x"}]).state == "failed"
    assert attempt_outcome([{"kind": "step"}]) is None
    assert final_state(0, killing=False, kill_reason=None, outcome=out, exit_text="") == ("finished", None)
    assert final_state(-9, killing=False, kill_reason=None, outcome=None, exit_text="killed by signal SIGKILL")[1] == "training process killed by signal SIGKILL"
    assert final_state(None, killing=False, kill_reason=None, outcome=None, exit_text="")[0] == "failed"
    assert final_state(0, killing=True, kill_reason="killed on request", outcome=out, exit_text="") == ("failed", "killed on request")


def test_a_reused_pid_is_not_the_supervisor():
    from cockpit.run.liveness import is_alive, start_time

    me = os.getpid()
    assert is_alive(me, start_time(me))
    assert not is_alive(me, start_time(me) - 30)  # same pid, another process's start time
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not is_alive(proc.pid, None)


# -- one writer, and a lock for the others ------------------------------------------------------------
HAMMER = """
import sys
from pathlib import Path
from cockpit.store.rundir import RunDir

run = RunDir(Path(sys.argv[1]))
who = sys.argv[2]
for i in range(int(sys.argv[3])):
    run.update_status(**{f"{who}{i}": i, who: i})
"""


def test_status_hammered_from_two_processes_loses_no_field(tmp_path):
    from cockpit.store.rundir import create_run_dir

    run = create_run_dir(tmp_path / "runs", "hammer")
    run.update_status(state="running")
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", HAMMER, str(run.path), who, str(n)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))) for who in ("sup", "rank")]
    for i in range(n):  # and this process, a third writer (a reader reconciling)
        run.update_status(**{f"ui{i}": i})
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    st = json.loads(run.status_path.read_text())
    missing = [f"{w}{i}" for w in ("sup", "rank", "ui") for i in range(n) if f"{w}{i}" not in st]
    assert not missing, missing[:10]
    assert st["sup"] == st["rank"] == n - 1 and st["state"] == "running"


def test_ranks_never_write_status_json():
    """The supervisor owns status.json; the training side speaks through events only."""
    import ast

    for path in (ROOT / "cockpit" / "train").glob("*.py"):
        tree = ast.parse(path.read_text())
        calls = [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        assert "update_status" not in calls, path


# -- the reproduction, with the tiny model ---------------------------------------------------------
def kill_supervisor_group(run: Path) -> int:
    pid = int(wait_for(lambda: status(run).get("supervisor_pid") and status(run).get("procs") and status(run)["supervisor_pid"], 60, "the supervisor"))
    os.killpg(os.getpgid(pid), signal.SIGKILL)  # what the OOM killer or a crashed login node does
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10, "the supervisor to die")
    return pid


def no_process_left(run: Path) -> None:
    st = status(run)
    pids = {p for p, _ in st.get("procs") or []} | {st.get("supervisor_pid")} - {None}

    def gone():
        return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    wait_for(gone, 15, f"no process of {run.name} left")


@pytest.mark.slow
def test_supervisor_killed_mid_run_is_adopted_and_the_run_finishes(tmp_path, tiny_model_dir):
    steps = 14
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=steps, save_steps=100000, probes=None, telemetry_interval_s=0.5)
    run = start_detached(tmp_path, cfg)
    wait_for(lambda: has_step(run, 2), 120, "two steps")
    dead = kill_supervisor_group(run)
    res = cockpit("runs", "--runs-dir", str(tmp_path / "runs"), "--json")  # any reader adopts
    row = json.loads(res.stdout)[0]
    assert row["state"] in ("running", "finished"), row
    t_adopt = time.time()
    st = wait_for(lambda: status(run) if status(run).get("state") == "finished" else None, 300, "the adopted run to finish")
    assert st["supervisor_pid"] != dead and dead in st.get("adopted_from", [dead]), (dead, st)
    assert st["step"] == st["total_steps"] == steps, st  # a finished run is at its last step
    events = read_events(run)
    assert [e["step"] for e in events if e["kind"] == "step"] == list(range(1, steps + 1))
    if "adopted_from" in st:  # it was still running when the reader looked: watched, telemetry and all
        adopted = [e["t"] for e in events if e["kind"] == "state" and "adopted by" in (e.get("reason") or "")]
        assert adopted, [e for e in events if e["kind"] == "state"]
        # the adopter's sampler (every 0.5 s) reports unless the ranks ended within a few of its intervals
        # of the adopter taking over (its start-up under load, after t_adopt, no longer counts against it)
        sampled = [e["t"] for e in events if e["kind"] == "telemetry" and e["t"] > adopted[0]]
        assert sampled or st["ended"] - adopted[0] < 2.0, (t_adopt, adopted, st["ended"])
    att = cockpit("attach", str(run), timeout=60)  # follows to the end, does not hang
    assert att.returncode == 0 and f"run {run.name}: finished" in att.stdout, att.stdout[-2000:]
    no_process_left(run)


@pytest.mark.slow
def test_supervisor_and_ranks_killed_is_lost_then_resumes_to_finished(tmp_path, tiny_model_dir):
    # enough steps that the kill after the first checkpoint lands mid-run: with 10, the tiny run could
    # finish all its steps first (a resume from a checkpoint at max_steps then trains none:
    # tests/test_nan_resume.py)
    steps = 30
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=steps, save_steps=3, probes=None, telemetry_interval_s=0)
    run = start_detached(tmp_path, cfg)
    wait_for(lambda: any(e["kind"] == "checkpoint_saved" for e in read_events(run)), 120, "a checkpoint")
    rank = int(status(run)["rank_pids"]["0"])
    pid = kill_supervisor_group(run)
    os.kill(rank, signal.SIGKILL)  # a reboot: everything gone
    res = cockpit("runs", "--runs-dir", str(tmp_path / "runs"))
    assert " lost " in res.stdout, res.stdout
    st = status(run)
    assert st["state"] == "lost" and st["reason"].startswith(f"supervisor pid {pid} exited without a final state; last step "), st
    stop = cockpit("stop", str(run))
    assert "already lost" in stop.stdout
    res = cockpit("resume", str(run), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    st = status(run)
    assert st["state"] == "finished" and st["attempt"] == 2 and st["step"] == steps
    no_process_left(run)


# -- the screens show it within 5 s of looking ------------------------------------------------------------
def _orphaned_run(runs: Path, name: str, final: bool):
    """A run dir as a dead supervisor leaves it: status 'running' at 26/27, the supervisor gone."""
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import create_run_dir

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = create_run_dir(runs, name)
    run.update_status(state="running", run_id=run.run_id, attempt=1, started=time.time() - 100, supervisor_pid=dead.pid,
                      supervisor_start=1.0, procs=[[dead.pid, 1.0]], step=26, total_steps=27, events_offset=0)
    with EventWriter(run.events_path) as w:
        w.emit("state", state="running")
        w.emit("step", step=26, total_steps=27, loss=1.5)
        if final:
            w.emit("run_finished", steps=27, runtime_s=10.0, first_loss=3.0, last_loss=1.5)
    return run


def test_runs_screen_shows_a_dead_supervisors_run_finished_or_lost_within_5s(tmp_path):
    import asyncio

    from textual.widgets import DataTable

    from cockpit.ui.app import CockpitApp

    runs = tmp_path / "runs"
    done = _orphaned_run(runs, "done", final=True)
    gone = _orphaned_run(runs, "gone", final=False)

    async def scenario() -> None:
        app = CockpitApp(runs, start="runs", follow=False)
        async with app.run_test(size=(160, 40)) as pilot:
            t0 = time.time()
            while time.time() - t0 < 5:
                await pilot.pause(0.2)
                table = app.screen.query(DataTable)
                if table and len(table.first().rows) == 2:
                    break
            table = app.screen.query_one(DataTable)
            row = {str(v) for v in table.get_row(done.run_id)}
            assert "27/27" in row and any(v.split()[-1:] == ["finished"] for v in row), row  # "✓ finished"
            assert any(str(v).split()[-1:] == ["lost"] for v in table.get_row(gone.run_id))

    asyncio.run(scenario())
    assert json.loads(gone.status_path.read_text())["reason"].startswith("supervisor pid ")


def test_stop_kill_after_escalates_to_a_deaf_supervisors_session(tmp_path):
    """`cockpit stop --kill-after S` (the Live screen's relaunch uses the same code): a supervisor that
    consumes neither the stop nor the kill request loses its whole session after the graces."""
    from cockpit.run.liveness import start_time
    from cockpit.store.rundir import create_run_dir

    deaf = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        run = create_run_dir(tmp_path / "runs", "deaf")
        run.update_status(state="running", run_id=run.run_id, attempt=1, started=time.time(), supervisor_pid=deaf.pid,
                          supervisor_start=start_time(deaf.pid), procs=[[deaf.pid, start_time(deaf.pid)]], step=3, total_steps=9)
        t0 = time.monotonic()
        res = cockpit("stop", run.run_id, "--runs-dir", str(tmp_path / "runs"), "--kill-after", "1")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "supervisor killed" in res.stdout
        assert deaf.wait(timeout=10) == -signal.SIGKILL
        assert time.monotonic() - t0 >= 2.0  # a stop grace, then a kill grace, before the SIGKILL
        assert run.pending("stop") and run.pending("kill")  # both asked, neither consumed
        assert "--kill-after" in json.loads((run.control_dir / "kill").read_text())["detail"]
    finally:
        if deaf.poll() is None:
            deaf.kill()


def test_kill_after_never_signals_a_reused_pid_or_another_hosts(tmp_path):
    """Issue 34: the supervisor's session is SIGKILLed only when the recorded pid is still the recorded
    process (start time) on this host; a reused pid or a Slurm supervisor's pid seen from the login node
    is left alone (`cockpit stop --kill-after` ends such a run as lost, by the same rule, without a signal)."""
    from cockpit.run.control import kill_supervisor_session
    from cockpit.run.liveness import start_time
    from cockpit.store.rundir import create_run_dir

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        real = start_time(bystander.pid)
        reused = {"supervisor_pid": bystander.pid, "supervisor_start": real - 1.0}
        assert kill_supervisor_session(reused).startswith("not ended")
        elsewhere = {"supervisor_pid": bystander.pid, "supervisor_start": real, "supervisor_host": "compute-17"}
        assert "compute-17" in kill_supervisor_session(elsewhere)
        run = create_run_dir(tmp_path / "runs", "reused")
        run.update_status(state="running", run_id=run.run_id, attempt=1, started=time.time(), supervisor_pid=bystander.pid,
                          supervisor_start=real - 1.0, procs=[], step=3, total_steps=9)
        res = cockpit("stop", run.run_id, "--runs-dir", str(tmp_path / "runs"), "--kill-after", "0.5")
        assert "lost" in res.stdout, res.stdout + res.stderr
        time.sleep(0.3)
        assert bystander.poll() is None  # alive: never signalled
        assert kill_supervisor_session({"supervisor_pid": bystander.pid, "supervisor_start": real}) == "supervisor killed"
        assert bystander.wait(timeout=10) == -signal.SIGKILL
    finally:
        if bystander.poll() is None:
            bystander.kill()
