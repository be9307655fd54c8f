"""Screenshots of every screen, fed from the recorded run in ``tests/fixtures/ui_run``.

    python scripts/ui_screenshots.py [OUT_DIR]     # default: screenshots/

A development script (it reads tests/fixtures/), so it lives here, not in the shipped package;
the tests import it through pytest's ``pythonpath = ["scripts"]``.

The same scenes drive the snapshot tests (tests/test_ui_snapshots.py), so what the README
shows is what the tests pin. Deterministic: frozen clock, no live following, UTC times,
an empty user config dir, relative paths.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path("tests") / "fixtures" / "ui_run"  # relative to ROOT: paths on screen stay short
RUN_ID = "20261130-094516-cpu-demo-tiny-de8f"
FROZEN_NOW = 1796031960.0
SIZES = {"80x24": (80, 24), "160x48": (160, 48)}


def prepare_env(config_home: Path) -> None:
    """What makes a scene deterministic: cwd at the repo root, UTC, no user presets."""
    os.chdir(ROOT)
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ["XDG_CONFIG_HOME"] = str(config_home)
    os.environ["COCKPIT_SLURM"] = "0"  # no "Launch on Slurm", whether sbatch is on PATH or not


# the recorded machine (the doctor.json one): a 2-core CPU box with 24 GiB and no GPU
MACHINE: dict[str, Any] = {"host": "cpu-box", "gpus": 0, "gpu_kind": "", "gpu_memory_gb": None, "ram_gb": 24.0}


def make_app(start: str, **kw: Any):
    """``colours``: "no" (NO_COLOR set, as Textual reads it) or "16" (the ANSI theme, 16 colours)."""
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.widgets import Machine

    colours = kw.pop("colours", None)
    doctor = json.loads((ROOT / FIXTURE / "doctor.json").read_text(encoding="utf-8"))
    if colours == "no":
        os.environ["NO_COLOR"] = "1"  # Textual reads (and removes) it when the app is made
    app = CockpitApp(FIXTURE, start=start, clock=lambda: FROZEN_NOW, follow=False, runs_refresh_s=3600,
                     doctor_checks=doctor, machine=Machine(**MACHINE), **kw)
    os.environ.pop("NO_COLOR", None)
    if colours == "16":
        app.theme = "ansi-dark"  # the terminal's own 16 colours
    return app


async def _settle(pilot, until: Callable[[], bool] | None = None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while until is not None and not until() and time.monotonic() < deadline:
        await pilot.pause(0.05)
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.1)


def tables_sized(pilot, screen: str, *selectors: str) -> bool:
    """The screen is up and each of its tables has rows and columns sized to them: DataTable
    sizes its columns to the new rows on idle (``_require_update_dimensions`` until then: a shot
    taken before has columns of their labels' width)."""
    if type(pilot.app.screen).__name__ != screen:
        return False
    tables = [t for sel in selectors for t in pilot.app.screen.query(sel)]
    return bool(tables) and all(t.row_count and not t._require_update_dimensions for t in tables)


async def _runs(pilot) -> None:
    await _settle(pilot)


async def _open(pilot, key: str, screen: str) -> None:
    from cockpit.store.rundir import RunDir

    run = RunDir(FIXTURE / RUN_ID)
    if screen == "live":
        pilot.app.open_live(run)
        await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "LiveScreen"
                      and pilot.app.screen.replay_progress is None and pilot.app.screen.state.events_seen > 0)
        pilot.app.screen._drawn_version = -1
        pilot.app.screen.draw()
    else:
        pilot.app.open_summary(run)
        # the probes table is filled from a worker: wait for its rows, then for the layout pass
        # that sizes its columns (a shot taken between the two has squeezed columns)
        await _settle(pilot, lambda: tables_sized(pilot, "SummaryScreen", "#probes"))
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.2)
    await pilot.pause(0.2)


async def _live(pilot) -> None:
    await _open(pilot, "", "live")


async def _plot(pilot) -> None:
    await _open(pilot, "", "live")
    await pilot.press("p")
    await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "PlotView")


async def _summary(pilot) -> None:
    await _open(pilot, "", "summary")


async def _setup(pilot) -> None:
    def ready() -> bool:
        scr = pilot.app.screen
        fit = scr.query("#fit")
        return scr._validate_timer is None and bool(fit) and "fit: peak" in str(fit.first().render())

    await _settle(pilot, ready)
    await _settle(pilot, ready)


async def _doctor(pilot) -> None:
    await _settle(pilot)


COMPARE_RUNS = 3  # the newest recorded runs, marked in Runs with space, compared with d


async def _compare(pilot) -> None:
    await _settle(pilot)
    for _ in range(COMPARE_RUNS):
        await pilot.press("space", "down")
    await pilot.press("d")
    await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "CompareScreen" and pilot.app.screen.data is not None)
    await _settle(pilot, lambda: tables_sized(pilot, "CompareScreen", "#compare-summary", "#compare-config"))
    await pilot.wait_for_scheduled_animations()
    await pilot.pause(0.3)


async def _keys(pilot) -> None:
    await _settle(pilot)
    await pilot.press("question_mark")
    await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "KeysView")


# name -> (start mode, extra app options, run_before)
SCENES: dict[str, tuple[str, dict[str, Any], Callable[[Any], Awaitable[None]]]] = {
    "runs": ("runs", {}, _runs),
    "live": ("runs", {}, _live),
    "plot": ("runs", {}, _plot),
    "summary": ("runs", {}, _summary),
    "setup": ("setup", {"start_preset": Path("presets") / "cpu-demo.yaml"}, _setup),
    "doctor": ("doctor", {}, _doctor),
    "compare": ("runs", {}, _compare),
    "keys": ("runs", {}, _keys),
    "summary-nocolor": ("runs", {"colours": "no"}, _summary),
    "runs-16colour": ("runs", {"colours": "16"}, _runs),
}


async def shoot(name: str, size: tuple[int, int], out: Path) -> Path:
    start, opts, before = SCENES[name]
    app = make_app(start, **opts)
    async with app.run_test(size=size) as pilot:
        await before(pilot)
        svg = app.export_screenshot(title=f"cockpit — {name}")
    path = out / f"{name}-{size[0]}x{size[1]}.svg"
    path.write_text(svg, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    import tempfile

    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]).resolve() if argv else ROOT / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    prepare_env(Path(tempfile.mkdtemp(prefix="cockpit-shots-")))
    for name in SCENES:
        for size in SIZES.values():
            print(asyncio.run(shoot(name, size, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
