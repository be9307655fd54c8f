"""A Slurm run's place in the queue, and the run state it implies. No torch.

``status.json`` of a submitted run holds ``slurm: {job_id, ...}`` and starts in state ``queued``;
the supervisor (started by the job on its first node) writes ``running`` and the end as for any
run. What only the scheduler knows comes from ``squeue`` (any job it still remembers, every
state) or, once squeue has forgotten it, ``sacct`` when accounting is on:

- while the job waits: state ``queued``, reason ``PENDING (Resources)`` / ``PENDING (JobHeldUser)``;
- when the scheduler ended the job before the run wrote its end (``scancel``, time limit, node
  failure): state ``cancelled`` (CANCELLED) or ``failed`` (FAILED, TIMEOUT, NODE_FAIL, ...) with
  the scheduler's state as the reason. Once the scheduler says the job ended, none of its
  processes is left, so this module writes that end into ``status.json`` (and a ``state``
  event) without racing the supervisor.

The scheduler's last answer is cached in ``RUN_DIR/slurm.json`` (at most one query per
``MAX_AGE_S`` per reader); ``effective_status`` never writes ``status.json`` while the job may
still be running.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

from cockpit.store.events import EventWriter
from cockpit.store.rundir import TERMINAL_STATES, RunDir, atomic_write_json

MAX_AGE_S = 5.0
WAITING = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "SUSPENDED",
        "STOPPED",
        "RESIZING",
    }
)
ENDED = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)


def query(job_ids: Iterable[str], runner: Runner = _run) -> dict[str, dict[str, Any]]:
    """{job_id: {state, reason, nodes, source}} for the jobs the scheduler still knows."""
    ids = sorted({str(j) for j in job_ids if j})
    if not ids:
        return {}
    out: dict[str, dict[str, Any]] = {}
    if shutil.which("squeue"):
        try:
            res = runner(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r|%N"])
        except (OSError, subprocess.TimeoutExpired):
            res = None
        for line in res.stdout.splitlines() if res is not None and res.returncode == 0 else []:
            job, state, reason, nodes = (line.split("|") + ["", "", "", ""])[:4]
            if job.strip() in ids:
                out[job.strip()] = {
                    "state": state.strip(),
                    "reason": _reason(reason),
                    "nodes": nodes.strip() or None,
                    "source": "squeue",
                }
    missing = [j for j in ids if j not in out]
    if missing and shutil.which("sacct"):
        out.update(_sacct(missing, runner))
    return out


def _reason(reason: str) -> str | None:
    reason = reason.strip()
    return None if reason in ("", "None", "(null)") else reason


def _sacct(ids: list[str], runner: Runner) -> dict[str, dict[str, Any]]:
    try:
        res = runner(["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobIDRaw,State,NodeList"])
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if res.returncode != 0:
        return {}
    out = {}
    for line in res.stdout.splitlines():
        job, state, nodes = (line.split("|") + ["", "", ""])[:3]
        words = state.split()  # 'CANCELLED by 1000'
        if job.strip() in ids and words:
            out[job.strip()] = {
                "state": words[0],
                "reason": " ".join(words[1:]) or None,
                "nodes": nodes.strip() or None,
                "source": "sacct",
            }
    return out


def job_id(status: dict[str, Any]) -> str | None:
    slurm = status.get("slurm")
    return str(slurm["job_id"]) if isinstance(slurm, dict) and slurm.get("job_id") else None


def describe(sched: dict[str, Any] | None) -> str:
    if not sched:
        return "not known to the scheduler (squeue/sacct)"
    reason = sched.get("reason")
    return f"{sched['state']} ({reason})" if reason else str(sched["state"])


def implied(status: dict[str, Any], sched: dict[str, Any] | None) -> dict[str, Any]:
    """The status as the scheduler's answer makes it (pure): ``queued`` with the scheduler's state
    and reason while the job waits, the scheduler's end when it ended the job before the run
    wrote its own; otherwise ``status`` unchanged (plus ``scheduler``)."""
    out = dict(status)
    state = status.get("state")
    if sched is None:
        if state == "queued":
            out["reason"] = describe(None)
        return out
    out["scheduler"] = describe(sched)
    sched_state = sched["state"]
    if state == "queued" and sched_state not in ENDED:
        out["reason"] = (
            describe(sched)
            if sched_state != "RUNNING"
            else f"RUNNING on {sched.get('nodes') or '?'}: starting the supervisor"
        )
        return out
    if sched_state in ENDED and state not in ("finished", "stopped", "killed") and not status.get("scheduler_end"):
        earlier = status.get("reason")
        if sched_state == "CANCELLED":
            out["state"], why = (
                "cancelled",
                f"cancelled by the scheduler: {sched_state}",
            )  # (its reason is the pending one's)
        elif state == "failed" and sched_state in ("FAILED", "COMPLETED"):
            why, earlier = str(earlier or "failed"), None  # the run's own reason says more
        elif sched_state == "COMPLETED":
            out["state"], why = "failed", "the Slurm job completed but the run never wrote its end"
        else:
            out["state"], why = "failed", f"the scheduler ended the job: {describe(sched)}"
        out["reason"] = why + (f"; the run said: {earlier}" if earlier and state not in ("queued",) else "")
        out["scheduler_end"] = sched_state
    return out


def _cached(run: RunDir, now: float, any_age: bool = False) -> dict[str, Any] | None:
    try:
        data = json.loads((run.path / "slurm.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if any_age or now - float(data.get("checked") or 0) < MAX_AGE_S else None


def effective_status(
    run: RunDir,
    status: dict[str, Any] | None = None,
    *,
    runner: Runner = _run,
    now: float | None = None,
    fresh: bool = False,
) -> dict[str, Any]:
    """``run``'s status with what the scheduler knows; for a run that is not a Slurm job (or has
    ended on its own), ``status`` as it is."""
    return effective_statuses(
        [run], {run.run_id: status} if status is not None else None, runner=runner, now=now, fresh=fresh
    )[run.run_id]


def effective_statuses(
    runs: list[RunDir],
    statuses: dict[str, dict[str, Any]] | None = None,
    *,
    runner: Runner = _run,
    now: float | None = None,
    fresh: bool = False,
    cached_only: bool = False,
) -> dict[str, dict[str, Any]]:
    """Like :func:`effective_status` for many runs, with one ``squeue`` call for all their jobs.
    ``cached_only``: the last answers in ``slurm.json`` however old, never a scheduler query (a UI
    thread; a worker thread refreshes them)."""
    now = time.time() if now is None else now
    statuses = {r.run_id: (statuses or {}).get(r.run_id) or r.read_status() for r in runs}
    open_jobs = {
        r.run_id: job_id(statuses[r.run_id])
        for r in runs
        if job_id(statuses[r.run_id]) and not _settled(statuses[r.run_id])
    }
    answers: dict[str, dict[str, Any] | None] = {}
    to_ask = []
    for r in runs:
        if r.run_id in open_jobs:
            cached = None if fresh else _cached(r, now, any_age=cached_only)
            if cached is not None:
                answers[r.run_id] = cached.get("job")
            else:
                to_ask.append(r)
    if cached_only:
        to_ask = []
    if to_ask:
        known = query([open_jobs[r.run_id] for r in to_ask], runner)
        for r in to_ask:
            answers[r.run_id] = known.get(open_jobs[r.run_id])
            try:
                atomic_write_json(
                    r.path / "slurm.json", {"checked": now, "job_id": open_jobs[r.run_id], "job": answers[r.run_id]}
                )
            except OSError:
                pass
    out = {}
    for r in runs:
        status = statuses[r.run_id]
        if r.run_id not in answers:
            out[r.run_id] = status
            continue
        if answers[r.run_id] is None and status.get("state") in TERMINAL_STATES:
            r.update_status(scheduler_end="unknown")  # ended, and the scheduler has forgotten the job: ask no more
            out[r.run_id] = {**status, "scheduler_end": "unknown"}
            continue
        out[r.run_id] = new = implied(status, answers[r.run_id])
        note = _cancel_note(r)
        if new.get("state") == "cancelled" and note and not status.get("scheduler_end"):
            new["reason"] = f"{new['reason']} ({note})"
        if new.get("scheduler_end") and not status.get("scheduler_end"):
            _write_end(r, new, now)
    return out


def waiting_on_scheduler(status: dict[str, Any]) -> bool:
    """A Slurm run whose state the scheduler may still change."""
    return bool(job_id(status)) and not _settled(status)


def _settled(status: dict[str, Any]) -> bool:
    return status.get("state") in TERMINAL_STATES and (
        status.get("state") in ("finished", "stopped", "killed") or bool(status.get("scheduler_end"))
    )


def _write_end(run: RunDir, new: dict[str, Any], now: float) -> None:
    """The scheduler ended the job: no process of it is left, so the end is written here."""
    fields = {k: new[k] for k in ("state", "reason", "scheduler_end", "scheduler")}
    run.update_status(**fields, ended=run.read_status().get("ended") or now)
    writer = EventWriter(run.events_path)
    try:
        writer.emit("state", state=new["state"], reason=new["reason"])
    finally:
        writer.close()


def _cancel_note(run: RunDir) -> str | None:
    try:
        return json.loads((run.control_dir / "scancel").read_text(encoding="utf-8")).get("detail")
    except (OSError, ValueError):
        return None


def cancel(run: RunDir, job: str, detail: str, runner: Runner = _run) -> tuple[bool, str]:
    """``scancel JOB`` (noting who asked in ``control/scancel``): (ok, scancel's own words)."""
    run.control_dir.mkdir(mode=0o700, exist_ok=True)
    atomic_write_json(run.control_dir / "scancel", {"t": time.time(), "detail": detail})
    try:
        res = runner(["scancel", str(job)])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    (run.path / "slurm.json").unlink(missing_ok=True)  # the next reader asks the scheduler afresh
    return res.returncode == 0, (res.stderr or res.stdout).strip()
