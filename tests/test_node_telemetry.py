"""Every node's GPUs and heartbeat through a real c10d TCPStore (cockpit/telemetry/node.py),
the fakes standing in for amdsmi on the other node; the supervisor's side of it."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

from cockpit.store.events import encode
from cockpit.run.supervisor import node_torch_devices, node_watchdog, observe_progress
from cockpit.telemetry import AmdSmiBackend
from cockpit.telemetry.fakes import FakeAmdSmi, FakeGpu, fake_from_env
from cockpit.store.node_grid import parse_ranges, row_devices
from cockpit.telemetry.node import NodeCollector, NodeReporter, NodeThread
from cockpit.config.run_config import RunConfig


def store_pair():
    from torch.distributed import TCPStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    return master, client


def test_reports_of_two_nodes_reach_rank_0_with_node_names_and_only_new_ones():
    master, client = store_pair()
    gpus = FakeAmdSmi([FakeGpu(vram_used_mb=1000 * (i + 1), bdf=f"0000:{i:02x}:00.0") for i in range(8)])
    gpus.amdsmi_init()
    backend, _ = AmdSmiBackend.open(gpus)
    node0 = NodeReporter(master, 0, "gpu-a")  # node 0: its supervisor samples its GPUs
    node1 = NodeReporter(client, 1, "gpu-b", backend, {"nvml": "not tried"})
    now = [100.0]
    collector = NodeCollector(master, nnodes=2, own_node=0, min_gap_s=3.0, clock=lambda: now[0])
    assert collector.collect() == []  # nothing published yet: never blocks on a missing key
    node0.step = 4
    node0.publish()
    node1.step = 3
    node1.publish()
    got = collector.collect()
    beats = [f for k, f in got if k == "heartbeats"]
    assert len(beats) == 1 and beats[0]["steps"] == [[4, "0"], [3, "1"]] and beats[0]["hosts"] == {"0": "gpu-a", "1": "gpu-b"}
    grid = [f for k, f in got if k == "node_telemetry"]
    assert len(grid) == 1 and [r["node"] for r in grid[0]["nodes"]] == [1]  # node 0's GPUs: its supervisor's
    row = grid[0]["nodes"][0]
    assert row["host"] == "gpu-b" and row["backend"] == "amdsmi" and row["total_mb"] == 196592
    assert [d["vram_used_mb"] for d in row_devices(row)] == [round(196592 * round(100_000 * (i + 1) / 196592) / 100) for i in range(8)]
    for kind, fields in got:
        encode(kind, **fields)
    assert collector.collect() == []  # no new report, no new heartbeat
    node1.publish()
    now[0] += 1.0
    assert collector.collect() == []  # a new report at the same step, 1 s later: not yet (min_gap_s)
    node1.step = 4
    node1.publish()
    assert [(k, f["steps"]) for k, f in collector.collect() if k == "heartbeats"] == [("heartbeats", [[4, "1"]])]  # the step moved
    now[0] += 3.0
    node1.publish()
    got = collector.collect()
    assert [k for k, _ in got] == ["heartbeats", "node_telemetry"] and "nodes" in got[1][1]  # the grid is small: every 3 s


def test_a_stopped_node_thread_stops_its_heartbeats():
    master, client = store_pair()
    events: list[tuple[str, dict]] = []
    t0 = NodeThread(NodeReporter(master, 0, "a"), NodeCollector(master, 2, min_gap_s=0.2), lambda kind, **f: events.append((kind, f)), 0.2).start()
    t1 = NodeThread(NodeReporter(client, 1, "b"), None, None, 0.2).start()
    def beat_count(node: int) -> int:
        return sum(1 for k, f in events if k == "heartbeats" for _, nodes in f["steps"] if node in parse_ranges(nodes))

    deadline = time.time() + 20
    while time.time() < deadline and not (beat_count(0) and beat_count(1)):
        time.sleep(0.1)
    t1.stop()
    time.sleep(0.5)
    n1, n0 = beat_count(1), beat_count(0)
    time.sleep(1.5)
    assert beat_count(1) == n1 >= 1
    assert beat_count(0) > n0  # node 0 goes on
    t0.stop()


def test_supervisor_feeds_heartbeats_and_train_end_to_the_watchdog():
    dog = node_watchdog(RunConfig(hang_timeout_s=30, load_timeout_s=600, nnodes=2, telemetry_interval_s=3.0), start_t=0)
    assert dog.check(599, True) is None  # loading: the load timeout
    dog.observe_step(1, 600)
    dog.observe_step(2, 601)
    observe_progress(dog, {"kind": "heartbeats", "t": 580, "steps": [[1, "0-1"]], "hosts": {"0": "a", "1": "b"}})
    observe_progress(dog, {"kind": "heartbeats", "t": 635, "steps": [[2, "0"]]})  # node 1 silent since 580
    alert = dog.check(640, True)
    assert alert["silent_nodes"] == [1] and "node 1 (b) silent: no heartbeat for 60 s" in alert["message"]
    observe_progress(dog, {"kind": "train_end", "t": 650, "step": 2})
    assert dog.phase == "wrapup" and dog.check(1200, True) is None


def test_torch_device_records_of_this_node_only():
    mem = {"0": {"node_rank": 0, "device": {"index": 0, "vram_total_mb": 10}}, "1": {"node_rank": 0, "device": {"index": 1}},
           "2": {"node_rank": 1, "device": {"index": 0}}, "3": {"node_rank": 0, "device": None}}
    assert [d["index"] for d in node_torch_devices(mem, 0)] == [0, 1]
    assert [d["index"] for d in node_torch_devices(mem, 1)] == [0]
    assert node_torch_devices(None, 0) == []


def test_fake_gpus_from_the_environment():
    name, module = fake_from_env("amdsmi:8")
    backend, reason = AmdSmiBackend.open(module)
    assert name == "amdsmi" and reason is None and len(backend.devices()) == 8
    assert fake_from_env("") is None
