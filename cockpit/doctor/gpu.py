"""Checks on Python, torch and the GPUs torch sees (device facts come from ``ctx.facts``)."""

from __future__ import annotations

import os
import sys

from cockpit.device import VISIBLE_VARS, listed
from cockpit.doctor.facts import parse_arch_list
from cockpit.doctor.model import FAIL, PASS, SKIP, WARN, Check, Context, gib, read_text, version_tuple
from cockpit.doctor.rocm import torch_install_fix

MIN_PYTHON = (3, 11)  # pyproject.toml: requires-python >= 3.11
GPU_BUILD_TAGS = ("gpu", "rocm", "cuda")


def check_python(ctx: Context) -> Check:
    v = sys.version_info
    seen = f"Python {v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if (v.major, v.minor) >= MIN_PYTHON:
        return Check("python", "Python version", PASS, seen)
    want = ".".join(map(str, MIN_PYTHON))
    return Check("python", "Python version", FAIL, seen, f"use Python >= {want} (make a new venv with python{want})")


def _rocm_release(ctx: Context) -> str:
    text = read_text(ctx.roots.rocm / ".info" / "version") or ""
    return ".".join(str(x) for x in version_tuple(text)[:2])


def check_torch(ctx: Context) -> Check:
    f = ctx.facts
    title = "torch build"
    if not f.importable:
        return Check(
            "torch",
            title,
            FAIL,
            f"torch does not import: {f.error}",
            torch_install_fix(ctx),
        )
    data = {"version": f.version, "build": f.build, "hip": f.hip, "cuda": f.cuda}
    if f.build == "rocm":
        return Check(
            "torch", title, PASS, f"torch {f.version}, ROCm (HIP {f.hip})", data=data, matters_for=frozenset({"gpu"})
        )
    rocm = _rocm_release(ctx)
    if f.build == "cuda":
        if rocm and (ctx.roots.dev / "kfd").exists() and not (ctx.roots.dev / "nvidiactl").exists():
            # The usual slip: a plain `pip install torch` brings the CUDA wheel onto an AMD box.
            return Check(
                "torch",
                title,
                ctx.severity(*GPU_BUILD_TAGS),
                f"torch {f.version} is a CUDA build, but this is a ROCm {rocm} machine (/dev/kfd, no NVIDIA driver)",
                torch_install_fix(ctx),
                frozenset(GPU_BUILD_TAGS),
                data,
            )
        return Check(
            "torch", title, PASS, f"torch {f.version}, CUDA {f.cuda}", data=data, matters_for=frozenset({"gpu"})
        )
    if rocm:
        seen = f"torch {f.version} is a CPU-only build, but ROCm {rocm} is installed at {ctx.roots.rocm}"
    else:
        seen = f"torch {f.version} is a CPU-only build: training runs on the CPU only"
    fix = f"for AMD GPUs install torch for ROCm: {torch_install_fix(ctx)}"
    return Check("torch", title, ctx.severity(*GPU_BUILD_TAGS), seen, fix, frozenset(GPU_BUILD_TAGS), data)


def check_gpu_visible(ctx: Context) -> Check:
    f = ctx.facts
    title = "GPUs visible to torch"
    tags = frozenset({"gpu"})
    vis = {k: ctx.env[k] for k in VISIBLE_VARS if k in ctx.env}
    env_note = " ".join(f"{k}={v!r}" for k, v in vis.items())
    data = {"device_count": f.device_count, "visible_env": vis}
    if f.build in ("none", "cpu"):
        return Check(
            "gpu_visible",
            title,
            ctx.severity(*GPU_BUILD_TAGS, otherwise=SKIP),
            "no GPU build of torch",
            "see the torch check",
            tags,
            data,
        )
    if not f.cuda_available or f.device_count == 0:
        seen = "torch.cuda.is_available() is False" + (f" ({f.device_error})" if f.device_error else "")
        if env_note:
            seen += f"; {env_note}"
        return Check("gpu_visible", title, FAIL, seen, _no_gpu_fix(ctx, vis), tags, data)
    seen = f"{f.device_count} GPU(s) visible" + (f" ({env_note})" if env_note else "")
    problems = _visible_devices_problems(f.build, vis, f.device_count)
    if problems:
        return Check(
            "gpu_visible",
            title,
            WARN,
            seen + "; " + "; ".join(p for p, _ in problems),
            "\n".join(x for _, x in problems),
            frozenset({"gpu", "multi_gpu"}),
            data,
        )
    return Check("gpu_visible", title, PASS, seen, matters_for=tags, data=data)


def _no_gpu_fix(ctx: Context, vis: dict[str, str]) -> str:
    """The likeliest fix when a GPU build of torch sees no GPU."""
    if any(v.strip() in ("", "-1") for v in vis.values()):
        return "a *_VISIBLE_DEVICES variable hides every GPU: unset it or list the GPUs to use"
    if ctx.facts.build == "rocm":
        return "check `rocminfo` lists the GPUs; add yourself to the render and video groups: sudo usermod -aG render,video $USER (then log in again)"
    if (ctx.roots.dev / "kfd").exists():
        return "this torch is a CUDA build: AMD GPUs need a ROCm build of torch (see the torch check)"
    return "check `nvidia-smi` lists the GPUs and the driver matches torch's CUDA"


def _visible_devices_problems(build: str, vis: dict[str, str], device_count: int) -> list[tuple[str, str]]:
    """(problem, fix) of the *_VISIBLE_DEVICES variables: clashing ROCm ones, a count torch does not see."""
    problems: list[tuple[str, str]] = []
    if build == "rocm":
        index_var = (
            "HIP_VISIBLE_DEVICES"
            if "HIP_VISIBLE_DEVICES" in vis
            else ("CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in vis else None)
        )
        problems += _rocm_visible_conflicts(vis, index_var)
        expected_var = index_var or ("ROCR_VISIBLE_DEVICES" if "ROCR_VISIBLE_DEVICES" in vis else None)
    else:
        expected_var = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in vis else None
    if expected_var and not vis[expected_var].strip().startswith("GPU-"):
        want = len(listed(vis[expected_var]))
        if want != device_count:
            problems.append(
                (
                    f"{expected_var} lists {want} GPU(s) but torch sees {device_count}",
                    f"correct {expected_var}: indexes of GPUs that do not exist are dropped",
                )
            )
    return problems


def _rocm_visible_conflicts(vis: dict[str, str], index_var: str | None) -> list[tuple[str, str]]:
    """(problem, fix) of ROCm visibility variables set together that give torch two views of the GPUs."""
    problems: list[tuple[str, str]] = []
    # ROCR_VISIBLE_DEVICES masks first, then HIP/CUDA_VISIBLE_DEVICES index what is left, in
    # another order (HIP init order); mixing them can hide every GPU:
    # github.com/mcmonkeyprojects/SwarmUI/issues/565, github.com/Parsl/parsl/issues/3858.
    if "ROCR_VISIBLE_DEVICES" in vis and index_var:
        problems.append(
            (
                f"ROCR_VISIBLE_DEVICES and {index_var} are both set: they index GPUs differently",
                f"set only ROCR_VISIBLE_DEVICES (unset {index_var})",
            )
        )
    # torch reads HIP_VISIBLE_DEVICES first and CUDA_VISIBLE_DEVICES only as a fallback
    # (github.com/pytorch/pytorch/pull/129650): two different values mean two different views.
    hip, cuda = vis.get("HIP_VISIBLE_DEVICES"), vis.get("CUDA_VISIBLE_DEVICES")
    if hip is not None and cuda is not None and hip.strip() != cuda.strip():
        problems.append(
            (
                "HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES differ",
                "set one of them (on ROCm: HIP_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES)",
            )
        )
    return problems


def check_gpu_devices(ctx: Context) -> Check:
    f = ctx.facts
    title = "GPU devices"
    if not f.devices:
        return Check("gpu_devices", title, SKIP, "no GPU devices", matters_for=frozenset({"gpu"}))
    parts = []
    for d in f.devices:
        arch = f", {d.gcn_arch}" if d.gcn_arch else (f", {d.target}" if d.target else "")
        shown = d.name if d.product == d.name else f"{d.product} (torch says {d.name!r}; {d.compute_units} CUs)"
        partition = f", partition {d.partition}: its memory is the device's" if d.partition else ""
        parts.append(f"{d.index}: {shown} ({gib(d.total_memory)}{arch}{partition})")
    data = {
        "devices": [
            {
                "index": d.index,
                "name": d.name,
                "total_memory": d.total_memory,
                "gcn_arch": d.gcn_arch,
                "target": d.target,
                "product": d.product,
                "compute_units": d.compute_units,
                "partition": d.partition,
            }
            for d in f.devices
        ]
    }
    kinds = {(d.product, d.target) for d in f.devices}
    if len(kinds) > 1:
        return Check(
            "gpu_devices",
            title,
            WARN,
            "mixed GPUs: " + "; ".join(parts),
            "use one kind of GPU per run (set HIP_VISIBLE_DEVICES): ranks on unlike GPUs run at the slowest one's pace",
            frozenset({"multi_gpu"}),
            data,
        )
    return Check("gpu_devices", title, PASS, "; ".join(parts), matters_for=frozenset({"gpu"}), data=data)


def _targets(ctx: Context) -> list[str]:
    seen: list[str] = []
    for d in ctx.facts.devices:
        if d.target and d.target not in seen:
            seen.append(d.target)
    return seen


def _export_line(targets: list[str]) -> str:
    value = ";".join(targets)
    return f'export PYTORCH_ROCM_ARCH="{value}"' if ";" in value else f"export PYTORCH_ROCM_ARCH={value}"


def check_torch_arch(ctx: Context) -> Check:
    """torch itself carries kernels for each device's gfx target (else: invalid device function)."""
    f = ctx.facts
    title = "torch kernels for these GPUs"
    tags = frozenset({"gpu", "rocm"})
    if f.build != "rocm" or not f.devices:
        return Check("torch_arch", title, SKIP, "no ROCm GPU", matters_for=tags)
    targets = _targets(ctx)
    override = ctx.env.get("HSA_OVERRIDE_GFX_VERSION")
    built = set(parse_arch_list(";".join(f.arch_list)))
    missing = [t for t in targets if built and t not in built]
    data = {"targets": targets, "torch_arch_list": f.arch_list}
    if missing:
        # "HIP error: invalid device function" is what a kernel launch without code for the
        # device's ISA gives: github.com/pytorch/pytorch/issues/147626, ROCm/ROCm#4208.
        return Check(
            "torch_arch",
            title,
            FAIL,
            f"torch {f.version} has no kernels for {', '.join(missing)} (built for {', '.join(sorted(built))}): expect 'HIP error: invalid device function'",
            "install a torch ROCm wheel built for these GPUs (the official rocm wheels cover gfx90a and gfx942)",
            tags,
            data,
        )
    if override and any(t.startswith("gfx9") for t in targets):
        # Forcing the ISA on a data-centre GPU that runs natively loads code for the wrong
        # target: illegal-instruction aborts or wrong results.
        return Check(
            "torch_arch",
            title,
            WARN,
            f"HSA_OVERRIDE_GFX_VERSION={override} forces the ISA on {', '.join(targets)}",
            "unset HSA_OVERRIDE_GFX_VERSION: these GPUs are supported natively",
            tags,
            data,
        )
    return Check(
        "torch_arch",
        title,
        PASS,
        f"torch has kernels for {', '.join(targets) or 'the GPUs'}",
        matters_for=tags,
        data=data,
    )


def check_rocm_arch(ctx: Context) -> Check:
    """PYTORCH_ROCM_ARCH names every device's gfx target (it decides what extensions build for)."""
    f = ctx.facts
    title = "PYTORCH_ROCM_ARCH"
    # Only what is compiled here reads it: a plain LoRA run with prebuilt wheels is unaffected.
    tags = frozenset({"deepspeed", "build"})
    value = ctx.env.get("PYTORCH_ROCM_ARCH")
    if f.build != "rocm":
        return Check("rocm_arch", title, SKIP, "not a ROCm build of torch", matters_for=tags)
    targets = _targets(ctx)
    data = {"value": value, "targets": targets}
    if value is None:
        tip = f" (tip: {_export_line(targets)} builds only what this machine needs)" if targets else ""
        return Check(
            "rocm_arch",
            title,
            PASS,
            f"unset: extensions build for torch's own arch list{tip}",
            matters_for=tags,
            data=data,
        )
    listed = parse_arch_list(value)
    if not targets:
        return Check(
            "rocm_arch",
            title,
            PASS,
            f"PYTORCH_ROCM_ARCH={value!r}; no GPU to compare with",
            matters_for=tags,
            data=data,
        )
    missing = [t for t in targets if t not in listed]
    if not missing:
        return Check(
            "rocm_arch",
            title,
            PASS,
            f"PYTORCH_ROCM_ARCH={value!r} covers {', '.join(targets)}",
            matters_for=tags,
            data=data,
        )
    names = {d.target: d.name for d in f.devices}
    who = ", ".join(f"{names.get(t, 'GPU')} ({t})" for t in missing)
    # PyTorch's cpp_extension (and so DeepSpeed's JIT ops, bitsandbytes/flash-attn source
    # builds) passes --offload-arch for each entry of PYTORCH_ROCM_ARCH only.
    seen = (
        f"{who} not in PYTORCH_ROCM_ARCH={value!r}: extensions built here (DeepSpeed ops, bitsandbytes, "
        "flash-attention) get no code for it -> 'HIP error: invalid device function', or an illegal-instruction abort"
    )
    fix = f"{_export_line(targets)}; then rebuild the extensions (e.g. rm -rf ~/.cache/torch_extensions)"
    return Check("rocm_arch", title, FAIL, seen, fix, tags, data)


def check_kfd(ctx: Context) -> Check:
    """/dev/kfd must be there and read/writable for ROCm (render group; --device in containers)."""
    title = "ROCm device node /dev/kfd"
    tags = frozenset({"gpu", "rocm"})
    kfd = ctx.roots.dev / "kfd"
    if ctx.facts.build != "rocm":
        return Check("kfd", title, SKIP, "not a ROCm build of torch", matters_for=tags)
    if not kfd.exists():
        return Check(
            "kfd",
            title,
            FAIL,
            f"{kfd} is missing: the amdgpu driver is not loaded, or the container has no GPU",
            "load amdgpu (sudo modprobe amdgpu); in docker add --device=/dev/kfd --device=/dev/dri --group-add video",
            tags,
        )
    if not os.access(kfd, os.R_OK | os.W_OK):
        return Check(
            "kfd",
            title,
            FAIL,
            f"no read/write access to {kfd}",
            "sudo usermod -aG render,video $USER, then log in again",
            tags,
        )
    return Check("kfd", title, PASS, f"{kfd} is accessible", matters_for=tags)
