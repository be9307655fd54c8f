"""The GPU presets (issue 7): each validates, plans offline to fit its device, and sets its arch.

Pure Python: the planner runs from its built-in catalogue (use_meta=False, no torch import here).
Only a preset with zero_stage makes load_config check the generated DeepSpeed config in a child
process, as ``cockpit check`` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.config.load import load_config, read_yaml
from cockpit.plan import plan

PRESETS = Path(__file__).resolve().parent.parent / "presets"
FAMILIES = {"mi300x": ("gfx942", 192), "mi325x": ("gfx942", 256), "mi355x": ("gfx950", 288), "mi250": ("gfx90a", 64),
            "mi210": ("gfx90a", 64)}  # fmt: skip
EXPECTED = {
    "mi300x-lora-8b",
    "mi300x-qlora-70b",
    "mi300x-full-8b-fsdp8",
    "mi300x-lora-70b-zero3-8",
    "mi250-lora-8b",
    "mi250-qlora-70b",
    "mi250-full-8b-fsdp8",
    "mi250-lora-70b-zero3-8",
    "mi210-lora-8b",
    "mi325x-lora-8b",
    "mi355x-lora-8b",
    "mi300x-lora-qwen3-30b-a3b",
    "mi300x-lora-qwen3-235b-a22b-zero3-8",  # mixture-of-experts (issue 64)
}
GPU_PRESETS = sorted(p for p in PRESETS.glob("*.yaml") if p.name.split("-")[0] in FAMILIES)


def family(path: Path) -> tuple[str, int]:
    return FAMILIES[path.name.split("-")[0]]


def test_all_expected_presets_exist():
    assert {p.stem for p in GPU_PRESETS} == EXPECTED


@pytest.mark.parametrize("path", GPU_PRESETS, ids=lambda p: p.stem)
def test_preset_validates_with_embedded_model(path):
    cfg = load_config(path, ["model_name_or_path=smollm2-135m-instruct"], check_paths=True)
    assert cfg.model_name_or_path == "smollm2-135m-instruct"
    assert cfg.bf16 is True and cfg.fp16 is False
    assert cfg.dataset == "cockpit_identity,cockpit_bilingual"
    assert not cfg.use_cpu
    world = cfg.nproc_per_node * cfg.nnodes
    assert world in (1, 8), "AMD's guidance: 1 or 8 GPUs per collective, not 2 or 4"
    name = path.stem
    if "fsdp" in name:
        assert cfg.fsdp == "full_shard auto_wrap" and cfg.finetuning_type == "full"
    if "zero3" in name:
        assert cfg.zero_stage == 3 and cfg.finetuning_type == "lora" and world == 8
    if "qlora" in name:
        assert cfg.quantization_bit == 4 and world == 1


@pytest.mark.parametrize("path", GPU_PRESETS, ids=lambda p: p.stem)
def test_preset_plans_to_fit_its_device(path):
    raw, _ = read_yaml(path)
    cfg = load_config(path, check_paths=False)
    assert "/" in raw["model_name_or_path"], "plans with its real hub-id model"
    _arch, gib = family(path)
    res = plan(cfg, gpu_memory_gb=gib, use_meta=False)  # the validated config: zero_stage read as is
    assert res.model_source == "catalogue"
    assert res.verdict["status"] in ("fits", "tight"), (path.name, res.as_dict()["verdict"], res.suggestion)


@pytest.mark.parametrize("path", GPU_PRESETS, ids=lambda p: p.stem)
def test_preset_env_matches_family(path):
    raw, _ = read_yaml(path)
    env = raw["env"]
    arch, _gib = family(path)
    assert env["PYTORCH_ROCM_ARCH"] == arch
    multi = int(raw.get("nproc_per_node", 1)) * int(raw.get("nnodes", 1)) > 1
    if multi:
        assert env["TORCH_NCCL_HIGH_PRIORITY"] == "1" and env["GPU_MAX_HW_QUEUES"] == "2"
    if path.name.startswith("mi300x") and multi:
        assert env["NCCL_MIN_NCHANNELS"] == "112"
    if not path.name.startswith("mi300x"):
        assert "NCCL_MIN_NCHANNELS" not in env, "112 channels is an MI300X setting"
    text = path.read_text(encoding="utf-8")
    for name in env:  # every env line carries its reason and source
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{name}:"))
        assert "# " in line and "source:" in line and "http" in line, line
