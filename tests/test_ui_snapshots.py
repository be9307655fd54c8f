"""Snapshots of every screen at 80x24 and 160x48, fed from the recorded run in
tests/fixtures/ui_run (the scenes are the ones `python scripts/ui_screenshots.py` draws).
Update after an intended change: pytest tests/test_ui_snapshots.py --snapshot-update"""

from __future__ import annotations

import os
import time

import pytest
import ui_screenshots as shots


@pytest.fixture(autouse=True)
def _deterministic(tmp_path, monkeypatch):
    cwd, tz, xdg = os.getcwd(), os.environ.get("TZ"), os.environ.get("XDG_CONFIG_HOME")
    shots.prepare_env(tmp_path)
    yield
    os.chdir(cwd)
    for name, value in (("TZ", tz), ("XDG_CONFIG_HOME", xdg)):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    time.tzset()


@pytest.mark.parametrize("size", list(shots.SIZES))
@pytest.mark.parametrize("scene", list(shots.SCENES))
def test_screen(snap_compare, scene, size):
    start, opts, before = shots.SCENES[scene]
    assert snap_compare(shots.make_app(start, **opts), terminal_size=shots.SIZES[size], run_before=before)
