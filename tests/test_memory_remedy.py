"""The memory alert's remedy in the Live screen (key m, Pilot) and its headless form
``cockpit resume RUN --set k=v [--stop]``: what is offered, what is refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import ROOT, cockpit

from cockpit.telemetry.pressure import MemoryPressure

pytestmark = pytest.mark.serial  # timing windows: run alone (scripts/test.sh)


def run_with_memory_alert(runs: Path, micro_batch: int = 4):
    from cockpit.config.load import dump_resolved, validate
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import create_run_dir

    cfg = validate({"dataset": "cockpit_identity", "per_device_train_batch_size": micro_batch, "gradient_accumulation_steps": 2,
                    "use_cpu": True}, check_paths=False)
    run = create_run_dir(runs, "mem-demo")
    run.config_path.write_text(dump_resolved(cfg), encoding="utf-8")
    run.update_status(state="running", run_id=run.run_id, attempt=1, step=3, total_steps=10)
    watch = MemoryPressure(headroom=0.08, swing=0.25)
    with EventWriter(run.events_path) as w:
        w.emit("run_started", run_id=run.run_id, model="tiny", dataset="cockpit_identity", method="lora", world_size=1, total_steps=10)
        w.emit("state", state="running")
        w.emit("train_begin", total_steps=10, start_step=0, world_size=1, global_batch=8)
        for step, peak in ((1, 900.0), (2, 1000.0), (3, 1400.0)):
            mem = {"0": {"peak_mb": peak, "reserved_mb": None, "capacity_mb": 24000.0, "source": "live_tensors", "node_rank": 0}}
            w.emit("step", step=step, total_steps=10, loss=2.0 / step, mem=mem)
            alert = watch.observe(step, mem, micro_batch=micro_batch, accumulation=2)
            if alert:
                w.emit("alert", **alert)
    return run


def test_m_offers_the_alerts_remedy_and_cancel_changes_nothing(tmp_path, monkeypatch):
    from cockpit.store.rundir import RunDir
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.screens.live import LiveScreen
    from cockpit.ui.screens.modals import Decide
    from tests.test_ui_pilot import wait_for
    from tests.test_ui_setup_live import DOCTOR, text_of

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    run = run_with_memory_alert(tmp_path / "runs")
    calls: list[tuple] = []
    monkeypatch.setattr(LiveScreen, "_resume_with", lambda self, items: calls.append(tuple(items)))

    async def scenario() -> None:
        app = CockpitApp(tmp_path / "runs", start="runs", doctor_checks=DOCTOR, follow=False)
        async with app.run_test(size=(120, 40)) as pilot:
            app.open_live(RunDir(run.path))
            await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen) and app.screen.query("#alerts") and app.screen.state.alerts, 10, "the live screen")
            live = app.screen
            await wait_for(pilot, lambda: "m: stop at a checkpoint, resume with micro-batch 2, accum 4" in text_of(live, "#alerts"), 5, "the hint")
            assert "memory_pressure: rank 0 (node 0): per-step peak memory swung +40 %" in text_of(live, "#alerts")
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, Decide), 5, "the confirmation")
            body = str(app.screen.body)
            assert "per_device_train_batch_size=2" in body and "gradient_accumulation_steps=4" in body
            assert f"cockpit resume {run.run_id} --stop --set 'per_device_train_batch_size=2'" in body
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen is live, 5, "back")
            assert calls == [] and not run.pending("stop")
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, Decide), 5, "the confirmation again")
            await pilot.press("y")
            await wait_for(pilot, lambda: calls, 5, "the resume")
            assert calls == [("per_device_train_batch_size=2", "gradient_accumulation_steps=4")]

    asyncio.run(scenario())


def test_without_a_standing_alert_m_only_says_so(tmp_path):
    from cockpit.ui.state import RunState, memory_alert, memory_remedy_args

    state = RunState()
    state.apply([{"kind": "train_begin", "t": 10.0}, {"kind": "alert", "t": 5.0, "code": "memory_pressure", "remedy_set": {"a": 1}}])
    assert memory_alert(state) is None  # from the attempt before the last train_begin
    state.apply([{"kind": "alert", "t": 11.0, "code": "memory_pressure", "remedy_set": None,
                  "remedy_env": {"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"}}])
    alert = memory_alert(state)
    assert alert is not None and memory_remedy_args(alert) == ["env={PYTORCH_HIP_ALLOC_CONF: 'expandable_segments:True'}"]
    from cockpit.config.load import parse_overrides

    assert parse_overrides(memory_remedy_args(alert)) == {"env": {"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"}}
    state.apply([{"kind": "state", "t": 12.0, "state": "finished"}])
    assert memory_alert(state) is None


@pytest.mark.parametrize("item,message", [
    ("lora_rank=16", "--set lora_rank: cannot change on resume"),
    ("per_device_train_batch_size=0", "per_device_train_batch_size"),
    ("no_such_key=1", "unknown key"),
])
def test_resume_set_refuses_bad_changes_with_exit_2(tmp_path, item, message):
    run = run_with_memory_alert(tmp_path / "runs")
    res = cockpit("resume", str(run.path), "--set", item, timeout=60)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert json.loads((run.path / "status.json").read_text())["state"] == "running"  # untouched


def test_resume_stop_waits_for_the_stop_and_says_when_it_never_comes(tmp_path):
    run = run_with_memory_alert(tmp_path / "runs")
    res = cockpit("resume", str(run.path), "--stop", "--wait", "1", "--set", "per_device_train_batch_size=2", timeout=60)
    assert res.returncode == 2 and "did not stop within 1 s" in res.stderr
    assert run.pending("stop")  # the stop was asked for
