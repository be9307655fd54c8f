"""Communication health probe for real (2 gloo ranks on CPU) and the comm environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cockpit.comm.env import KEY_VARS, comm_env, missing_key_vars
from cockpit.comm.health import bandwidths, busbw_factor


def test_busbw_factor_is_the_nccl_tests_allreduce_definition():
    assert busbw_factor(1) == 0.0
    assert busbw_factor(2) == 1.0
    assert busbw_factor(4) == 1.5
    assert busbw_factor(8) == 1.75
    algbw, busbw = bandwidths(64 * 2**20, 0.001, 8)
    assert algbw == pytest.approx(67.108864)  # GB/s = 1e9 bytes/s
    assert busbw == pytest.approx(67.108864 * 1.75)
    assert bandwidths(1, 0.0, 2) == (0.0, 0.0)


_WORKER = r"""
import json, os, sys
import torch.distributed as dist
from cockpit.comm.health import allreduce_probe, backend_info

rank, world, init_file, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
before = backend_info()
dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
result = {"before": before, "info": backend_info(),
          "probe": allreduce_probe(sizes_bytes=(1000, 4096, 65536), iters=3, warmup=1)}
dist.destroy_process_group()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
    json.dump(result, fh)
"""


@pytest.fixture(scope="module")
def two_rank_probe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe")
    init_file = tmp / "init"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(rank), "2", str(init_file), str(tmp)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(p.returncode == 0 for p in procs), outputs
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def test_backend_info_before_and_after_init(two_rank_probe):
    for rank, result in enumerate(two_rank_probe):
        assert result["before"]["initialized"] is False and result["before"]["backend"] is None
        info = result["info"]
        assert info["initialized"] is True
        assert (info["backend"], info["library"], info["world_size"], info["rank"]) == ("gloo", "gloo", 2, rank)
        assert info["torch"]


def test_allreduce_probe_over_gloo(two_rank_probe):
    probes = [r["probe"] for r in two_rank_probe]
    for probe in probes:
        assert probe["ok"] is True and probe["backend"] == "gloo" and probe["world_size"] == 2
        assert [r["size_bytes"] for r in probe["results"]] == [1000, 4096, 65536]
        for row in probe["results"]:
            assert row["ok"] is True and row["time_us"] > 0
            expected_alg = row["size_bytes"] / (row["time_us"] / 1e6) / 1e9
            assert row["algbw_gbps"] == pytest.approx(expected_alg, rel=0.01, abs=1e-3)
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * busbw_factor(2), rel=0.01, abs=1e-3)
    # the slowest rank's time is shared: both ranks report the same numbers
    assert probes[0]["results"] == probes[1]["results"]


def test_comm_env_orders_key_vars_first_then_the_rest():
    env = {
        "PATH": "/usr/bin",
        "NCCL_SOCKET_IFNAME": "=eth0",
        "HSA_NO_SCRATCH_RECLAIM": "1",
        "NCCL_DEBUG": "INFO",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "RCCL_MSCCL_ENABLE": "0",
        "NCCL_ALGO": "Ring",
        "GPU_MAX_HW_QUEUES": "2",
        "HIP_VISIBLE_DEVICES": "0,1",
    }
    out = comm_env(env)
    assert list(out) == [
        "NCCL_DEBUG",
        "NCCL_SOCKET_IFNAME",
        "GPU_MAX_HW_QUEUES",
        "HSA_NO_SCRATCH_RECLAIM",
        "NCCL_ALGO",
        "RCCL_MSCCL_ENABLE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    ]
    assert out["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert "PATH" not in out and "HIP_VISIBLE_DEVICES" not in out
    assert missing_key_vars(env) == [v for v in KEY_VARS if v not in env]
    assert "HSA_FORCE_FINE_GRAIN_PCIE" in missing_key_vars(env)


def test_importing_comm_does_not_import_torch():
    code = "import sys, cockpit.comm.health, cockpit.comm.env, cockpit.comm.nccl_log; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip() == "False"
