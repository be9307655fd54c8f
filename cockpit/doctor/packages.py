"""Optional packages: DeepSpeed (and which of its ops can build here), bitsandbytes, amdsmi/NVML."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import os
from pathlib import Path
from typing import Any

from cockpit import side_site
from cockpit.doctor.facts import probe_amdsmi, probe_nvml
from cockpit.doctor.model import FAIL, PASS, SKIP, WARN, Check, Context, version_at_least

# Ops a LoRA/ZeRO run may JIT-build: cpu_adam (ZeRO-Offload optimizer), fused_adam (GPU Adam),
# async_io (NVMe offload). Names as in deepspeed/accelerator/constants.py.
DS_OPS = ("cpu_adam", "fused_adam", "async_io")

# bitsandbytes on ROCm: its PyPI wheels carry ROCm libraries since 0.49 (gfx90a, gfx942, gfx950).
# 4-bit with blocksize 64 (the default, and the layout of pre-quantized Hub checkpoints) works on
# warp-64 CDNA from 0.49.2 (bitsandbytes PR #1856), but 0.49.x returns NaNs at decode on AMD GPUs:
# the 4-bit GEMV kernel's warp-64 fix (bitsandbytes #1887) landed in 0.50.0 (unsloth PR #7535).
BNB_GOOD_ROCM = "0.50.0"
BNB_SMOKE_TIMEOUT_S = 180.0


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
    """bitsandbytes for QLoRA: a native library for this torch build, on ROCm at least
    :data:`BNB_GOOD_ROCM`, and a tiny ``Linear4bit`` forward and backward (and a one-row decode
    forward, the GEMV kernel) on the training device that agrees with the dequantized weights:
    since 0.46 the import succeeds without a usable native library, the error only comes at the
    first kernel call."""
    title = "bitsandbytes (QLoRA)"
    tags = frozenset({"qlora"})
    f = ctx.facts
    found = side_site.find("bitsandbytes", ctx.env)  # sys.path, else <venv>/lowrank-site (the ranks get it)
    if found is None:
        return Check(
            "bitsandbytes",
            title,
            ctx.severity("qlora", otherwise=SKIP),
            f"not installed (neither on sys.path nor in {side_site.folder(ctx.env)})",
            f"pip install 'cockpit-tune[qlora]', or {side_site.install_command(ctx.env)}",
            tags,
        )
    spec = found[0]
    version, folder = side_site.installed_at("bitsandbytes", ctx.env) or ("?", "?")
    libs = bnb_libraries(spec)
    data: dict[str, Any] = {"version": version, "libraries": libs, "folder": folder}
    seen = f"bitsandbytes {version} in {folder} ({', '.join(libs) or 'no native library'})"

    def failed(why: str, fix: str) -> Check:
        return Check("bitsandbytes", title, FAIL, f"{seen}: {why}", fix, tags, data)

    upgrade = f"pip install -U 'bitsandbytes>={BNB_GOOD_ROCM}'"
    if f.build == "rocm":
        targets = sorted({d.target for d in f.devices if d.target}) or ["gfx90a/gfx942/gfx950"]
        if not any("rocm" in n or "hip" in n for n in libs):
            return failed(
                "no ROCm/HIP library, 4-bit will not run on these GPUs",
                f"{upgrade} (wheels with ROCm libraries), or build with cmake -DCOMPUTE_BACKEND=hip",
            )
        if not version_at_least(version, BNB_GOOD_ROCM):
            return failed(
                f"before {BNB_GOOD_ROCM} 4-bit returns NaNs at decode on AMD GPUs ({', '.join(targets)}; "
                "bitsandbytes #1887, the GEMV kernel's warp-64 fix)",
                upgrade,
            )
    elif f.build == "cuda" and not any("cuda" in n for n in libs):
        return failed("no CUDA library", "pip install -U bitsandbytes")
    device = "cpu" if f.build == "cpu" else ("cuda:0" if f.devices else None)
    if device is None:
        return Check("bitsandbytes", title, SKIP, seen + "; no GPU visible to run its kernels on", "", tags, data)
    ok, note = bnb_kernel_smoke(ctx, spec, device)
    data["smoke"] = {"device": device, "ok": ok, "note": note}
    if not ok:
        return failed(
            f"the import works but a Linear4bit forward/backward on {device} does not: {note}",
            f"{upgrade} (a wheel with the native library for this torch: {f.version or 'torch'})",
        )
    return Check("bitsandbytes", title, PASS, f"{seen}; {note}", matters_for=tags, data=data)


# A 64 x 64 NF4 layer (double quantization, as the ranks load): a 4-row forward and backward (training)
# and a one-row forward without grad (decode: the GEMV kernel), each against the dequantized weight.
_BNB_SMOKE = """
import sys, torch, bitsandbytes as bnb
dev = torch.device(sys.argv[1])
dt = torch.float32 if dev.type == "cpu" else torch.bfloat16
torch.manual_seed(0)
lin = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=dt, compress_statistics=True, quant_type="nf4")
lin.weight = bnb.nn.Params4bit(torch.randn(64, 64), requires_grad=False, compress_statistics=True, quant_type="nf4")
lin = lin.to(dev)
ref = bnb.functional.dequantize_4bit(lin.weight.data, lin.weight.quant_state).to(dt)
x = torch.randn(4, 64, device=dev, dtype=dt, requires_grad=True)
y = lin(x)
y.float().sum().backward()
with torch.no_grad():
    x1 = torch.randn(1, 64, device=dev, dtype=dt)
    y1 = lin(x1)
def err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
errs = {"forward": err(y, x.detach() @ ref.t()), "backward": err(x.grad, ref.sum(0).expand_as(x)),
        "decode": err(y1, x1 @ ref.t())}
bad = {k: v for k, v in errs.items() if not v < 0.05}
print(("BAD " if bad else "OK ") + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
"""


def bnb_kernel_smoke(ctx: Context, spec: importlib.machinery.ModuleSpec, device: str) -> tuple[bool, str]:
    """Run :data:`_BNB_SMOKE` on ``device`` in a subprocess (a native crash or hang stays there)
    with the bitsandbytes the doctor found first on its path; (ok, what happened)."""
    import sys

    origin = Path(spec.origin or next(iter(spec.submodule_search_locations or []), ""))
    site = str(origin.parent.parent if origin.name == "__init__.py" else origin.parent)
    env = {**ctx.env, "PYTHONPATH": os.pathsep.join(p for p in (site, ctx.env.get("PYTHONPATH", "")) if p)}
    code, out = ctx.run([sys.executable, "-c", _BNB_SMOKE, device], timeout=BNB_SMOKE_TIMEOUT_S, env=env)
    lines = [line for line in out.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit code {code}, no output"
    if code == 0 and last.startswith("OK "):
        return True, f"Linear4bit forward/backward/decode on {device} match the dequantized weights ({last[3:]})"
    if last.startswith("BAD "):
        return False, f"wrong results (relative errors {last[4:]})"
    return False, last[-300:]


# (what uses them, the config keys, the modules) for the extras row: the side folders' packages by key
EXTRAS = (
    ("QLoRA", "quantization_bit, ref_model_quantization_bit, optim: adamw_8bit / paged_* / lion_*", ("bitsandbytes",)),
    ("GaLore", "use_galore", ("galore_torch",)),
    ("APOLLO", "use_apollo", ("apollo_torch",)),
    ("trackers", "report_to, use_swanlab", tuple(side_site.TRACKER_MODULES.values())),
)


def check_extras(ctx: Context) -> Check:
    """Which optional packages the keys that need them find, and where: on sys.path (a pip install into the
    venv) or in the side folder of the README's install (``<venv>/lowrank-site``, ``<venv>/trackers-site``),
    which the ranks of a run with those keys get on their PYTHONPATH (:mod:`cockpit.side_site`). A missing
    one is a skip (optional) with the command that installs it; ``cockpit check`` refuses a config that
    needs it."""
    rows: list[str] = []
    fixes: list[str] = []
    data: dict[str, Any] = {}
    for what, keys, modules in EXTRAS:
        found = {m: side_site.installed_at(m, ctx.env) for m in modules}
        data[what] = {m: ({"version": v[0], "folder": v[1]} if v else None) for m, v in found.items()}
        have = [f"{side_site.DISTRIBUTIONS.get(m, m)} {v[0]} in {v[1]}" for m, v in found.items() if v]
        missing = [m for m, v in found.items() if not v]
        row = f"{what} ({keys}): " + "; ".join(have)
        if missing:
            extra = {"QLoRA": "qlora", "trackers": "trackers"}.get(what, "lowrank")
            fix = (
                f"pip install 'cockpit-tune[{extra}]'"
                + (f", or {side_site.install_command(ctx.env)}" if extra != "trackers" else "")
                + ", or bash scripts/bootstrap.sh (the side folders)"
            )
            row += ("; " if have else "") + f"{', '.join(missing)} not installed: {fix}"
            fixes.append(f"{what}: {fix}")
        rows.append(row)
    status = PASS if not fixes else SKIP
    return Check("extras", "Optional packages by key", status, "\n".join(rows), "\n".join(fixes), data=data)


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
