"""``python -m cockpit.run.slurm_node RUN_DIR``: what ``srun`` runs on each node of a submitted run.

Node 0 (``SLURM_NODEID``) runs the supervisor of ``RUN_DIR`` itself; node K > 0 runs one for the
sub-run ``RUN_DIR/nodes/node<K>`` (its own status, events and rank logs, as a node of a
``cockpit train --set node_rank=K`` run). Each node's config gets its ``node_rank``, the
rendezvous address (``MASTER_ADDR``: the allocation's first node) and port (the config's, else
a free one for one node, else one derived from the job id, the same on every node). The
supervisor replaces this process (``exec``), so Slurm's signals (``scancel``, time limit) reach
it directly. No torch.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cockpit.config.load import dump_resolved
from cockpit.redact import unredacted
from cockpit.store.rundir import RunDir, atomic_write_text


def job_port(job_id: str | None) -> int:
    return 20000 + int(job_id or 0) % 20000


def node_config(saved: Mapping[str, Any], node: int, env: dict[str, str]) -> dict[str, Any]:
    """This node's config: the run's config.yaml as read (``saved``) with its node rank, port and address."""
    nnodes = int(saved["nnodes"])
    port = int(saved.get("master_port") or 0)
    if not port:
        if nnodes > 1:
            port = job_port(env.get("SLURM_JOB_ID"))
        else:
            from cockpit.strategy.launch import free_port

            port = free_port()
    out = {**saved, "node_rank": node, "master_port": port}
    if nnodes > 1:
        out["master_addr"] = env.get("MASTER_ADDR") or socket.gethostname()
    return out


def node_run(run0: RunDir, node: int) -> RunDir:
    if node == 0:
        return run0
    path = run0.path / "nodes" / f"node{node}"
    for sub in ("logs", "control"):
        (path / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    return RunDir(path)


def main(argv: list[str]) -> int:
    run0 = RunDir(Path(argv[0]).resolve())
    env = dict(os.environ)
    node = int(env.get("SLURM_NODEID") or 0)
    saved = yaml.safe_load(run0.config_path.read_text(encoding="utf-8"))
    run = node_run(run0, node)
    ours = node_config(saved, node, env)
    atomic_write_text(run.config_path, dump_resolved(ours))
    slurm = {
        **(run0.read_status().get("slurm") or {}),
        "job_id": env.get("SLURM_JOB_ID"),
        "node": socket.gethostname(),
        "node_id": node,
    }
    run.update_status(
        state="starting",
        reason=None,
        run_id=run.run_id,
        started=time.time(),
        attempt=run.read_status().get("attempt") or 1,
        slurm=slurm,
    )
    env.update(unredacted(ours.get("env")))  # secrets: from the job's env
    os.chdir(run.path)
    os.execve(sys.executable, [sys.executable, "-m", "cockpit.run.supervisor", str(run.path)], env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
