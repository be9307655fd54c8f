"""``cockpit resume RUN [--detach]``: continue a stopped, failed or lost run from its last good
checkpoint, as a new attempt of the same run (same run dir, event log appended; step numbers,
learning-rate schedule and data order continue from the checkpoint)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from cockpit.commands.common import EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.config.load import REDACTED
from cockpit.errors import InputError
from cockpit.events import EventWriter
from cockpit.rundir import TERMINAL_STATES, atomic_write_text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run")
    add_runs_dir(p)
    p.add_argument("--detach", action="store_true")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from cockpit.launch import record_supervisor, spawn_supervisor
    from cockpit.liveness import reconcile
    from cockpit.train.worker import artefact_dirs, last_checkpoint

    try:
        run_dir = find_run(args)
        status = reconcile(run_dir)  # a run whose supervisor died is lost (or adopted) first
        if status.get("state") not in TERMINAL_STATES - {"finished"}:
            raise InputError(f"run {run_dir.run_id} is {status.get('state')}; only a stopped, failed or lost run can be resumed")
        cfg = yaml.safe_load(run_dir.config_path.read_text(encoding="utf-8"))
        ckpt = last_checkpoint(artefact_dirs(run_dir, cfg)["checkpoints"])
        if ckpt is None:
            raise InputError(f"run {run_dir.run_id} has no complete checkpoint to resume from")
    except InputError as err:
        return print_input_error(err)
    cfg["resume_from_checkpoint"] = ckpt
    atomic_write_text(run_dir.config_path, yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    attempt = int(status.get("attempt") or 1) + 1
    EventWriter(run_dir.events_path).emit("state", state="starting", reason=f"resume attempt {attempt} from {Path(ckpt).name}")
    offset = run_dir.events_path.stat().st_size  # the new attempt's events start here
    run_dir.update_status(
        state="starting", reason=None, attempt=attempt, resumed_from=ckpt, ended=None, log_tail=[],
        supervisor_pid=None, supervisor_start=None, procs=[], pids=[], rank_pids={}, events_offset=offset, exit_code=None,
    )
    for f in ("stop", "kill", "save"):
        (run_dir.control_dir / f).unlink(missing_ok=True)
    # Secrets were redacted from config.yaml: they must come from this environment again.
    env = {k: v for k, v in (cfg.get("env") or {}).items() if v != REDACTED}
    record_supervisor(run_dir, spawn_supervisor(run_dir, env))
    if args.detach:
        print(json.dumps({"run_id": run_dir.run_id, "run_dir": str(run_dir.path), "attempt": attempt, "checkpoint": ckpt}) if args.json else f"run {run_dir.run_id}: attempt {attempt} from {ckpt}")
        return EXIT_OK
    from cockpit.commands.train import follow_interactively

    return follow_interactively(run_dir)
