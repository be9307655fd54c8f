"""Every sequence of up to three of the cockpit's global keys, from both start states (no runs: the
app opens on Setup; runs present: on Runs), in a fresh app each, with Textual's Pilot: no exception,
and the screen a person expects (the model below says which).

The keys: F2 Setup, F3 Runs, F4 Doctor, F8 launch, ? keys view, Esc, n (new run), Ctrl+P palette.
A launch goes through ``cli_calls.train_detached`` (``cockpit train --detach`` in a subprocess): here it
answers with a recorded run dir, so a walk of a thousand launches trains nothing;
``test_launch_with_runs_present_reaches_live`` launches for real.

Cost: a fresh app costs ~0.2 s (Runs) to ~1 s (Setup's form) on a 2-core box, so the walk is a
breadth-first search over the app's states: a sequence runs in a fresh app unless the keys before its
last one left a state (modes registered, every mode's screen stack, focus, Setup's form) that
shorter or earlier keys already left; then it ends where the same last key took that state, and the
model must predict that too. The two start states are two files (xdist runs files side by side):
this one and ``test_ui_navigation_runs.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path

import pytest

from tests.test_ui_pilot import form_filled, wait_for_form

FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "ui_run"
KEYS = ("f2", "f3", "f4", "f8", "question_mark", "escape", "n", "ctrl+p")
BASE = {"setup": "SetupScreen", "runs": "RunsScreen", "doctor": "DoctorScreen"}
OVERLAYS = ("KeysView", "CockpitPalette")


def expected_stack(start: str, keys: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """What a person expects after ``keys``: (mode, the shown mode's screen stack)."""
    mode = start
    stacks: dict[str, list[str]] = {start: [BASE[start]]}

    def go(target: str) -> None:  # a mode opens on its base screen (F3: the Runs list, from Live too)
        nonlocal mode
        if target != mode:
            while stacks[mode][-1] in OVERLAYS:
                stacks[mode].pop()
            mode = target
        del stacks.setdefault(mode, [BASE[mode]])[1:]

    for key in keys:
        top = stacks[mode][-1]
        if key in ("f2", "f3", "f4"):
            go({"f2": "setup", "f3": "runs", "f4": "doctor"}[key])
        elif top == "CockpitPalette":  # the palette's search box takes the other keys as text, Esc closes it
            if key == "escape":
                stacks[mode].pop()
        elif key == "f8" and top == "SetupScreen":
            go("runs")
            stacks["runs"].append("LiveScreen")
        elif key == "question_mark":
            stacks[mode].pop() if top == "KeysView" else stacks[mode].append("KeysView")
        elif key == "escape" and top in ("KeysView", "LiveScreen", "SummaryScreen"):
            stacks[mode].pop()
        elif key == "n" and top == "RunsScreen":
            go("setup")
        elif key == "ctrl+p":
            stacks[mode].append("CockpitPalette")
    return mode, tuple(stacks[mode])


def fingerprint(app) -> tuple:
    """Everything that decides what the next of KEYS does. Not the palette's search text: Esc closes
    the palette whatever it holds, and the other keys only add to it (Enter is not one of KEYS)."""
    stacks = tuple(sorted((m, tuple(type(s).__name__ for s in st)) for m, st in app._screen_stacks.items()))
    setup = next((s for st in app._screen_stacks.values() for s in st if type(s).__name__ == "SetupScreen"), None)
    form = tuple(sorted(setup.model.raw().items())) if setup is not None else None
    focused = app.focused.id if app.focused is not None else None
    return app.current_mode, stacks, tuple(sorted(app._modes)), focused, repr(form)


def form_pending(app) -> bool:
    """A Setup screen on top whose form is still being laid out, filled and checked (after its first frame)."""
    return type(app.screen).__name__ == "SetupScreen" and not form_filled(app)


async def settle(app, pilot) -> None:
    """Until no worker runs and the messages they posted are handled (a launch: preflight, then launch),
    and a Setup screen just shown has its form."""
    for _ in range(20):
        await pilot.pause()
        if not any(w.is_running for w in app.workers) and not form_pending(app):
            await pilot.pause()
            if not any(w.is_running for w in app.workers) and not form_pending(app):
                return
        await app.workers.wait_for_complete()
        if form_pending(app):
            await pilot.pause(0.05)


async def walk_one(runs_dir: Path, keys: tuple[str, ...]) -> tuple[tuple, tuple[str, tuple[str, ...]]]:
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.widgets import Machine

    app = CockpitApp(runs_dir, follow=False, doctor_checks=[], machine=Machine("testhost", 0, "", None, 24.0))
    async with app.run_test(size=(120, 36)) as pilot:
        if app.start == "setup":  # the form is filled and checked after the first frame
            await wait_for_form(pilot)
        await settle(app, pilot)
        for key in keys:
            await pilot.press(key)
            await settle(app, pilot)
            assert app._exception is None, (keys, key, app._exception)
        seen = (app.current_mode, tuple(type(s).__name__ for s in app.screen_stack))
        state = fingerprint(app)
    assert app.return_code in (None, 0), (keys, app.return_code)
    return state, seen


@pytest.fixture
def nav_env(tmp_path, monkeypatch):
    """Both start states' runs dirs, and launches answered by a recorded run (nothing trains)."""
    from cockpit.ui import cli_calls

    recorded = tmp_path / "launched" / "20261130-094516-cpu-demo-tiny-de8f"
    shutil.copytree(FIXTURE_RUNS / recorded.name, recorded)
    launches: list[Path] = []

    def train_detached(path, runs_dir, *args, **kwargs):
        launches.append(Path(path))
        return cli_calls.CliResult(0, {"run_dir": str(recorded)}, "", "")

    monkeypatch.setattr(cli_calls, "train_detached", train_detached)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    empty = tmp_path / "no-runs"
    empty.mkdir()
    full = tmp_path / "runs"
    shutil.copytree(FIXTURE_RUNS, full)
    return {"setup": empty, "runs": full, "launches": launches}


def walk_and_check(nav_env: dict, start: str) -> None:
    runs_dir = nav_env[start]

    async def walk() -> tuple[dict, int]:
        state, start_seen = await walk_one(runs_dir, ())
        seen = {(): start_seen}  # keys -> (mode, screen stack) after them
        state_after = {(): state}
        first_to = {state: ()}  # a state -> the first keys that left it (walked from, in a fresh app)
        fresh = 1
        for depth in (1, 2, 3):
            for keys in itertools.product(KEYS, repeat=depth):
                twin = first_to[state_after[keys[:-1]]]
                if twin == keys[:-1]:
                    state_after[keys], seen[keys] = await walk_one(runs_dir, keys)
                    fresh += 1
                else:  # the keys before the last left the same state as `twin`: walked already
                    state_after[keys], seen[keys] = state_after[(*twin, keys[-1])], seen[(*twin, keys[-1])]
                first_to.setdefault(state_after[keys], keys)
        return seen, fresh

    seen, fresh = asyncio.run(walk())
    assert len(seen) == 1 + 8 + 64 + 512
    wrong = {" ".join(k) or "(start)": (got, expected_stack(start, k)) for k, got in seen.items()
             if got != expected_stack(start, k)}
    assert not wrong, f"{len(wrong)} sequences end elsewhere (got, expected): {dict(list(wrong.items())[:12])}"
    assert nav_env["launches"], "F8 on Setup launched nothing"
    print(f"{start}: {len(seen)} sequences, {fresh} fresh apps")  # 2026-12-02: 585 sequences; see the docstring


@pytest.mark.budget(600, reason="every sequence of up to three of 8 keys from a fresh app with no runs (issue 51: a state-graph walk will shrink it)")
@pytest.mark.slow
def test_every_key_sequence_up_to_three_without_runs(nav_env):
    walk_and_check(nav_env, "setup")
