"""``cockpit runs [--json]``: every run in the runs dir with state, step, last loss, duration."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cockpit.commands.common import EXIT_OK, add_runs_dir, runs_dir
from cockpit.store.rundir import list_runs, running_s


def run_row(run, status: dict | None = None) -> dict:
    from cockpit.run.liveness import reconcile

    st = status if status is not None else run.read_status()
    st = reconcile(run, status=st)  # liveness checked, not assumed: a dead supervisor's run is adopted or ended
    started = st.get("started")
    dur = running_s(st, time.time())  # the pauses between attempts left out
    return {
        "run_id": run.run_id,
        "state": st.get("state"),
        "step": st.get("step"),
        "total_steps": st.get("total_steps"),
        "last_loss": st.get("last_loss"),
        "duration_s": round(dur, 1) if dur is not None else None,
        "started": started,
        "reason": st.get("reason"),
        "scheduler": st.get("scheduler"),  # Slurm runs: the job's state (reason) in squeue/sacct
        "run_dir": str(run.path),
    }


def queued_rows(runs: Path) -> list[dict]:
    """The queue's entries that are no run yet (queued, launching), in queue order; a started one is
    listed as its run."""
    from cockpit.run.queue import listing

    try:
        entries = listing(runs)
    except NotADirectoryError:  # a runs dir under a file holds no queue (nor runs)
        return []
    return [
        {
            "queue_entry": e["id"],
            "run_id": None,
            "state": "queued",
            "position": e["position"],
            "config": e["config"],
            "overrides": list(e.get("overrides") or []),
            "added": e.get("added"),
        }
        for e in entries
        if e["state"] in ("queued", "launching")
    ]


def command_text(entry: dict) -> str:
    """A queue entry's config and its ``--set`` overrides, as ``cockpit queue add`` was given them."""
    import shlex

    return " ".join(
        [shlex.quote(str(entry["config"])), *(f"--set {shlex.quote(o)}" for o in entry.get("overrides") or [])]
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_runs_dir(p)
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from cockpit.run.follow import fmt_duration
    from cockpit.slurm.queue import effective_statuses

    runs = list_runs(runs_dir(args))
    statuses = effective_statuses(runs)  # Slurm runs: queued / ended by the scheduler
    rows = [run_row(r, statuses[r.run_id]) for r in runs]
    queued = queued_rows(runs_dir(args))
    if args.json:
        print(json.dumps(queued + rows, indent=1))
        return EXIT_OK
    if not rows and not queued:
        print(f"no runs in {runs_dir(args)}")
        return EXIT_OK
    print(f"{'RUN':44} {'STATE':9} {'STEP':>11} {'LOSS':>8} {'TIME':>8}  STARTED")
    for q in queued:  # above the runs, in queue order, as the Runs screen lists them
        added = time.strftime("%Y-%m-%d %H:%M", time.localtime(q["added"])) if q.get("added") else "-"
        where = f"queued #{q['position']}" if q["position"] else "starting"
        print(f"{'queue:' + q['queue_entry']:44} {where:21} {'-':>8} {'-':>8}  {added}")
        print(f"{'':44} {command_text(q)}")
    for r in rows:
        step = f"{r['step'] or 0}/{r['total_steps'] or '?'}"
        loss = f"{r['last_loss']:.4f}" if isinstance(r["last_loss"], (int, float)) else "-"
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started"])) if r["started"] else "-"
        print(
            f"{r['run_id']:44} {r['state'] or '?':9} {step:>11} {loss:>8} {fmt_duration(r['duration_s']):>8}  {started}"
        )
        if r["state"] in ("queued", "cancelled") and r["reason"]:
            print(f"{'':44} {r['reason']}")
    return EXIT_OK
