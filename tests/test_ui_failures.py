"""A run that fails while the cockpit watches it: the Live screen shows the state and the reason
within seconds of status.json saying so, and the app keeps running (Textual Pilot, real run)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from conftest import read_events, start_detached, tiny_config, wait_for
from test_reliability import status

pytestmark = pytest.mark.slow


def text_of(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


async def until(pilot, cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


def test_live_screen_shows_a_rank_killed_mid_run(tmp_path, monkeypatch, tiny_model_dir):
    from cockpit.ui.app import CockpitApp

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=100000, save_steps=100000, probes=None)
    run = start_detached(tmp_path, cfg)
    wait_for(lambda: any(e["kind"] == "step" for e in read_events(run)), 120, "a step")

    async def scenario() -> None:
        app = CockpitApp(tmp_path / "runs", start="runs", poll_s=0.25, open_run=run.name)
        async with app.run_test(size=(100, 32)) as pilot:
            await until(pilot, lambda: type(app.screen).__name__ == "LiveScreen" and " running " in text_of(app, "#live-title"), 20, "the Live screen of the running run")
            os.kill(int(status(run)["rank_pids"]["0"]), signal.SIGKILL)
            st = await until(pilot, lambda: status(run) if status(run).get("state") == "failed" else None, 30, "status.json: failed")
            t_status = time.time()
            title = await until(pilot, lambda: (lambda s: s if " failed " in s and "SIGKILL" in s else None)(text_of(app, "#live-title")), 5, "the failed state and its reason in the title")
            shown = time.time() - t_status
            assert st["reason"].splitlines()[0] in title, (st["reason"], title)
            alerts = text_of(app, "#alerts")
            assert "FAILED:" in alerts and "SIGKILL" in alerts, alerts
            # the app is still up and answers keys: F3 shows the runs table with the run failed
            assert app.is_running
            await pilot.press("escape")
            await pilot.pause(0.5)
            await pilot.press("f3")
            await until(pilot, lambda: type(app.screen).__name__ == "RunsScreen", 5, "the Runs screen")
            assert app.is_running
            print(f"failure on screen {shown:.2f} s after status.json")

    asyncio.run(scenario())
    ev = [e for e in read_events(run) if e["kind"] == "run_failed"]
    assert ev and "SIGKILL" in ev[0]["reason"]
    assert json.loads((run / "status.json").read_text())["state"] == "failed"
