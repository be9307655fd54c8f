"""Telemetry backends, backend selection and the Sampler (fakes at the hardware boundary)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time

import pytest

from cockpit.store.events import encode
from cockpit.telemetry import Sampler, select_backend
from cockpit.telemetry.amd import AmdSmiBackend, load_amdsmi
from cockpit.telemetry.base import DEVICE_KEYS, call_with_timeout, quiet_output
from cockpit.telemetry.cpu import CpuBackend, RankProcesses
from cockpit.telemetry.fakes import FakeAmdSmi, FakeGpu, FakeNvml
from cockpit.telemetry.nvml import NvmlBackend, load_nvml


def test_amdsmi_backend_reads_units_and_static_info():
    gpus = [FakeGpu(), FakeGpu(market_name="AMD Instinct MI250X", gfx_target="gfx90a", compute_units=110,
                              numa_node=1, current_socket_power="N/A", average_socket_power=402,
                              temp_hotspot_c=0xFFFF, processes=[(4242, 3 * 2**30)])]
    backend, reason = AmdSmiBackend.open(FakeAmdSmi(gpus))
    assert reason is None
    mi300, mi250 = backend.devices()
    assert set(DEVICE_KEYS) <= set(mi300)
    assert mi300["vram_total_mb"] == 196592 and mi300["vram_used_mb"] == 1024  # MB straight through
    assert mi300["power_w"] == 512  # current_socket_power (MI300+)
    assert mi300["temp_c"] == 61 and mi300["temp_edge_c"] == 45  # hotspot preferred
    assert mi300["gfx_target"] == "gfx942" and mi300["compute_units"] == 304 and mi300["numa_node"] == 0
    assert mi250["power_w"] == 402  # falls back to average_socket_power (MI200)
    assert mi250["temp_hotspot_c"] is None and mi250["temp_c"] == 45  # 0xFFFF sentinel -> edge
    assert mi250["processes"] == [{"pid": 4242, "vram_mb": 3072.0}]  # bytes -> MiB
    assert mi250["name"] == "AMD Instinct MI250X" and mi250["numa_node"] == 1


def test_amdsmi_unsupported_metric_is_none_and_not_asked_forever():
    smi = FakeAmdSmi([FakeGpu(gfx_activity="N/A")], fail={"amdsmi_get_power_info"})
    backend, _ = AmdSmiBackend.open(smi)
    for _ in range(5):
        dev = backend.devices()[0]
    assert dev["power_w"] is None and dev["util_pct"] is None
    assert dev["vram_used_mb"] == 1024  # other metrics unaffected
    assert smi.calls.count("amdsmi_get_power_info") == 3  # gave up after 3 failures


def test_amdsmi_close_shuts_down_once():
    smi = FakeAmdSmi()
    backend, _ = AmdSmiBackend.open(smi)
    backend.close()
    backend.close()
    assert smi.calls.count("amdsmi_shut_down") == 1


def test_no_gpu_means_unavailable_with_reason():
    backend, reason = AmdSmiBackend.open(FakeAmdSmi([]))
    assert backend is None and "no GPU" in reason


def test_nvml_backend_converts_bytes_and_milliwatts():
    nvml = FakeNvml([FakeGpu(market_name="NVIDIA H100", vram_total_mb=81559, vram_used_mb=2048,
                             current_socket_power=312.5, processes=[(7, 2**30)])])
    backend, reason = NvmlBackend.open(nvml)
    assert reason is None
    (dev,) = backend.devices()
    assert dev["name"] == "NVIDIA H100"
    assert dev["vram_total_mb"] == 81559.0 and dev["vram_used_mb"] == 2048.0
    assert dev["power_w"] == 312.5
    assert dev["processes"] == [{"pid": 7, "vram_mb": 1024.0}]


def test_select_backend_order_and_reasons():
    backend, unavailable = select_backend(amdsmi_module=FakeAmdSmi(), nvml_module=FakeNvml())
    assert backend.name == "amdsmi" and unavailable == {"nvml": "not tried: amdsmi is active"}

    backend, unavailable = select_backend(amdsmi_module=FakeAmdSmi([]), nvml_module=FakeNvml())
    assert backend.name == "nvml" and "no GPU" in unavailable["amdsmi"]


def test_real_libraries_on_this_machine_fail_quietly(capfd):
    """No ROCm and no NVIDIA driver here: the real packages must give reasons, not output."""
    backend, unavailable = select_backend()
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    if backend.name != "cpu":
        pytest.skip(f"a real GPU library works here ({backend.name})")
    assert set(unavailable) == {"amdsmi", "nvml"}
    assert all(isinstance(r, str) and 0 < len(r) <= 160 for r in unavailable.values())


def test_amdsmi_import_failure_in_a_fresh_interpreter_prints_nothing():
    """The KeyError-after-print import of amdsmi 7.0.2, from a clean process (no cached module)."""
    code = (
        "from cockpit.telemetry.amd import load_amdsmi\n"
        "import json, sys\n"
        "mod, reason = load_amdsmi()\n"
        "sys.stderr.write(json.dumps({'ok': mod is not None, 'reason': reason}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout == ""
    result = json.loads(proc.stderr)
    if result["ok"]:
        pytest.skip("amdsmi initialises on this machine")
    assert result["reason"]


def test_quiet_output_catches_python_and_fd_level_writes(capfd):
    with quiet_output() as printed:
        print("from python")
        os.write(1, b"from C\n")
        os.write(2, b"to stderr\n")
        ctypes.CDLL(None).printf(b"from printf\n")  # buffered in libc, flushed before restoring
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert "from python" in printed.getvalue() and "from C" in printed.getvalue()
    assert "from printf" in printed.getvalue()


def test_call_with_timeout_gives_up_on_a_hung_init():
    start = time.monotonic()
    ok, exc = call_with_timeout(lambda: time.sleep(5), 0.2)
    assert not ok and isinstance(exc, TimeoutError)
    assert time.monotonic() - start < 2
    ok, exc = call_with_timeout(lambda: {}["libamd_smi.so"], 1)
    assert not ok and isinstance(exc, KeyError)
    with pytest.raises(KeyboardInterrupt):
        call_with_timeout(lambda: (_ for _ in ()).throw(KeyboardInterrupt()), 1)


def test_load_functions_name_missing_packages():
    mod, reason = load_amdsmi("cockpit_no_such_amdsmi")
    assert mod is None and "not installed" in reason
    mod, reason = load_nvml("cockpit_no_such_pynvml")
    assert mod is None and "not installed" in reason


def test_rank_processes_cpu_percent_needs_a_previous_call_and_dead_pids():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ranks = RankProcesses({0: os.getpid(), 1: child.pid})
        first = ranks.sample()
        assert [e["cpu_pct"] for e in first] == [None, None]  # psutil's first reading is meaningless
        assert all(e["alive"] and e["rss_mb"] > 0 for e in first)
        start = time.process_time()
        while time.process_time() - start < 0.05:  # some CPU for rank 0: 5 clock ticks, however loaded the box
            sum(i * i for i in range(20_000))
        second = ranks.sample()
        assert second[0]["cpu_pct"] is not None and second[0]["cpu_pct"] > 0
        child.kill()
        child.wait()
        third = ranks.sample()
        assert third[1] == {"rank": 1, "pid": child.pid, "alive": False, "rss_mb": None, "cpu_pct": None}
    finally:
        if child.poll() is None:
            child.kill()


def test_sampler_event_shape_interval_and_rank_gpu_mapping():
    gpu = FakeGpu(processes=[(os.getpid(), 5 * 2**30)])
    backend, _ = AmdSmiBackend.open(FakeAmdSmi([gpu]))
    sampler = Sampler({0: os.getpid()}, interval_s=1.0, backend=backend, unavailable={"nvml": "x"})
    snap = sampler.maybe_sample(now=100.0)
    assert snap["backend"] == "amdsmi" and snap["unavailable"] == {"nvml": "x"}
    assert snap["ranks"][0]["gpu"] == 0 and snap["ranks"][0]["gpu_vram_mb"] == 5120.0
    assert sampler.maybe_sample(now=100.5) is None
    assert sampler.maybe_sample(now=101.0) is not None
    line = json.loads(encode("telemetry", **snap))  # valid as an event
    assert line["kind"] == "telemetry" and line["devices"][0]["vram_total_mb"] == 196592


def test_sampler_uses_rank_reported_torch_devices_only_without_a_gpu_library():
    torch_dev = {"index": 0, "name": "AMD Instinct MI300X", "vram_used_mb": 10.0, "vram_total_mb": 20.0,
                 "util_pct": None, "temp_c": None, "power_w": None}
    sampler = Sampler({}, backend=CpuBackend(), unavailable={})
    assert sampler.sample()["backend"] == "cpu"
    snap = sampler.sample(torch_devices=[torch_dev])
    assert snap["backend"] == "torch" and snap["devices"] == [torch_dev]

    gpu_backend, _ = AmdSmiBackend.open(FakeAmdSmi())
    snap = Sampler({}, backend=gpu_backend, unavailable={}).sample(torch_devices=[torch_dev])
    assert snap["backend"] == "amdsmi" and snap["devices"][0]["name"] == "AMD Instinct MI300X"
    assert snap["devices"][0]["vram_total_mb"] == 196592


def test_sampler_survives_a_backend_that_starts_failing():
    class Broken(CpuBackend):
        name = "amdsmi"

        def devices(self):
            raise RuntimeError("GPU fell off the bus")

    snap = Sampler({}, backend=Broken(), unavailable={}).sample()
    assert snap["devices"] == [] and "fell off the bus" in snap["unavailable"]["amdsmi"]


def test_rank_memory_stats_on_cpu():
    from cockpit.telemetry import rank_memory_stats, torch_device_memory

    stats = rank_memory_stats()
    assert set(stats) == {"allocated_mb", "reserved_mb", "peak_mb", "rss_mb", "capacity_mb", "source"}
    import torch

    if torch.cuda.is_available():
        pytest.skip("GPU torch: CPU branch not exercised")
    assert stats["allocated_mb"] is None and stats["rss_mb"] > 0 and stats["source"] == "rss"
    assert stats["capacity_mb"] > stats["rss_mb"]  # the host's RAM
    assert torch_device_memory() is None


def test_rank_memory_stats_from_the_live_tensor_tracker_peak_since_the_last_call():
    import torch

    from cockpit.plan.measure import live_tensor_bytes
    from cockpit.telemetry import rank_memory_stats

    if torch.cuda.is_available():
        pytest.skip("GPU torch: CPU branch not exercised")
    mode = live_tensor_bytes()
    with mode:
        big = torch.ones(4 * 2**20 // 4)  # 4 MiB
        del big
        small = torch.ones(2**20 // 4)  # 1 MiB
        first = rank_memory_stats(tracker=mode, reset_peak=True)
        second = rank_memory_stats(tracker=mode, reset_peak=True)
    assert first["source"] == "live_tensors" and first["reserved_mb"] is None
    assert first["peak_mb"] == pytest.approx(4.0, abs=0.1) and first["allocated_mb"] == pytest.approx(1.0, abs=0.1)
    assert second["peak_mb"] == pytest.approx(1.0, abs=0.1)  # the 4 MiB peak was before the reset
    del small


def test_importing_telemetry_does_not_import_torch_or_textual():
    code = "import sys, cockpit.telemetry; print('torch' in sys.modules, 'textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["False", "False"]
