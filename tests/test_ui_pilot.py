"""The main path through the app with Textual's Pilot, on a REAL tiny run:
fill the form -> a validation error (cockpit check's message) -> fix it -> launch ->
the Live screen shows steps -> stop -> the Runs screen shows the run ended.
Also: the UI process never imports torch / transformers / peft."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


async def wait_for(pilot, cond, timeout: float, what: str) -> None:
    """Until ``cond()``; a widget it reads that is not mounted yet (NoMatches: Setup's form comes
    after the first frame) counts as not yet; an app that stopped meanwhile (its screens gone) fails
    with the app's own error, not "No screens on stack"."""
    from textual.app import ScreenStackError
    from textual.css.query import NoMatches

    def holds() -> bool:
        try:
            return bool(cond())
        except NoMatches:
            return False
        except ScreenStackError as exc:
            raise AssertionError(f"the app stopped while waiting for {what}: {pilot.app._exception!r}") from exc

    deadline = time.monotonic() + timeout
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.2)


def form_filled(app) -> bool:
    """Setup (on top) has its form laid out, filled and checked. The form comes after Setup's first
    frame (SetupScreen._build, then _start); a test that reads the form, or ends while Setup is
    still filling it (the app's teardown then removes the form's widgets under the filling), waits
    for this, not for one of its widgets to exist."""
    return type(app.screen).__name__ == "SetupScreen" and getattr(app.screen, "checked", None) is not None


async def wait_for_form(pilot, timeout: float = 30) -> None:
    await wait_for(pilot, lambda: form_filled(pilot.app), timeout, "Setup's form (laid out, filled and checked)")


def runs_listed(app) -> bool:
    """The Runs screen (on top) has its rows: its first listing comes from a worker after its first
    frame (RunsScreen.listed), so a test that acts on a run in the table waits for this."""
    return type(app.screen).__name__ == "RunsScreen" and getattr(app.screen, "listed", False)


def text_of(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


@pytest.mark.slow
def test_setup_launch_live_stop_runs(tmp_path, monkeypatch, tiny_model_dir):
    from textual.widgets import DataTable, Input, Select

    from cockpit.ui.app import CockpitApp

    runs = tmp_path / "runs"
    monkeypatch.setenv("COCKPIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    async def scenario() -> None:
        app = CockpitApp(start="auto", poll_s=0.25)
        async with app.run_test(size=(100, 32)) as pilot:
            assert app.runs_dir == runs and type(app.screen).__name__ == "SetupScreen"  # no runs yet
            scr = app.screen
            # the form is laid out after the first frame, then filled and validated
            await wait_for_form(pilot)
            # on a CPU machine Setup opens with cpu-demo; clear what we type over
            await wait_for(pilot, lambda: scr.query_one("#f-dataset", Input).value.startswith("cockpit_identity"), 5, "cpu-demo")
            for key in ("template", "dataset", "probes", "cutoff_len"):
                scr.query_one(f"#f-{key}", Input).value = ""
            await wait_for(pilot, lambda: "dataset: required" in text_of(app, "#problems"), 5, "the dataset error")
            # fill the form: model, data, a few training keys; type a bad cutoff
            scr.query_one("#f-model_name_or_path", Input).value = str(tiny_model_dir)
            await pilot.click("#f-template")
            await pilot.press(*"chatml")
            scr.query_one("#setup-tabs").active = "tab-dataset"
            await pilot.pause()
            await pilot.click("#f-dataset")
            await pilot.press(*"cockpit_identity")
            scr.query_one("#setup-tabs").active = "tab-training"
            await pilot.pause()
            for key, value in {"per_device_train_batch_size": "2", "learning_rate": "5e-3", "max_steps": "400",
                               "logging_steps": "1", "save_steps": "1000"}.items():
                scr.query_one(f"#f-{key}", Input).value = value
            scr.query_one("#f-device", Select).value = "cpu"
            await pilot.click("#f-cutoff_len")
            await pilot.press("ctrl+u", "4")
            await wait_for(pilot, lambda: "cutoff_len: must be int >= 8" in text_of(app, "#problems"), 5, "the cutoff error")
            assert "dataset" not in text_of(app, "#problems")
            await pilot.press("backspace", *"128")
            await wait_for(pilot, lambda: "config valid" in text_of(app, "#problems"), 5, "a valid config")
            await wait_for(pilot, lambda: "fit: peak" in text_of(app, "#fit"), 20, "the fit line")
            # launch: cockpit train --detach in a subprocess, then the Live screen
            await pilot.press("f8")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "LiveScreen", 180, "the live screen")
            live = app.screen
            await wait_for(pilot, lambda: live.state.step >= 2, 180, "steps on the live screen")
            assert f"step {live.state.step}/400" in text_of(app, "#live-title")
            assert live.state.series["loss"].n >= 2
            # stop gracefully; the run saves and stops
            await pilot.press("x")
            await wait_for(pilot, lambda: live.state.ended, 120, "the run to stop")
            assert live.state.state == "stopped", live.state.state
            await pilot.press("escape")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "RunsScreen", 5, "the runs screen")
            app.screen.refresh_runs()
            await pilot.pause()
            table = app.screen.query_one(DataTable)
            assert table.row_count == 1
            assert str(table.get_row_at(0)[2]) == "■ stopped"
            # one timestamp in the run id, and the preset's name; Runs shows it without the time
            import re

            run_id = live.run.run_id
            assert re.fullmatch(r"\d{8}-\d{6}-cpu-demo-[0-9a-f]{4}", run_id), run_id
            assert str(table.get_row_at(0)[1]) == run_id[16:]

    asyncio.run(scenario())


def test_ui_process_never_imports_torch():
    code = r"""
import asyncio, sys
from cockpit.ui.app import CockpitApp
async def main():
    app = CockpitApp("tests/fixtures/ui_run", start="runs", follow=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("enter")          # the summary of the finished run
        await pilot.pause(0.5)
        await pilot.press("v")              # its live view (replay)
        await pilot.pause(0.5)
        await pilot.press("p")              # the full plot
        await pilot.pause(0.3)
        app.switch_mode("setup")
        await pilot.pause(1.0)
        await app.workers.wait_for_complete()
asyncio.run(main())
bad = [m for m in ("torch", "transformers", "peft", "cockpit.train") if m in sys.modules]
assert not bad, bad
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr
