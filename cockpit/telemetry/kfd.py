"""This machine's AMD GPUs and their memory from KFD's topology in sysfs: no torch, no ROCm userspace.
Read by the UI's bearings line and by ``cockpit plan`` (the GPUs a config would train on here)."""

from __future__ import annotations

from pathlib import Path


def kfd_gpus(root: Path = Path("/sys/class/kfd/kfd/topology/nodes")) -> tuple[int, float | None]:
    """KFD topology: nodes with SIMDs are GPUs; their local memory bank gives the VRAM."""
    count, mem = 0, None
    for node in sorted(root.glob("*")) if root.is_dir() else []:
        try:
            props = dict(
                line.split()[:2] for line in (node / "properties").read_text().splitlines() if len(line.split()) >= 2
            )
        except OSError:
            continue
        if int(props.get("simd_count", "0") or 0) <= 0:
            continue
        count += 1
        for bank in (node / "mem_banks").glob("*/properties"):
            try:
                bp = dict(line.split()[:2] for line in bank.read_text().splitlines() if len(line.split()) >= 2)
                mem = max(mem or 0.0, int(bp.get("size_in_bytes", "0")) / 2**30) or None
            except (OSError, ValueError):
                pass
    return count, mem
