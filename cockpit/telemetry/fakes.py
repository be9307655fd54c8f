"""Stand-ins for the vendor libraries at the hardware boundary (tests, demos without GPUs).

``FakeAmdSmi`` and ``FakeNvml`` behave like the *initialised* ``amdsmi`` / ``pynvml`` modules
for exactly the calls the backends make (``amd.AMDSMI_API``, ``nvml.NVML_API``): same names,
same parameters, same returned keys/fields and units. ``tests/test_telemetry_contract.py``
checks that against the installed packages, so a fake cannot drift from the real library.

    backend, reason = AmdSmiBackend.open(FakeAmdSmi([FakeGpu()]))
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import IntEnum
from types import SimpleNamespace
from typing import Any


@dataclass
class FakeGpu:
    """One GPU as the library reports it, in the library's own units."""

    market_name: str = "AMD Instinct MI300X"
    gfx_target: str = "gfx942"
    compute_units: int = 304
    numa_node: int = 0
    bdf: str = "0000:0c:00.0"
    vram_total_mb: int = 196592  # amdsmi: MB; NVML fake: converted to bytes
    vram_used_mb: int = 1024
    gfx_activity: Any = 87  # percent, or "N/A"
    umc_activity: Any = 40
    temp_edge_c: int = 45
    temp_hotspot_c: int = 61
    current_socket_power: Any = 512  # W (MI300+)
    average_socket_power: Any = "N/A"  # W (MI200 and older)
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, vram bytes)


# -- amdsmi ------------------------------------------------------------------------------
class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int):
        super().__init__(err_code)
        self.err_code = err_code


class _Handle:
    def __init__(self, index: int):
        self.index = index


class FakeAmdSmi:
    """``fail``: names of calls that raise AmdSmiLibraryException(2) (AMDSMI_STATUS_NOT_SUPPORTED)."""

    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException

    def __init__(self, gpus: list[FakeGpu] | None = None, fail: set[str] | None = None, hang: set[str] | None = None):
        self.gpus = list(gpus if gpus is not None else [FakeGpu()])
        self.fail = set(fail or ())
        self.hang = set(hang or ())  # calls that never return, as a driver's in a GPU hang
        self.calls: list[str] = []
        self.initialised = False

    def _gpu(self, name: str, processor_handle: _Handle) -> FakeGpu:
        self.calls.append(name)
        if name in self.fail:
            raise AmdSmiLibraryException(2)
        if name in self.hang:
            threading.Event().wait()
        return self.gpus[processor_handle.index]

    def amdsmi_init(self, flag=AmdSmiInitFlags.INIT_AMD_GPUS):
        self.calls.append("amdsmi_init")
        self.initialised = True

    def amdsmi_shut_down(self):
        self.calls.append("amdsmi_shut_down")
        self.initialised = False

    def amdsmi_get_processor_handles(self):
        self.calls.append("amdsmi_get_processor_handles")
        return [_Handle(i) for i in range(len(self.gpus))]

    def amdsmi_get_gpu_device_bdf(self, processor_handle):
        return self._gpu("amdsmi_get_gpu_device_bdf", processor_handle).bdf

    def amdsmi_get_gpu_asic_info(self, processor_handle):
        gpu = self._gpu("amdsmi_get_gpu_asic_info", processor_handle)
        return {
            "market_name": gpu.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": "0x0000000000000000",
            "oam_id": 0,
            "num_compute_units": gpu.compute_units,
            "target_graphics_version": gpu.gfx_target,
            "subsystem_id": "0x74a1",
        }

    def amdsmi_get_gpu_topo_numa_affinity(self, processor_handle):
        return self._gpu("amdsmi_get_gpu_topo_numa_affinity", processor_handle).numa_node

    def amdsmi_get_gpu_vram_usage(self, processor_handle):
        gpu = self._gpu("amdsmi_get_gpu_vram_usage", processor_handle)
        return {"vram_total": gpu.vram_total_mb, "vram_used": gpu.vram_used_mb}

    def amdsmi_get_gpu_activity(self, processor_handle):
        gpu = self._gpu("amdsmi_get_gpu_activity", processor_handle)
        return {"gfx_activity": gpu.gfx_activity, "umc_activity": gpu.umc_activity, "mm_activity": "N/A"}

    def amdsmi_get_temp_metric(self, processor_handle, sensor_type, metric):
        gpu = self._gpu("amdsmi_get_temp_metric", processor_handle)
        if sensor_type == AmdSmiTemperatureType.HOTSPOT:
            return gpu.temp_hotspot_c
        return gpu.temp_edge_c

    def amdsmi_get_power_info(self, processor_handle):
        gpu = self._gpu("amdsmi_get_power_info", processor_handle)
        return {
            "socket_power": "N/A",
            "current_socket_power": gpu.current_socket_power,
            "average_socket_power": gpu.average_socket_power,
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": 750,
        }

    def amdsmi_get_gpu_process_list(self, processor_handle):
        gpu = self._gpu("amdsmi_get_gpu_process_list", processor_handle)
        return [
            {
                "name": "python",
                "pid": pid,
                "mem": vram,
                "engine_usage": {"gfx": 0, "enc": 0},
                "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": vram},
                "cu_occupancy": "N/A",
            }
            for pid, vram in gpu.processes
        ]


# -- NVML --------------------------------------------------------------------------------
class NVMLError(Exception):
    def __init__(self, value: int = 999):
        super().__init__(value)
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's name
    def __init__(self, value: int = 12):
        super().__init__(value)


class FakeNvml:
    """``missing_library``: nvmlInit raises NVMLError_LibraryNotFound, as on this CI machine."""

    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound

    def __init__(self, gpus: list[FakeGpu] | None = None, missing_library: bool = False):
        self.gpus = list(gpus if gpus is not None else [FakeGpu(market_name="NVIDIA H100 80GB HBM3")])
        self.missing_library = missing_library
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("nvmlInit")
        if self.missing_library:
            raise NVMLError_LibraryNotFound()

    def nvmlShutdown(self):
        self.calls.append("nvmlShutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return _Handle(index)

    def nvmlDeviceGetName(self, handle):
        return self.gpus[handle.index].market_name

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self.gpus[handle.index]
        total, used = gpu.vram_total_mb * 2**20, gpu.vram_used_mb * 2**20  # bytes, like c_nvmlMemory_t
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self.gpus[handle.index]
        return SimpleNamespace(gpu=gpu.gfx_activity, memory=gpu.umc_activity)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self.gpus[handle.index].temp_edge_c

    def nvmlDeviceGetPowerUsage(self, handle):
        return int(self.gpus[handle.index].current_socket_power * 1000)  # milliwatts

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=vram) for pid, vram in self.gpus[handle.index].processes]


FAKE_ENV = "COCKPIT_FAKE_GPUS"


def fake_from_env(value: str | None) -> tuple[str, Any] | None:
    """``COCKPIT_FAKE_GPUS=amdsmi:8`` (or ``nvml:N``): (backend name, initialised fake module)
    with N fake GPUs, for multi-process tests and demos on machines without GPUs; None when unset.
    ``amdsmi:N:hang``: every VRAM query blocks forever (a driver in a GPU hang)."""
    if not value:
        return None
    name, _, rest = value.partition(":")
    count, _, mode = rest.partition(":")
    n = int(count or 1)
    gpus = [  # different levels per GPU, so that a screen shows which is which
        FakeGpu(
            bdf=f"0000:{0x0C + i:02x}:00.0",
            numa_node=i * 2 // max(n, 1),
            vram_used_mb=int(196592 * (0.35 + 0.08 * i)),
            gfx_activity=60 + 5 * i,
            temp_hotspot_c=50 + 3 * i,
            current_socket_power=400 + 25 * i,
        )
        for i in range(n)
    ]
    if name == "amdsmi":
        module: Any = FakeAmdSmi(gpus, hang={"amdsmi_get_gpu_vram_usage"} if mode == "hang" else None)
        module.amdsmi_init()
        return name, module
    if name == "nvml":
        module = FakeNvml(gpus)
        module.nvmlInit()
        return name, module
    raise ValueError(f"{FAKE_ENV}={value!r}: expected amdsmi:N or nvml:N")
