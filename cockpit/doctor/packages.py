"""Optional packages: DeepSpeed (and which of its ops can build here), bitsandbytes, amdsmi/NVML."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
from pathlib import Path
from typing import Any

from cockpit.doctor.facts import is_warp64, probe_amdsmi, probe_nvml
from cockpit.doctor.model import FAIL, PASS, SKIP, WARN, Check, Context, version_at_least

# Ops a LoRA/ZeRO run may JIT-build: cpu_adam (ZeRO-Offload optimizer), fused_adam (GPU Adam),
# async_io (NVMe offload). Names as in deepspeed/accelerator/constants.py.
DS_OPS = ("cpu_adam", "fused_adam", "async_io")

# bitsandbytes on ROCm CDNA (warp 64): 4-bit with blocksize 64 (the default and the layout of
# pre-quantized Hub checkpoints) only works from 0.49.2 on (bitsandbytes PR #1856, released in
# 0.49.2; unsloth PR #4161 gates 4-bit on CDNA on >= 0.49.2). The 4-bit GEMV inference kernel's
# warp-64 fix (bitsandbytes PR #1887) landed in 0.50.0 (unsloth PR #7535).
BNB_MIN_CDNA_4BIT = "0.49.2"
BNB_GOOD_CDNA = "0.50.0"


@contextlib.contextmanager
def _quiet():
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield sink


def dist_version(name: str, module: Any = None) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(module, "__version__", "") or "?")


def _ds_ops() -> tuple[dict[str, Any], dict[str, bool]]:
    """(builders by name, installed-op flags) without building anything."""
    try:
        all_ops = importlib.import_module("deepspeed.ops.op_builder.all_ops").ALL_OPS
    except Exception:
        all_ops = importlib.import_module("deepspeed.ops.op_builder").ALL_OPS
    try:
        installed = dict(importlib.import_module("deepspeed.git_version_info").installed_ops)
    except Exception:
        installed = {}
    return dict(all_ops), installed


def check_deepspeed(ctx: Context) -> Check:
    title = "DeepSpeed"
    tags = frozenset({"deepspeed"})
    if importlib.util.find_spec("deepspeed") is None:
        return Check(
            "deepspeed",
            title,
            ctx.severity("deepspeed", otherwise=SKIP),
            "not installed",
            "pip install 'cockpit-tune[deepspeed]'",
            tags,
        )
    try:
        with _quiet():
            import deepspeed

            builders, installed = _ds_ops()
    except Exception as exc:
        return Check(
            "deepspeed",
            title,
            FAIL,
            f"deepspeed does not import: {type(exc).__name__}: {exc}",
            "pip install -U 'deepspeed>=0.15' (with the torch you train with)",
            tags,
        )
    version = dist_version("deepspeed", deepspeed)
    ops: dict[str, dict[str, bool]] = {}
    for name in DS_OPS:
        builder = builders.get(name)
        if builder is None:
            continue
        try:
            with _quiet():  # is_compatible() checks headers/libs, it compiles nothing big
                compatible = bool(builder.is_compatible(False))
        except Exception:
            compatible = False
        ops[name] = {"installed": bool(installed.get(name)), "compatible": compatible}
    ninja = importlib.util.find_spec("ninja") is not None or bool(ctx.which("ninja"))
    usable = [n for n, o in ops.items() if o["installed"] or o["compatible"]]
    unusable = [n for n in ops if n not in usable]
    needs_jit = any(not o["installed"] for o in ops.values())
    data = {"version": version, "ops": ops, "ninja": ninja}
    seen = f"deepspeed {version}; ops usable here: {', '.join(usable) or 'none'}" + (
        f"; cannot build: {', '.join(unusable)}" if unusable else ""
    )
    problems = []
    if any(n in unusable for n in ("cpu_adam", "fused_adam")):
        problems.append(
            "see the compilers and rocm_dev checks (DeepSpeed builds its ops with hipcc/nvcc and the C++ compiler)"
        )
    if needs_jit and not ninja:
        seen += "; ninja missing (JIT op builds need it)"
        problems.append("pip install ninja")
    if problems:
        return Check("deepspeed", title, WARN, seen, "\n".join(problems), tags, data)
    return Check("deepspeed", title, PASS, seen, matters_for=tags, data=data)


def bnb_libraries(spec: importlib.machinery.ModuleSpec) -> list[str]:
    """Names of the native libraries bitsandbytes ships (libbitsandbytes_rocm64.so, ..._cuda126.so)."""
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    names: list[str] = []
    for loc in locations:
        try:
            names += sorted(p.name for p in Path(loc).glob("libbitsandbytes_*"))
        except OSError:
            continue
    return names


def check_bitsandbytes(ctx: Context) -> Check:
    title = "bitsandbytes (QLoRA)"
    tags = frozenset({"qlora"})
    f = ctx.facts
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None:
        return Check(
            "bitsandbytes",
            title,
            ctx.severity("qlora", otherwise=SKIP),
            "not installed",
            "pip install 'cockpit-tune[qlora]'",
            tags,
        )
    version = dist_version("bitsandbytes")
    libs = bnb_libraries(spec)
    has_rocm = any("rocm" in n or "hip" in n for n in libs)
    has_cuda = any("cuda" in n for n in libs)
    data = {"version": version, "libraries": libs}
    seen = f"bitsandbytes {version} ({', '.join(libs) or 'no native library'})"
    if f.build == "rocm":
        targets = [d.target for d in f.devices if d.target]
        cdna = any(is_warp64(t) for t in targets) or not targets
        if not has_rocm:
            return Check(
                "bitsandbytes",
                title,
                FAIL,
                seen + ": no ROCm/HIP library, 4-bit will not run on these GPUs",
                f"pip install -U 'bitsandbytes>={BNB_GOOD_CDNA}' (wheels with ROCm libraries), or build with cmake -DCOMPUTE_BACKEND=hip",
                tags,
                data,
            )
        if cdna and not version_at_least(version, BNB_MIN_CDNA_4BIT):
            return Check(
                "bitsandbytes",
                title,
                FAIL,
                seen + f": 4-bit (blocksize 64) is broken on CDNA (gfx90a/gfx942) before {BNB_MIN_CDNA_4BIT}",
                f"pip install -U 'bitsandbytes>={BNB_GOOD_CDNA}'",
                tags,
                data,
            )
        if cdna and not version_at_least(version, BNB_GOOD_CDNA):
            return Check(
                "bitsandbytes",
                title,
                WARN,
                seen
                + f": 4-bit training works; the 4-bit GEMV (generation) kernel is fixed for warp-64 GPUs only in {BNB_GOOD_CDNA}",
                f"pip install -U 'bitsandbytes>={BNB_GOOD_CDNA}'",
                tags,
                data,
            )
        return Check("bitsandbytes", title, PASS, seen, matters_for=tags, data=data)
    if f.build == "cuda":
        if not has_cuda:
            return Check(
                "bitsandbytes", title, FAIL, seen + ": no CUDA library", "pip install -U bitsandbytes", tags, data
            )
        return Check("bitsandbytes", title, PASS, seen, matters_for=tags, data=data)
    return Check("bitsandbytes", title, SKIP, seen + "; no GPU build of torch", matters_for=tags, data=data)


def check_telemetry(ctx: Context) -> Check:
    title = "GPU telemetry (amdsmi / NVML)"
    tags = frozenset({"telemetry"})
    build = ctx.facts.build
    if build == "rocm":
        ok, note = probe_amdsmi()
        if ok:
            return Check("telemetry", title, PASS, note, matters_for=tags)
        return Check(
            "telemetry",
            title,
            WARN,
            note + "; power/temperature/VRAM panels fall back to torch",
            f"pip install {ctx.roots.rocm}/share/amd_smi (the amdsmi matching your ROCm), or pip install 'cockpit-tune[amd]'",
            tags,
        )
    if build == "cuda":
        ok, note = probe_nvml()
        if ok:
            return Check("telemetry", title, PASS, note, matters_for=tags)
        return Check("telemetry", title, WARN, note, "pip install 'cockpit-tune[nvidia]'", tags)
    amd_ok, amd_note = probe_amdsmi()
    nv_ok, nv_note = probe_nvml()
    status = PASS if (amd_ok or nv_ok) else SKIP
    return Check("telemetry", title, status, f"{amd_note}; {nv_note}", matters_for=tags)
