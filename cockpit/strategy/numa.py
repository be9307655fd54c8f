"""NUMA binding of local ranks: which node each rank's CPUs and memory are bound to.

``numa_bind`` (config key): ``auto`` (each local rank on its GPU's NUMA node), ``off``, or an
explicit map ``"LOCAL_RANK:NODE,..."`` such as ``"0:0,1:0,2:1"``.

Where the GPU's node comes from: amdsmi's ``amdsmi_get_gpu_topo_numa_affinity`` (through the
telemetry's safe loader, which never hangs or prints), else sysfs
``/sys/bus/pci/devices/<bdf>/numa_node`` of the display-class PCI functions of AMD / NVIDIA,
in BDF order (the order ROCm and CUDA enumerate them), honouring ``HIP_VISIBLE_DEVICES`` /
``ROCR_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` given as indices.

How the binding is applied: every rank runs through :mod:`cockpit.strategy.bind`, which
looks up its ``LOCAL_RANK`` in the plan and ``exec``s ``numactl --cpunodebind=N
--preferred=N`` (``numa_memory: strict``: ``--membind=N``; strict binding OOM-kills a rank whose
node fills up, as CPU Adam and pinned offload buffers do on two-socket MI250 / MI300X nodes, while
the other node has room; preferred allocates there and spills over) (or, when numactl is missing, sets ``os.sched_setaffinity`` to the node's CPUs
and execs; memory then follows first touch). ``exec`` keeps the pid, so the pid torchrun and
the supervisor see is the training rank itself (stop / kill reach it).

Why not ``torchrun --numa-binding``: it derives the node from the CUDA device of each rank
(needs a working GPU torch at launch time), takes no explicit map, cannot be previewed as a
command, and does nothing on a CPU-only box, where our tests run. Pure: no torch.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GPU_VENDORS = {"0x1002": "amd", "0x10de": "nvidia"}
GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")  # display VGA / 3D / other, processing accelerator


def parse_map(text: str) -> dict[int, int]:
    """``"0:0,1:0,2:1"`` -> {0: 0, 1: 0, 2: 1}; raises ValueError naming the bad part."""
    out: dict[int, int] = {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*:\s*(\d+)", part)
        if not m:
            raise ValueError(f"expected LOCAL_RANK:NODE pairs like '0:0,1:0,2:1', got {part!r}")
        rank, node = int(m.group(1)), int(m.group(2))
        if rank in out:
            raise ValueError(f"local rank {rank} is mapped twice")
        out[rank] = node
    if not out:
        raise ValueError("empty map; use auto, off, or pairs like '0:0,1:0'")
    return out


def check_value(value: str | None, nproc_per_node: int) -> str | None:
    """A problem with a ``numa_bind`` value, or None (used by config validation)."""
    if value is None or str(value).strip().lower() in ("auto", "off"):
        return None
    try:
        mapping = parse_map(str(value))
    except ValueError as exc:
        return str(exc)
    missing = [r for r in range(nproc_per_node) if r not in mapping]
    extra = [r for r in mapping if r >= nproc_per_node]
    if missing:
        return f"no NUMA node for local rank(s) {missing} (nproc_per_node is {nproc_per_node})"
    if extra:
        return f"local rank(s) {extra} do not exist (nproc_per_node is {nproc_per_node})"
    return None


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def online_nodes(sysfs: str | os.PathLike[str] = "/sys") -> list[int]:
    text = _read(Path(sysfs) / "devices/system/node/online")
    return parse_cpulist(text) if text else [0]


def node_cpus(node: int, sysfs: str | os.PathLike[str] = "/sys") -> list[int]:
    text = _read(Path(sysfs) / f"devices/system/node/node{node}/cpulist")
    return parse_cpulist(text) if text else []


def sysfs_gpu_nodes(sysfs: str | os.PathLike[str] = "/sys") -> list[dict[str, Any]]:
    """GPUs on the PCI bus (AMD / NVIDIA display-class functions), in BDF order."""
    root = Path(sysfs) / "bus/pci/devices"
    out = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    for dev in entries:
        vendor, cls = _read(dev / "vendor"), _read(dev / "class")
        if vendor not in GPU_VENDORS or not cls or not cls.startswith(GPU_CLASSES):
            continue
        node = _read(dev / "numa_node")
        try:
            n = int(node) if node is not None else -1
        except ValueError:
            n = -1
        out.append(
            {"bdf": dev.name, "vendor": GPU_VENDORS[vendor], "numa_node": n if n >= 0 else None, "source": "sysfs"}
        )
    return out


def amdsmi_gpu_nodes() -> list[dict[str, Any]]:
    """GPUs and their NUMA node from amdsmi ([] when amdsmi is missing or fails)."""
    try:
        from cockpit.telemetry.amd import AmdSmiBackend, load_amdsmi

        smi, _reason = load_amdsmi()
        if smi is None:
            return []
        backend = AmdSmiBackend(smi)
        try:
            return [
                {"bdf": s.get("bdf"), "vendor": "amd", "numa_node": s.get("numa_node"), "source": "amdsmi"}
                for s in backend._static
            ]
        finally:
            backend.close()
    except Exception:  # noqa: BLE001 - amdsmi absent or failing: no GPU NUMA facts
        return []


def visible_indices(env: Mapping[str, str]) -> list[int] | None:
    for name in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name)
        if value is None or not value.strip():
            continue
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if all(p.isdigit() for p in parts):
            return [int(p) for p in parts]
        return None  # UUIDs: cannot map to indices here
    return None


@dataclass
class NumaPlan:
    mode: str  # off | auto | map
    nodes: dict[int, int] = field(default_factory=dict)  # local rank -> node; empty: no binding
    method: str | None = None  # numactl | sched_setaffinity | None
    notes: list[str] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    memory: str = "preferred"  # numactl's memory policy: preferred (spills to other nodes) | strict (--membind)

    @property
    def active(self) -> bool:
        return bool(self.nodes)

    def map_text(self) -> str:
        return ",".join(f"{r}:{n}" for r, n in sorted(self.nodes.items()))

    def prefix(self, local_rank: int) -> list[str]:
        """What goes in front of the rank's python for this local rank (for previews)."""
        node = self.nodes.get(local_rank)
        if node is None:
            return []
        if self.method == "numactl":
            return numactl_prefix(node, self.memory)
        return [f"<sched_setaffinity: node {node} cpus>"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "nodes": {str(k): v for k, v in self.nodes.items()},
            "method": self.method,
            "notes": self.notes,
            "gpus": self.gpus,
            "memory": self.memory,
        }


MEMORY_POLICIES = ("preferred", "strict")


def numactl_prefix(node: int, memory: str = "preferred") -> list[str]:
    """``numactl`` in front of a rank: its CPUs on ``node``, its memory preferred there (strict: only there)."""
    policy = f"--membind={node}" if memory == "strict" else f"--preferred={node}"
    return ["numactl", f"--cpunodebind={node}", policy]


def plan(
    value: str | None,
    nproc_per_node: int,
    *,
    sysfs: str | os.PathLike[str] = "/sys",
    env: Mapping[str, str] | None = None,
    gpu_source: Callable[[], list[dict[str, Any]]] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    memory: str = "preferred",
) -> NumaPlan:
    """The binding for this node's local ranks. Never raises on a machine quirk: it notes it."""
    p = _plan(value, nproc_per_node, sysfs=sysfs, env=env, gpu_source=gpu_source, which=which)
    p.memory = memory if memory in MEMORY_POLICIES else "preferred"
    return p


def _plan(
    value: str | None,
    nproc_per_node: int,
    *,
    sysfs: str | os.PathLike[str],
    env: Mapping[str, str] | None,
    gpu_source: Callable[[], list[dict[str, Any]]] | None,
    which: Callable[[str], str | None],
) -> NumaPlan:
    env = os.environ if env is None else env
    raw = "auto" if value is None else str(value).strip().lower()
    method = "numactl" if which("numactl") else "sched_setaffinity"
    if raw == "off":
        return NumaPlan("off", notes=["NUMA binding off (numa_bind: off)"])
    nodes_online = online_nodes(sysfs)
    if raw != "auto":
        mapping = parse_map(str(value))
        bad = sorted({n for n in mapping.values() if n not in nodes_online})
        p = NumaPlan("map", {r: n for r, n in mapping.items() if r < nproc_per_node}, method)
        if bad:
            p.notes.append(f"NUMA node(s) {bad} are not online here (online: {nodes_online}); numactl will refuse them")
        if method == "sched_setaffinity":
            p.notes.append(
                "numactl not found: CPUs bound with sched_setaffinity, memory follows first touch (install numactl to place memory too)"
            )
        return p
    if len(nodes_online) <= 1:
        return NumaPlan(
            "auto",
            notes=[
                f"one NUMA node on this machine (node {nodes_online[0] if nodes_online else 0}): binding is a no-op"
            ],
        )
    gpus = (gpu_source or amdsmi_gpu_nodes)() if gpu_source is not None or sysfs == "/sys" else []
    if not gpus:
        gpus = sysfs_gpu_nodes(sysfs)
    visible = visible_indices(env)
    if visible is not None:
        gpus = [gpus[i] for i in visible if i < len(gpus)]
    p = NumaPlan("auto", method=method, gpus=gpus)
    if not gpus:
        p.notes.append("no GPU found on the PCI bus: not binding (set numa_bind to an explicit map to bind CPU ranks)")
        return p
    for r in range(nproc_per_node):
        if r >= len(gpus):
            p.notes.append(f"local rank {r} has no GPU ({len(gpus)} visible): not bound")
            continue
        node = gpus[r].get("numa_node")
        if node is None:
            p.notes.append(f"GPU {gpus[r].get('bdf')} reports no NUMA node: local rank {r} not bound")
            continue
        p.nodes[r] = int(node)
    if method == "sched_setaffinity" and p.nodes:
        p.notes.append(
            "numactl not found: CPUs bound with sched_setaffinity, memory follows first touch (install numactl to place memory too)"
        )
    return p
