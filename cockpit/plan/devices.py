"""The device a config is written for, as its YAML's header names it (pure, stdlib only).

Every GPU preset opens with the device it is sized for (``# MI300X (gfx942, 192 GB HBM3): ...``,
``# MI250/MI250X x4 cards = 8 GCDs (gfx90a, 64 GB each): ...``). ``cockpit plan`` and Setup's fit
line plan such a config on that device's memory unless told otherwise (``--gpu-memory``, the GPU
memory field, the GPUs of the machine it trains on): an MI300X preset on 192 GiB, not on an
assumed MI250 GCD. A YAML of your own gets the same by naming its device in its first comment lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# memory of one device as torch / the planner count it, in GiB (an MI250 / MI250X card is two 64 GiB GCDs,
# each one device); the longer names first, so "MI300X" is not read as "MI300"
INSTINCT_GIB = {
    "MI355X": 288.0,
    "MI350X": 288.0,
    "MI325X": 256.0,
    "MI300X": 192.0,
    "MI250X": 64.0,
    "MI250": 64.0,
    "MI210": 64.0,
    "MI100": 32.0,
}
_NAME = re.compile(r"\b(" + "|".join(INSTINCT_GIB) + r")\b", re.IGNORECASE)


@dataclass(frozen=True)
class NamedDevice:
    name: str  # "MI300X"
    gib: float  # one device's memory
    where: str  # "mi300x-lora-8b.yaml's header"

    @property
    def source(self) -> str:
        """Where the capacity came from, as the plan and the fit line say it."""
        return f"an {self.name}, as {self.where} names it"


def header_lines(text: str) -> list[str]:
    """The comment lines that open a YAML (blank lines between them kept out), up to its first key."""
    out: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        out.append(stripped)
    return out


def named_device(path: str | Path | None) -> NamedDevice | None:
    """The first Instinct device named in the comment lines that open the YAML at ``path``; None
    without one (or without a readable file)."""
    if not path:
        return None
    p = Path(path)
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            text = fh.read(8192)
    except OSError:
        return None
    for i, line in enumerate(header_lines(text)):
        m = _NAME.search(line)
        if m:
            name = m.group(1).upper()
            return NamedDevice(name, INSTINCT_GIB[name], f"{p.name}'s header")
        if i > 4:
            break
    return None
