"""RCCL/NCCL: the library torch uses, and NCCL_*/RCCL_*/HSA_* settings known to cause trouble.

Sources for the settings (cited again where each is judged):
- NCCL environment variables: docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
  (RCCL reads the same NCCL_* names: rocm.docs.amd.com/projects/rccl/en/latest/api-reference/env-variables.html)
- a missing NCCL_SOCKET_IFNAME interface breaks bootstrap even on one node ("Bootstrap : no socket
  interface found"): github.com/NVIDIA/nccl/issues/1837, github.com/NVIDIA/nccl/issues/210
- net plugins are optional libraries RCCL dlopens (librccl-net.so / libnccl-net.so):
  github.com/ROCm/rccl/issues/1029
- HSA_FORCE_FINE_GRAIN_PCIE is not needed since ROCm 5.7 (github.com/ROCm/rccl/pull/842,
  github.com/ROCm/rccl-tests/issues/84); before that, PCIe P2P needed it (github.com/ROCm/rccl/issues/92)
"""

from __future__ import annotations

import re
from pathlib import Path

from cockpit.doctor.model import FAIL, PASS, SKIP, WARN, Check, Context, read_text
from cockpit.doctor.rocm import find_lib, lib_dirs, major_minor, rocm_version

TAGS = frozenset({"multi_gpu"})
_RANK = {PASS: 0, SKIP: 0, WARN: 1, FAIL: 2}


def ld_cache(ctx: Context) -> dict[str, str]:
    """soname -> path from ``ldconfig -p`` (empty when ldconfig is not there or roots say no)."""
    if not ctx.roots.ld_cache:
        return {}
    ldconfig = ctx.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if Path(p).is_file()), None
    )
    if not ldconfig:
        return {}
    code, out = ctx.run([ldconfig, "-p"])
    if code != 0:
        return {}
    found: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+\(.*\)\s+=>\s+(\S+)", line)
        if m:
            found.setdefault(m.group(1), m.group(2))
    return found


def rccl_header_version(root: Path) -> str:
    text = read_text(root / "include" / "rccl" / "rccl.h") or ""
    parts = [re.search(rf"#define\s+NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) if all(parts) else ""


def torch_rccl_link(lib_dir: str, ctx: Context) -> tuple[str, str]:
    """('bundled'|'linked'|'missing'|'', path). Wheels ship librccl in torch/lib; else ask ldd."""
    if not lib_dir:
        return "", ""
    bundled = find_lib([Path(lib_dir)], "librccl.so")
    if bundled:
        return "bundled", str(bundled)
    target = Path(lib_dir) / "libtorch_hip.so"
    ldd = ctx.which("ldd") or ("/usr/bin/ldd" if Path("/usr/bin/ldd").is_file() else None)
    if not target.is_file() or not ldd:
        return "", ""
    code, out = ctx.run([ldd, str(target)])
    m = re.search(r"(librccl\S*)\s+=>\s+(.+?)\s*(?:\(0x[0-9a-f]+\))?$", out, re.MULTILINE)
    if not m:
        return "", ""
    where = m.group(2).strip()
    return ("missing", m.group(1)) if where == "not found" else ("linked", where)


def check_rccl(ctx: Context) -> Check:
    f = ctx.facts
    title = "RCCL (collective library)"
    if f.build == "cuda":
        if f.nccl_version:
            return Check("rccl", title, PASS, f"NCCL {f.nccl_version} (CUDA build)", matters_for=TAGS)
        return Check("rccl", title, SKIP, "CUDA build without NCCL", matters_for=TAGS)
    if f.build != "rocm":
        return Check("rccl", title, SKIP, "not a ROCm build of torch", matters_for=TAGS)
    system = find_lib(lib_dirs(ctx), "librccl.so")
    system_path = (
        str(system) if system else next((p for n, p in ld_cache(ctx).items() if n.startswith("librccl.so")), "")
    )
    how, torch_path = torch_rccl_link(f.lib_dir, ctx)
    version = f.nccl_version or rccl_header_version(ctx.roots.rocm)
    data = {"version": version, "system": system_path, "torch": torch_path, "torch_link": how}
    vtext = f"RCCL {version}" if version else "RCCL (version unknown)"
    if how == "missing":
        return Check(
            "rccl",
            title,
            FAIL,
            f"torch's libtorch_hip.so needs {torch_path}, which is not found",
            "install rccl (apt install rccl) or add its lib dir to LD_LIBRARY_PATH",
            TAGS,
            data,
        )
    if how:
        where = "bundled with torch" if how == "bundled" else "linked by torch"
        return Check("rccl", title, PASS, f"{vtext}, {where}: {torch_path}", matters_for=TAGS, data=data)
    if system_path:
        return Check("rccl", title, PASS, f"{vtext} at {system_path}", matters_for=TAGS, data=data)
    return Check(
        "rccl",
        title,
        ctx.severity("multi_gpu"),
        "no librccl.so found (ROCm lib dir, LD_LIBRARY_PATH, ld cache, torch/lib)",
        "install rccl (apt install rccl), or a torch ROCm wheel (it bundles librccl)",
        TAGS,
        data,
    )


def interfaces(ctx: Context) -> list[str] | None:
    net = ctx.roots.sys / "class" / "net"
    try:
        return sorted(p.name for p in net.iterdir())
    except OSError:
        return None


def ifname_selects(spec: str, ifaces: list[str]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME picks: comma-separated prefixes, '^' excludes, '=' exact."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    names = [s.strip() for s in spec.split(",") if s.strip()]

    def hit(i: str) -> bool:
        return any(i == n if exact else i.startswith(n) for n in names)

    return [i for i in ifaces if not hit(i)] if exclude else [i for i in ifaces if hit(i)]


def plugin_present(ctx: Context, value: str) -> str:
    """Path of the net plugin NCCL_NET_PLUGIN/RCCL_NET_PLUGIN names, or ''."""
    if "/" in value:
        return value if Path(value).is_file() else ""
    names = [value, f"libnccl-net-{value}.so", f"librccl-net-{value}.so"]
    dirs = lib_dirs(ctx, extra=(ctx.facts.lib_dir,))
    for name in names:
        for d in dirs:
            if (d / name).is_file():
                return str(d / name)
    cache = ld_cache(ctx)
    return next((cache[n] for n in names if n in cache), "")


def comm_findings(ctx: Context) -> list[tuple[str, str, str]]:
    """(status, what was seen, fix) for each setting worth a word."""
    env = ctx.env
    out: list[tuple[str, str, str]] = []
    if env.get("NCCL_P2P_DISABLE", "").strip() not in ("", "0"):
        # P2P is the direct GPU-to-GPU transport (xGMI / PCIe); without it traffic goes through
        # host memory (SHM) or the network: NCCL env docs, NCCL_P2P_DISABLE.
        out.append(
            (
                WARN,
                f"NCCL_P2P_DISABLE={env['NCCL_P2P_DISABLE']}: GPU-to-GPU (xGMI) transport off, intra-node all-reduce goes through host memory",
                "unset NCCL_P2P_DISABLE",
            )
        )
    if env.get("NCCL_P2P_LEVEL", "").strip().upper() in ("0", "LOC"):
        out.append((WARN, f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} never uses P2P", "unset NCCL_P2P_LEVEL"))
    if env.get("NCCL_SHM_DISABLE", "").strip() not in ("", "0") and env.get("NCCL_P2P_DISABLE", "").strip() not in (
        "",
        "0",
    ):
        out.append(
            (
                WARN,
                "NCCL_SHM_DISABLE and NCCL_P2P_DISABLE: intra-node traffic falls back to sockets",
                "unset NCCL_SHM_DISABLE NCCL_P2P_DISABLE",
            )
        )
    debug = env.get("NCCL_DEBUG", "").strip().upper()
    if debug == "TRACE":
        # TRACE logs every call: rank logs grow by MBs per step.
        out.append(
            (
                WARN,
                "NCCL_DEBUG=TRACE logs every collective call: rank logs flood",
                "export NCCL_DEBUG=WARN (INFO for one debugging run)",
            )
        )
    for var in ("NCCL_ALGO", "NCCL_PROTO"):
        if env.get(var, "").strip():
            out.append(
                (WARN, f"{var}={env[var]} overrides RCCL's tuning", f"unset {var} unless you are debugging a hang")
            )
    for var in ("NCCL_NET_PLUGIN", "RCCL_NET_PLUGIN"):
        value = env.get(var, "").strip()
        if value and value.lower() != "none":
            path = plugin_present(ctx, value)
            if not path:
                out.append(
                    (
                        WARN,
                        f"{var}={value}: no such plugin library (looked for {value}, libnccl-net-{value}.so, librccl-net-{value}.so)",
                        f"unset {var}, or install the plugin and add its dir to LD_LIBRARY_PATH",
                    )
                )
    spec = env.get("NCCL_SOCKET_IFNAME", "").strip()
    if spec:
        ifaces = interfaces(ctx)
        if ifaces is not None and not ifname_selects(spec, ifaces):
            out.append(
                (
                    FAIL,
                    f"NCCL_SOCKET_IFNAME={spec} matches no interface (have: {', '.join(ifaces) or 'none'}): bootstrap fails with 'no socket interface found'",
                    f"export NCCL_SOCKET_IFNAME={_suggest_iface(ifaces)} (or unset it)",
                )
            )
    if "HSA_FORCE_FINE_GRAIN_PCIE" in env or ctx.facts.build == "rocm":
        version, _ = rocm_version(ctx)
        mm = major_minor(version or ctx.facts.hip)
        if mm and mm < (5, 7) and env.get("HSA_FORCE_FINE_GRAIN_PCIE") != "1":
            out.append(
                (
                    WARN,
                    f"ROCm {'.'.join(map(str, mm))} without HSA_FORCE_FINE_GRAIN_PCIE=1: no P2P between PCIe-connected GPUs",
                    "export HSA_FORCE_FINE_GRAIN_PCIE=1 (not needed on xGMI-connected GPUs or ROCm >= 5.7)",
                )
            )
    return out


def _suggest_iface(ifaces: list[str]) -> str:
    real = [i for i in ifaces if i != "lo" and not i.startswith(("docker", "veth", "virbr"))]
    return real[0] if real else "lo"


def check_comm_env(ctx: Context) -> Check:
    title = "NCCL/RCCL settings"
    shown = {
        k: v for k, v in sorted(ctx.env.items()) if k.startswith(("NCCL_", "RCCL_")) or k == "HSA_FORCE_FINE_GRAIN_PCIE"
    }
    findings = comm_findings(ctx)
    data = {"settings": shown, "findings": [{"status": s, "seen": w, "fix": x} for s, w, x in findings]}
    if not findings:
        seen = ("set: " + " ".join(f"{k}={v}" for k, v in shown.items())) if shown else "no NCCL_*/RCCL_* settings"
        return Check("comm_env", title, PASS, seen + "; none known to cause trouble", matters_for=TAGS, data=data)
    worst = max((s for s, _, _ in findings), key=_RANK.__getitem__)
    return Check(
        "comm_env", title, worst, "; ".join(w for _, w, _ in findings), "\n".join(x for _, _, x in findings), TAGS, data
    )
