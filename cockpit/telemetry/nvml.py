"""NVIDIA GPUs through NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package).

Facts relied on (nvidia-ml-py 13.615's ``pynvml.py`` and the NVML API reference; pinned by
``tests/test_telemetry_contract.py``):

- ``nvmlInit()`` raises ``NVMLError_LibraryNotFound`` ("NVML Shared Library Not Found") when
  ``libnvidia-ml.so.1`` cannot be loaded, other ``NVMLError_*`` subclasses when the driver
  is unusable.
- ``nvmlDeviceGetMemoryInfo(h)`` -> ``c_nvmlMemory_t`` with ``total``/``free``/``used`` in
  bytes.
- ``nvmlDeviceGetUtilizationRates(h)`` -> ``c_nvmlUtilization_t`` with ``gpu``/``memory`` in
  percent over the last sample period.
- ``nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)`` -> degrees Celsius.
- ``nvmlDeviceGetPowerUsage(h)`` -> milliwatts.
- ``nvmlDeviceGetName(h)`` -> str (pynvml decodes the bytes).
- ``nvmlDeviceGetComputeRunningProcesses(h)`` -> objects with ``pid`` and ``usedGpuMemory``
  (bytes, or None where not available).
"""

from __future__ import annotations

import importlib
from typing import Any

from cockpit.telemetry.base import VendorBackend, empty_device, mib, number, quiet_output, short_reason

NVML_API = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetComputeRunningProcesses",
    "NVML_TEMPERATURE_GPU",
    "NVMLError",
)

_NOT_AVAILABLE = 0xFFFFFFFF


def load_nvml(module_name: str = "pynvml") -> tuple[Any, str | None]:
    """Import pynvml and call nvmlInit quietly: (module, None) or (None, reason)."""
    with quiet_output():
        try:
            mod = importlib.import_module(module_name)
        except (KeyboardInterrupt, SystemExit):
            raise
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None, "nvidia-ml-py is not installed"
            return None, f"import pynvml failed: {short_reason(exc)}"
        except BaseException as exc:  # noqa: BLE001
            return None, f"import pynvml failed: {short_reason(exc)}"
        try:
            mod.nvmlInit()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001
            if type(exc).__name__ == "NVMLError_LibraryNotFound":
                return None, "libnvidia-ml.so.1 not found (no NVIDIA driver)"
            return None, f"nvmlInit failed: {short_reason(exc)}"
    return mod, None


class NvmlBackend(VendorBackend):
    name = "nvml"
    label = "NVML"
    load = staticmethod(load_nvml)

    def __init__(self, nvml: Any):
        self._nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._names = []
        for handle in self._handles:
            try:
                self._names.append(str(nvml.nvmlDeviceGetName(handle)))
            except Exception:
                self._names.append(None)

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception:
            return None

    def devices(self) -> list[dict[str, Any]]:
        nvml = self._nvml
        out = []
        for index, handle in enumerate(self._handles):
            dev = empty_device(index, self._names[index] or f"NVIDIA GPU {index}")
            mem = self._try(nvml.nvmlDeviceGetMemoryInfo, handle)
            if mem is not None:
                dev["vram_used_mb"] = mib(mem.used)  # bytes -> MiB
                dev["vram_total_mb"] = mib(mem.total)
            util = self._try(nvml.nvmlDeviceGetUtilizationRates, handle)
            if util is not None:
                dev["util_pct"] = number(util.gpu, invalid_at=_NOT_AVAILABLE)
                dev["mem_util_pct"] = number(util.memory, invalid_at=_NOT_AVAILABLE)
            temp = self._try(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            dev["temp_c"] = number(temp, invalid_at=_NOT_AVAILABLE)  # degrees C
            milliwatts = number(self._try(nvml.nvmlDeviceGetPowerUsage, handle), invalid_at=_NOT_AVAILABLE)
            dev["power_w"] = None if milliwatts is None else round(milliwatts / 1000.0, 1)  # mW -> W
            procs = self._try(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            dev["processes"] = [
                {"pid": getattr(p, "pid", None), "vram_mb": mib(getattr(p, "usedGpuMemory", None))} for p in procs
            ]
            out.append(dev)
        return out

    def close(self) -> None:
        if self._nvml is None:
            return
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        self._nvml = None
