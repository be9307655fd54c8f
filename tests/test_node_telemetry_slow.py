"""Real multi-process runs: two loopback "nodes" (each its own supervisor and run dir, one rank
each, gloo) with 8 fake MI300X per node at the hardware boundary; and a CPU run whose
live-tensor peaks swing, raising the memory-pressure alert, whose Live key stops the run at a
checkpoint and resumes it with half the micro-batch and twice the accumulation."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, cockpit, read_events, start_detached, tiny_config, wait_for
from cockpit.supervisor import free_port

pytestmark = pytest.mark.slow
ENV = {"TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"), "OMP_NUM_THREADS": "1"}
QUIET = dict(cutoff_len=64, lr_scheduler_type="constant", save_strategy="no", probes=None, numa_bind="off", seed=7, comm_probe=False)


def test_two_loopback_nodes_report_every_nodes_gpus_memory_and_heartbeats(tmp_path, tiny_model_dir):
    port = free_port()
    runs = [tmp_path / f"runs{k}" for k in (0, 1)]
    for k in (0, 1):
        cfg = tiny_config(tmp_path, tiny_model_dir, f"node{k}", **QUIET, max_steps=4, nnodes=2, node_rank=k,
                          master_port=port, telemetry_interval_s=0.5)
        res = cockpit("train", str(cfg), "--runs-dir", str(runs[k]), "--detach", "--json", env={**ENV, "COCKPIT_FAKE_GPUS": "amdsmi:8"})
        assert res.returncode == 0, res.stderr
    dirs = [next(d for d in r.iterdir() if d.is_dir()) for r in runs]
    ended = lambda: all(json.loads((d / "status.json").read_text())["state"] in ("finished", "failed", "stopped") for d in dirs)  # noqa: E731
    wait_for(ended, 300, "both nodes to end")
    assert [json.loads((d / "status.json").read_text())["state"] for d in dirs] == ["finished", "finished"]
    main = next(d for d in dirs if any(e["kind"] == "step" for e in read_events(d)))  # global rank 0's node
    events = read_events(main)
    host = next(e["host"] for e in events if e["kind"] == "rank_started")
    # every rank's own allocator figures, naming its node, in each step event
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    for e in steps:
        assert sorted(e["mem"]) == ["0", "1"]
        assert sorted(m["node_rank"] for m in e["mem"].values()) == [0, 1]
        for m in e["mem"].values():
            assert m["host"] == host and m["source"] == "rss" and m["rss_mb"] > 50 and m["capacity_mb"] > m["rss_mb"]
    # GPUs of both nodes: node 0's from its supervisor, the other node's relayed by rank 0
    tel = [e for e in events if e["kind"] == "telemetry"]
    by_node = {n: [e for e in tel if e.get("node_rank") == n] for n in (0, 1)}
    assert by_node[0] and by_node[1], {e.get("node_rank") for e in tel}
    for n in (0, 1):
        last = by_node[n][-1]
        assert last["backend"] == "amdsmi" and last["host"] == host
        assert [d["index"] for d in last["devices"]] == list(range(8))
        assert all(d["name"] == "AMD Instinct MI300X" and d["vram_total_mb"] == 196592 for d in last["devices"])
    assert all(e["source"] == "node_reporter" and e["ranks"] == [] for e in by_node[1])
    # heartbeats of both nodes, with the step each node had reached
    beats = [e for e in events if e["kind"] == "heartbeat"]
    assert {e["node_rank"] for e in beats} == {0, 1}
    for n in (0, 1):
        assert max(e["step"] or 0 for e in beats if e["node_rank"] == n) >= 3
    assert any(e["kind"] == "train_end" and e["step"] == 4 for e in events)
    assert not [e for e in events if e["kind"] == "alert"]
