"""Plain facts about torch and the GPUs, gathered in one place so checks can be fed fakes.

``torch_facts()`` is the only function here that imports torch. Everything it returns is
plain data (strings, ints, lists), so tests build a :class:`TorchFacts` by hand for an
MI250X or an MI300X box and run the real checks on it.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

# Product -> gfx target (base name, without the :sramecc+:xnack- feature suffix).
# Sources: ROCm "GPU hardware specifications" table (rocm.docs.amd.com/en/latest/reference/
# gpu-arch-specs.html): MI50/MI60 gfx906, MI100 gfx908, MI210/MI250/MI250X gfx90a,
# MI300A/MI300X/MI325X gfx942, MI350X/MI355X gfx950.
PRODUCT_TARGETS: tuple[tuple[str, str], ...] = (
    ("MI355", "gfx950"),
    ("MI350", "gfx950"),
    ("MI325", "gfx942"),
    ("MI300", "gfx942"),
    ("MI250", "gfx90a"),
    ("MI210", "gfx90a"),
    ("MI200", "gfx90a"),
    ("MI100", "gfx908"),
    ("MI60", "gfx906"),
    ("MI50", "gfx906"),
)


def base_target(gcn_arch: str) -> str:
    """'gfx90a:sramecc+:xnack-' -> 'gfx90a'."""
    return gcn_arch.split(":", 1)[0].strip().lower()


def target_for(name: str, gcn_arch: str = "") -> str:
    """The device's gfx target: from gcnArchName, else guessed from the product name."""
    if gcn_arch and base_target(gcn_arch).startswith("gfx"):
        return base_target(gcn_arch)
    upper = name.upper()
    for product, target in PRODUCT_TARGETS:
        if product in upper:
            return target
    return ""


def parse_arch_list(value: str) -> list[str]:
    """PYTORCH_ROCM_ARCH / an arch list: 'gfx90a;gfx942', 'gfx90a gfx942' -> base targets."""
    return [base_target(p) for p in re.split(r"[;,\s]+", value or "") if p.strip()]


def is_warp64(target: str) -> bool:
    """CDNA / GCN (gfx9xx) run 64-wide wavefronts; RDNA (gfx10+) 32."""
    return bool(re.fullmatch(r"gfx9[0-9a-f]{1,2}", target))


# Compute units per device (one GCD of an MI250 / MI250X; a whole MI300X in SPX mode), from AMD's
# CDNA2 / CDNA3 specs. torch names both CDNA2 dual-GCD parts "AMD Instinct MI250X/MI250": the CUs tell.
CUS_PER_GCD = {110: "MI250X", 104: "MI250"}
MI300X_CUS = 304  # 8 XCDs x 38 CUs; CPX mode shows each XCD as a device of 38 CUs, DPX 2 x 4, QPX 4 x 2
MI300X_PARTITIONS = {304: ("SPX", 1), 152: ("DPX", 2), 76: ("QPX", 4), 38: ("CPX", 8)}


def product_of(name: str, compute_units: int) -> tuple[str, str | None]:
    """(the product, its compute partition or None) from torch's device name and compute units:
    MI250 vs MI250X by CUs per GCD; an MI300X in a CPX / DPX / QPX partition mode (one physical GPU
    shown as several devices, each with its share of CUs and memory)."""
    upper = name.upper()
    if "MI250" in upper and compute_units in CUS_PER_GCD:
        return CUS_PER_GCD[compute_units], None
    if "MI300X" in upper and compute_units in MI300X_PARTITIONS:
        mode, parts = MI300X_PARTITIONS[compute_units]
        return "MI300X", None if parts == 1 else f"{mode}: 1/{parts} of a GPU ({compute_units} CUs)"
    return name, None


@dataclass
class DeviceFacts:
    index: int
    name: str
    total_memory: int  # bytes (a partition's share in CPX / NPS modes: what the planner must use)
    gcn_arch: str = ""  # torch's gcnArchName, e.g. 'gfx90a:sramecc+:xnack-' ('' on CUDA)
    compute_units: int = 0  # torch's multi_processor_count (CUs on ROCm)

    @property
    def target(self) -> str:
        return target_for(self.name, self.gcn_arch)

    @property
    def product(self) -> str:
        return product_of(self.name, self.compute_units)[0]

    @property
    def partition(self) -> str | None:
        return product_of(self.name, self.compute_units)[1]


@dataclass
class TorchFacts:
    importable: bool
    error: str = ""
    version: str = ""
    hip: str | None = None  # torch.version.hip
    cuda: str | None = None  # torch.version.cuda
    cuda_available: bool = False
    device_count: int = 0
    devices: list[DeviceFacts] = field(default_factory=list)
    arch_list: list[str] = field(default_factory=list)  # torch.cuda.get_arch_list()
    lib_dir: str = ""  # torch/lib
    nccl_version: str | None = None  # torch.cuda.nccl.version(): RCCL's on ROCm
    device_error: str = ""

    @property
    def build(self) -> str:
        if not self.importable:
            return "none"
        if self.hip:
            return "rocm"
        if self.cuda:
            return "cuda"
        return "cpu"


def torch_facts() -> TorchFacts:
    """Import torch and read what the checks need. Never raises."""
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet):
            import torch
    except Exception as exc:  # ImportError, or a broken install raising OSError/RuntimeError
        return TorchFacts(importable=False, error=f"{type(exc).__name__}: {exc}")
    facts = TorchFacts(
        importable=True,
        version=str(torch.__version__),
        hip=getattr(torch.version, "hip", None),
        cuda=getattr(torch.version, "cuda", None),
        lib_dir=str(Path(torch.__file__).parent / "lib"),
    )
    if facts.build == "cpu":
        return facts
    try:
        facts.cuda_available = bool(torch.cuda.is_available())
        facts.device_count = int(torch.cuda.device_count()) if facts.cuda_available else 0
        facts.arch_list = [str(a) for a in torch.cuda.get_arch_list()]
        for i in range(facts.device_count):
            props = torch.cuda.get_device_properties(i)
            facts.devices.append(
                DeviceFacts(
                    index=i,
                    name=str(props.name),
                    total_memory=int(props.total_memory),
                    gcn_arch=str(getattr(props, "gcnArchName", "") or ""),
                    compute_units=int(getattr(props, "multi_processor_count", 0) or 0),
                )
            )
    except Exception as exc:  # driver trouble shows here, not at import
        facts.device_error = f"{type(exc).__name__}: {exc}"
    try:
        v = torch.cuda.nccl.version()
        facts.nccl_version = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        facts.nccl_version = None
    return facts


def _probe(module: str, package: str, init: str, count: str, shutdown: str, label: str) -> tuple[bool, str]:
    """Import a telemetry library quietly, init it, count GPUs, shut it down. Never raises.

    amdsmi 7.x on a machine without ROCm prints to stdout and then raises KeyError on import;
    both are caught here (stdout too: ``cockpit doctor --json`` must print JSON alone).
    """
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        try:
            lib = importlib.import_module(module)
        except ModuleNotFoundError:
            return False, f"{package} not installed"
        except Exception as exc:
            said = quiet.getvalue().strip().splitlines()
            return False, f"{module} import failed ({type(exc).__name__}: {exc})" + (f": {said[0]}" if said else "")
        try:
            getattr(lib, init)()
            try:
                n = getattr(lib, count)()
            finally:
                getattr(lib, shutdown)()
        except Exception as exc:
            return False, f"{label} unavailable ({type(exc).__name__}: {exc})"
    return True, f"{label} sees {n if isinstance(n, int) else len(n)} GPU(s)"


def probe_amdsmi() -> tuple[bool, str]:
    return _probe("amdsmi", "amdsmi", "amdsmi_init", "amdsmi_get_processor_handles", "amdsmi_shut_down", "amdsmi")


def probe_nvml() -> tuple[bool, str]:
    return _probe("pynvml", "nvidia-ml-py", "nvmlInit", "nvmlDeviceGetCount", "nvmlShutdown", "NVML")
