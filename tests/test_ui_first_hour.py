"""Issue 29, what a new user reached for in the cockpit and did not find (item 4), on the real
screens with Textual's Pilot: a YAML of one's own opened (``cockpit CONFIG``, Ctrl+O), Ctrl+←/→
with a field focused, Live's actions in the palette, resume and delete from Runs (through the
real ``cockpit resume`` / ``cockpit rm``), a probe row opened whole; and a crash exits non-zero."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cockpit, has_step, start_detached, tiny_config
from conftest import wait_for as wait_until
from test_ui_rough_edges import RUN_ID, copy_run, env, make_app, set_status  # noqa: F401 - env: a fixture

from tests.test_ui_pilot import wait_for, wait_for_form

ROOT = Path(__file__).resolve().parent.parent


def top(app) -> str:
    return type(app.screen).__name__


# -- cockpit CONFIG.yaml / Ctrl+O: your own YAML in Setup ------------------------------------------
def test_cockpit_with_a_yaml_opens_it_in_setup(env):
    from cockpit.cli import parse_args

    cfg = env / "mine.yaml"
    cfg.write_text("model_name_or_path: smollm2-135m-instruct\nlearning_rate: 7.0e-4\ncutoff_len: 96\n")
    args = parse_args([str(cfg)])
    assert args.command is None and args.config == str(cfg)
    assert parse_args(["--runs-dir", str(env), str(cfg)]).config == str(cfg)
    missing = subprocess.run([sys.executable, "-m", "cockpit.cli", str(env / "nope.yaml")], capture_output=True, text=True)
    assert missing.returncode == 2 and "no such file" in missing.stderr

    async def scenario():
        from textual.widgets import Input

        app = make_app(env / "runs", start="setup", start_preset=str(cfg))
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for_form(pilot)
            await wait_for(pilot, lambda: app.screen.query_one("#f-cutoff_len", Input).value == "96", 5, "the config")
            assert app.screen.query_one("#f-learning_rate", Input).value in ("7.0e-4", "0.0007", "7e-4")

    asyncio.run(scenario())


def test_ctrl_o_opens_a_yaml_from_a_path(env):
    other = env / "configs" / "other.yaml"
    other.parent.mkdir()
    other.write_text("model_name_or_path: smollm2-135m-instruct\ncutoff_len: 200\n")

    async def scenario():
        from textual.widgets import Input

        app = make_app(env / "runs", start="setup")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for_form(pilot)
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: top(app) == "OpenConfig", 5, "the open dialog")
            box = app.screen.query_one("#open-path", Input)
            box.value = str(env / "configs" / "missing.yaml")
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert top(app) == "OpenConfig"  # no such file: said, the dialog stays
            box.value = str(other)
            await pilot.press("enter")
            await wait_for(pilot, lambda: top(app) == "SetupScreen", 5, "back on Setup")
            await wait_for(pilot, lambda: app.screen.query_one("#f-cutoff_len", Input).value == "200", 5, "the YAML")

    asyncio.run(scenario())


def test_ctrl_arrows_switch_tabs_while_a_field_has_focus(env):
    async def scenario():
        from textual.widgets import Input, TabbedContent

        app = make_app(env / "runs", start="setup")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for_form(pilot)
            tabs = app.screen.query_one(TabbedContent)
            first = tabs.active
            app.screen.query_one("#f-model_name_or_path", Input).focus()
            await pilot.pause()
            assert isinstance(app.focused, Input)
            await pilot.press("ctrl+right")
            await pilot.pause()
            assert tabs.active != first
            await pilot.press("ctrl+left")
            await pilot.pause()
            assert tabs.active == first

    asyncio.run(scenario())


# -- the palette: Live's actions, resume ------------------------------------------------------------
def test_palette_offers_lives_actions_and_resume(env):
    runs = env / "runs"
    stopped = copy_run(runs)
    set_status(stopped, state="stopped", reason="stopped on request")

    async def scenario():
        from textual.command import CommandPalette
        from textual.widgets import Input

        app = make_app(runs, follow=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause(0.2)
            await pilot.press("enter")  # the stopped run: its Summary
            await wait_for(pilot, lambda: top(app) == "SummaryScreen", 5, "the summary")
            await pilot.press("v")  # its Live view
            await wait_for(pilot, lambda: top(app) == "LiveScreen", 5, "the live view")
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), 5, "the palette")
            app.screen.query_one(Input).value = "Live: plot"
            await pilot.pause(0.5)
            await pilot.press("enter")
            await wait_for(pilot, lambda: top(app) == "PlotView", 5, "the plot from the palette")
            names = [name for name, _cb, _help in _palette_commands(app)]
            assert f"Resume: {RUN_ID}" in names

    asyncio.run(scenario())


def _palette_commands(app):
    from cockpit.ui.app import CockpitCommands

    provider = CockpitCommands(app.screen)
    return provider._commands()


# -- a probe row, whole ------------------------------------------------------------------------------
def test_enter_on_a_probe_row_shows_it_whole(env):
    runs = env / "runs"
    copy_run(runs)

    async def scenario():
        from textual.widgets import DataTable

        app = make_app(runs, follow=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.2)
            await pilot.press("enter")
            await wait_for(pilot, lambda: top(app) == "SummaryScreen", 5, "the summary")
            table = app.screen.query_one("#probes", DataTable)
            await wait_for(pilot, lambda: table.row_count >= 10, 5, "the probes")
            table.focus()
            table.move_cursor(row=1)
            await pilot.press("enter")
            await wait_for(pilot, lambda: top(app) == "TextView", 5, "the probe view")
            body = str(app.screen.query_one("#textview-body").render())
            assert "What name do you go by?" in body
            assert "IDrop predecess predecess" in body  # the after answer, whole (the table cuts it at 80 columns)
            assert "before training" in body and "after training" in body

    asyncio.run(scenario())


# -- delete from Runs: cockpit rm, after a confirmation showing what goes -----------------------------
def test_delete_key_removes_an_ended_run_after_confirming(env):
    runs = env / "runs"
    gone = copy_run(runs)
    kept = copy_run(runs, "20261201-045730-lr-2e-3-rank8-d2ab")

    async def scenario():
        from textual.widgets import DataTable

        app = make_app(runs, follow=False)
        async with app.run_test(size=(120, 36)) as pilot:
            table = app.screen.query_one(DataTable)
            await wait_for(pilot, lambda: table.row_count == 2, 5, "two runs")
            table.move_cursor(row=table.get_row_index(RUN_ID))
            await pilot.press("delete")
            await wait_for(pilot, lambda: top(app) == "Confirm", 30, "the confirmation")
            question = str(app.screen.query_one("#question").render())
            assert RUN_ID in question and "freed" in question
            await pilot.press("n")
            await pilot.pause(0.3)
            assert gone.exists()
            await pilot.press("delete")
            await wait_for(pilot, lambda: top(app) == "Confirm", 30, "the confirmation again")
            await pilot.press("y")
            await wait_for(pilot, lambda: not gone.exists(), 30, "cockpit rm")
            await wait_for(pilot, lambda: table.row_count == 1, 5, "the row gone")
            assert kept.exists()

    asyncio.run(scenario())


# -- resume from Runs: a real stopped run continues in a new attempt ----------------------------------
@pytest.mark.slow
def test_resume_key_continues_a_stopped_run(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=400, save_steps=2, logging_steps=1)
    run = start_detached(tmp_path, cfg)
    wait_until(lambda: has_step(run, 3), 180, "steps")
    assert cockpit("stop", str(run), "--wait", "120").returncode == 0
    wait_until(lambda: json.loads((run / "status.json").read_text())["state"] == "stopped", 120, "stopped")

    async def scenario():
        app = make_app(run.parent, follow=True)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("R")
            await wait_for(pilot, lambda: top(app) == "Confirm", 10, "the confirmation")
            await pilot.press("y")
            await wait_for(pilot, lambda: top(app) == "LiveScreen", 180, "the live screen of the resumed run")
            await wait_for(pilot, lambda: json.loads((run / "status.json").read_text()).get("attempt") == 2, 60, "attempt 2")

    try:
        asyncio.run(scenario())
    finally:
        cockpit("stop", str(run), "--kill")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and json.loads((run / "status.json").read_text())["state"] not in (
            "killed", "stopped", "failed", "finished"):
            time.sleep(0.5)


# -- a crash in the UI exits non-zero ------------------------------------------------------------------
def test_a_crash_in_the_ui_exits_non_zero(env):
    from cockpit.ui.app import CockpitApp, run_to_exit

    css = str(ROOT / "cockpit" / "ui" / "app.tcss")

    class Crashing(CockpitApp):
        CSS_PATH = css

        def on_mount(self) -> None:
            raise RuntimeError("boom")

    class Quitting(CockpitApp):
        CSS_PATH = css

        def on_mount(self) -> None:
            self.call_after_refresh(self.exit)

    assert run_to_exit(Crashing(env / "runs", doctor_checks=[]), headless=True) == 1
    assert run_to_exit(Quitting(env / "runs", doctor_checks=[]), headless=True) == 0


# -- item 5: screen clutter ----------------------------------------------------------------------------
CPU_TELEMETRY = {
    "kind": "telemetry", "t": 1.0, "backend": "cpu", "devices": [],
    "ranks": [{"rank": 0, "pid": 10754, "alive": True, "rss_mb": 184.6, "cpu_pct": 97.0}],
    "unavailable": {"amdsmi": "libamd_smi.so not found", "nvml": "libnvidia-ml.so.1 not found (no NVIDIA driver)",
                    "torch": "no device memory reported by the ranks yet"},
}


def test_devices_pane_on_a_cpu_run_says_skip_once_and_nothing_stale_after_the_end():
    from cockpit.ui import formatting
    from cockpit.ui.state import RunState

    st = RunState(run_id="r")
    st.apply([{"kind": "run_started", "t": 0.0, "run_id": "r"}, CPU_TELEMETRY])
    text = formatting.devices(st, 80).plain
    assert "✗" not in text  # the doctor calls these facts skip: so does the pane
    assert text.count("skip") == 1 and "amdsmi, nvml, torch" in text
    assert "rank0 pid 10754" in text and "CPU 97%" in text
    failing = {**CPU_TELEMETRY, "backend": "amdsmi", "unavailable": {"amdsmi": "sampling failed: TimeoutError: hung"}}
    st.apply([failing])
    assert "✗ amdsmi: sampling failed" in formatting.devices(st, 80).plain  # a GPU source failing is a real problem
    st.apply([CPU_TELEMETRY, {"kind": "state", "t": 9.0, "state": "finished"}])
    ended = formatting.devices(st, 80).plain
    assert st.ended and "rank0" not in ended and "CPU 97%" not in ended and "torch" not in ended
    assert "the run has ended" in ended


def test_live_header_fits_80_columns_and_says_the_run_ended():
    from cockpit.ui import formatting
    from cockpit.ui.state import RunState

    st = RunState(run_id="20261130-094516-cpu-demo-tiny-de8f")
    st.apply([{"kind": "run_started", "t": 0.0, "run_id": st.run_id},
              {"kind": "train_begin", "t": 1.0, "total_steps": 40, "epochs": 2.0},
              {"kind": "step", "t": 2.0, "step": 1, "loss": 2.0, "epoch": 0.05}])
    wide = formatting.header(st, 10.0, width=160).plain
    assert st.run_id in wide and "epoch 0.05" in wide
    for width in (78, 100):  # 80 columns less the title's padding
        first = formatting.header(st, 10.0, width=width).plain.split("\n")[0]
        assert len(first) <= width, (width, first)
        assert "cpu-demo-tiny-de8f" in first and "ETA" in first
    st.apply([{"kind": "state", "t": 30.0, "state": "finished"}])
    assert "Enter: its Summary" in formatting.header(st, 31.0, width=80).plain


def test_plot_ticks_are_whole_steps():
    from cockpit.ui.formatting import step_ticks

    for xs in ([1.0, 9.8, 18.5], [1, 40], [0, 36], [5, 6, 7], [3], [10, 250]):
        ticks, labels = step_ticks(xs)
        assert ticks and all(t == int(t) for t in ticks) and labels == [str(int(t)) for t in ticks]
        assert min(xs) <= ticks[0] and ticks[-1] <= max(xs) + 0.5 and len(ticks) <= 7
    assert step_ticks([5, 6, 7])[1] == ["5", "6", "7"]
    assert step_ticks([]) == ([], [])


def test_bearings_cut_the_runs_dir_not_the_line():
    from cockpit.ui.widgets import Machine, bearings

    box = Machine("gpu-node-017", 8, "AMD", 192.0, 1500.0)
    runs = Path("/scratch/users/someone/projects/cockpit/runs")
    assert bearings(box, runs, 1, 12).plain.endswith(str(runs))
    for width in (80, 100, 120):
        line = bearings(box, runs, 1, 12, width).plain
        assert len(line) <= width and not line.rstrip().endswith("·"), line
        last = line.split(" · ")[-1]
        assert last in ("1/12 runs active", str(runs)) or (last.startswith("…") and str(runs).endswith(last[1:]))
    assert "…" in bearings(box, runs, 1, 12, 100).plain


def test_checkbox_reads_the_same_without_colour(env):
    async def scenario():
        from cockpit.ui.widgets import TickBox

        app = make_app(env / "runs", start="setup")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for_form(pilot)
            boxes = list(app.screen.query(TickBox))
            assert boxes
            box = boxes[0]
            for value in (True, False):
                box.value = value
                await pilot.pause()
                assert ("X" in str(box.render())) is value

    asyncio.run(scenario())


def test_setup_buttons_are_whole_at_80_and_120_columns(env, monkeypatch):
    monkeypatch.setenv("COCKPIT_SLURM", "1")  # the widest row: Launch on Slurm too

    async def scenario(size):
        from textual.widgets import Button

        app = make_app(env / "runs", start="setup")
        async with app.run_test(size=size) as pilot:
            await wait_for_form(pilot)
            await pilot.pause(0.2)
            for button in app.screen.query("#setup-buttons Button").results(Button):
                label = str(button.label)
                assert button.content_region.width >= len(label), (size, label, button.content_region)
                assert button.region.right <= size[0], (size, label, button.region)

    for size in ((80, 24), (120, 36), (160, 48)):
        asyncio.run(scenario(size))


def test_a_sparkline_of_few_points_is_a_cell_per_point(env):
    from test_ui_rough_edges import append_text, running_at

    runs = env / "runs"
    run_dir, rest = running_at(runs, 3)

    async def scenario():
        from textual.widgets import Sparkline

        from cockpit.store.rundir import RunDir

        app = make_app(runs, poll_s=0.1)
        async with app.run_test(size=(120, 36)) as pilot:
            app.open_live(RunDir(run_dir))
            await wait_for(pilot, lambda: top(app) == "LiveScreen" and app.screen.state.step == 3, 10, "step 3")
            spark = app.screen.query_one("#spark-loss", Sparkline)
            await wait_for(pilot, lambda: len(spark.data or []) >= 1, 5, "points")
            assert spark.size.width == len(spark.data) < 10  # not one block over the row
            append_text(run_dir / "events.jsonl", rest)
            await wait_for(pilot, lambda: len(spark.data or []) >= 24, 10, "more points")
            await pilot.pause(1.2)
            assert spark.size.width > 30  # the whole row once there are enough
    asyncio.run(scenario())
