"""The chaos test (issue 14, 6): one tiny-model run through 20 randomised faults.

Faults: SIGKILL of the supervisor's process group, of the rank, of both; SIGKILL of the rank
while a checkpoint is being written; SIGSTOP of the rank; the run dir's disk filled (the runs dir
is a small tmpfs; a ballast file fills it). After each fault the readers look (the liveness
check every CLI command and screen runs) and, where the run ended, ``cockpit resume`` continues
it. For every trial: within 10 s the state is terminal, or active with a live supervisor and live
ranks (adopted, when the supervisor was the victim) - never ``running`` with nothing running; no
``checkpoint-*`` is half-written. At the end: every step a later attempt repeated matches the
earlier attempt's loss within the CPU's noise, and no process is left.

The seed is printed (``COCKPIT_CHAOS_SEED`` replays one).
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from cockpit.run.liveness import ranks_alive, reconcile, supervisor_alive
from cockpit.store.rundir import ACTIVE_STATES, TERMINAL_STATES, RunDir
from conftest import cockpit, prerequisite, read_events, start_detached, tiny_config, wait_for

# Serial: its 10 s windows need the box to itself (scripts/test.sh runs it after the parallel part). It was
# quarantined while it failed in fresh-clone .ci/run (its checkpoints filled the tmpfs: save_total_limit below;
# a rank killed mid-rotation left a half-deleted checkpoint: retirement is atomic now); it passed a full
# fresh-clone .ci/run in 177 s (2026-12-01) and is counted again.
pytestmark = [pytest.mark.serial, pytest.mark.slow]

TRIALS = 20
FAULTS = (  # every fault at least twice; the restarting ones cost ~13 s each (resume, imports, model load)
    "kill_supervisor",
    "sigstop_rank",
    "kill_rank",
    "kill_both",
    "kill_during_save",
    "disk_full",
)
CHEAP = {"kill_supervisor": 2, "sigstop_rank": 1}  # the rest of the 20 drawn from these (no restart needed)


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True)
    prerequisite(res.returncode == 0, f"cannot mount a tmpfs here (needs root): {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


class Chaos:
    def __init__(self, run: Path, rng: random.Random):
        self.run = run
        self.rd = RunDir(run)
        self.rng = rng
        self.pids: set[int] = set()
        self.log: list[str] = []

    def status(self) -> dict:
        st = self.rd.read_status()
        self.pids |= {p for p, _ in st.get("procs") or []} | ({st["supervisor_pid"]} if st.get("supervisor_pid") else set())
        return st

    def steps(self) -> int:
        return sum(1 for e in read_events(self.run) if e["kind"] == "step")

    def running(self, new_steps: int = 1) -> dict:
        """Resume the run when it ended; then wait until it is running and made progress."""
        st = reconcile(self.rd)
        if st.get("state") in TERMINAL_STATES:
            res = cockpit("resume", str(self.run), "--detach", timeout=120)
            assert res.returncode == 0, res.stdout + res.stderr
        before = self.steps()
        wait_for(lambda: self.steps() >= before + new_steps, 120, "steps after the fault")
        return wait_for(lambda: (lambda s: s if s.get("rank_pids") and s.get("state") == "running" else None)(self.status()), 30, "rank pids")

    def settled(self, what: str) -> dict:
        """Within 10 s of the fault the readers see a terminal state, or an active run with a
        live supervisor and live ranks; never 'running' with nothing running."""

        def look():
            st = reconcile(self.rd)
            self.status()
            if st.get("state") in TERMINAL_STATES:
                return st
            if st.get("state") in ACTIVE_STATES and supervisor_alive(st) and ranks_alive(st):
                return st
            return None

        t0 = time.time()
        try:
            st = wait_for(look, 10, f"a settled state after {what}")
        except AssertionError:
            raise AssertionError(f"{what}: not settled within 10 s: {self.rd.read_status()}") from None
        self.log.append(f"{what}: {st['state']} in {time.time() - t0:.1f}s" + (f" ({st.get('reason')})" if st.get("reason") else ""))
        return st

    def explain(self, st: dict) -> str:
        """What an unexpected verdict is made of: state, reason, who wrote it, the attempt's events."""
        keys = ("state", "reason", "attempt", "supervisor_pid", "rank_pids", "procs", "events_offset", "exit_code")
        tail = [{k: e.get(k) for k in ("kind", "t", "state", "reason", "by", "step", "pid", "rank") if k in e}
                for e in read_events(self.run)[-12:]]
        logs = []
        for name in ("supervisor.log", "rank0.log"):
            path = self.run / "logs" / name
            lines = path.read_text(errors="replace").splitlines()[-15:] if path.exists() else []
            logs.append(f"--- {name}\n" + "\n".join(lines))
        df = os.statvfs(self.run)
        return (f"status {({k: st.get(k) for k in keys})}; last events {tail}; trials {self.log}; "
                f"free {df.f_bavail * df.f_frsize // 2**20} MiB\n" + "\n".join(logs))

    def checkpoints_whole(self) -> None:
        for ckpt in (self.run / "checkpoints").glob("checkpoint-*"):
            assert (ckpt / "trainer_state.json").exists() and (ckpt / "cockpit_checkpoint.json").exists(), ckpt

    def gone(self, *pids: int) -> None:
        """A SIGKILL is delivered asynchronously: the fault has happened once the process is gone."""
        from cockpit.run.liveness import start_time

        wait_for(lambda: all(start_time(p) is None for p in pids), 10, f"pids {pids} to die")

    # -- the faults -------------------------------------------------------------------------------------
    def kill_supervisor(self, st: dict) -> None:
        pid = st["supervisor_pid"]
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        self.gone(pid)
        st = self.settled("SIGKILL supervisor")
        if st["state"] in ACTIVE_STATES:
            assert st["supervisor_pid"] != pid and pid in st.get("adopted_from", []), st

    def sigstop_rank(self, st: dict) -> None:
        rank = int(st["rank_pids"]["0"])
        os.kill(rank, signal.SIGSTOP)
        try:
            time.sleep(1.5)
            st = self.settled("SIGSTOP rank")
            assert st["state"] in ACTIVE_STATES, st  # stopped, not dead: still watched
        finally:
            os.kill(rank, signal.SIGCONT)

    def kill_rank(self, st: dict) -> None:
        rank = int(st["rank_pids"]["0"])
        os.kill(rank, signal.SIGKILL)
        self.gone(rank)
        assert self.settled("SIGKILL rank")["state"] in ("failed", "lost")

    def kill_both(self, st: dict) -> None:
        rank, sup = int(st["rank_pids"]["0"]), st["supervisor_pid"]
        os.killpg(os.getpgid(sup), signal.SIGKILL)
        os.kill(rank, signal.SIGKILL)
        self.gone(rank, sup)
        st = self.settled("SIGKILL supervisor and rank")
        assert st["state"] == "lost" and f"supervisor pid {sup} exited without a final state" in st["reason"], self.explain(st)

    def kill_during_save(self, st: dict) -> None:
        staging = self.run / "checkpoints" / ".staging"
        deadline = time.time() + 20
        while time.time() < deadline and not (staging.is_dir() and any(staging.iterdir())):
            time.sleep(0.002)
        caught = staging.is_dir()
        rank = int(st["rank_pids"]["0"])
        os.kill(rank, signal.SIGKILL)
        self.gone(rank)
        assert self.settled("SIGKILL rank during a checkpoint save" if caught else "SIGKILL rank (no save caught)")["state"] in ("failed", "lost")

    def disk_full(self, st: dict) -> None:
        ballast = self.run.parent.parent / "ballast"
        try:
            with open(ballast, "wb") as fh:
                while True:
                    fh.write(b"\0" * (1 << 20))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            st = wait_for(lambda: (lambda s: s if s.get("state") in TERMINAL_STATES else None)(reconcile(self.rd)), 60, "the run to end on a full disk")
            self.settled("disk full")
            assert st["state"] == "failed" and "disk full" in st["reason"], st
        finally:
            ballast.unlink()


def overlapping_steps_match(run: Path) -> int:
    """Every step a later attempt repeated matches the earlier attempt's loss; returns how many."""
    seen: dict[int, float] = {}
    compared = 0
    for e in read_events(run):
        if e["kind"] != "step":
            continue
        if e["step"] in seen:
            assert e["loss"] == pytest.approx(seen[e["step"]], rel=1e-3), (e["step"], e["loss"], seen[e["step"]])
            compared += 1
        seen[e["step"]] = e["loss"]
    return compared


@pytest.mark.budget(150, reason="twenty faults, each a real supervisor and rank killed, stalled or starved, and resumed")
def test_chaos_twenty_randomised_faults(tmp_path, tiny_model_dir, tmpfs):
    seed = int(os.environ.get("COCKPIT_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"chaos seed {seed} (COCKPIT_CHAOS_SEED={seed} replays it)")
    rng = random.Random(seed)
    # save_total_limit: without it ~14 checkpoints of 20 trials filled the 48 MB tmpfs (free 1 MiB with no
    # ballast; the run then failed for real with "disk full", which is what broke the quarantined CI runs)
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=100000, save_steps=3, save_total_limit=3, logging_steps=1, probes=None,
                      lr_scheduler_type="constant", telemetry_interval_s=0.5, per_device_train_batch_size=1)
    run = start_detached(tmpfs, cfg)
    chaos = Chaos(run, rng)
    # every fault at least twice, the rest drawn from the cheap ones (3 minutes in all); in a seeded random order
    schedule = [*FAULTS, *FAULTS]
    schedule += rng.choices(list(CHEAP), list(CHEAP.values()), k=TRIALS - len(schedule))
    rng.shuffle(schedule)
    t0 = time.time()
    try:
        for trial, fault in enumerate(schedule):
            try:
                st = chaos.running(new_steps=4 if trial == 0 else 1)  # the first fault comes after a checkpoint
                getattr(chaos, fault)(st)
                chaos.checkpoints_whole()
            except AssertionError as exc:
                raise AssertionError(f"trial {trial + 1} ({fault}, seed {seed}): {exc}\n{chaos.explain(chaos.rd.read_status())}") from None
        print("\n".join(f"{i + 1:2}. {line}" for i, line in enumerate(chaos.log)))
    finally:
        cockpit("stop", str(run), "--kill", "--wait", "30")
        print(f"chaos: {len(chaos.log)} faults in {time.time() - t0:.0f} s, seed {seed}")
    assert len(chaos.log) >= TRIALS
    assert overlapping_steps_match(run) > 0
    chaos.checkpoints_whole()

    def none_left():
        return not [p for p in chaos.pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    wait_for(none_left, 20, "no process of the run left")
