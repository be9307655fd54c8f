"""One device decision (cockpit/device.py) for preflight, ranks, planner, doctor gate and UI:
every preset is classified; a GPU preset on this GPU-less machine is refused at preflight (exit 2,
with the doctor's reasons) and blocked by the launch gate, where "Launch anyway" still works."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.conftest import ROOT, cockpit

PRESETS = sorted((ROOT / "presets").glob("*.yaml"))
CPU_PRESETS = {"cpu-demo", "cpu-dpo-demo", "cpu-grpo-demo", "cpu-grpo-hack", "cpu-vlm-demo"}


def _preset(path: Path) -> dict:
    from cockpit.config.load import load_config

    return load_config(path, check_paths=False)


def _gpus_here() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_resolve_device_rules():
    from cockpit.device import CPU, GPU, NoGPU, describe, needs_gpu, resolve_device

    assert resolve_device(True, None, 8) == CPU  # asked for the CPU: the CPU, even beside GPUs
    assert resolve_device(True, 4, 0) == CPU
    assert resolve_device(None, None, 0) == CPU and resolve_device(None, None, 2) == GPU  # never asked: wherever it can
    assert resolve_device(False, None, 1) == GPU and resolve_device(None, 4, 1) == GPU
    for use_cpu, quantization_bit in ((False, None), ("false", None), (None, 4)):
        assert needs_gpu(use_cpu, quantization_bit)
        with pytest.raises(NoGPU) as err:
            resolve_device(use_cpu, quantization_bit, 0, reasons=["GPUs visible to torch: none"])
        assert "will not fall back to the CPU" in str(err.value) and "doctor: GPUs visible to torch: none" in str(err.value)
        assert all(p.key == "use_cpu" for p in err.value.problems)
    assert describe(False, None).startswith("gpu, required") and describe(True, None).startswith("cpu")


def test_every_preset_is_classified():
    from cockpit.device import needs_gpu
    from cockpit.doctor.relevance import config_tags

    assert len(PRESETS) >= 10
    for path in PRESETS:
        cfg = _preset(path)
        gpu = path.stem not in CPU_PRESETS
        assert needs_gpu(cfg.use_cpu, cfg.quantization_bit) is gpu, path.name
        assert ("gpu" in config_tags(cfg.keys_only())) is gpu, path.name
        if gpu:  # declared in the file, not inferred
            assert "use_cpu: false" in path.read_text(), path.name


@pytest.mark.slow
def test_gpu_presets_are_blocked_by_the_launch_gate_here():
    """The real doctor on this machine, run as the gate runs it (``--needs`` the config's tags)."""
    if _gpus_here():
        pytest.skip("this machine has a GPU")
    from cockpit.doctor import run_checks
    from cockpit.doctor.relevance import blocking_for_config, config_tags

    by_tags: dict[frozenset, list] = {}
    for path in PRESETS:
        cfg = _preset(path)
        tags = frozenset(config_tags(cfg.keys_only()))
        if tags not in by_tags:
            by_tags[tags] = run_checks(needs=tags)
        blocking = {c.id for c in blocking_for_config(by_tags[tags], cfg.keys_only())}
        if path.stem in CPU_PRESETS:
            assert not blocking & {"torch", "gpu_visible"}, (path.name, blocking)
        else:
            assert {"torch", "gpu_visible"} <= blocking, (path.name, blocking)


@pytest.mark.slow
def test_gpu_preset_fails_at_preflight_with_the_doctors_reasons(tmp_path):
    if _gpus_here():
        pytest.skip("this machine has a GPU")
    res = cockpit("check", str(ROOT / "presets" / "mi300x-lora-8b.yaml"), timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "needs GPUs (use_cpu: false)" in res.stderr and "doctor: GPUs visible to torch" in res.stderr
    res = cockpit("train", str(ROOT / "presets" / "mi300x-lora-8b.yaml"), "--runs-dir", str(tmp_path / "runs"), timeout=300)
    assert res.returncode == 2 and "will not fall back to the CPU" in res.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run was started
    # on purpose: the same preset with use_cpu true passes the device gate (then stops at the model, not the device)
    res = cockpit("check", str(ROOT / "presets" / "mi300x-lora-8b.yaml"), "--set", "use_cpu=true", timeout=300)
    assert "needs GPUs" not in res.stderr


def test_setup_blocks_a_gpu_preset_here_and_launch_anyway_still_launches(tmp_path, monkeypatch):
    """Setup with a GPU preset and this machine's doctor: F8 shows the GPU findings; "Launch
    anyway" hands the config to ``cockpit train`` (which refuses it at preflight, exit 2)."""
    if _gpus_here():
        pytest.skip("this machine has a GPU")
    from cockpit.doctor import run_checks
    from cockpit.doctor.relevance import config_tags
    from cockpit.ui import cli_calls
    from tests.test_ui_pilot import wait_for
    from tests.test_ui_setup_live import make_app, text_of

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    preset = ROOT / "presets" / "mi250-lora-8b.yaml"
    checks = [c.to_dict() for c in run_checks(needs=config_tags(_preset(preset).keys_only()))]
    launched: list[str] = []
    monkeypatch.setattr(cli_calls, "train_detached", lambda path, runs_dir, timeout=600, secrets=None, on_stage=None: launched.append(str(path)) or cli_calls.CliResult(2, None, "", "use_cpu: this config needs GPUs"))

    async def scenario() -> None:
        from cockpit.ui.screens.modals import Decide

        app = make_app(tmp_path / "runs", checks, start_preset=str(preset))
        async with app.run_test(size=(120, 40)) as pilot:
            scr = app.screen
            # cockpit check's refusal, shown before any launch (issue 62, item 3); F8 still offers "Launch anyway"
            await wait_for(pilot, lambda: "this config needs GPUs" in text_of(scr, "#problems"), 15, "check's refusal")
            await pilot.press("f8")
            await wait_for(pilot, lambda: isinstance(app.screen, Decide), 15, "the doctor modal")
            body = str(app.screen.body)
            assert "GPUs visible to torch" in body, body
            await pilot.press("y")  # Launch anyway
            await wait_for(pilot, lambda: launched, 10, "the launch")

    asyncio.run(scenario())
    assert launched and "use_cpu: false" in Path(launched[0]).read_text()


def test_worker_refuses_a_gpu_config_without_gpus():
    """The rank's own resolution (a config launched with --skip-check): exit 2, no CPU training."""
    if _gpus_here():
        pytest.skip("this machine has a GPU")
    from cockpit.config.run_config import RunConfig
    from cockpit.errors import InputError
    from cockpit.train.arguments import trains_on_cpu as _use_cpu

    with pytest.raises(InputError, match="will not fall back"):
        _use_cpu(RunConfig(use_cpu=False))
    assert _use_cpu(RunConfig(use_cpu=None)) is True and _use_cpu(RunConfig(use_cpu=True)) is True
