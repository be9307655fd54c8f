"""The filesystem a path lives on (from /proc/self/mounts), and whether other nodes can see it.

A multi-node run writes one run dir that every node's supervisor and rank reads and writes
(control requests, events, checkpoints), so the runs dir must be on a filesystem the nodes
share: NFS, Lustre, GPFS (Spectrum Scale), BeeGFS, CephFS, WekaFS, ...
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "cephfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "wekafs",
        "panfs",
        "fuse.cephfs",
        "fuse.beegfs",
        "smb3",
        "cifs",
        "virtiofs",
        "9p",
        "fuse.sshfs",
    }
)


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def filesystem_of(path: str | os.PathLike[str], mounts: str = "/proc/self/mounts") -> tuple[str, str]:
    """(fstype, mount point) of ``path`` (or of its nearest existing parent); ('unknown', '') when
    the mount table cannot be read."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    real = os.path.realpath(p)
    try:
        table = Path(mounts).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown", ""
    return mount_of(real, table)


def mount_of(real: str, table: str) -> tuple[str, str]:
    """(fstype, mount point) of the absolute, resolved path ``real`` in a mount table's text."""
    best = ("unknown", "")
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point, fstype = _unescape(fields[1]), fields[2]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[1]):
            best = (fstype, point)
    return best


def is_shared(fstype: str) -> bool:
    return fstype in SHARED_FS_TYPES or fstype.startswith("nfs")


def describe(path: str | os.PathLike[str]) -> str:
    """One line for doctor and submit messages: 'ext4 at / (local to this node)'."""
    fstype, point = filesystem_of(path)
    where = f" at {point}" if point else ""
    kind = (
        "shared between nodes"
        if is_shared(fstype)
        else "local to this node: multi-node Slurm runs need a shared filesystem"
    )
    return f"{fstype}{where} ({kind})"
