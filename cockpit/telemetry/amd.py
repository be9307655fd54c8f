"""AMD GPUs through the ``amdsmi`` Python package (ROCm's AMD SMI library).

Facts this module relies on (checked against amdsmi 7.0.2's ``amdsmi_interface.py`` and the
AMD SMI C headers/sources; the contract tests in ``tests/test_telemetry_contract.py`` pin the
names and returned keys against the installed package):

- ``import amdsmi`` without ROCm prints two lines to stdout and raises ``KeyError:
  'libamd_smi.so'`` (amdsmi_wrapper.py looks the library up in a dict it failed to fill),
  not ImportError. ``amdsmi_init()`` raises ``AmdSmiLibraryException`` where the library is
  installed but no amdgpu driver is loaded.
- ``amdsmi_get_gpu_vram_usage(h)`` -> ``{"vram_total", "vram_used"}`` in MB; the C library
  divides the DRM byte counts by 1024*1024, so these are MiB (amd_smi.cc,
  ``amdsmi_vram_usage_t``: "In MB").
- ``amdsmi_get_gpu_activity(h)`` -> ``{"gfx_activity", "umc_activity", "mm_activity"}`` in
  percent (0-100), the string "N/A" where unsupported.
- ``amdsmi_get_temp_metric(h, AmdSmiTemperatureType.HOTSPOT|EDGE,
  AmdSmiTemperatureMetric.CURRENT)`` -> int, degrees Celsius (the C library divides the
  kernel's millidegrees by 1000).
- ``amdsmi_get_power_info(h)`` -> ``current_socket_power`` (W, MI300 and newer) and
  ``average_socket_power`` (W, MI200 and older, Navi); "N/A" (0xFFFF) or UINT32_MAX where
  unsupported (``amdsmi_power_info_t``: "Socket power in W").
- ``amdsmi_get_gpu_asic_info(h)`` -> ``market_name``, ``target_graphics_version`` ("gfx90a",
  "gfx942", ...), ``num_compute_units``, ...
- ``amdsmi_get_gpu_topo_numa_affinity(h)`` -> int NUMA node (-1: none).
- ``amdsmi_get_gpu_process_list(h)`` -> list of ``{"name", "pid", "mem", "memory_usage":
  {"gtt_mem", "cpu_mem", "vram_mem"}, ...}``, memory in bytes.

Device record (see ``base.DEVICE_KEYS``) extras: ``temp_edge_c``, ``temp_hotspot_c`` (``temp_c``
is the hotspot/junction temperature when there is one, else edge), ``mem_util_pct``
(umc_activity), ``market_name``, ``gfx_target``, ``compute_units``, ``numa_node``, ``bdf``,
``processes`` ([{pid, vram_mb}]).
"""

from __future__ import annotations

import importlib
from typing import Any

from cockpit.telemetry.base import (
    VendorBackend,
    call_with_timeout,
    empty_device,
    mib,
    number,
    quiet_output,
    short_reason,
)

# Every attribute of the amdsmi module this backend touches. The contract test checks each
# one against the installed package and against the fake in cockpit/telemetry/fakes.py.
AMDSMI_API = (
    "amdsmi_init",
    "amdsmi_shut_down",
    "amdsmi_get_processor_handles",
    "amdsmi_get_gpu_device_bdf",
    "amdsmi_get_gpu_asic_info",
    "amdsmi_get_gpu_topo_numa_affinity",
    "amdsmi_get_gpu_vram_usage",
    "amdsmi_get_gpu_activity",
    "amdsmi_get_temp_metric",
    "amdsmi_get_power_info",
    "amdsmi_get_gpu_process_list",
    "AmdSmiInitFlags",
    "AmdSmiTemperatureType",
    "AmdSmiTemperatureMetric",
    "AmdSmiException",
)

INIT_TIMEOUT_S = 10.0
_UNSUPPORTED = 0xFFFF  # amdsmi's "N/A" sentinel; UINT32_MAX is above it too
_GIVE_UP_AFTER = 3  # consecutive failures of one metric on one device before we stop asking


def load_amdsmi(module_name: str = "amdsmi", timeout_s: float = INIT_TIMEOUT_S) -> tuple[Any, str | None]:
    """Import and initialise amdsmi quietly: (module, None) or (None, short reason)."""
    stage = {"now": "import"}

    def attempt() -> Any:
        mod = importlib.import_module(module_name)
        stage["now"] = "amdsmi_init"
        mod.amdsmi_init(mod.AmdSmiInitFlags.INIT_AMD_GPUS)
        return mod

    with quiet_output():
        ok, value = call_with_timeout(attempt, timeout_s)
    if ok:
        return value, None
    exc = value
    if isinstance(exc, ModuleNotFoundError) and exc.name == module_name:
        return None, "amdsmi is not installed (pip install 'cockpit-tune[amd]')"
    if stage["now"] == "import" and isinstance(exc, KeyError) and "libamd_smi" in str(exc):
        return None, "libamd_smi.so not found (ROCm's amd-smi-lib is not installed)"
    if isinstance(exc, TimeoutError):
        return None, f"{stage['now']} {exc} (driver hung?)"
    if stage["now"] == "import":
        return None, f"import amdsmi failed: {short_reason(exc)}"
    return None, f"amdsmi_init failed ({short_reason(exc)}); is the amdgpu driver loaded?"


class AmdSmiBackend(VendorBackend):
    """Samples every AMD GPU the library sees. Build with :meth:`open` (never raises)."""

    name = "amdsmi"
    label = "amdsmi"
    load = staticmethod(load_amdsmi)

    def __init__(self, smi: Any):
        self._smi = smi
        self._failures: dict[tuple[int, str], int] = {}
        self._handles = list(smi.amdsmi_get_processor_handles())
        self._static = [self._static_info(i, h) for i, h in enumerate(self._handles)]

    # -- helpers --------------------------------------------------------------------------
    def _try(self, index: int, metric: str, fn: Any, *args: Any) -> Any:
        key = (index, metric)
        if self._failures.get(key, 0) >= _GIVE_UP_AFTER:
            return None
        try:
            value = fn(*args)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception:
            self._failures[key] = self._failures.get(key, 0) + 1
            return None
        self._failures.pop(key, None)
        return value

    def _static_info(self, index: int, handle: Any) -> dict[str, Any]:
        smi = self._smi
        asic = self._try(index, "asic", smi.amdsmi_get_gpu_asic_info, handle) or {}
        numa = self._try(index, "numa", smi.amdsmi_get_gpu_topo_numa_affinity, handle)
        bdf = self._try(index, "bdf", smi.amdsmi_get_gpu_device_bdf, handle)
        market = asic.get("market_name")
        cus = asic.get("num_compute_units")
        return {
            "market_name": market if market and market != "N/A" else None,
            "gfx_target": asic.get("target_graphics_version") or None,
            "compute_units": cus if isinstance(cus, int) else None,
            "numa_node": numa if isinstance(numa, int) and numa >= 0 else None,
            "bdf": bdf,
        }

    def _temperature(self, index: int, handle: Any, kind: str) -> float | None:
        smi = self._smi
        sensor = getattr(smi.AmdSmiTemperatureType, kind)
        value = self._try(
            index, f"temp_{kind}", smi.amdsmi_get_temp_metric, handle, sensor, smi.AmdSmiTemperatureMetric.CURRENT
        )
        return number(value, invalid_at=_UNSUPPORTED)

    # -- the backend interface ------------------------------------------------------------
    def devices(self) -> list[dict[str, Any]]:
        smi = self._smi
        out = []
        for index, handle in enumerate(self._handles):
            static = self._static[index]
            dev = empty_device(index, static["market_name"] or static["gfx_target"] or f"AMD GPU {index}")
            dev.update(static)
            vram = self._try(index, "vram", smi.amdsmi_get_gpu_vram_usage, handle) or {}
            dev["vram_used_mb"] = number(vram.get("vram_used"))  # MB (MiB) per amdsmi
            dev["vram_total_mb"] = number(vram.get("vram_total"))
            activity = self._try(index, "activity", smi.amdsmi_get_gpu_activity, handle) or {}
            dev["util_pct"] = number(activity.get("gfx_activity"), invalid_at=_UNSUPPORTED)
            dev["mem_util_pct"] = number(activity.get("umc_activity"), invalid_at=_UNSUPPORTED)
            dev["temp_edge_c"] = self._temperature(index, handle, "EDGE")
            dev["temp_hotspot_c"] = self._temperature(index, handle, "HOTSPOT")
            dev["temp_c"] = dev["temp_hotspot_c"] if dev["temp_hotspot_c"] is not None else dev["temp_edge_c"]
            power = self._try(index, "power", smi.amdsmi_get_power_info, handle) or {}
            current = number(power.get("current_socket_power"), invalid_at=_UNSUPPORTED)
            average = number(power.get("average_socket_power"), invalid_at=_UNSUPPORTED)
            # MI300+ report current_socket_power, MI200 and older average_socket_power; an
            # unsupported field can also read 0, so take the first non-zero reading.
            readings = [v for v in (current, average) if v is not None]
            dev["power_w"] = next((v for v in readings if v), readings[0] if readings else None)
            procs = self._try(index, "processes", smi.amdsmi_get_gpu_process_list, handle)
            dev["processes"] = [
                {"pid": p.get("pid"), "vram_mb": mib((p.get("memory_usage") or {}).get("vram_mem"))}
                for p in (procs or [])
                if isinstance(p, dict)
            ]
            out.append(dev)
        return out

    def close(self) -> None:
        if self._smi is None:
            return
        try:
            self._smi.amdsmi_shut_down()
        except Exception:
            pass
        self._smi = None
