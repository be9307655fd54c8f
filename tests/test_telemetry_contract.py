"""Contract tests: our backends and fakes against the REAL amdsmi / pynvml packages.

Neither native library exists on CI, so the C side is simulated at the ctypes boundary:

- amdsmi 7.0.2 loads ``libamd_smi.so`` in ``amdsmi_wrapper.find_smi_library()`` through
  ``ctypes.CDLL(location)`` and then reads every C symbol as an attribute of that object.
  Patching ``ctypes.CDLL`` during the import gives the real Python package (interface code,
  struct layouts, dict keys, enums, exceptions) on top of a simulated C library.
- pynvml resolves C symbols through the module global ``nvmlLib`` (``_nvmlGetFunctionPointer``);
  setting it to a simulated library makes the real wrappers run.

The simulated C functions fill the ctypes structs the real wrappers pass them, in the C API's
units (MB, degrees C and W for amdsmi; bytes and milliwatts for NVML).
"""

from __future__ import annotations

import ast
import ctypes
import importlib
import inspect
import sys
from pathlib import Path
from unittest import mock

import pytest

from cockpit.telemetry import amd, nvml
from cockpit.telemetry.amd import AMDSMI_API, AmdSmiBackend
from cockpit.telemetry.fakes import FakeAmdSmi, FakeGpu, FakeNvml
from cockpit.telemetry.nvml import NVML_API, NvmlBackend, load_nvml

amdsmi_spec = importlib.util.find_spec("amdsmi")
pynvml_spec = importlib.util.find_spec("pynvml")


class SimLib:
    """A ctypes.CDLL stand-in: attribute lookup yields C functions; unknown ones return 0."""

    def __init__(self, handlers: dict | None = None):
        self._handlers = handlers or {}
        self._fns: dict[str, object] = {}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        fns = self.__dict__["_fns"]
        if name not in fns:
            handler = self.__dict__["_handlers"].get(name, lambda *args: 0)
            fn = lambda *args, _h=handler: _h(*args)  # noqa: E731 - needs restype/argtypes slots
            fns[name] = _CFunction(fn)
        return fns[name]


class _CFunction:
    def __init__(self, fn):
        self.fn, self.restype, self.argtypes = fn, None, None

    def __call__(self, *args):
        return self.fn(*args)


def _obj(ref):
    """The ctypes object behind ``ctypes.byref(x)`` (or x itself)."""
    return getattr(ref, "_obj", ref)


# -- amdsmi ------------------------------------------------------------------------------
def _amd_c_library() -> dict:
    def handles(*args):
        count, array = _obj(args[-2]), args[-1]
        count.value = 1
        if isinstance(array, ctypes.Array):
            array[0] = 0x1000
        return 0

    def vram(handle, ref):
        _obj(ref).vram_total, _obj(ref).vram_used = 196592, 2048  # MB
        return 0

    def activity(handle, ref):
        _obj(ref).gfx_activity, _obj(ref).umc_activity, _obj(ref).mm_activity = 93, 41, 0xFFFF
        return 0

    def power(handle, ref):
        _obj(ref).current_socket_power, _obj(ref).average_socket_power = 640, 0xFFFF  # W
        return 0

    def temp(handle, sensor, metric, ref):
        _obj(ref).value = {0: 48, 1: 71}[int(sensor)]  # EDGE, HOTSPOT; degrees C
        return 0

    def asic(handle, ref):
        info = _obj(ref)
        info.market_name, info.target_graphics_version, info.num_of_compute_units = b"AMD Instinct MI300X", 0x942, 304
        info.vendor_id, info.device_id = 0x1002, 0x74A1
        return 0

    def numa(handle, ref):
        _obj(ref).value = 1
        return 0

    def processes(handle, count_ref, array):
        _obj(count_ref).value = 1
        array[0].pid, array[0].name, array[0].memory_usage.vram_mem = 4321, b"python", 3 * 2**30  # bytes
        return 0

    return {
        "amdsmi_get_socket_handles": handles,
        "amdsmi_get_processor_handles": handles,
        "amdsmi_get_gpu_vram_usage": vram,
        "amdsmi_get_gpu_activity": activity,
        "amdsmi_get_power_info": power,
        "amdsmi_get_temp_metric": temp,
        "amdsmi_get_gpu_asic_info": asic,
        "amdsmi_get_gpu_topo_numa_affinity": numa,
        "amdsmi_get_gpu_process_list": processes,
    }


@pytest.fixture(scope="module")
def real_amdsmi():
    """The installed amdsmi package on a simulated libamd_smi.so; sys.modules restored after."""
    if amdsmi_spec is None:
        pytest.skip("amdsmi not installed (pip install amdsmi==7.0.2)")
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "amdsmi" or k.startswith("amdsmi.")}
    lib = SimLib(_amd_c_library())
    try:
        with mock.patch.object(ctypes, "CDLL", lambda *a, **k: lib):
            module = importlib.import_module("amdsmi")
        yield module
    finally:
        for k in [k for k in sys.modules if k == "amdsmi" or k.startswith("amdsmi.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _params(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()]


def test_every_amdsmi_name_we_use_exists_with_a_compatible_signature(real_amdsmi):
    fake = FakeAmdSmi()
    for name in AMDSMI_API:
        real_attr = getattr(real_amdsmi, name)  # AttributeError = the API moved
        fake_attr = getattr(fake, name)
        if inspect.isfunction(real_attr):
            assert _params(fake_attr) == _params(real_attr), name
    for enum_name, members in {
        "AmdSmiTemperatureType": ("EDGE", "HOTSPOT"),
        "AmdSmiTemperatureMetric": ("CURRENT",),
        "AmdSmiInitFlags": ("INIT_AMD_GPUS",),
    }.items():
        for member in members:
            assert int(getattr(getattr(fake, enum_name), member)) == int(getattr(getattr(real_amdsmi, enum_name), member))
    assert issubclass(real_amdsmi.AmdSmiLibraryException, real_amdsmi.AmdSmiException)


def test_amd_backend_touches_only_the_declared_api():
    tree = ast.parse(Path(amd.__file__).read_text())
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and (node.attr.startswith("amdsmi_") or node.attr.startswith("AmdSmi"))
    }
    assert used and used <= set(AMDSMI_API), used - set(AMDSMI_API)
    tree = ast.parse(Path(nvml.__file__).read_text())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.lower().startswith("nvml")}
    assert used and used <= set(NVML_API), used - set(NVML_API)


def test_fake_amdsmi_returns_the_keys_of_the_real_functions(real_amdsmi):
    handle = sys.modules["amdsmi.amdsmi_wrapper"].amdsmi_processor_handle(0x1000)
    fake = FakeAmdSmi([FakeGpu(processes=[(1, 2)])])
    fake_handle = fake.amdsmi_get_processor_handles()[0]
    for name in (
        "amdsmi_get_gpu_vram_usage",
        "amdsmi_get_gpu_activity",
        "amdsmi_get_power_info",
        "amdsmi_get_gpu_asic_info",
    ):
        real = getattr(real_amdsmi, name)(handle)
        assert set(getattr(fake, name)(fake_handle)) == set(real), name
    real_proc = real_amdsmi.amdsmi_get_gpu_process_list(handle)[0]
    fake_proc = fake.amdsmi_get_gpu_process_list(fake_handle)[0]
    assert set(fake_proc) == set(real_proc)
    assert set(fake_proc["memory_usage"]) == set(real_proc["memory_usage"])
    assert isinstance(real_amdsmi.amdsmi_get_gpu_topo_numa_affinity(handle), int)
    assert real_amdsmi.amdsmi_get_gpu_asic_info(handle)["target_graphics_version"] == "gfx942"


def test_amd_backend_end_to_end_on_the_real_package(real_amdsmi):
    real_amdsmi.amdsmi_init(real_amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    backend, reason = AmdSmiBackend.open(real_amdsmi)
    assert reason is None
    (dev,) = backend.devices()
    assert dev["name"] == "AMD Instinct MI300X" and dev["gfx_target"] == "gfx942"
    assert dev["compute_units"] == 304 and dev["numa_node"] == 1
    assert (dev["vram_total_mb"], dev["vram_used_mb"]) == (196592, 2048)
    assert (dev["util_pct"], dev["mem_util_pct"]) == (93, 41)
    assert (dev["temp_c"], dev["temp_edge_c"], dev["temp_hotspot_c"]) == (71, 48, 71)
    assert dev["power_w"] == 640
    assert dev["processes"] == [{"pid": 4321, "vram_mb": 3072.0}]
    backend.close()


def test_real_amdsmi_not_supported_error_becomes_none(real_amdsmi):
    """A C status != success raises the real AmdSmiLibraryException; the backend shrugs."""
    wrapper = sys.modules["amdsmi.amdsmi_wrapper"]
    original = wrapper.amdsmi_get_power_info
    wrapper.amdsmi_get_power_info = _CFunction(lambda *a: wrapper.AMDSMI_STATUS_NOT_SUPPORTED)
    try:
        with pytest.raises(real_amdsmi.AmdSmiLibraryException):
            real_amdsmi.amdsmi_get_power_info(wrapper.amdsmi_processor_handle(0x1000))
        backend, _ = AmdSmiBackend.open(real_amdsmi)
        assert backend.devices()[0]["power_w"] is None
    finally:
        wrapper.amdsmi_get_power_info = original


# -- NVML --------------------------------------------------------------------------------
@pytest.fixture()
def pynvml_module():
    if pynvml_spec is None:
        pytest.skip("nvidia-ml-py not installed")
    return importlib.import_module("pynvml")


def test_nvml_on_this_machine_stops_at_library_not_found(pynvml_module):
    try:
        pynvml_module.nvmlInit()
    except pynvml_module.NVMLError_LibraryNotFound:
        pass
    else:
        pynvml_module.nvmlShutdown()
        pytest.skip("a real NVIDIA driver is present")
    module, reason = load_nvml()
    assert module is None and "libnvidia-ml.so.1 not found" in reason
    assert issubclass(FakeNvml.NVMLError_LibraryNotFound, FakeNvml.NVMLError)
    with pytest.raises(FakeNvml.NVMLError_LibraryNotFound):
        FakeNvml(missing_library=True).nvmlInit()


def test_every_nvml_name_we_use_exists_with_a_compatible_signature(pynvml_module):
    fake = FakeNvml()
    for name in NVML_API:
        real_attr = getattr(pynvml_module, name)
        fake_attr = getattr(fake, name)
        if inspect.isfunction(real_attr):
            assert _params(fake_attr) == _params(real_attr), name
    assert fake.NVML_TEMPERATURE_GPU == pynvml_module.NVML_TEMPERATURE_GPU


def _nvml_c_library(pynvml_module) -> dict:
    def count(ref):
        _obj(ref).value = 1
        return 0

    def name(handle, buf, size):
        buf.value = b"NVIDIA H100 80GB HBM3"
        return 0

    def memory(handle, ref):
        m = _obj(ref)
        m.total, m.used, m.free = 80 * 2**30, 2 * 2**30, 78 * 2**30  # bytes
        return 0

    def utilization(handle, ref):
        _obj(ref).gpu, _obj(ref).memory = 77, 30
        return 0

    def uint(value):
        def fn(*args):
            _obj(args[-1]).value = value
            return 0

        return fn

    def procs(handle, count_ref, array):
        _obj(count_ref).value = 1
        if array is None:
            return pynvml_module.NVML_ERROR_INSUFFICIENT_SIZE
        array[0].pid, array[0].usedGpuMemory = 999, 2**30
        return 0

    return {
        "nvmlDeviceGetCount_v2": count,
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetUtilizationRates": utilization,
        "nvmlDeviceGetTemperature": uint(55),  # degrees C
        "nvmlDeviceGetPowerUsage": uint(312500),  # milliwatts
        "nvmlDeviceGetComputeRunningProcesses_v3": procs,
    }


@pytest.fixture()
def simulated_nvml(pynvml_module):
    lib = SimLib(_nvml_c_library(pynvml_module))
    with mock.patch.object(pynvml_module, "nvmlLib", lib), mock.patch.dict(
        pynvml_module._nvmlGetFunctionPointer_cache, clear=True
    ):
        pynvml_module.nvmlInit()
        yield pynvml_module
    pynvml_module._nvmlGetFunctionPointer_cache.clear()


def test_fake_nvml_structures_match_the_real_ones(simulated_nvml):
    handle = simulated_nvml.nvmlDeviceGetHandleByIndex(0)
    fake = FakeNvml([FakeGpu(processes=[(1, 2)])])
    fake_handle = fake.nvmlDeviceGetHandleByIndex(0)
    real_mem = simulated_nvml.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(real_mem, simulated_nvml.c_nvmlMemory_t)
    for real, fake_value in (
        (real_mem, fake.nvmlDeviceGetMemoryInfo(fake_handle)),
        (simulated_nvml.nvmlDeviceGetUtilizationRates(handle), fake.nvmlDeviceGetUtilizationRates(fake_handle)),
    ):
        fields = [f[0] for f in type(real)._fields_]
        assert sorted(vars(fake_value)) == sorted(fields)
    real_proc = simulated_nvml.nvmlDeviceGetComputeRunningProcesses(handle)[0]
    fake_proc = fake.nvmlDeviceGetComputeRunningProcesses(fake_handle)[0]
    assert {"pid", "usedGpuMemory"} <= set(vars(fake_proc)) and {"pid", "usedGpuMemory"} <= set(vars(real_proc))
    assert isinstance(simulated_nvml.nvmlDeviceGetName(handle), str)


def test_nvml_backend_end_to_end_on_the_real_package(simulated_nvml):
    backend, reason = NvmlBackend.open(simulated_nvml)
    assert reason is None
    (dev,) = backend.devices()
    assert dev["name"] == "NVIDIA H100 80GB HBM3"
    assert (dev["vram_total_mb"], dev["vram_used_mb"]) == (81920.0, 2048.0)
    assert (dev["util_pct"], dev["temp_c"], dev["power_w"]) == (77, 55, 312.5)
    assert dev["processes"] == [{"pid": 999, "vram_mb": 1024.0}]
    backend.close()
