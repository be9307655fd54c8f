"""The planner's host-RAM line: the load-time peak per node for the run's strategy (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.config.load import read_yaml
from cockpit.plan import plan
from cockpit.plan.host import READ_BYTES, PROCESS_BYTES

PRESETS = Path(__file__).resolve().parent.parent / "presets"
ZERO3_70B = sorted(PRESETS.glob("*-70b-zero3-*.yaml"))
TiB_GIB = 2048.0  # a 2 TB MI300X node


def host(cfg: dict, gib: float) -> dict:
    return plan(cfg, host_memory_gb=gib, use_meta=False, suggest=False).as_dict()["host"]


def test_read_size_matches_the_loader():
    from cockpit.train.sharded_load import READ_BYTES as LOADER

    assert READ_BYTES == LOADER


@pytest.mark.parametrize("path", ZERO3_70B, ids=lambda p: p.stem)
def test_70b_zero3_presets_fit_a_2tb_node_and_ddp_loading_would_not_fit_a_smaller_one(path):
    cfg, _lines = read_yaml(path)
    sharded = host(cfg, TiB_GIB)
    assert sharded["verdict"]["status"] == "fits" and "sharded" in sharded["pattern"]
    model = sharded["model_bytes"]
    assert 130e9 < model < 150e9  # 70.6B parameters in bf16
    assert sharded["peak_bytes"] == pytest.approx(8 * READ_BYTES + 8 * PROCESS_BYTES)  # shards live on the GPUs
    ddp = {k: v for k, v in cfg.items() if k != "zero_stage"}  # the same run, every rank loading the whole model
    full = host(ddp, 1024.0)
    assert full["peak_bytes"] == pytest.approx(8 * model + 8 * PROCESS_BYTES)
    assert full["verdict"]["status"] == "does not fit"  # 8 x 141 GB on a 1 TiB node
    assert host(cfg, 1024.0)["verdict"]["status"] == "fits"


def test_cpu_sharded_run_keeps_one_copy_per_node_at_most():
    cfg = {"model_name_or_path": "meta-llama/Llama-3.1-8B", "use_cpu": True, "nproc_per_node": 2, "fsdp": "full_shard"}
    h = host(cfg, 64.0)
    model = h["model_bytes"]  # fp32 on the CPU
    assert h["peak_bytes"] == pytest.approx(model + 2 * READ_BYTES + 2 * PROCESS_BYTES)  # 2 shards of 1/2 on the host
    ddp = host({**cfg, "fsdp": None}, 64.0)
    assert ddp["peak_bytes"] - h["peak_bytes"] == pytest.approx(model - 2 * READ_BYTES)


def test_plan_cli_prints_the_host_line_and_fails_when_it_does_not_fit(tmp_path):
    from tests.conftest import cockpit, write_yaml

    path = PRESETS / "mi300x-lora-70b-zero3-8.yaml"
    ok = cockpit("plan", str(path), "--gpu-memory", "192", "--host-memory", "2048")
    assert ok.returncode == 0 and "host RAM at load, per node" in ok.stdout and "FITS on 2048 GiB of host RAM" in ok.stdout
    cfg, _ = read_yaml(path)
    ddp = write_yaml(tmp_path / "ddp.yaml", {k: v for k, v in cfg.items() if k != "zero_stage"})
    bad = cockpit("plan", str(ddp), "--gpu-memory", "192", "--host-memory", "512")
    assert bad.returncode == 1 and "DOES NOT FIT on 512 GiB of host RAM" in bad.stdout
    assert cockpit("plan", str(path), "--host-memory", "0").returncode == 2
