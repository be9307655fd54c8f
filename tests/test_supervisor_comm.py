"""The supervisor turns the ranks' NCCL/RCCL INFO output into ``comm`` events."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from cockpit.config import default_config
from cockpit.store.rundir import create_run_dir
from cockpit.run.supervisor import Supervisor
from conftest import read_events

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


def test_rank_logs_become_comm_events(tmp_path):
    run = create_run_dir(tmp_path, "comm")
    cfg = default_config()
    cfg.update(dataset="x", nproc_per_node=2, telemetry_interval_s=0)
    run.config_path.write_text(yaml.safe_dump(cfg))
    sup = Supervisor(run)
    fixture = sorted(FIXTURES.glob("*rccl*"))[0]
    text = "\n".join(l for l in fixture.read_text().splitlines() if not l.startswith("#"))
    half = len(text) // 2
    run.rank_log(0).write_text(text[:half])  # the log is still being written
    sup.follow_comm_logs()
    with open(run.rank_log(0), "a") as fh:
        fh.write(text[half:] + "\n")
    sup.follow_comm_logs()
    sup.follow_comm_logs()  # nothing new: no duplicate event
    comm = [e for e in read_events(run.path) if e["kind"] == "comm"]
    assert comm, "no comm event"
    assert comm[-1]["source"] == "nccl_log" and comm[-1]["status"] != "unknown"
    assert len(comm) <= 2
