"""Host checks: NUMA (numactl, automatic balancing, the node of each GPU), disk and memory.

NUMA balancing: the kernel migrates pages by unmapping them and trapping the faults; for
workloads already bound to nodes it "should be disabled" (Documentation/sysctl/kernel.txt,
numa_balancing), and ROCm's MI200/MI300X system-optimization guides say to disable it
(rocm.docs.amd.com/en/latest/how-to/system-optimization/mi300x.html, "Disable NUMA auto-balancing").
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from cockpit.doctor.model import FAIL, PASS, SKIP, WARN, Check, Context, gib, read_text

GPU_VENDORS = {"0x1002": "AMD", "0x10de": "NVIDIA"}
DISK_FAIL = 2 * 2**30
DISK_WARN = 20 * 2**30
MEM_FAIL = 2 * 2**30
MEM_WARN = 8 * 2**30
NUMA = frozenset({"numa"})


def numa_nodes(ctx: Context) -> int:
    """NUMA nodes in sysfs (0 when sysfs does not say)."""
    base = ctx.roots.sys / "devices" / "system" / "node"
    try:
        return sum(1 for p in base.iterdir() if re.fullmatch(r"node\d+", p.name))
    except OSError:
        return 0


def check_numactl(ctx: Context) -> Check:
    title = "numactl"
    path = ctx.which("numactl")
    if not path:
        return Check(
            "numactl",
            title,
            WARN,
            "numactl is not on PATH: ranks cannot be bound to the GPU's NUMA node",
            "sudo apt-get install numactl (or dnf install numactl)",
            NUMA,
        )
    code, out = ctx.run([path, "--hardware"])
    m = re.search(r"available:\s*(\d+)\s+nodes?", out)
    if code != 0 or not m:
        first = out.strip().splitlines()[0] if out.strip() else f"exit {code}"
        return Check(
            "numactl",
            title,
            WARN,
            f"{path} --hardware failed: {first}",
            "check that numactl works here (containers may need --cap-add SYS_NICE)",
            NUMA,
        )
    nodes = int(m.group(1))
    return Check("numactl", title, PASS, f"{path}: {nodes} NUMA node(s)", matters_for=NUMA, data={"nodes": nodes})


def check_numa_balancing(ctx: Context) -> Check:
    title = "NUMA balancing"
    path = ctx.roots.proc / "sys" / "kernel" / "numa_balancing"
    value = read_text(path)
    if value is None:
        return Check(
            "numa_balancing", title, SKIP, f"{path} not readable (kernel without NUMA balancing)", matters_for=NUMA
        )
    if value.strip() == "0":
        return Check("numa_balancing", title, PASS, "off", matters_for=NUMA)
    return Check(
        "numa_balancing",
        title,
        WARN,
        f"on ({path} = {value}): the kernel keeps migrating pages under the ranks",
        "sudo sysctl kernel.numa_balancing=0 (persist: echo kernel.numa_balancing=0 | sudo tee /etc/sysctl.d/90-numa.conf)",
        NUMA,
    )


def _gpu_dev(dev: Path) -> tuple[str, str, int] | None:
    """(vendor, bdf, numa node) of a PCI device dir if it is an AMD/NVIDIA display/accelerator."""
    vendor = (read_text(dev / "vendor") or "").lower()
    if vendor not in GPU_VENDORS:
        return None
    klass = (read_text(dev / "class") or "").lower()
    if klass and not klass.startswith(("0x03", "0x12")):  # display controller, processing accelerator
        return None
    uevent = read_text(dev / "uevent") or ""
    m = re.search(r"PCI_SLOT_NAME=(\S+)", uevent)
    bdf = m.group(1) if m else Path(os.path.realpath(dev)).name
    try:
        node = int(read_text(dev / "numa_node") or "-1")
    except ValueError:
        node = -1
    return GPU_VENDORS[vendor], bdf, node


def gpu_numa_map(ctx: Context) -> list[dict[str, Any]]:
    """GPUs from /sys/class/drm/card*/device, else from /sys/bus/pci/devices (no drm driver)."""
    found: list[dict[str, Any]] = []
    seen: set[str] = set()
    drm = ctx.roots.sys / "class" / "drm"
    cards = (
        sorted((p for p in drm.glob("card*") if re.fullmatch(r"card\d+", p.name)), key=lambda p: int(p.name[4:]))
        if drm.is_dir()
        else []
    )
    for card in cards:
        got = _gpu_dev(card / "device")
        if got and got[1] not in seen:
            seen.add(got[1])
            found.append({"card": card.name, "vendor": got[0], "bdf": got[1], "numa_node": got[2]})
    if not found:
        pci = ctx.roots.sys / "bus" / "pci" / "devices"
        for dev in sorted(pci.iterdir()) if pci.is_dir() else []:
            got = _gpu_dev(dev)
            if got and got[1] not in seen:
                seen.add(got[1])
                found.append({"card": "", "vendor": got[0], "bdf": got[1], "numa_node": got[2]})
    return found


def check_gpu_numa(ctx: Context) -> Check:
    title = "NUMA node of each GPU"
    gpus = gpu_numa_map(ctx)
    nodes = numa_nodes(ctx)
    data = {"gpus": gpus, "nodes": nodes}
    if not gpus:
        return Check("gpu_numa", title, SKIP, "no AMD/NVIDIA GPU in sysfs", matters_for=NUMA, data=data)
    shown = ", ".join(f"{g['card'] or g['bdf']} ({g['bdf']}) -> node {g['numa_node']}" for g in gpus)
    if nodes > 1 and all(g["numa_node"] == -1 for g in gpus):
        return Check(
            "gpu_numa",
            title,
            WARN,
            f"{nodes} NUMA nodes, but no GPU reports one: {shown}",
            "enable ACPI SRAT/NUMA reporting in the BIOS (NPS setting); bind ranks by hand with numactl --cpunodebind",
            NUMA,
            data,
        )
    spread = sorted({int(g["numa_node"]) for g in gpus if int(g["numa_node"]) >= 0})
    tail = f"; GPUs on nodes {spread}: bind each rank to its GPU's node" if len(spread) > 1 else ""
    return Check("gpu_numa", title, PASS, shown + tail, matters_for=NUMA, data=data)


def free_bytes(path: Path) -> tuple[Path, int]:
    """Free space where ``path`` is (or would be created): nearest existing ancestor."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p, shutil.disk_usage(p).free


def disk_status(free: int) -> str:
    return FAIL if free < DISK_FAIL else WARN if free < DISK_WARN else PASS


def _disk_check(check_id: str, title: str, path: Path, what: str) -> Check:
    try:
        where, free = free_bytes(path)
    except OSError as exc:
        return Check(check_id, title, WARN, f"{path}: {exc}", f"make {path} writable or point it elsewhere")
    status = disk_status(free)
    seen = f"{gib(free)} free at {where}" + ("" if where == path else f" (for {path})")
    data = {"path": str(path), "free": free}
    if status == PASS:
        return Check(check_id, title, PASS, seen, data=data)
    floor = gib(DISK_FAIL if status == FAIL else DISK_WARN)
    return Check(
        check_id,
        title,
        status,
        f"{seen}: under {floor}, {what} may not fit",
        f"free space there, or set {'COCKPIT_RUNS_DIR' if check_id == 'disk_runs' else 'COCKPIT_CACHE_DIR'} to a bigger disk",
        data=data,
    )


def check_disk_runs(ctx: Context) -> Check:
    from cockpit.store.rundir import default_runs_dir

    path = ctx.roots.runs_dir or default_runs_dir()
    check = _disk_check("disk_runs", "free disk: runs dir", path, "checkpoints and merged exports")
    return with_filesystem(check, path)


def with_filesystem(check: Check, path: Path) -> Check:
    """The runs dir's filesystem type in the check: a multi-node (Slurm) run needs a shared one."""
    from dataclasses import replace

    from cockpit.slurm.fs import describe, filesystem_of, is_shared

    fstype, point = filesystem_of(path)
    data = {**(check.data or {}), "fstype": fstype, "mount": point, "shared": is_shared(fstype)}
    return replace(check, seen=f"{check.seen}; filesystem {describe(path)}", data=data)


def check_disk_cache(ctx: Context) -> Check:
    from cockpit.store.rundir import cache_dir

    path = ctx.roots.cache_dir or cache_dir()
    return _disk_check("disk_cache", "free disk: cache", path, "the converted model")


def meminfo(ctx: Context) -> dict[str, int]:
    """/proc/meminfo in bytes; psutil when procfs is not there."""
    text = read_text(ctx.roots.proc / "meminfo")
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024
    if "MemTotal" not in out:
        try:
            import psutil

            vm = psutil.virtual_memory()
            out = {"MemTotal": int(vm.total), "MemAvailable": int(vm.available)}
        except Exception:
            pass
    return out


def check_host_memory(ctx: Context) -> Check:
    title = "host memory"
    info = meminfo(ctx)
    if "MemTotal" not in info:
        return Check("host_memory", title, SKIP, "cannot read /proc/meminfo (and no psutil)")
    total, avail = info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    seen = f"{gib(avail)} available of {gib(total)}"
    data = {"total": total, "available": avail}
    if avail < MEM_FAIL:
        return Check(
            "host_memory",
            title,
            FAIL,
            seen + ": too little to load a model",
            "stop other jobs on this machine (see `top`)",
            data=data,
        )
    if avail < MEM_WARN:
        return Check(
            "host_memory",
            title,
            WARN,
            seen + ": loading a 7B model needs ~15 GB on the host",
            "stop other jobs, or train a smaller model",
            data=data,
        )
    return Check("host_memory", title, PASS, seen, data=data)
