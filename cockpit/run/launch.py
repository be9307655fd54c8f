"""Start a run: a new run dir, the resolved config, and a detached supervisor.

Used by ``cockpit train`` and (through ``cockpit train --detach``) by the TUI. No torch here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.config.load import dump_resolved
from cockpit.device import visible_env
from cockpit.redact import unredacted
from cockpit.store.events import EventWriter
from cockpit.store.rundir import RunDir, atomic_write_text, create_run_dir, default_runs_dir, run_name

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def start_run(
    cfg: RunConfig,
    *,
    config_path: str | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    held: bool = False,
    status_extra: Mapping[str, Any] | None = None,
    gpus: Sequence[str] | None = None,
) -> RunDir:
    """Create the run dir and start the supervisor in its own session; returns at once.
    ``held``: the ranks wait before training until this process releases the run
    (``cockpit.run.gate``). ``status_extra``: more status.json fields from the start (the queue's
    ``queue_entry``). ``gpus``: the only GPUs the run may use (the queue's assignment): its
    supervisor and ranks get them as HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES (replacing the
    config's ``env`` ones), and status.json ``gpus`` says which the run holds; without it, ``gpus``
    records those the run takes as the environment stands (``queue.taken_gpus``), so the queue
    leaves them alone and hands out the others."""
    if not cfg.master_port:
        from cockpit.strategy.launch import free_port

        cfg = cfg.replace(master_port=free_port())
    run = create_run_dir(runs_dir or default_runs_dir(), run_name(config_path, cfg.run_name, cfg.model_name_or_path))
    atomic_write_text(run.config_path, dump_resolved(cfg))
    run.update_status(
        state="starting",
        run_id=run.run_id,
        attempt=1,
        config_source=str(Path(config_path).resolve()) if config_path else None,
        output_dir=cfg.output_dir,
        started=run.path.stat().st_mtime,
        step=0,
        total_steps=None,
        events_offset=0,
        gpus=list(gpus) if gpus is not None else outside_queue_gpus(cfg),
        **(status_extra or {}),
    )
    EventWriter(run.events_path).close()  # the log exists from the start (0600)
    if held:
        from cockpit.run.gate import hold

        hold(run)
    env = {**(cfg.env or {}), **(visible_env(gpus) if gpus is not None else {})}
    record_supervisor(run, spawn_supervisor(run, env))
    return run


def outside_queue_gpus(cfg: RunConfig) -> list[str] | None:
    """The GPUs a run started here outside the queue takes: this process's environment with the
    config's ``env`` on top (what the supervisor and its ranks get)."""
    from cockpit.run.queue import taken_gpus

    return taken_gpus(cfg, {**os.environ, **{k: str(v) for k, v in (cfg.env or {}).items()}})


def record_supervisor(run: RunDir, proc: subprocess.Popen) -> None:
    """Name the new supervisor (pid + start time) in status.json at once, so a reader can tell
    a supervisor that died at birth from one still starting."""
    from cockpit.run.liveness import start_time

    started = start_time(proc.pid)
    with run.status_lock():
        if not run.read_status().get("supervisor_pid"):
            run.update_status(supervisor_pid=proc.pid, supervisor_start=started, supervisor_host=socket.gethostname())


def spawn_supervisor(run: RunDir, env_add: Mapping[str, str]) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(unredacted(env_add))  # a redacted secret: the value this process inherited
    log = open(run.supervisor_log, "ab", buffering=0)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "cockpit.run.supervisor", str(run.path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(run.path),
            start_new_session=True,  # setsid: no SIGHUP from the terminal, survives SSH drops
            close_fds=True,
        )
    finally:
        log.close()
