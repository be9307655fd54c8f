"""Checks on the ROCm install (root: $ROCM_PATH, default /opt/rocm) and the compilers."""

from __future__ import annotations

import re
from pathlib import Path

from cockpit.doctor.model import PASS, SKIP, WARN, Check, Context, read_text, version_tuple

BUILD_TAGS = frozenset({"build", "deepspeed"})
# What a JIT-built extension (DeepSpeed ops) links against: HIP runtime and the BLAS libraries.
ROCM_LIBS = ("libamdhip64.so", "librocblas.so", "libhipblas.so")
MIN_GCC = 11
MIN_CLANG = 15


def rocm_version(ctx: Context) -> tuple[str, str]:
    """(version, where it came from): .info/version first, then hipconfig --version."""
    text = read_text(ctx.roots.rocm / ".info" / "version")
    if text:
        return text.splitlines()[0].strip(), str(ctx.roots.rocm / ".info" / "version")
    hipconfig = ctx.tool("hipconfig")
    if hipconfig:
        code, out = ctx.run([hipconfig, "--version"])
        m = re.search(r"\d+\.\d+[\w.\-]*", out or "")
        if code == 0 and m:
            return m.group(0), "hipconfig --version"
    return "", ""


def major_minor(text: str | None) -> tuple[int, ...]:
    return version_tuple(text)[:2]


TORCH_INDEX = "https://download.pytorch.org/whl/rocm{}"
EXAMPLE_ROCM = "6.4"  # the index's ROCm for a machine without a ROCm install (the wheel brings its runtime)
CONTAINER = (
    "docker run -it --device=/dev/kfd --device=/dev/dri --group-add video --ipc=host rocm/pytorch:latest "
    "(AMD's image with torch for ROCm; a tag per ROCm release: hub.docker.com/r/rocm/pytorch/tags)"
)


def torch_install_fix(ctx: Context) -> str:
    """The commands that install torch for this machine's ROCm: the PyTorch index of the installed ROCm's
    major.minor (read from its .info/version, else hipconfig), and AMD's container as the alternative."""
    version, source = rocm_version(ctx)
    release = ".".join(map(str, major_minor(version)))
    if release:
        first = f"pip install torch --index-url {TORCH_INDEX.format(release)}  (ROCm {version}, read from {source})"
    else:
        first = (
            f"pip install torch --index-url {TORCH_INDEX.format(EXAMPLE_ROCM)}  (no ROCm install at "
            f"{ctx.roots.rocm}: the wheel brings its ROCm runtime; the host needs the amdgpu driver)"
        )
    return f"{first}\nor the container: {CONTAINER}"


def check_rocm_version(ctx: Context) -> Check:
    title = "ROCm version"
    f = ctx.facts
    version, source = rocm_version(ctx)
    data = {"root": str(ctx.roots.rocm), "version": version, "torch_hip": f.hip}
    if not version:
        if f.build == "rocm":
            return Check(
                "rocm_version",
                title,
                ctx.severity("build"),
                f"no ROCm install at {ctx.roots.rocm}: torch {f.version} brings its own runtime, but nothing can be compiled here",
                f"install ROCm {'.'.join(map(str, major_minor(f.hip)))} (amdgpu-install --usecase=rocm) or set ROCM_PATH",
                BUILD_TAGS,
                data,
            )
        return Check(
            "rocm_version",
            title,
            SKIP,
            f"no ROCm install at {ctx.roots.rocm}",
            matters_for=frozenset({"rocm"}),
            data=data,
        )
    seen = f"ROCm {version} ({source})"
    if f.build == "rocm" and major_minor(f.hip) and major_minor(version) != major_minor(f.hip):
        torch_rocm = ".".join(map(str, major_minor(f.hip)))
        return Check(
            "rocm_version",
            title,
            WARN,
            f"{seen}, but torch was built for ROCm {torch_rocm}: extensions compiled here may not load",
            f"install torch for ROCm {'.'.join(map(str, major_minor(version)))}, or point ROCM_PATH at a ROCm {torch_rocm} install",
            BUILD_TAGS,
            data,
        )
    return Check("rocm_version", title, PASS, seen, matters_for=frozenset({"rocm"}), data=data)


def lib_dirs(ctx: Context, extra: tuple[str, ...] = ()) -> list[Path]:
    dirs = [ctx.roots.rocm / "lib", ctx.roots.rocm / "lib64"]
    dirs += [Path(p) for p in ctx.env.get("LD_LIBRARY_PATH", "").split(":") if p]
    dirs += [Path(p) for p in extra if p]
    return dirs


def find_lib(dirs: list[Path], stem: str) -> Path | None:
    """First ``stem`` or ``stem.*`` (librccl.so, librccl.so.1, librccl.so.1.0) in ``dirs``."""
    for d in dirs:
        try:
            for p in sorted(d.glob(stem + "*")):
                if p.name == stem or p.name.startswith(stem + "."):
                    return p
        except OSError:
            continue
    return None


def check_rocm_dev(ctx: Context) -> Check:
    title = "HIP headers and ROCm libraries"
    root = ctx.roots.rocm
    if not root.is_dir():
        return Check("rocm_dev", title, SKIP, f"no ROCm install at {root}", matters_for=BUILD_TAGS)
    header = root / "include" / "hip" / "hip_runtime.h"
    missing = [] if header.is_file() else [str(header)]
    dirs = lib_dirs(ctx)[:2]
    missing += [name for name in ROCM_LIBS if find_lib(dirs, name) is None]
    if missing:
        return Check(
            "rocm_dev",
            title,
            ctx.severity("build"),
            "missing: " + ", ".join(missing),
            "install the ROCm development packages: sudo amdgpu-install --usecase=rocm,hiplibsdk (or apt install rocm-hip-sdk)",
            BUILD_TAGS,
            {"missing": missing},
        )
    return Check(
        "rocm_dev",
        title,
        PASS,
        f"{header.relative_to(root)} and {', '.join(ROCM_LIBS)} under {root}",
        matters_for=BUILD_TAGS,
    )


def compiler_version(ctx: Context, name: str) -> tuple[str, tuple[int, ...]]:
    """(path, version) of gcc/clang on PATH, or ('', ())."""
    path = ctx.which(name)
    if not path:
        return "", ()
    argv = [path, "-dumpfullversion", "-dumpversion"] if name == "gcc" else [path, "--version"]
    code, out = ctx.run(argv)
    if code != 0:
        return path, ()
    m = re.search(r"(?:version\s+)?(\d+)\.(\d+)(?:\.(\d+))?", out)
    return path, tuple(int(x) for x in m.groups() if x is not None) if m else ()


def check_compilers(ctx: Context) -> Check:
    title = "compilers (gcc/clang, hipcc)"
    found: list[str] = []
    ok = False
    for name, minimum in (("gcc", MIN_GCC), ("clang", MIN_CLANG)):
        path, version = compiler_version(ctx, name)
        if path:
            shown = ".".join(map(str, version)) or "?"
            found.append(f"{name} {shown}")
            ok = ok or (bool(version) and version[0] >= minimum)
    hipcc = ctx.tool("hipcc")
    need_hipcc = ctx.facts.build == "rocm" or (ctx.roots.rocm / ".info" / "version").is_file()
    if hipcc:
        found.append(f"hipcc ({hipcc})")
    problems = []
    if not ok:
        problems.append(f"no gcc >= {MIN_GCC} or clang >= {MIN_CLANG}")
    if need_hipcc and not hipcc:
        problems.append("no hipcc")
    seen = ", ".join(found) or "no compiler on PATH"
    data = {"found": found}
    if problems:
        fix = []
        if not ok:
            fix.append(f"install gcc >= {MIN_GCC} (apt install g++-12) and put it first on PATH")
        if need_hipcc and not hipcc:
            fix.append("install hipcc (apt install hipcc / rocm-hip-sdk), or set ROCM_PATH to a ROCm with bin/hipcc")
        return Check(
            "compilers",
            title,
            ctx.severity("build"),
            f"{seen}; " + "; ".join(problems),
            "\n".join(fix),
            BUILD_TAGS,
            data,
        )
    return Check("compilers", title, PASS, seen, matters_for=BUILD_TAGS, data=data)
