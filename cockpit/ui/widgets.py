"""Small pieces the screens share: the bearings line (which machine, which runs dir), this
machine's GPUs and RAM read without torch, and DataTable cells that fit the table's width."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.widgets import Checkbox, Static

from cockpit.cells import clip  # noqa: F401 - the screens' tables cut cells with it
from cockpit.telemetry.kfd import kfd_gpus


@dataclass(frozen=True)
class Machine:
    host: str
    gpus: int
    gpu_kind: str  # "AMD" | "NVIDIA" | ""
    gpu_memory_gb: float | None  # per device, when the driver says it
    ram_gb: float | None

    @property
    def gpu_text(self) -> str:
        if not self.gpus:
            return "no GPU: CPU runs"
        mem = f" {self.gpu_memory_gb:.0f} GiB" if self.gpu_memory_gb else ""
        return f"{self.gpus}× {self.gpu_kind} GPU{mem}"


def host_ram_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def detect_machine() -> Machine:
    """This machine, from the kernel's files only (the UI never imports torch)."""
    amd, amd_mem = kfd_gpus()
    nvidia = Path("/proc/driver/nvidia/gpus")
    nv = len(list(nvidia.iterdir())) if nvidia.is_dir() else 0
    kind = "AMD" if amd else "NVIDIA" if nv else ""
    return Machine(socket.gethostname().split(".")[0], amd or nv, kind, amd_mem if amd else None, host_ram_gb())


def machine_of(app: Any) -> Machine:
    """The app's machine (injected by tests and screenshots, else detected once)."""
    m = getattr(app, "machine", None)
    if m is None:
        m = detect_machine()
        try:
            app.machine = m
        except AttributeError:
            pass
    return m


def bearings(machine: Machine, runs_dir: Path, active: int | None, total: int | None, width: int | None = None) -> Text:
    """The line: cockpit · host · GPUs · active runs · runs dir (counts None: not read yet, ``…``).
    In ``width`` cells the runs dir is cut from the left (``…/cockpit/runs``), never the line's end mid-way."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("cockpit", style="bold")
    t.append(f" · {machine.host} · ")
    t.append(machine.gpu_text, style="bold" if machine.gpus else "")
    t.append(" · ")
    t.append(
        f"{'…' if active is None else active}/{'…' if total is None else total} runs active",
        style="bold" if active else "",
    )
    home = str(Path.home())
    where = str(runs_dir)
    where = "~" + where[len(home) :] if where.startswith(home + os.sep) else where
    room = None if width is None else width - t.cell_len - 3
    if room is not None and len(where) > room:
        where = "…" + where[len(where) - room + 1 :] if room >= 12 else ""
    if where:
        t.append(" · " + where)
    return t


class Bearings(Static):
    """One line on top of Runs, Setup and Doctor: host, GPUs found, runs dir, active runs."""

    DEFAULT_CSS = "Bearings { height: 1; padding: 0 1; background: $boost; }"

    def __init__(self, *, counted_by_screen: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.counted_by_screen = counted_by_screen  # Runs passes the counts it has just read

    def on_mount(self) -> None:
        # the counts (each run's status read) come after the first frame: the screen's own (Runs),
        # or this line's, every runs_refresh_s
        self.refresh_line((None, None))
        if not self.counted_by_screen:
            self.call_after_refresh(self.refresh_line)
            self.set_interval(getattr(self.app, "runs_refresh_s", 2.0), self.refresh_line)

    def refresh_line(self, counts: tuple[int | None, int | None] | None = None) -> None:
        from cockpit.store.rundir import TERMINAL_STATES, list_runs

        runs_dir = Path(getattr(self.app, "runs_dir", "."))
        if counts is None:
            runs = list_runs(runs_dir)
            counts = (sum(1 for r in runs if r.read_status().get("state") not in TERMINAL_STATES), len(runs))
        self._counts = counts
        self.update(bearings(machine_of(self.app), runs_dir, *counts, width=self.content_region.width or None))

    def on_resize(self) -> None:
        if getattr(self, "_counts", None) is not None:
            self.refresh_line(self._counts)


def share_width(total: int, wants: list[int], mins: list[int]) -> list[int]:
    """Column widths that fit ``total`` cells: each column gets what it wants when all fit,
    else the widest are cut first (never below their minimum)."""
    widths = list(wants)
    while sum(widths) > total:
        i = max(range(len(widths)), key=lambda k: widths[k] - mins[k])
        if widths[i] <= mins[i]:
            break
        widths[i] -= 1
    return widths


class TickBox(Checkbox):
    """A checkbox that reads the same without colour: ``X`` when checked, blank when not (Textual's
    draws ``X`` both ways and tells them apart by colour alone; NO_COLOR and 16-colour terminals)."""

    @property
    def BUTTON_INNER(self) -> str:  # type: ignore[override]  # Textual reads a class attribute; here per value
        return "X" if self.value else " "
