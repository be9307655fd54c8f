"""Presets: the repo's ``presets/*.yaml`` and the user's ``~/.config/cockpit/presets/*.yaml``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.config.load import read_yaml, to_yaml
from cockpit.rundir import atomic_write_text

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
    for folder, source in [(REPO_PRESETS, "built-in"), (user_presets_dir(), "yours")] + [(d, "yours") for d in extra_dirs or []]:
        if folder.is_dir():
            for p in sorted(folder.glob("*.y*ml")):
                found.append(Preset(p.stem, p, source))
    return found


def load_preset(path: Path) -> dict[str, Any]:
    data, _lines = read_yaml(path)
    return data


def save_preset(name: str, mapping: dict[str, Any], folder: Path | None = None) -> Path:
    import re

    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "preset"
    folder = folder or user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug}.yaml"
    text = f"# saved from the cockpit Setup screen; run it with: cockpit train {path}\n" + to_yaml(mapping)
    atomic_write_text(path, text, mode=0o644)
    return path
