"""Hang watchdog: thresholds, one alert per stall, the alert's content."""

from __future__ import annotations

import json

import pytest

from cockpit.store.events import encode
from cockpit.comm.flight import FLIGHT_ENV
from cockpit.run.watchdog import HangWatchdog, relaunch_env


def steps(dog: HangWatchdog, times: list[float], first_step: int = 1) -> None:
    for i, t in enumerate(times):
        dog.observe_step(first_step + i, t)


def test_threshold_is_factor_times_median_above_the_floor():
    dog = HangWatchdog(floor_s=30, factor=5.0)
    steps(dog, [0, 10, 20, 30, 40])
    assert dog.median_step_s() == 10 and dog.threshold_s() == 50
    assert dog.check(89.9, ranks_alive=True) is None  # 49.9 s since step 5
    alert = dog.check(90.1, ranks_alive=True)
    assert alert is not None and alert["threshold_s"] == 50 and alert["stalled_s"] == pytest.approx(50.1)

    fast = HangWatchdog(floor_s=30, factor=5.0)
    steps(fast, [0, 1, 2, 3])
    assert fast.threshold_s() == 30  # 5 x 1 s is below the floor
    assert fast.check(32.9, True) is None and fast.check(33.1, True) is not None


def test_one_slow_step_does_not_move_the_median_much():
    dog = HangWatchdog(floor_s=10, factor=5.0)
    steps(dog, [0, 2, 4, 6, 106, 108, 110])  # a 100 s checkpoint in the middle
    assert dog.median_step_s() == 2 and dog.threshold_s() == 10


def test_alerts_once_per_stall_and_again_after_progress():
    dog = HangWatchdog(floor_s=5, factor=2.0)
    steps(dog, [0, 1, 2])
    assert dog.check(10, True) is not None
    assert dog.check(20, True) is None and dog.check(1000, True) is None
    dog.observe_step(4, 1001)
    assert dog.check(1003, True) is None
    assert dog.check(1010, True) is not None


def test_no_alert_when_ranks_are_dead():
    dog = HangWatchdog(floor_s=5)
    steps(dog, [0, 1])
    assert dog.check(100, ranks_alive=False) is None
    assert dog.check(101, ranks_alive=True) is not None  # the stall still counts once they are alive


def test_before_the_first_step_counts_from_start_or_first_check():
    dog = HangWatchdog(floor_s=60, start_t=1000)
    assert dog.check(1059, True) is None
    alert = dog.check(1061, True)
    assert alert is not None and alert["last_step"] is None and "before any step" in alert["message"]

    lazy = HangWatchdog(floor_s=60)
    assert lazy.check(5000, True) is None  # first check starts the clock
    assert lazy.check(5061, True) is not None


def test_replayed_steps_are_ignored():
    dog = HangWatchdog(floor_s=5)
    steps(dog, [0, 10, 20])
    dog.observe_step(2, 25)  # an older step replayed from the event log
    assert dog.last_step == 3 and dog.last_step_t == 20 and dog.median_step_s() == 10


def test_alert_names_ranks_last_lines_remedies_and_is_a_valid_event():
    dog = HangWatchdog(floor_s=5)
    steps(dog, [0, 1, 2], first_step=41)
    last = {
        1: "host:2:3 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC\n",
        0: "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout",
        2: "",
    }
    alert = dog.check(100, True, last_lines=last)
    assert (alert["level"], alert["code"]) == ("error", "hang")
    assert [r["rank"] for r in alert["ranks"]] == [0, 1, 2]
    assert alert["ranks"][1]["last_line"].endswith("via P2P/IPC")
    assert "since step 43" in alert["message"] and "rank 2: (nothing logged)" in alert["message"]
    remedies = " ".join(alert["remedies"])
    for needle in ("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL", "NCCL_NET_PLUGIN=none", "RCCL_NET_PLUGIN=none",
                   "NCCL_SOCKET_IFNAME", "echo 0 > /proc/sys/kernel/numa_balancing"):
        assert needle in remedies
    assert alert["relaunch_env"] == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL", **FLIGHT_ENV}
    event = json.loads(encode("alert", **alert))
    assert event["kind"] == "alert" and event["remedies"] == alert["remedies"]


def test_relaunch_env_variants():
    assert relaunch_env(disable_plugin=True, socket_ifname="eth0") == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,COLL",
        **FLIGHT_ENV,  # PyTorch's flight recorder (docs/rocm.md item 10)
        "NCCL_NET_PLUGIN": "none",
        "RCCL_NET_PLUGIN": "none",
        "NCCL_SOCKET_IFNAME": "eth0",
    }


def test_rejects_nonsense_configuration():
    with pytest.raises(ValueError):
        HangWatchdog(floor_s=0)


def test_loading_and_probes_use_the_longer_load_timeout_then_the_step_threshold():
    dog = HangWatchdog(floor_s=60, start_t=1000, load_timeout_s=1800)
    assert dog.phase == "load"
    assert dog.check(1000 + 1799, True) is None  # a long model load / probes before training: no hang
    alert = dog.check(1000 + 1801, True)
    assert alert is not None and alert["phase"] == "load" and "load timeout 1800 s" in alert["message"]
    dog.observe_step(1, 3000)
    assert dog.phase == "train" and dog.threshold_s() == 60
    assert dog.check(3061, True)["phase"] == "train"
    dog.observe_step(2, 3100)
    dog.observe_train_end(3101)  # saving and the probes after training: the load timeout again
    assert dog.phase == "wrapup" and dog.check(3101 + 600, True) is None
    late = dog.check(3101 + 1801, True)
    assert late is not None and "since training ended at step 2" in late["message"]


def test_a_silent_node_is_named_and_a_lagging_one_too():
    dog = HangWatchdog(floor_s=30, start_t=0, expected_nodes=3, heartbeat_silent_s=20)
    steps(dog, [0, 1, 2], first_step=40)
    dog.observe_heartbeat(0, 100, host="gpu-a", step=42)
    dog.observe_heartbeat(1, 40, host="gpu-b", step=42)  # nothing since t=40
    dog.observe_heartbeat(2, 99, host="gpu-c", step=41)
    dog.observe_heartbeat(1, 30, host="gpu-b", step=41)  # an older one replayed: ignored
    alert = dog.check(100, True)
    assert alert is not None and alert["silent_nodes"] == [1]
    assert "node 1 (gpu-b) silent: no heartbeat for 60 s, last at step 42" in alert["message"]
    assert "node 2 (gpu-c) behind: at step 41" in alert["message"]
    assert "node 0" not in alert["message"]
    by_node = {n["node_rank"]: n for n in alert["nodes"]}
    assert by_node[0]["silent"] is False and by_node[1]["heartbeat_age_s"] == 60 and by_node[2]["host"] == "gpu-c"
    json.loads(encode("alert", **alert))


def test_a_node_that_never_reported_is_silent():
    dog = HangWatchdog(floor_s=10, start_t=0, expected_nodes=2)
    dog.observe_heartbeat(0, 5, host="a", step=None)
    alert = dog.check(11, True)
    assert alert["silent_nodes"] == [1] and "node 1 silent: no heartbeat at all" in alert["message"]
    single = HangWatchdog(floor_s=10, start_t=0)
    assert "nodes" not in single.check(11, True)
