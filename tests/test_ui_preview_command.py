"""F6's "the same run from a shell" runs as shown from the folder the cockpit started in (issue 50,
item 8): it names the opened YAML or the preset's own file (a real path, not ``ui.yaml`` /
``cpu-demo.yaml`` in the current folder), ``--set`` for what the form changed, and the run is named by
the config file (the Output tab's "Run name: from the config file name"), not "ui"."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

from tests.conftest import write_yaml
from tests.test_ui_pilot import wait_for, wait_for_form
from tests.test_ui_setup_live import DOCTOR

ROOT = Path(__file__).resolve().parent.parent


def shown_command(app) -> list[str]:
    """The preview's shell line, as argv after ``cockpit``."""
    from cockpit.ui.screens.modals import TextView

    assert isinstance(app.screen, TextView)
    body = str(app.screen.body).splitlines()
    line = body[body.index("# the same run from a shell:") + 1]
    argv = shlex.split(line)
    return argv[argv.index("train") :]


def config_of(argv: list[str], cwd: Path):
    """What ``cockpit train`` reads from ``argv``, run in ``cwd``: the file must be there."""
    from cockpit.config.load import load_config

    path = cwd / argv[1]
    assert path.is_file(), f"{argv[1]}: no such file in {cwd}"
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    return load_config(path, sets, check_paths=False)


def test_preview_names_the_opened_yaml_and_the_preset_file(tmp_path, monkeypatch):
    from textual.widgets import Input

    from cockpit.ui.app import CockpitApp

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    work = tmp_path / "work"
    (work / "cfgs").mkdir(parents=True)
    monkeypatch.chdir(work)
    demo = (ROOT / "presets" / "cpu-demo.yaml").read_text()
    import yaml

    mine = write_yaml(work / "cfgs" / "mine.yaml", yaml.safe_load(demo))

    async def scenario(start_preset: Path | None) -> list[tuple[list[str], str]]:
        app = CockpitApp(tmp_path / "runs", start="setup", doctor_checks=DOCTOR, start_preset=start_preset)
        seen = []
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for_form(pilot)
            scr = app.screen
            await pilot.press("f6")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "TextView", 5, "the preview")
            seen.append((shown_command(app), scr._run_name()))
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is scr, 5, "back to Setup")
            scr.query_one("#f-learning_rate", Input).value = "3e-4"
            await wait_for(pilot, lambda: scr.checked.cfg and scr.checked.cfg.learning_rate == 3e-4, 5, "lr")
            await pilot.press("f6")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "TextView", 5, "the preview")
            seen.append((shown_command(app), scr._run_name()))
        return seen

    # an opened YAML of one's own: its path from here, named by it; an edit is a --set
    (argv, name), (edited, _) = asyncio.run(scenario(mine))
    assert argv[1] == "cfgs/mine.yaml" and "--set" not in argv, argv
    assert name == "mine"
    assert config_of(argv, work).learning_rate != 3e-4
    assert "learning_rate=0.0003" in edited or "learning_rate=3e-4" in edited, edited
    assert config_of(edited, work).learning_rate == 3e-4

    # the built-in preset (Setup opens with it): its own file in presets/, which is not in this folder
    (argv, name), (edited, _) = asyncio.run(scenario(None))
    assert Path(argv[1]).resolve() == (ROOT / "presets" / "cpu-demo.yaml").resolve(), argv
    assert name == "cpu-demo"
    assert config_of(edited, work).learning_rate == 3e-4
