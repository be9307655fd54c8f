"""The Live screen's device pane with 2 nodes x 8 GPUs (tests/fixtures/ui_nodes, recorded from
two loopback nodes with fake MI300X): readable at 160x48 (a line per GPU, under its node),
usable at 80x24 (a line per node, a cell per GPU); snapshots and the pane's text."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import ui_screenshots as shots

FIXTURE = Path("tests") / "fixtures" / "ui_nodes"
RUN_ID = "20261201-050119-two-nodes-ef92"
SIZES = {"80x24": (80, 24), "160x48": (160, 48)}


@pytest.fixture(autouse=True)
def _deterministic(tmp_path):
    cwd, tz = os.getcwd(), os.environ.get("TZ")
    shots.prepare_env(tmp_path)
    yield
    os.chdir(cwd)
    if tz is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = tz
    time.tzset()


def make_app():
    import json

    from cockpit.ui.app import CockpitApp

    doctor = json.loads((shots.ROOT / shots.FIXTURE / "doctor.json").read_text(encoding="utf-8"))
    return CockpitApp(FIXTURE, start="runs", clock=lambda: 1796101290.0, follow=False, runs_refresh_s=3600, doctor_checks=doctor)


async def open_live(pilot) -> None:
    from cockpit.store.rundir import RunDir

    pilot.app.open_live(RunDir(FIXTURE / RUN_ID))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (type(pilot.app.screen).__name__ == "LiveScreen" and pilot.app.screen.replay_progress is None
                                               and pilot.app.screen.state.events_seen > 0):
        await pilot.pause(0.05)
    await pilot.app.workers.wait_for_complete()
    pilot.app.screen._drawn_version = -1
    pilot.app.screen.draw()
    await pilot.pause(0.3)


def devices_text(size: tuple[int, int]) -> str:
    async def scenario() -> str:
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await open_live(pilot)
            return str(app.screen.query_one("#devices").render())

    return asyncio.run(scenario())


@pytest.mark.parametrize("size", list(SIZES))
def test_two_nodes_of_eight_gpus_snapshot(snap_compare, size):
    assert snap_compare(make_app(), terminal_size=SIZES[size], run_before=open_live)


def test_wide_pane_shows_every_gpu_under_its_node():
    text = devices_text((160, 48))
    assert "2 nodes, 16 GPUs" in text
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("node ")]
    assert len(heads) == 2 and "amdsmi" in lines[heads[0]] and "max 71°C" in lines[heads[0]]
    gpu_lines = [line for line in lines if "%" in line and "°" in line and not line.startswith("node")]
    assert len(gpu_lines) == 8  # two GPUs per line, 4 lines per node
    assert all(line.count("°") == 2 for line in gpu_lines)
    assert " 7 " in gpu_lines[3] and "91%" in gpu_lines[3]  # GPU 7: 35 % + 7 x 8 % of its VRAM
    assert "ranks 1: RSS max" in text  # each node's rank's own figures (CPU: RSS)


def test_narrow_pane_shows_a_line_per_node_with_a_cell_per_gpu():
    text = devices_text((80, 24))
    lines = text.splitlines()
    nodes = [line for line in lines if line.startswith(("n0 ", "n1 ", "node 0", "node 1"))]
    assert len(nodes) == 2
    for line in nodes:
        cells = line.split("VRAM ", 1)[1][:8]
        assert cells == "▃▃▄▅▅▆▇▇"  # 35 % ... 91 % in eighths, one cell per GPU, in index order


def test_a_node_the_hang_alert_names_is_marked_silent():
    from cockpit.ui.formatting import node_devices
    from cockpit.ui.state import RunState

    state = RunState()
    gpu = {"index": 0, "name": "MI300X", "vram_used_mb": 100, "vram_total_mb": 1000}
    state.apply([{"kind": "telemetry", "node_rank": n, "host": f"h{n}", "backend": "amdsmi", "devices": [gpu]} for n in (0, 1)]
                + [{"kind": "step", "step": 5}])
    assert "SILENT" not in node_devices(state, 80, 15).plain
    state.apply([{"kind": "alert", "code": "hang", "last_step": 5, "silent_nodes": [1], "message": "node 1 (h1) silent"}])
    lines = node_devices(state, 80, 15).plain.splitlines()
    assert [ln.startswith("node 1") for ln in lines if "SILENT" in ln] == [True]


def test_64_nodes_map_drills_down_with_n_o_and_a():
    """The 64-node scene (scripts/ui_screenshots.write_nodes_run): n shows node 0's GPUs, N from there
    goes back to the map, o shows the least busy GPU's node, a the map again."""

    async def scenario() -> list[str]:
        app = make_app()
        seen = []
        async with app.run_test(size=(160, 48)) as pilot:
            await shots._nodes_live(pilot)
            pane = lambda: str(app.screen.query_one("#devices").render())  # noqa: E731
            seen.append(pane())
            for key in ("n", "N", "o", "a"):
                await pilot.press(key)
                await pilot.pause(0.2)
                seen.append(pane())
        return seen

    grid, node0, back, least, again = asyncio.run(scenario())
    assert "64 nodes, 512 GPUs" in grid and "least busy node 41 GPU 5 util 4%" in grid
    assert "node 0 of 64" in node0 and node0.count("W ") + node0.count("W\n") >= 8  # 8 GPUs with their power
    assert back == grid and again == grid
    assert "node 41 of 64" in least and " 4%" in least


def test_the_map_follows_new_figures_at_most_every_two_seconds():
    """While following, node figures that changed within MAP_PERIOD_S of the last map wait (the pane is
    pending, so the 4 Hz poll's draw shows them once the period is over, with no new event: the scene does not
    follow, so the test calls draw as the poll would); a step still redraws the header."""
    from cockpit.store.node_grid import grid_row

    async def scenario() -> tuple[str, bool, str, str]:
        app = make_app()
        async with app.run_test(size=(160, 48)) as pilot:
            await shots._nodes_live(pilot)
            live = app.screen
            pane = live.query_one("#devices")
            rows = [grid_row(7, "mi300-07", "amdsmi", [{"index": i, "vram_used_mb": 10, "vram_total_mb": 100, "util_pct": 1,
                                                         "temp_c": 99, "power_w": 100} for i in range(8)])]
            pane._map_at = __import__("time").monotonic()  # a map was just drawn
            with live._state_lock:
                live.state.apply([{"kind": "node_telemetry", "nodes": rows}, {"kind": "step", "step": 31, "total_steps": 500}])
            live.draw()
            held, pending = str(pane.render()), pane.pending
            header = str(live.query_one("#live-title").render())
            pane._map_at -= 3.0  # the period is over: the poll's next draw (no new event) shows the new figures
            live.draw()
            await pilot.pause(0.2)
            return held, pending, header, str(pane.render())

    held, pending, header, after = asyncio.run(scenario())
    assert "hottest node 17 GPU 2 96°C" in held and pending and "step 31/500" in header
    assert "hottest node 7 GPU 0 99°C" in after and "least busy node 7 GPU 0 util 1%" in after
