"""The navigation walk of ``test_ui_navigation.py`` from the other start state: runs present, the
app opens on Runs (a file of its own: xdist runs the two walks side by side)."""

from __future__ import annotations

import pytest
from test_ui_navigation import nav_env, walk_and_check  # noqa: F401 - nav_env is a fixture


@pytest.mark.budget(
    200,
    reason="every edge of the app's state graph within two keys of Runs (45 states, 180 edges with S and the Sweep screen, 40 apps: 138 s on a loaded box, 2026-12-05)",
)
@pytest.mark.slow
def test_every_key_sequence_up_to_three_with_runs(nav_env):  # noqa: F811
    walk_and_check(nav_env, "runs")
