"""Presets: the repo's ``presets/*.yaml`` and the user's ``~/.config/cockpit/presets/*.yaml``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.store.rundir import atomic_write_text

REPO_PRESETS = Path(__file__).resolve().parent.parent.parent / "presets"


def user_config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "cockpit"


def user_presets_dir() -> Path:
    return user_config_dir() / "presets"


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    source: str  # "built-in" | "yours"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.source})"


def list_presets(extra_dirs: list[Path] | None = None) -> list[Preset]:
    found: list[Preset] = []
    for folder, source in [(REPO_PRESETS, "built-in"), (user_presets_dir(), "yours")] + [
        (d, "yours") for d in extra_dirs or []
    ]:
        if folder.is_dir():
            for p in sorted(folder.glob("*.y*ml")):
                found.append(Preset(p.stem, p, source))
    return found


def load_preset(path: Path) -> dict[str, Any]:
    from cockpit.config.load import read_yaml

    data, _lines = read_yaml(path)
    return data


def save_preset(name: str, mapping: dict[str, Any], folder: Path | None = None) -> Path:
    import re

    from cockpit.config.load import to_yaml

    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "preset"
    folder = folder or user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug}.yaml"
    text = f"# saved from the cockpit Setup screen; run it with: cockpit train {path}\n" + to_yaml(mapping)
    atomic_write_text(path, text, mode=0o644)
    return path


# -- the presets this machine calls for -------------------------------------------------------
# gfx target -> preset name prefixes, the first the one to load (doctor.facts: MI300X/MI325X are
# gfx942, told apart by memory, 192 vs 256 GB; MI350X/MI355X gfx950; MI250/MI250X/MI210 gfx90a, 64 GiB
# per device: an MI250 GCD or an MI210)
FAMILIES = {"gfx942": ("mi300x-",), "gfx950": ("mi355x-",), "gfx90a": ("mi250-", "mi210-")}
MI325X_MIN_GIB = 224  # an MI300X shows 192 GiB, an MI325X 256
FIRST_CHOICE = "lora-8b"  # one device, LoRA: runs on any machine of the family


def detected_devices(checks: list[dict] | None) -> list[dict]:
    """The GPUs ``cockpit doctor --json`` saw (its ``gpu_devices`` check), [] for none."""
    for c in checks or []:
        if c.get("id") == "gpu_devices" and c.get("status") in ("pass", "warn"):
            return list((c.get("data") or {}).get("devices") or [])
    return []


def machine_family(checks: list[dict] | None) -> tuple[tuple[str, ...], str]:
    """(preset name prefixes, why) for the machine the doctor checks describe; ("cpu-demo",) on a
    machine without a GPU, () for a GPU no preset is written for."""
    devices = detected_devices(checks)
    if not devices:
        return ("cpu-demo",), "no GPU"
    d = devices[0]
    target = str(d.get("target") or d.get("gcn_arch") or "").split(":")[0]
    gib = float(d.get("total_memory") or 0) / 2**30
    why = f"{len(devices)} x {d.get('name') or 'GPU'} ({target or '?'}, {gib:.0f} GiB)"
    prefixes = FAMILIES.get(target, ())
    if target == "gfx942" and gib >= MI325X_MIN_GIB:
        prefixes = ("mi325x-", "mi300x-")
    if target == "gfx90a":
        if gib and gib < 48:
            return (), why  # not a 64 GiB part: the gfx90a presets would not fit
        if "MI210" in str(d.get("name") or "").upper():
            prefixes = ("mi210-", "mi250-")
    return prefixes, why


def offered_presets(checks: list[dict] | None, found: list[Preset] | None = None) -> tuple[list[Preset], str]:
    """The built-in presets for this machine, the one to load first; and why."""
    prefixes, why = machine_family(checks)
    found = list_presets() if found is None else found
    out: list[Preset] = []
    for prefix in prefixes:
        family = [p for p in found if p.source == "built-in" and (p.name == prefix or p.name.startswith(prefix))]
        out += sorted(family, key=lambda p: (FIRST_CHOICE not in p.name, p.name))
    return out, why
