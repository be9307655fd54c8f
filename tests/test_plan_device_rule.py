"""``cockpit plan`` and Setup's fit line decide a CPU run by one rule (issue 50, item 7): a YAML without
``use_cpu`` on a host without GPUs trains on the CPU (``cockpit.device.trains_on_cpu``, the rule of
``resolve_device`` that ``cockpit train`` goes by), so both compare the planned peak with the host's
RAM; with a GPU visible neither does. ``cockpit plan`` said "no verdict: pass --gpu-memory GB" there,
Setup "fits" against the RAM, and plan printed a transformers FutureWarning (PEFT's use of a
deprecated alias), now silenced where the planner calls PEFT."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import cockpit

ROOT = Path(__file__).resolve().parent.parent


def demo_without_use_cpu() -> dict:
    raw = yaml.safe_load((ROOT / "presets" / "cpu-demo.yaml").read_text())
    raw.pop("use_cpu", None)
    return raw


@pytest.mark.parametrize("gpus", [0, 1])
def test_plan_and_setup_agree_where_the_run_trains(gpus):
    from cockpit.plan import plan
    from cockpit.ui.forms import FormModel, fit_line
    from cockpit.ui.widgets import Machine

    raw = demo_without_use_cpu()
    model = FormModel()
    model.fill(raw)
    cfg = model.check(check_paths=False).cfg
    assert cfg is not None and cfg.use_cpu is None
    machine = Machine("host", gpus, "AMD" if gpus else "", 64.0 if gpus else None, 23.5)
    line = fit_line(cfg, machine, model.gpu_memory())
    planned = plan(raw, gpus_visible=gpus, host_memory_gb=23.5, base_dir=str(ROOT / "presets"), use_meta=False)
    if gpus == 0:  # a CPU run: both against the host's RAM, the same verdict
        assert "on 23.5 GiB of host RAM" in line, line
        assert planned.verdict is not None and planned.capacity_gib == 23.5
        assert f"-> {planned.verdict['status']} on" in line, line
        assert f"({100 * planned.verdict['headroom']:.0f}% headroom)" in line, line
    else:  # a GPU run: neither compares with the RAM; both with the GPUs this machine has
        assert "host RAM" not in line and "on 64 GiB of the 1 GPU(s) of this machine" in line, line
        assert planned.verdict is None  # plan's caller gave no GPU memory


def test_cockpit_plan_gives_the_verdict_on_a_host_without_gpus(tmp_path):
    from cockpit.plan import host_gpu_count

    if host_gpu_count():
        pytest.skip("this host has GPUs: the YAML would train on one")
    path = tmp_path / "nocpu.yaml"
    path.write_text(yaml.safe_dump(demo_without_use_cpu()))
    res = cockpit("plan", str(path), cwd=str(ROOT / "presets"), timeout=300)
    assert res.returncode == 0, res.stderr
    assert "no verdict" not in res.stdout
    assert "of host RAM (a CPU run)" in res.stdout and "FITS" in res.stdout, res.stdout[-800:]
    assert "FutureWarning" not in res.stderr, res.stderr
