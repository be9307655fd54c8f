"""``cockpit train CONFIG --slurm``: a new run dir in state ``queued``, its job script, ``sbatch``.

The run dir is created here (on the submitting host) and written before the job exists; the
job's first node starts the supervisor for this same run dir (``cockpit.run.slurm_node``), so the
run is listed, attachable and stoppable from the moment it is submitted. No torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.config.load import dump_resolved
from cockpit.errors import InputError, Problem
from cockpit.slurm import fs
from cockpit.slurm.script import SlurmOptions, cluster_has_gpus, job_script
from cockpit.store.events import EventWriter
from cockpit.store.rundir import RunDir, atomic_write_text, create_run_dir, default_runs_dir, run_name

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


class SubmitRefused(Exception):
    """sbatch refused the job; ``str()`` is sbatch's own message."""


def check_runs_dir(cfg: RunConfig, runs_dir: Path) -> None:
    """Several nodes share one run dir: refuse a runs dir local to this node."""
    if int(cfg.nnodes) <= 1:
        return
    fstype, point = fs.filesystem_of(runs_dir)
    if not fs.is_shared(fstype):
        raise InputError(
            Problem(
                f"runs dir {runs_dir}: filesystem {fstype} at {point or '?'} is local to this node; a {cfg.nnodes}-node Slurm run "
                "needs the runs dir on a filesystem every node mounts (NFS, Lustre, GPFS, BeeGFS, ...): pass --runs-dir or set COCKPIT_RUNS_DIR",
                key="nnodes",
            )
        )


def submit(
    cfg: RunConfig,
    opts: SlurmOptions,
    *,
    config_path: str | None = None,
    runs_dir: Path | None = None,
    python: str = sys.executable,
    status_extra: Mapping[str, Any] | None = None,
) -> tuple[RunDir, str]:
    """Create the run dir (state ``queued``), write ``slurm/job.sh``, submit it. Returns (run, job id).
    Raises :class:`SubmitRefused` with sbatch's message (the run dir then says ``failed``).
    ``status_extra``: more status.json fields from the start (a sweep trial's ``sweep``, ``sweep_trial``)."""
    runs = Path(runs_dir or default_runs_dir()).expanduser().absolute()
    check_runs_dir(cfg, runs)
    sbatch = shutil.which("sbatch")
    if not sbatch:
        raise InputError("--slurm: sbatch is not on PATH (is this a Slurm login node?)")
    run = create_run_dir(runs, run_name(config_path, cfg.run_name, cfg.model_name_or_path))
    atomic_write_text(run.config_path, dump_resolved(cfg))
    script = job_script(
        str(run.path), cfg, opts, job_name=f"cockpit-{run.run_id}", has_gpus=cluster_has_gpus(), python=python
    )
    (run.path / "slurm").mkdir(mode=0o700)
    script_path = run.path / "slurm" / "job.sh"
    atomic_write_text(script_path, script, mode=0o700)
    base = {
        "run_id": run.run_id,
        "attempt": 1,
        "config_source": str(Path(config_path).resolve()) if config_path else None,
        "output_dir": cfg.output_dir,
        "step": 0,
        "total_steps": None,
        "submitted": time.time(),
        **(status_extra or {}),
    }
    run.update_status(state="submitting", **base)
    try:
        res = subprocess.run(
            [sbatch, "--parsable", str(script_path)],
            capture_output=True,
            text=True,
            cwd=str(run.path),
            env=dict(os.environ),
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        res = subprocess.CompletedProcess(
            [sbatch], 1, "", "sbatch did not answer within 300 s (is slurmctld reachable?)"
        )
    events = EventWriter(run.events_path)
    try:
        if res.returncode != 0:
            why = (res.stderr or res.stdout).strip() or f"sbatch exited with code {res.returncode}"
            run.update_status(state="failed", reason=f"sbatch refused the job: {why}", ended=time.time())
            events.emit("state", state="failed", reason=f"sbatch refused the job: {why}")
            raise SubmitRefused(why)
        job = res.stdout.strip().split(";")[0]  # --parsable: 'ID' or 'ID;cluster'
        slurm = {
            "job_id": job,
            "script": str(script_path),
            "nodes": int(cfg.nnodes),
            "partition": opts.partition,
            "account": opts.account,
            "time": opts.time,
        }
        run.update_status(state="queued", reason=f"submitted as Slurm job {job}", slurm=slurm)
        events.emit("state", state="queued", reason=f"submitted as Slurm job {job}", slurm_job_id=job)
    finally:
        events.close()
    return run, job
