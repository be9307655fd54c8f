"""Every sequence of up to three of the cockpit's global keys, from both start states (no runs: the
app opens on Setup; runs present: on Runs), in a fresh app each, with Textual's Pilot: no exception,
and the screen a person expects (the model below says which).

The keys: F2 Setup, F3 Runs, F4 Doctor, F8 launch, ? keys view, Esc, n (new run), Ctrl+P palette, S (Runs:
the selected run's sweep; with runs present the newest run is a trial of the sweep ``ui_screenshots.write_sweep``
writes, so S opens its Sweep screen).
A launch goes through ``cli_calls.train_detached`` (``cockpit train --detach`` in a subprocess): here it
answers with a recorded run dir, so a walk of a thousand launches trains nothing;
``test_launch_with_runs_present_reaches_live`` launches for real.

Cost: a fresh app costs ~0.2 s (Runs) to ~1 s (Setup's form) on a 2-core box, and replaying each
sequence from a fresh app took 6-10 min a walk. So the walk explores the app's state graph in one app:
a state is what decides what the next key does (modes registered, every mode's screen stack, focus,
Setup's form: ``fingerprint``); each (state, key) edge of a state within two keys of the start is driven
once, from wherever the app is, by walking the known edges to that state (a fresh app, replayed from the
start, only when no known edge leads there). Every sequence of up to three keys is then read off the
edges, and the model must predict each one. A merged state must really be one state: every known edge
the walk drives again on its way somewhere must lead where it led the first time, or the test fails.
The two start states are two files (xdist runs files side by side): this one and
``test_ui_navigation_runs.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path

import pytest
from ui_screenshots import write_sweep

from tests.test_ui_pilot import form_filled, wait_for_form

FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "ui_run"
KEYS = ("f2", "f3", "f4", "f8", "question_mark", "escape", "n", "ctrl+p", "S")
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
        elif key == "escape" and top in ("KeysView", "LiveScreen", "SummaryScreen", "SweepScreen"):
            stacks[mode].pop()
        elif key == "S" and top == "RunsScreen" and start == "runs":  # the selected (newest) run is a sweep's trial
            stacks[mode].append("SweepScreen")
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


def new_app(runs_dir: Path):
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.widgets import Machine

    return CockpitApp(runs_dir, follow=False, doctor_checks=[], machine=Machine("testhost", 0, "", None, 24.0))


class Walker:
    """One app driven key by key, and the state graph it has seen: ``edges[(state, key)]`` is the state
    the key led to, ``shown[state]`` the (mode, screen stack) a person sees there."""

    def __init__(self) -> None:
        self.edges: dict[tuple, tuple] = {}
        self.shown: dict[tuple, tuple[str, tuple[str, ...]]] = {}
        self.start: tuple | None = None
        self.fresh = 0
        self.pressed = 0

    def look(self, app) -> tuple:
        state = fingerprint(app)
        self.shown[state] = (app.current_mode, tuple(type(s).__name__ for s in app.screen_stack))
        return state

    async def press(self, app, pilot, state: tuple, key: str) -> tuple:
        await pilot.press(key)
        await settle(app, pilot)
        self.pressed += 1
        assert app._exception is None, (state, key, app._exception)
        after = self.look(app)
        known = self.edges.setdefault((state, key), after)
        assert known == after, f"{key} from one state led to two: a state the walk merged is not one state ({state})"
        return after

    def path(self, source: tuple, targets: set) -> list[str] | None:
        """The fewest known keys from ``source`` to any of ``targets`` (breadth first), None without one."""
        previous: dict[tuple, tuple[tuple, str] | None] = {source: None}
        queue = [source]
        for state in queue:
            if state in targets:
                keys = []
                while previous[state] is not None:
                    state, key = previous[state]
                    keys.append(key)
                return keys[::-1]
            for key in KEYS:
                nxt = self.edges.get((state, key))
                if nxt is not None and nxt not in previous:
                    previous[nxt] = (state, key)
                    queue.append(nxt)
        return None

    def within(self, depth: int) -> dict[tuple, int]:
        """The states within ``depth`` keys of the start, by the known edges, and their distance."""
        dist = {self.start: 0}
        frontier = [self.start]
        for d in range(1, depth + 1):
            frontier = [
                n for s in frontier for k in KEYS if (n := self.edges.get((s, k))) is not None and n not in dist
            ]
            for n in frontier:
                dist[n] = d
        return dist

    async def explore(self, runs_dir: Path, depth: int = 2) -> None:
        """Drive every key from every state within ``depth`` keys of the start."""
        while True:
            app = new_app(runs_dir)
            self.fresh += 1
            async with app.run_test(size=(120, 36)) as pilot:
                if app.start == "setup":  # the form is filled and checked after the first frame
                    await wait_for_form(pilot)
                await settle(app, pilot)
                state = self.look(app)
                assert self.start in (None, state), "a fresh app opened in another state"
                self.start = state
                while True:
                    todo = {s for s in self.within(depth) if any((s, k) not in self.edges for k in KEYS)}
                    if not todo:
                        break
                    route = self.path(state, todo)
                    if route is None:
                        break  # nothing known leads back there: a fresh app
                    for key in route:
                        state = await self.press(app, pilot, state, key)
                    key = next(k for k in KEYS if (state, k) not in self.edges)
                    state = await self.press(app, pilot, state, key)
            assert app.return_code in (None, 0), app.return_code
            if not todo:
                return

    def after(self, keys: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
        state = self.start
        for key in keys:
            state = self.edges[(state, key)]
        return self.shown[state]


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
    write_sweep(full)  # its trials' runs are the newest: S on Runs opens the Sweep screen
    return {"setup": empty, "runs": full, "launches": launches}


def walk_and_check(nav_env: dict, start: str) -> None:
    walker = Walker()
    asyncio.run(walker.explore(nav_env[start]))
    seen = {keys: walker.after(keys) for depth in (0, 1, 2, 3) for keys in itertools.product(KEYS, repeat=depth)}
    assert len(seen) == sum(len(KEYS) ** depth for depth in (0, 1, 2, 3))
    wrong = {
        " ".join(k) or "(start)": (got, expected_stack(start, k))
        for k, got in seen.items()
        if got != expected_stack(start, k)
    }
    assert not wrong, f"{len(wrong)} sequences end elsewhere (got, expected): {dict(list(wrong.items())[:12])}"
    assert nav_env["launches"], "F8 on Setup launched nothing"
    print(
        f"{start}: {len(seen)} sequences, {len(walker.shown)} states, {len(walker.edges)} edges driven, "
        f"{walker.pressed} keys pressed in {walker.fresh} app(s)"
    )


@pytest.mark.budget(
    240,
    reason="every edge of the app's state graph within two keys of Setup (37 states, 171 edges with S, 32 apps each filling Setup's form: 137 s, 2026-12-05)",
)
@pytest.mark.slow
def test_every_key_sequence_up_to_three_without_runs(nav_env):
    walk_and_check(nav_env, "setup")
