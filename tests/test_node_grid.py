"""Many nodes' telemetry in bounded events (cockpit/store/node_grid.py, cockpit/telemetry/node.py's
collector): the compact rows and ranges, the byte budget, 64 nodes' reporters over a real c10d
TCPStore on loopback, and the Live screen's node x GPU map with its drill-down (snapshots at
160x48 and 80x24 are the nodes-live / nodes-drill scenes of tests/test_ui_snapshots.py)."""

from __future__ import annotations

import json
import socket
import threading
from datetime import timedelta

import pytest

from cockpit.run.supervisor import node_watchdog, observe_progress
from cockpit.store.events import encode
from cockpit.store.node_grid import grid_row, outliers, parse_ranges, ranges, row_devices
from cockpit.telemetry import AmdSmiBackend
from cockpit.telemetry.fakes import FakeAmdSmi, FakeGpu
from cockpit.telemetry.node import NodeCollector, NodeReporter
from ui_screenshots import DictStore
from cockpit.config.run_config import RunConfig


def test_ranges_round_trip():
    assert ranges([5, 0, 1, 2, 3, 7, 9, 10, 3]) == "0-3,5,7,9-10"
    assert parse_ranges("0-3,5,7,9-10") == [0, 1, 2, 3, 5, 7, 9, 10]
    assert ranges([]) == "" and parse_ranges("") == [] and parse_ranges(None) == []


def test_a_row_keeps_what_the_screen_shows():
    backend, _ = AmdSmiBackend.open(FakeAmdSmi([FakeGpu(vram_used_mb=98296, gfx_activity=12 * i, temp_hotspot_c=60 + i,
                                                         current_socket_power=500 + i) for i in range(3)]))
    devices = backend.devices()
    row = grid_row(4, "h4", "amdsmi", devices)
    assert row["mem"] == [50, 50, 50] and row["util"] == [0, 12, 24] and row["temp"] == [60, 61, 62]
    assert row["power"] == [500, 501, 502] and row["total_mb"] == 196592 and "totals_mb" not in row
    back = row_devices(row)
    assert [d["index"] for d in back] == [0, 1, 2] and back[1]["util_pct"] == 12 and back[2]["power_w"] == 502
    assert back[0]["vram_used_mb"] == 98296 and back[0]["vram_total_mb"] == 196592
    assert len(json.dumps(row)) < len(json.dumps(devices)) / 6  # the point of it


def test_outliers_name_the_hottest_least_busy_and_fullest():
    devs = {n: [{"index": i, "temp_c": 60, "util_pct": 90, "vram_used_mb": 50, "vram_total_mb": 100} for i in range(8)]
            for n in range(4)}
    devs[2][5]["temp_c"] = 99
    devs[3][1]["util_pct"] = 3
    devs[1][7]["vram_used_mb"] = 98
    top = {(o["node_rank"], o["index"]): o["why"] for o in outliers(devs, most=1)}
    assert top == {(2, 5): ["hottest"], (3, 1): ["least busy"], (1, 7): ["fullest"]}


def test_the_grid_keeps_to_its_byte_budget_and_outliers_come_between():
    nnodes = 64
    store = DictStore()
    backends = [AmdSmiBackend(FakeAmdSmi([FakeGpu(gfx_activity=50 + i) for i in range(8)])) for _ in range(nnodes)]
    reporters = [NodeReporter(store, n, f"h{n}", None if n == 0 else backends[n]) for n in range(nnodes)]
    now = [0.0]
    collector = NodeCollector(store, nnodes, min_gap_s=3.0, clock=lambda: now[0], budget_bytes_per_s=1024)
    written: list[tuple[float, str, dict]] = []
    for tick in range(120):  # two minutes at 1 Hz, every node at a new step each second
        now[0] = float(tick)
        for r in reporters:
            r.step = tick
            r.publish()
        for kind, fields in collector.collect():
            written.append((now[0], kind, fields))
            encode(kind, **fields)
    grids = [(t, f) for t, k, f in written if k == "node_telemetry" and "nodes" in f]
    assert len(grids[0][1]["nodes"]) == nnodes - 1  # node 0's GPUs come from its own supervisor
    grid_bytes = len(json.dumps(grids[0][1]["nodes"], separators=(",", ":")))
    gap = grids[1][0] - grids[0][0]
    assert gap >= grid_bytes / 1024 > 3.0  # the budget, not min_gap_s, spaces them out
    assert grid_bytes / gap <= 1024
    between = [t for t, k, f in written if k == "node_telemetry" and "nodes" not in f and grids[0][0] < t < grids[1][0]]
    assert between and all(b - a >= 3.0 for a, b in zip([grids[0][0], *between], between))
    beats = [f for _, k, f in written if k == "heartbeats"]
    assert len(beats) == 120 and beats[-1]["steps"] == [[119, "0-63"]]  # every node, one range
    assert beats[0]["hosts"]["63"] == "h63" and "hosts" not in beats[1]


def test_heartbeats_leave_out_a_silent_node_and_the_watchdog_names_it():
    store = DictStore()
    reporters = [NodeReporter(store, n, f"h{n}") for n in range(8)]
    now = [0.0]
    collector = NodeCollector(store, 8, clock=lambda: now[0])
    dog = node_watchdog(RunConfig(hang_timeout_s=30, nnodes=8, telemetry_interval_s=1.0), start_t=0)
    for tick in range(1, 41):  # (an event's t of 0 reads as "now")
        now[0] = float(tick)
        for r in reporters:
            if r.node_rank != 5 or tick < 10:  # node 5 freezes at 10 s
                r.step = tick
                r.publish()
        for kind, fields in collector.collect():
            if kind == "heartbeats":
                observe_progress(dog, {"kind": kind, "t": now[0], **fields})
        dog.observe_step(tick, now[0])
    report, words = dog.node_report(41.0)
    assert [n["node_rank"] for n in report if n["silent"]] == [5]
    assert any("node 5 (h5) silent" in w for w in words)


@pytest.mark.slow
def test_64_nodes_report_through_a_real_tcpstore_on_loopback():
    """64 reporter clients (threads, one TCPStore client each, 8 fake GPUs per node) and global
    rank 0's collector on the master: one grid with every other node's GPUs, heartbeats of all 64."""
    from torch.distributed import TCPStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    nnodes = 64

    def node(n: int) -> None:
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        gpus = FakeAmdSmi([FakeGpu(vram_used_mb=1000 * (n + 1), gfx_activity=90 - (n == 41) * 85) for _ in range(8)])
        reporter = NodeReporter(client, n, f"node-{n:02d}", None if n == 0 else AmdSmiBackend(gpus))
        reporter.step = 7
        reporter.publish()

    threads = [threading.Thread(target=node, args=(n,)) for n in range(nnodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    events = NodeCollector(master, nnodes, own_node=0).collect()
    kinds = [k for k, _ in events]
    assert kinds == ["heartbeats", "node_telemetry"]
    beats, grid = events[0][1], events[1][1]
    assert beats["steps"] == [[7, "0-63"]] and beats["hosts"]["41"] == "node-41"
    assert [r["node"] for r in grid["nodes"]] == list(range(1, nnodes))
    assert grid["nodes"][40]["host"] == "node-41" and grid["nodes"][40]["util"] == [5] * 8
    assert {o["node_rank"] for o in grid["outliers"] if "least busy" in o["why"]} == {41}
    assert row_devices(grid["nodes"][62])[0]["vram_used_mb"] == round(196592 * round(100 * 64000 / 196592) / 100)


def test_the_map_marks_the_hottest_and_least_busy_and_drills_down():
    from cockpit.ui import device_grid
    from cockpit.ui.state import RunState

    state = RunState()
    rows = [grid_row(n, f"h{n}", "amdsmi", [{"index": i, "vram_used_mb": 50 + i, "vram_total_mb": 100,
                                              "util_pct": 3 if (n, i) == (41, 5) else 90, "temp_c": 97 if (n, i) == (17, 2) else 60,
                                              "power_w": 600} for i in range(8)]) for n in range(64)]
    state.apply([{"kind": "node_telemetry", "nodes": rows, "outliers": []}])
    assert device_grid.marks(state) == {"hottest": (17, 2, 97.0), "least busy": (41, 5, 3.0)}
    wide = device_grid.devices(state, 77, 21).plain
    lines = wide.splitlines()
    assert "64 nodes, 512 GPUs" in lines[0] and len(lines) <= 21 + 1
    assert "hottest node 17 GPU 2 97°C" in wide and "least busy node 41 GPU 5 util 3%" in wide
    assert sum(1 for ln in lines if ln[:4].strip().isdigit()) == 16  # 4 nodes to a line
    narrow = device_grid.devices(state, 45, 8).plain.splitlines()
    assert len(narrow) <= 8 and narrow[1].startswith("VRAM  0 ") and len(narrow[1]) == 8 + 32  # a cell per node
    one = device_grid.devices(state, 77, 21, only=41).plain
    assert "node 41 of 64" in one and "600W" in one and one.count("%") >= 16  # every GPU's VRAM and util
    assert device_grid.least_busy_node(state) == 41
    # an outlier event between grids updates that GPU
    state.apply([{"kind": "node_telemetry", "outliers": [{"node_rank": 3, "why": ["hottest"], "index": 0, "temp_c": 99,
                                                          "util_pct": 90, "vram_used_mb": 50, "vram_total_mb": 100, "power_w": 700}]}])
    assert device_grid.marks(state)["hottest"] == (3, 0, 99.0)


def test_the_map_names_the_nodes_the_hang_alert_calls_silent():
    from cockpit.ui import device_grid
    from cockpit.ui.state import RunState

    state = RunState()
    rows = [grid_row(n, f"h{n}", "amdsmi", [{"index": i, "vram_used_mb": 50, "vram_total_mb": 100, "util_pct": 90,
                                              "temp_c": 60, "power_w": 600} for i in range(8)]) for n in range(64)]
    state.apply([{"kind": "node_telemetry", "nodes": rows}])
    assert "SILENT" not in device_grid.devices(state, 77, 21).plain
    state.apply([{"kind": "alert", "code": "hang", "silent_nodes": [5, 6, 9], "message": "nodes silent"}])
    lines = device_grid.devices(state, 77, 21).plain.splitlines()
    assert [ln for ln in lines if "SILENT" in ln] == ["SILENT (the map shows their last report): nodes 5-6,9"]
    assert len(lines) <= 21 + 1
