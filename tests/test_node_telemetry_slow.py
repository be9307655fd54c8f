"""Real runs: what two loopback "nodes" (each its own supervisor and run dir, one rank each,
gloo, 8 fake MI300X per node at the hardware boundary) report, checked inside
test_strategy_runs.test_two_nodes_on_loopback (one two-node run for both); and a CPU run whose
live-tensor peaks swing, raising the memory-pressure alert, whose Live key stops the run at a
checkpoint and resumes it with half the micro-batch and twice the accumulation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, cockpit, read_events, start_detached, tiny_config, wait_for

pytestmark = [pytest.mark.serial, pytest.mark.slow]
ENV = {"TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"), "OMP_NUM_THREADS": "1"}
QUIET = {"cutoff_len": 64, "lr_scheduler_type": "constant", "save_strategy": "no", "probes": None, "numa_bind": "off", "seed": 7, "comm_probe": False}


def assert_every_node_reported(dirs: list[Path], steps_run: int) -> None:
    """Called by test_strategy_runs.test_two_nodes_on_loopback (two loopback nodes, one rank
    each, telemetry every 0.5 s, ``COCKPIT_FAKE_GPUS=amdsmi:8``): global rank 0's run dir holds
    every rank's allocator figures, both nodes' 8 GPUs and both nodes' heartbeats."""
    main = next(d for d in dirs if any(e["kind"] == "step" for e in read_events(d)))  # global rank 0's node
    events = read_events(main)
    host = next(e["host"] for e in events if e["kind"] == "rank_started")
    # every rank's own allocator figures, naming its node, in each step event
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, steps_run + 1))
    for e in steps:
        assert sorted(e["mem"]) == ["0", "1"]
        assert sorted(m["node_rank"] for m in e["mem"].values()) == [0, 1]
        for m in e["mem"].values():
            assert m["host"] == host and m["source"] == "rss" and m["rss_mb"] > 50 and m["capacity_mb"] > m["rss_mb"]
    # GPUs of both nodes: node 0's from its supervisor, the other node's relayed by rank 0 as a grid row
    from cockpit.store.node_grid import parse_ranges, row_devices

    tel = [e for e in events if e["kind"] == "telemetry"]
    assert tel and all(e.get("node_rank") == 0 for e in tel)
    last = tel[-1]
    assert last["backend"] == "amdsmi" and last["host"] == host
    assert [d["index"] for d in last["devices"]] == list(range(8))
    assert all(d["name"] == "AMD Instinct MI300X" and d["vram_total_mb"] == 196592 for d in last["devices"])
    rows = [r for e in events if e["kind"] == "node_telemetry" for r in e.get("nodes") or []]
    assert rows and {r["node"] for r in rows} == {1}
    assert rows[-1]["backend"] == "amdsmi" and rows[-1]["host"] == host and rows[-1]["total_mb"] == 196592
    assert [d["index"] for d in row_devices(rows[-1])] == list(range(8))
    # heartbeats of both nodes, with the step each node had reached
    beats = [(node, step) for e in events if e["kind"] == "heartbeats" for step, nodes in e["steps"] for node in parse_ranges(nodes)]
    assert {n for n, _ in beats} == {0, 1}
    for n in (0, 1):
        assert max(step or 0 for node, step in beats if node == n) >= steps_run - 1
    assert any(e["kind"] == "train_end" and e["step"] == steps_run for e in events)
    assert not [e for e in events if e["kind"] == "alert"]


def test_cpu_run_raises_the_memory_alert_and_m_resumes_it_with_the_remedy(tmp_path, tiny_model_dir, monkeypatch):
    """The live-tensor tracker's per-step peaks swing with the identity data's lengths (recorded:
    +15 % at step 4 of this config); the alert names rank 0 and offers m; m stops the run at a
    checkpoint and resumes it (attempt 2) with micro-batch 1 and accumulation 2, recorded. The
    resumed attempt trains one step with the new micro-batch, then stops."""
    from cockpit.store.rundir import RunDir
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.screens.live import LiveScreen
    from cockpit.ui.screens.modals import Decide
    from tests.test_ui_pilot import wait_for as pilot_wait
    from tests.test_ui_setup_live import DOCTOR, text_of

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cfg = tiny_config(tmp_path, tiny_model_dir, "swing", **{**QUIET, "cutoff_len": 128}, max_steps=200, save_steps=1000,
                      telemetry_interval_s=0, cpu_memory_tracker=True, memory_alert_swing=0.1)
    run = start_detached(tmp_path, cfg, env=ENV)
    status = lambda: json.loads((run / "status.json").read_text())

    async def scenario() -> None:
        app = CockpitApp(tmp_path / "runs", start="runs", doctor_checks=DOCTOR)
        async with app.run_test(size=(120, 40)) as pilot:
            app.open_live(RunDir(run))
            await pilot_wait(pilot, lambda: isinstance(app.screen, LiveScreen) and app.screen.query("#alerts"), 10, "the live screen")
            live = app.screen
            await pilot_wait(pilot, lambda: "m: stop at a checkpoint, resume with micro-batch 1, accum 2" in text_of(live, "#alerts"), 240, "the memory alert")
            await pilot.press("m")
            await pilot_wait(pilot, lambda: isinstance(app.screen, Decide), 5, "the confirmation")
            body = str(app.screen.body)
            assert "per_device_train_batch_size=1" in body and "gradient_accumulation_steps=2" in body and "swung" in body
            await pilot.press("y")
            await pilot_wait(pilot, lambda: status().get("attempt") == 2, 300, "attempt 2")

    try:
        asyncio.run(scenario())
        # attempt 2 trains one step with the new micro-batch, then stops (the stop is consumed at its first step)
        wait_for(lambda: sum(e["kind"] == "run_started" for e in read_events(run)) == 2, 120, "attempt 2's supervisor")
        RunDir(run).request("stop", "test: one step of attempt 2 is enough")
        wait_for(lambda: status()["state"] in ("stopped", "failed", "finished"), 240, "attempt 2 to stop")
    finally:
        if status()["state"] not in ("stopped", "failed", "finished"):
            cockpit("stop", str(run), "--kill", "--wait", "60")
    st = status()
    assert st["state"] == "stopped" and st["attempt"] == 2, st
    assert st["config_changes"] == {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2}
    events = read_events(run)
    alert = next(e for e in events if e["kind"] == "alert" and e["code"] == "memory_pressure")
    assert alert["trigger"] == "swing" and alert["rank"] == 0 and alert["figures"]["previous_peak_mb"] > 0
    assert alert["remedy_set"] == {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2}
    steps = [e for e in events if e["kind"] == "step"]
    assert all(m["source"] == "live_tensors" and m["peak_mb"] > 0 for e in steps for m in e["mem"].values())
    first_stop = next(e for e in events if e["kind"] == "run_stopped")
    resumed = [e for e in events if e["kind"] == "state" and e.get("config_changes")]
    assert len(resumed) == 1 and "with per_device_train_batch_size=1, gradient_accumulation_steps=2" in resumed[0]["reason"]
    begins = [e for e in events if e["kind"] == "train_begin"]
    assert len(begins) == 2 and begins[0]["global_batch"] == begins[1]["global_batch"] == 2  # the same global batch
    assert begins[1]["start_step"] == first_stop["step"] < 200
    assert steps[-1]["step"] == first_stop["step"] + 1 and steps[-1]["t"] > begins[1]["t"]  # a step of attempt 2
    assert yaml.safe_load((run / "config.yaml").read_text())["per_device_train_batch_size"] == 1
    before = yaml.safe_load((run / "config.attempt1.yaml").read_text())
    assert (before["per_device_train_batch_size"], before["gradient_accumulation_steps"]) == (2, 1)


def test_a_frozen_node_is_named_silent_in_the_hang_alert(tmp_path, tiny_model_dir):
    """Two loopback nodes; after step 3 the other node's rank is frozen (SIGSTOP: its heartbeat
    thread stops with it, its peer waits in the all-reduce). Global rank 0's supervisor raises the
    hang alert after hang_timeout_s and names that node as silent (measured with 20 s: 21 s after the freeze)."""
    import os
    import signal
    import subprocess
    import sys

    from cockpit.strategy.launch import free_port

    port = free_port()
    runs = [tmp_path / f"runs{k}" for k in (0, 1)]
    starts = []
    for k in (0, 1):  # both nodes' `cockpit train` at once: each one's preflight takes a while
        cfg = tiny_config(tmp_path, tiny_model_dir, f"node{k}", **QUIET, max_steps=100000, nnodes=2, node_rank=k, master_port=port,
                          telemetry_interval_s=0.5, hang_timeout_s=12, ddp_timeout=600)
        starts.append(subprocess.Popen([sys.executable, "-m", "cockpit.cli", "train", str(cfg), "--runs-dir", str(runs[k]), "--detach", "--json"],
                                       cwd=str(ROOT), env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in starts:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    dirs = [next(d for d in r.iterdir() if d.is_dir()) for r in runs]
    frozen = None
    try:
        main_dir = wait_for(lambda: next((d for d in dirs if sum(e["kind"] == "step" for e in read_events(d)) >= 3), None), 240, "step 3")
        main = dirs.index(main_dir)
        other = dirs[1 - main]
        # c10d numbers the nodes by the order they joined: the group rank the events use
        node_of_other = next(e["node_rank"] for e in read_events(other) if e["kind"] == "rank_started")
        frozen = next(iter(json.loads((other / "status.json").read_text())["rank_pids"].values()))
        os.kill(frozen, signal.SIGSTOP)
        hang = lambda: next((e for e in read_events(dirs[main]) if e["kind"] == "alert" and e["code"] == "hang"), None)
        alert = wait_for(hang, 120, "the hang alert")
    finally:
        if frozen:
            os.kill(frozen, signal.SIGCONT)
        for d in dirs:
            cockpit("stop", str(d), "--kill", "--wait", "60")
    assert alert["phase"] == "train" and alert["silent_nodes"] == [node_of_other]
    assert f"node {node_of_other} (" in alert["message"] and "silent: no heartbeat for" in alert["message"]
    me = next(n for n in alert["nodes"] if n["node_rank"] != node_of_other)
    assert me["silent"] is False and me["heartbeat_age_s"] < 10
