"""Issue 62, item 4: a GPU preset planned on a CPU box pointed three ways. ``cockpit plan
presets/mi300x-lora-8b.yaml --gpus 8 --gpu-memory 192`` said FITS (exit 0) under its own host-RAM line's
"DOES NOT FIT on 23.6 GiB", and Setup's fit line planned the MI300X preset on an assumed 64 GiB MI250 GCD.
Now: the device a preset's header names (``cockpit.plan.devices``) is the capacity unless told otherwise,
one verdict counts every line that has one (the exit code follows), and Setup's fit line is the plan's.
Pure Python (the planner's catalogue, ``use_meta=False``) but for one ``cockpit plan`` call."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.config.load import read_yaml
from cockpit.plan import plan
from cockpit.plan.devices import named_device
from tests.test_presets import FAMILIES, GPU_PRESETS

ROOT = Path(__file__).resolve().parent.parent
MI300X = ROOT / "presets" / "mi300x-lora-8b.yaml"


def test_every_gpu_preset_names_the_device_it_is_sized_for():
    for path in GPU_PRESETS:
        named = named_device(path)
        assert named is not None, path.name
        assert named.gib == FAMILIES[path.name.split("-")[0]][1], (path.name, named)
        assert named.name.lower().startswith(path.name.split("-")[0]), (path.name, named)
    assert named_device(ROOT / "presets" / "cpu-demo.yaml") is None


def test_a_gpu_preset_is_planned_on_its_device_and_the_host_line_counts(monkeypatch):
    from cockpit.commands.plan import render

    raw, _ = read_yaml(MI300X)
    base = {"base_dir": str(MI300X.parent), "use_meta": False, "config_path": str(MI300X)}
    # a box without GPUs: the MI300X the header names, 192 GiB; this box's RAM is not the node's, so the
    # host line has no verdict (it said DOES NOT FIT beside an exit 0)
    d = plan(raw, gpus=8, gpus_visible=0, machine_ram_gb=23.6, **base).as_dict()
    assert d["capacity_gib"] == 192.0 and "MI300X" in d["capacity_source"]
    assert d["host"]["verdict"] is None and d["overall"]["status"] == "fits"
    text = render(d)
    assert "DOES NOT FIT" not in text and "no verdict: planned for GPUs and this machine has none" in text
    assert "verdict: planned peak" in text and "FITS on 192 GiB of an MI300X" in text
    # 8 GPUs here (their memory unknown) and 23.6 GiB of RAM: the host line is judged, and decides
    d = plan(raw, gpus=8, gpus_visible=8, machine_ram_gb=23.6, **base).as_dict()
    assert d["verdict"]["status"] == "fits" and d["host"]["verdict"]["status"] == "does not fit"
    assert d["overall"] == {"status": "does not fit", "by": ["host RAM"]}
    first = render(d).split("\n\n")[-1].splitlines()[0]
    assert first.startswith("verdict: DOES NOT FIT: host RAM at load"), first
    # told otherwise: the memory given wins over the header
    assert plan(raw, gpu_memory_gb=64, gpus_visible=0, **base).capacity_gib == 64.0


def test_cockpit_plan_exits_by_the_one_verdict(tmp_path):
    from tests.conftest import cockpit

    res = cockpit("plan", str(MI300X), "--gpus", "8", "--gpu-memory", "192", "--host-memory", "64", timeout=300)
    assert res.returncode == 1, res.stdout[-1500:] + res.stderr
    assert "verdict: DOES NOT FIT: host RAM at load, per node" in res.stdout, res.stdout[-1500:]
    assert "FITS on 192 GiB" in res.stdout  # the device's own verdict, said after it


@pytest.mark.parametrize("gpus", [0, 8])
def test_setup_fit_line_says_what_plan_says(gpus):
    from cockpit.ui.forms import FormModel, fit_line
    from cockpit.ui.presets import load_preset
    from cockpit.ui.widgets import Machine

    model = FormModel()
    model.fill(load_preset(MI300X))
    cfg = model.check(check_paths=False).cfg
    assert cfg is not None
    machine = Machine("box", gpus, "AMD" if gpus else "", 192.0 if gpus else None, 23.6)
    line = fit_line(cfg, machine, model.gpu_memory(), str(MI300X))
    d = plan(
        cfg.keys_only(),
        base_dir=cfg.base_dir,
        use_meta=False,
        gpus_visible=gpus,
        detected_gpu_gb=machine.gpu_memory_gb,
        machine_ram_gb=23.6,
        config_path=str(MI300X),
    ).as_dict()
    v = d["verdict"]
    assert f"-> {v['status']} on 192 GiB of {d['capacity_source']} ({100 * v['headroom']:.0f}% headroom)" in line, line
    assert "MI250" not in line and "64 GiB" not in line, line
    if gpus == 0:
        assert "an MI300X, as mi300x-lora-8b.yaml's header names it" in line and v["status"] == "fits"
    else:  # 8 ranks on this 23.6 GiB host: the host line decides the one verdict, and the line says it first
        model.values.update(nproc_per_node="8", strategy="ddp")
        eight = fit_line(model.check(check_paths=False).cfg, machine, model.gpu_memory(), str(MI300X))
        assert eight.startswith("fit: does not fit (host RAM at load 127.7 GiB on 23.6 GiB); peak"), eight
        assert "-> fits on 192 GiB of the 8 GPU(s) of this machine" in eight, eight
