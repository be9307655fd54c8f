"""Random fast keys at 80x24 with three runs present (issue 50, item 1): the cockpit must not crash.

A person (or a loaded box) sends keys faster than the app settles: each key here goes in as the
terminal driver sends it (no wait for the app between keys, gaps of 0-20 ms), the palette included.
Before the fix most seeds ended the app: the palette closed by F2/F3/F4 while an Enter or a search was
still queued in it dismissed itself a second time (``ScreenStackError``, or the top screen of the mode
just switched to popped), its search ran on a palette being taken apart (``NoMatches``), a new palette
was pushed while the closed one was still in the app (``DuplicateIds`` on ``--command-palette``), and
a Summary closed before its first frame failed in ``on_mount``. Seeded: a failure prints its keys.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import unicodedata
from pathlib import Path

import pytest
from textual import events
from textual.keys import _get_unicode_name_from_key

FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "ui_run"
KEYS = ("f2", "f3", "f4", "ctrl+p", "ctrl+p", "escape", "enter", "down", "up", "question_mark")
GAPS_S = (0.0, 0.0, 0.001, 0.005, 0.02)


def send_key(app, key: str) -> None:
    """``key`` into the app's queue as the terminal driver puts it there (Pilot.press waits for the app)."""
    try:
        char = unicodedata.lookup(_get_unicode_name_from_key(key))
    except KeyError:
        char = key if len(key) == 1 else None
    event = events.Key(key, char)
    event.set_sender(app)
    app._driver.send_message(event)


async def walk(runs_dir: Path, seed: int, n_keys: int) -> list[str]:
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.widgets import Machine

    rng = random.Random(seed)
    app = CockpitApp(runs_dir, follow=False, doctor_checks=[], machine=Machine("testhost", 0, "", None, 24.0))
    errors: list[BaseException] = []
    handle = app._handle_exception

    def record(error: BaseException) -> None:  # every exception, not only the first
        errors.append(error)
        handle(error)

    app._handle_exception = record  # type: ignore[method-assign]
    sent: list[str] = []
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            for _ in range(n_keys):
                if errors or not app.is_running:  # the palette's Quit ends the walk
                    break
                sent.append(rng.choice(KEYS))
                send_key(app, sent[-1])
                await asyncio.sleep(rng.choice(GAPS_S))
            await pilot.pause(0.3)
            if app.is_running:
                palettes = [s for st in app._screen_stacks.values() for s in st if "CommandPalette" in
                            [c.__name__ for c in type(s).__mro__]]
                assert len(palettes) <= 1, (sent, palettes)
    except Exception as exc:  # run_test re-raises the app's first exception
        errors.append(exc)
    assert not errors, f"seed {seed}: {[repr(e)[:200] for e in errors]} after keys {' '.join(sent)}"
    assert app.return_code in (None, 0), (seed, app.return_code, sent)
    return sent


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_fast_random_keys_never_crash(seed, tmp_path, monkeypatch):
    from cockpit.ui.screens import chat

    runs = tmp_path / "runs"
    shutil.copytree(FIXTURE_RUNS, runs)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)  # the palette's "Save screenshot" writes here
    chats: list[str] = []
    monkeypatch.setattr(chat, "open_chat", lambda app, run: chats.append(run.run_id))  # no model loaded
    sent = asyncio.run(walk(runs, seed, 70))
    assert len(sent) >= 5, sent
