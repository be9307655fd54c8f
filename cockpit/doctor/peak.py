"""A device's peak FLOPs/s, MFU's denominator: a table of GPUs' dense bf16 peaks, and on the CPU a
matmul microbenchmark measured once per host, dtype and thread count, cached in the cache dir.

Only :func:`measure_cpu_tflops` imports torch (lazily): the training ranks call it; the UI never
imports this module (it reads the peak the ranks wrote into ``train_begin``).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cockpit.doctor.facts import MI300X_PARTITIONS, product_of

# Dense (no sparsity) bf16 TFLOPS per device as torch shows it (one GCD of an MI250 / MI250X), from the
# vendors' data sheets; fp16 peaks are the same on these parts. torch names both CDNA2 parts
# "AMD Instinct MI250X/MI250": ``product_of`` tells them apart by compute units (104 vs 110 per GCD).
PEAK_BF16_TFLOPS: dict[str, float] = {
    "MI250": 181.05,
    "MI250X": 191.5,
    "MI300X": 1307.4,
    "MI325X": 1307.4,
    "MI355X": 2500.0,
    "H100": 989.4,  # SXM; the PCIe and NVL parts have lower clocks and are not in the table
    "H200": 989.4,
}
CACHE_FILE = "peak_flops.json"
_NOT_IN_TABLE = ("PCIE", "NVL")  # H100 PCIe / NVL: other peaks


@dataclass(frozen=True)
class Peak:
    """A device's peak: ``tflops`` (None: "peak unknown", ``why`` says so), where it came from."""

    device: str  # the product (MI250X) or torch's name, or the CPU's model
    tflops: float | None
    source: str  # table | measured | cached | unknown
    dtype: str = "bf16"
    why: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def table_product(name: str, compute_units: int) -> tuple[str, int]:
    """(the table's product for torch's device name, how many devices one GPU shows as: an MI300X in
    a CPX / DPX / QPX partition mode has that share of its compute units); ("", 1) when not in the table."""
    product, _ = product_of(name, compute_units)
    upper = product.upper()
    if "MI300X" in upper and compute_units in MI300X_PARTITIONS:
        return "MI300X", MI300X_PARTITIONS[compute_units][1]
    if upper in PEAK_BF16_TFLOPS:
        return upper, 1
    if any(w in upper for w in _NOT_IN_TABLE):
        return "", 1
    for known in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):  # MI325X before a shorter match
        if known in upper.replace(" ", "") and known not in ("MI250", "MI250X"):  # MI250s go by their CUs
            return known, 1
    return "", 1


def device_peak(name: str, compute_units: int, dtype: str = "bf16") -> Peak:
    """The dense peak of a GPU from the table, or "peak unknown" (an unknown part, or an fp32 run:
    the table holds the bf16 / fp16 peaks)."""
    product, parts = table_product(name, compute_units)
    if not product:
        return Peak(name, None, "unknown", dtype, f"{name} ({compute_units} CUs) is not in the peak table")
    if dtype not in ("bf16", "fp16"):
        return Peak(product, None, "unknown", dtype, f"the table holds {product}'s bf16 / fp16 peak, not {dtype}'s")
    peak = PEAK_BF16_TFLOPS[product] / parts
    shown = product if parts == 1 else f"{product} (1/{parts} partition)"
    return Peak(shown, round(peak, 2), "table", dtype)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def measure_cpu_tflops(dtype: str, threads: int, size: int = 1024, seconds: float = 0.5) -> float:
    """The best TFLOPS of a ``size`` x ``size`` matmul in ``dtype`` (fp32 / bf16) over about ``seconds``
    on ``threads`` threads: 2 size^3 FLOPs a product."""
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        a = torch.randn(size, size).to(torch_dtype)
        b = torch.randn(size, size).to(torch_dtype)
        torch.mm(a, b)  # warm-up: the first call picks the kernel
        best = float("inf")
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or best == float("inf"):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return 2.0 * size**3 / best / 1e12


def cpu_peak(dtype: str, threads: int, cache_dir: Path, measure=measure_cpu_tflops) -> Peak:
    """The CPU's peak for ``dtype`` on ``threads`` threads: measured once by a matmul microbenchmark and
    kept in ``cache_dir/peak_flops.json`` by CPU model, dtype, threads and torch version; later calls
    read the cache."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "?"
    model = cpu_model()
    key = f"{model}|{dtype}|{threads} threads|torch {torch_version}"
    path = Path(cache_dir) / CACHE_FILE
    cached = _read_cache(path)
    seen = cached.get(key, {}).get("tflops") if isinstance(cached.get(key), dict) else None
    if isinstance(seen, (int, float)):
        return Peak(model, float(seen), "cached", dtype)
    tflops = round(measure(dtype, threads), 4)
    cached[key] = {"tflops": tflops, "measured_at": round(time.time(), 3)}
    _write_cache(path, cached)
    return Peak(model, tflops, "measured", dtype)


def _read_cache(path: Path) -> dict[str, dict[str, object]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, data: dict[str, dict[str, object]]) -> None:
    """Atomic (temp + rename); a cache that cannot be written is measured again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
