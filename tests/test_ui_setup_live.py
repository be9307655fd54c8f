"""Setup and Live screens: the preset this machine calls for, doctor failures before launch,
every rank's launch in the preview, ZeRO keys, the tune button, relaunch after a hang alert,
bounded sparkline redraws. Pilot tests on real screens; the doctor's results are injected as
`cockpit doctor --json` dicts (the recorded CPU machine in tests/fixtures/ui_run/doctor.json)."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import cockpit, write_yaml
from tests.test_ui_pilot import wait_for

ROOT = Path(__file__).resolve().parent.parent
DOCTOR = json.loads((ROOT / "tests" / "fixtures" / "ui_run" / "doctor.json").read_text(encoding="utf-8"))
GiB = 2**30


def text_of(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def doctor_with(**changes: dict) -> list[dict]:
    """The recorded CPU machine's checks with some replaced (by id)."""
    checks = copy.deepcopy(DOCTOR)
    for c in checks:
        c.update(changes.get(c["id"], {}))
    return checks


def gpu_machine(name: str, target: str, gib: int, n: int = 8) -> list[dict]:
    devices = [{"index": i, "name": name, "total_memory": gib * GiB, "gcn_arch": f"{target}:sramecc+:xnack-", "target": target} for i in range(n)]
    return doctor_with(gpu_devices={"status": "pass", "seen": f"{n} x {name}", "data": {"devices": devices}})


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def make_app(runs: Path, checks: list[dict] | None = None, **kw):
    from cockpit.ui.app import CockpitApp

    return CockpitApp(runs, start=kw.pop("start", "setup"), doctor_checks=DOCTOR if checks is None else checks, **kw)


# -- 1. the preset this machine calls for (#7) -----------------------------------------------------
def test_setup_opens_with_the_preset_for_this_machine(env):
    from textual.widgets import Input, Select

    from cockpit.ui.presets import offered_presets

    # the mapping: gfx942 -> mi300x-*, gfx90a 64 GB -> mi250-*/mi210-* (MI210 first on an MI210)
    assert offered_presets(gpu_machine("AMD Instinct MI300X", "gfx942", 192))[0][0].name == "mi300x-lora-8b"
    mi250 = [p.name for p in offered_presets(gpu_machine("AMD Instinct MI250X/MI250", "gfx90a", 64))[0]]
    assert mi250[0] == "mi250-lora-8b" and "mi210-lora-8b" in mi250 and not any(n.startswith("mi300x") for n in mi250)
    assert offered_presets(gpu_machine("AMD Instinct MI210", "gfx90a", 64, 1))[0][0].name == "mi210-lora-8b"
    assert [p.name for p in offered_presets(DOCTOR)[0]] == ["cpu-demo"]
    # gfx942 with 256 GiB is an MI325X (its preset first, the MI300X's beside it); gfx950 an MI350X / MI355X
    mi325 = [p.name for p in offered_presets(gpu_machine("AMD Instinct MI325X", "gfx942", 256))[0]]
    assert mi325[0] == "mi325x-lora-8b" and "mi300x-lora-8b" in mi325
    assert "mi325x-lora-8b" not in [p.name for p in offered_presets(gpu_machine("AMD Instinct MI300X", "gfx942", 192))[0]]
    assert offered_presets(gpu_machine("AMD Instinct MI355X", "gfx950", 288))[0][0].name == "mi355x-lora-8b"

    async def scenario(checks, expect_model, expect_preset, expect_dataset) -> None:
        app = make_app(env / "runs", checks)
        async with app.run_test(size=(120, 40)) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.query_one("#preset", Select).value == str(ROOT / "presets" / f"{expect_preset}.yaml"), 30, expect_preset)
            await wait_for(pilot, lambda: scr.query_one("#f-model_name_or_path", Input).value == expect_model, 15, expect_model)
            await pilot.pause(0.3)
            assert scr.query_one("#f-dataset", Input).value == expect_dataset
            labels = [str(label) for label, _v in scr.query_one("#preset", Select)._options if str(label)]
            assert labels[0] == f"{expect_preset} (built-in) (for this machine)", labels
            assert "config valid" in text_of(scr, "#problems")

    asyncio.run(scenario(DOCTOR, "smollm2-135m-instruct", "cpu-demo", "cockpit_identity,cockpit_bilingual"))
    asyncio.run(scenario(gpu_machine("AMD Instinct MI300X", "gfx942", 192), "meta-llama/Llama-3.1-8B-Instruct",
                         "mi300x-lora-8b", "cockpit_identity,cockpit_bilingual"))


# -- 2. doctor failures block launch (#7) ---------------------------------------------------------
def test_doctor_failures_that_matter_block_launch(env, monkeypatch):
    from cockpit.doctor.relevance import blocking_for_config, config_tags
    from cockpit.ui import cli_calls

    # the relevance rules on real check dicts
    assert config_tags({"use_cpu": True, "zero_stage": 3, "nproc_per_node": 2}) == {"deepspeed"}
    assert {"gpu", "multi_gpu", "qlora"} <= config_tags({"quantization_bit": 4, "nproc_per_node": 2})
    arch_fail = {"rocm_arch": {"status": "fail", "seen": "gfx942 not in PYTORCH_ROCM_ARCH='gfx90a'", "fix": "export PYTORCH_ROCM_ARCH=gfx942"}}
    assert [c.id for c in blocking_for_config(doctor_with(**arch_fail), {"zero_stage": 2})] == ["rocm_arch"]
    assert blocking_for_config(doctor_with(**arch_fail), {"use_cpu": True}) == []  # a plain CPU LoRA builds nothing
    no_ds = {"deepspeed": {"status": "skip", "seen": "not installed", "fix": "pip install 'cockpit-tune[deepspeed]'"}}
    assert [c.id for c in blocking_for_config(doctor_with(**no_ds), {"zero_stage": 3})] == ["deepspeed"]
    no_numactl = {"numactl": {"status": "warn", "seen": "numactl is not on PATH", "fix": "sudo apt-get install numactl"}}
    assert [c.id for c in blocking_for_config(doctor_with(**no_numactl), {"numa_bind": "0:0,1:0"})] == ["numactl"]
    assert blocking_for_config(doctor_with(**no_numactl), {"numa_bind": "auto"}) == []

    launched: list[str] = []
    monkeypatch.setattr(cli_calls, "train_detached", lambda path, runs_dir, timeout=600, secrets=None, on_stage=None: launched.append(str(path)) or cli_calls.CliResult(1, None, "", "fake: not started"))
    full_disk = {"disk_runs": {"status": "fail", "seen": "0.2 GiB free at /runs", "fix": "free some space or set COCKPIT_RUNS_DIR"}}
    runs = env / "runs"

    async def scenario() -> None:
        from cockpit.ui.screens.modals import Decide

        app = make_app(runs, doctor_with(**full_disk))
        async with app.run_test(size=(120, 40)) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: "config valid" in text_of(scr, "#problems"), 10, "a valid config")
            await pilot.press("f8")
            await wait_for(pilot, lambda: isinstance(app.screen, Decide), 10, "the doctor modal")
            body = str(app.screen.body)
            assert "0.2 GiB free" in body and "fix: free some space" in body
            await pilot.press("n")  # Cancel
            await wait_for(pilot, lambda: app.screen is scr, 5, "back to Setup")
            await pilot.pause(0.3)
            assert launched == [] and not scr._launching and not (runs / ".ui-configs").exists()
            await pilot.press("f8")
            await wait_for(pilot, lambda: isinstance(app.screen, Decide), 10, "the doctor modal again")
            await pilot.press("y")  # Launch anyway
            await wait_for(pilot, lambda: launched, 10, "the launch")
            await wait_for(pilot, lambda: "launch failed" in text_of(scr, "#problems"), 10, "the fake's answer")

    asyncio.run(scenario())


# -- 3. every rank's command and environment in the preview (#6) ---------------------------------
def test_preview_shows_each_ranks_command_and_env(env):
    from textual.widgets import Input

    async def scenario() -> None:
        from cockpit.ui.screens.modals import TextView

        app = make_app(env / "runs")
        async with app.run_test(size=(120, 40)) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: "config valid" in text_of(scr, "#problems"), 10, "a valid config")
            scr.query_one("#f-nproc_per_node", Input).value = "2"
            await wait_for(pilot, lambda: scr.checked.cfg and scr.checked.cfg.nproc_per_node == 2, 5, "nproc 2")
            await pilot.press("f6")
            await wait_for(pilot, lambda: isinstance(app.screen, TextView), 5, "the preview")
            view = app.screen  # "computing …" until `cockpit preview --json` answers
            await wait_for(pilot, lambda: "# rank 1" in str(view.body), 60, "the per-rank launch")
            body = str(view.body)
            assert "torchrun" in body and "--nproc-per-node" in body or "--nproc_per_node" in body
            for rank in (0, 1):
                assert f"# rank {rank} (local {rank}, node 0" in body
                assert f"  RANK={rank}\n" in body and f"  LOCAL_RANK={rank}\n" in body
            assert "-m cockpit.train.worker" in body and "WORLD_SIZE=2" in body
            assert "nproc_per_node: 2" in body  # the YAML is still there

    asyncio.run(scenario())


# -- 4. ZeRO in Setup maps to zero_stage / offload (#4) -------------------------------------------
ZERO_CASES = [("zero2", False, 2, None), ("zero3", False, 3, None), ("zero3", True, 3, "optimizer+params"), ("zero2", True, 2, "optimizer")]


@pytest.mark.parametrize("strategy,offload,stage,off", ZERO_CASES)
def test_zero_strategy_writes_the_keys_deepspeed_configs_are_generated_from(env, strategy, offload, stage, off):
    from cockpit.config.load import load_config
    from cockpit.strategy import deepspeed as ds
    from cockpit.ui.forms import FormModel
    from cockpit.ui.presets import REPO_PRESETS, load_preset

    m = FormModel()
    m.fill(load_preset(REPO_PRESETS / "cpu-demo.yaml"))
    m.values.update(strategy=strategy, offload=offload, nproc_per_node="2")
    typed = m.typed()
    assert typed["zero_stage"] == stage and typed.get("offload") == off and "deepspeed" not in typed
    path = write_yaml(env / f"{strategy}.yaml", typed)
    cfg = load_config(path, check_paths=False)  # the schema and strategy rules of `cockpit check`
    generated = ds.generate(cfg.keys_only())
    assert generated["zero_optimization"]["stage"] == stage
    assert ds.check(generated, cfg.keys_only(), "generated") == []
    back = FormModel()
    back.fill(load_preset(path))
    assert (back.values["strategy"], back.values["offload"]) == (strategy, offload)


@pytest.mark.slow
def test_zero3_offload_from_setup_passes_cockpit_check(env):
    """The full check: HF's "auto" filling and DeepSpeed's own parser (a child process)."""
    from cockpit.ui.forms import FormModel
    from cockpit.ui.presets import REPO_PRESETS, load_preset

    m = FormModel()
    m.fill(load_preset(REPO_PRESETS / "cpu-demo.yaml"))
    m.values.update(strategy="zero3", offload=True, nproc_per_node="2")
    path = write_yaml(env / "z3.yaml", m.typed())
    res = cockpit("check", str(path), "--json", "--no-devices", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["ok"] is True


# -- 5. the Tune button (#8) ----------------------------------------------------------------------
TUNE_ANSWER = {
    "ok": True, "out": "/tmp/tuned.yaml", "cap_gb": 60.0, "message": "micro-batch 8 x accumulation 1 is the fastest that fits",
    "chosen": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "tokens_per_s": 1234.5, "peak_gb": 41.2},
    "trials": [
        {"micro_batch": 4, "accumulation": 2, "tokens_per_s": 900.0, "peak_gb": 22.0, "status": "fits"},
        {"micro_batch": 8, "accumulation": 1, "tokens_per_s": 1234.5, "peak_gb": 41.2, "status": "fits"},
        {"micro_batch": 16, "accumulation": 1, "tokens_per_s": None, "peak_gb": None, "status": "oom"},
    ],
}


def test_tune_fills_micro_batch_and_accumulation(env, monkeypatch):
    """Against the `cockpit tune --json` contract (a fake CLI answer), and the error when the
    command is missing."""
    from textual.widgets import Input

    from cockpit.ui import cli_calls

    calls: list[tuple] = []
    answer = {"res": cli_calls.CliResult(0, TUNE_ANSWER, json.dumps(TUNE_ANSWER), "")}

    def fake(*args, **kw):
        calls.append(args)
        assert args[0] == "tune" and args[2:4] == ("--json", "--out"), args
        assert Path(args[1]).is_file()
        return answer["res"]

    monkeypatch.setattr(cli_calls, "run_cli", fake)

    async def scenario() -> None:
        from cockpit.ui.screens.modals import Decide

        app = make_app(env / "runs")
        async with app.run_test(size=(120, 40)) as pilot:
            scr = app.screen
            messages: list[str] = []
            notify = scr.notify
            scr.notify = lambda message, **kw: (messages.append(str(message)), notify(message, **kw))[1]
            await wait_for(pilot, lambda: "config valid" in text_of(scr, "#problems"), 10, "a valid config")
            await pilot.press("f9")
            await wait_for(pilot, lambda: isinstance(app.screen, Decide), 10, "the trials")
            body = str(app.screen.body)
            assert "oom" in body and "1,234" in body and "→" in body
            await pilot.press("y")
            await wait_for(pilot, lambda: app.screen is scr, 5, "back to Setup")
            assert scr.query_one("#f-per_device_train_batch_size", Input).value == "8"
            assert scr.query_one("#f-gradient_accumulation_steps", Input).value == "1"
            await wait_for(pilot, lambda: "per_device_train_batch_size" in scr.model.yaml() and scr.checked.cfg.per_device_train_batch_size == 8, 5, "the form")
            # no `cockpit tune` in this install: a clear message, the form unchanged
            answer["res"] = cli_calls.CliResult(2, None, "", "cockpit: error: argument command: invalid choice: 'tune'")
            await pilot.press("f9")
            await wait_for(pilot, lambda: any("no `cockpit tune` command" in m for m in messages), 10, "the message")
            assert scr.checked.cfg.per_device_train_batch_size == 8

    asyncio.run(scenario())
    assert len(calls) == 2


# -- 6. relaunch with the hang alert's remedy (#5) ------------------------------------------------
def hung_run(runs: Path, tiny_model_dir: Path) -> tuple[object, subprocess.Popen]:
    """A run dir as a hung run leaves it: a resolved config, two steps, the watchdog's real
    alert, and a supervisor that answers nothing (a sleeping process in its own session)."""
    from cockpit.config.load import dump_resolved, validate
    from cockpit.run.watchdog import HangWatchdog
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import create_run_dir

    cfg = validate({"model_name_or_path": str(tiny_model_dir), "template": "chatml", "dataset": "cockpit_identity",
                    "max_steps": 2, "cutoff_len": 64, "per_device_train_batch_size": 2, "use_cpu": True,
                    "save_steps": 1000, "env": {"MY_SETTING": "kept"}})
    run = create_run_dir(runs, "hung-demo")
    run.config_path.write_text(dump_resolved(cfg), encoding="utf-8")
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    run.update_status(state="running", run_id=run.run_id, attempt=1, supervisor_pid=fake.pid, step=2, total_steps=10)
    t0 = time.time() - 400
    dog = HangWatchdog(floor_s=300, start_t=t0)
    with EventWriter(run.events_path) as w:
        w.emit("run_started", run_id=run.run_id, model="tiny", dataset="cockpit_identity", method="lora", world_size=1, total_steps=10)
        w.emit("state", state="running")
        for step in (1, 2):
            dog.observe_step(step, t0 + step)
            w.emit("step", step=step, total_steps=10, loss=2.0 / step, lr=1e-3)
        alert = dog.check(time.time(), ranks_alive=True, last_lines={0: "[rank0] all_reduce ..."})
        assert alert and alert["code"] == "hang"
        w.emit("alert", **alert)
    return run, fake


@pytest.mark.slow
def test_relaunch_after_a_hang_alert_adds_the_remedy_env(env, monkeypatch, tiny_model_dir):
    import yaml

    from cockpit.store.rundir import RunDir, list_runs
    from cockpit.ui.screens.live import LiveScreen

    runs = env / "runs"
    run, fake = hung_run(runs, tiny_model_dir)
    monkeypatch.setattr(LiveScreen, "RELAUNCH_STOP_GRACE_S", 0.5)
    monkeypatch.setattr(LiveScreen, "RELAUNCH_KILL_GRACE_S", 0.5)
    new_run: dict = {}

    async def scenario() -> None:
        from cockpit.ui.screens.modals import Decide

        app = make_app(runs, start="runs", follow=False)
        async with app.run_test(size=(120, 40)) as pilot:
            app.open_live(RunDir(run.path))
            await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen) and app.screen.state.alerts, 10, "the live screen")
            live = app.screen
            await wait_for(pilot, lambda: "r: stop and relaunch" in text_of(live, "#alerts"), 5, "the hint")
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, Decide), 5, "the confirmation")
            body = str(app.screen.body)
            for line in ("NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,COLL", "NCCL_NET_PLUGIN=none", "RCCL_NET_PLUGIN=none"):
                assert line in body
            await pilot.press("y")
            await wait_for(
                pilot,  # mounted too: an app left while the screen's Mount is pending tears its panes down under it
                lambda: isinstance(app.screen, LiveScreen) and app.screen is not live and app.screen.is_mounted,
                180,
                "the new run's live screen",
            )
            new_run["dir"] = app.screen.run.path
            assert run.pending("stop") and run.pending("kill")  # nothing answered the stop, nor the kill

    try:
        asyncio.run(scenario())
        assert fake.wait(timeout=10) == -signal.SIGKILL  # the unanswering supervisor was killed
        new = Path(new_run["dir"])
        assert new != run.path and [r.path for r in list_runs(runs)][-1] == new
        cfg = yaml.safe_load((new / "config.yaml").read_text())
        assert cfg["env"] == {"MY_SETTING": "kept", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL",
                              "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                              "NCCL_NET_PLUGIN": "none", "RCCL_NET_PLUGIN": "none"}
        assert cfg["model_name_or_path"] == str(tiny_model_dir) and cfg["max_steps"] == 2
    finally:
        if fake.poll() is None:
            os.killpg(fake.pid, signal.SIGKILL)
            fake.wait()
        if new_run.get("dir"):
            cockpit("stop", str(new_run["dir"]), "--kill", "--wait", "60")


# -- 7. sparklines redraw a few times a second, however fast events arrive -------------------------
def test_sparklines_redraw_at_most_a_few_times_per_second(env):
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import RunDir, create_run_dir
    from cockpit.ui.screens.live import LiveScreen

    run = create_run_dir(env / "runs", "fast")
    run.update_status(state="running", run_id=run.run_id)
    with EventWriter(run.events_path) as w:
        w.emit("train_begin", total_steps=100000)
    redraws: list[float] = []
    stop = threading.Event()
    written = {"n": 0}

    def writer() -> None:
        with EventWriter(run.events_path) as w:
            step = 0
            while not stop.is_set():
                for _ in range(20):
                    step += 1
                    w.emit("step", step=step, total_steps=100000, loss=1.0 + 1.0 / step, lr=1e-3, grad_norm=1.0, tokens_per_s=100.0)
                written["n"] = step
                time.sleep(0.002)

    async def scenario() -> None:
        app = make_app(env / "runs", start="runs")
        async with app.run_test(size=(120, 40)) as pilot:
            app.open_live(RunDir(run.path))
            await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen) and app.screen.replay_progress is None, 10, "live")
            live = app.screen
            original = live.draw

            from cockpit.ui.panes import SparkGrid

            sparks = live.query_one("#sparks", SparkGrid)

            def counting() -> None:
                before = sparks.drawn.get("loss")
                original()
                if sparks.drawn.get("loss") != before:
                    redraws.append(time.monotonic())

            live.draw = counting
            th = threading.Thread(target=writer, daemon=True)
            t0 = time.monotonic()
            th.start()
            await pilot.pause(3.0)
            stop.set()
            th.join()
            elapsed = time.monotonic() - t0
            await wait_for(pilot, lambda: live.state.step == written["n"], 10, "the last step drawn")
            assert written["n"] > 1000  # hundreds of events per second
            assert len(redraws) <= 4 * elapsed + 3, (len(redraws), elapsed)
            assert live.state.series["loss"].n == written["n"]

    asyncio.run(scenario())


# -- the stage and its keys in the Method form (issue 17) -----------------------------------------
def test_method_form_holds_the_stage_and_its_keys_checked_as_you_type(env):
    from textual.widgets import Input, Select

    async def scenario() -> None:
        app = make_app(env / "runs")
        async with app.run_test(size=(120, 40)) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: "config valid" in text_of(scr, "#problems"), 10, "a valid config")
            assert scr.query_one("#f-stage", Select).value == "sft"  # the SFT demo
            assert not any(scr.query_one(f"#row-{k}").display for k in ("pref_loss", "pref_beta", "pref_ftx", "simpo_gamma"))
            scr.query_one("#preset", Select).value = str(ROOT / "presets" / "cpu-dpo-demo.yaml")  # picked, as a user does
            await wait_for(pilot, lambda: scr.query_one("#f-stage", Select).value == "dpo", 10, "the DPO preset's stage")
            await pilot.pause(0.3)  # the filled widgets' Changed messages
            assert scr.query_one("#f-pref_loss", Select).value == "sigmoid"
            await wait_for(pilot, lambda: scr.query_one("#row-pref_loss").display, 5, "the DPO keys shown")
            assert scr.query_one("#f-pref_beta", Input).value == "0.1" and scr.query_one("#f-pref_ftx", Input).value == "1"
            scr.query_one("#f-pref_beta", Input).value = "-1"
            await wait_for(pilot, lambda: "pref_beta" in text_of(scr, "#problems"), 10, "the pref_beta problem")
            assert scr.query_one("#f-pref_beta").has_class("-invalid") and scr.checked.cfg is None
            scr.query_one("#f-pref_beta", Input).value = "0.2"
            scr.query_one("#f-pref_loss", Select).value = "simpo"
            await wait_for(pilot, lambda: scr.checked.cfg and scr.checked.cfg.pref_loss == "simpo", 10, "a valid SimPO config")
            assert scr.checked.cfg.stage == "dpo" and scr.checked.cfg.pref_beta == 0.2
            assert not scr.query_one("#f-pref_beta").has_class("-invalid")
            scr.query_one("#f-stage", Select).value = "kto"
            await wait_for(pilot, lambda: scr.model.raw().get("stage") == "kto", 10, "stage kto in the form's config")
            await wait_for(pilot, lambda: not scr.query_one("#row-pref_loss").display, 5, "DPO's keys hidden for KTO")
            assert scr.query_one("#row-pref_beta").display and not scr.query_one("#row-simpo_gamma").display

    asyncio.run(scenario())


def test_a_pane_redraws_when_the_state_is_changed_in_place():
    """Live's panes compare what they would show with what they show: a reducer that mutates an object
    instead of replacing it (the old redraw keys were the ids of the state's objects) still redraws."""
    from textual.app import App

    from cockpit.telemetry.base import empty_device
    from cockpit.ui.panes import AlertsPane, DevicesPane
    from cockpit.ui.state import RunState

    gpu = {**empty_device(0, "AMD Instinct MI300X"), "vram_used_mb": 1024.0, "vram_total_mb": 196592.0}
    state = RunState()
    state.apply([{"v": 1, "t": 1.0, "kind": "telemetry", "backend": "amdsmi", "devices": [gpu], "ranks": []}])

    class Panes(App):
        def compose(self):
            yield DevicesPane(id="devices")
            yield AlertsPane(id="alerts")

    async def scenario() -> tuple[str, str]:
        app = Panes()
        async with app.run_test(size=(100, 20)) as pilot:
            pane = app.query_one(DevicesPane)
            pane.show_state(state, 8)
            await pilot.pause()
            before = str(pane.content)
            state.telemetry["devices"][0]["vram_used_mb"] = 150000.0  # in place: the same dict objects
            pane.show_state(state, 8)
            await pilot.pause()
            return before, str(pane.content)

    before, after = asyncio.run(scenario())
    assert "1.0 GiB/192.0 GiB" in before and "146.5 GiB/192.0 GiB" in after
