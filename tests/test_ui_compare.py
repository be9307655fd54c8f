"""Compare runs: ``cockpit compare`` on the recorded runs in tests/fixtures/ui_run (three real
tiny runs: learning rate / LoRA rank / an eval split differ), and the compare screen (Runs:
space marks, d compares; t: by tokens seen; m: the next curve). Snapshots: test_ui_snapshots."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.conftest import cockpit
from tests.test_ui_pilot import wait_for

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "ui_run"
A, B, C = "cpu-demo-tiny-de8f", "lr-2e-3-rank8-d2ab", "lr-5e-3-eval-dd39"


def test_compare_json_has_curves_config_diff_and_summaries():
    res = cockpit("compare", A, B, C, "--runs-dir", str(FIXTURES), "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    runs = {r["name"]: r for r in data["runs"]}
    assert list(runs) == [A, B, C]
    # only what differs; keys a run's config lacks count as their schema default; ports never
    diff = data["config_diff"]
    assert set(diff) == {"learning_rate", "lora_rank", "lora_alpha", "val_size", "logging_steps", "max_steps"}, diff
    assert diff["learning_rate"] == [0.005, 0.002, 0.005] and diff["lora_rank"] == [16, 8, 16]
    # curves per step, with tokens seen for the other x axis; eval loss where the run has it
    a, c = runs[A], runs[C]
    assert a["steps"] == list(range(1, 41)) and len(a["curves"]["loss"]) == 40
    assert a["tokens"][-1] == 5979 and a["tokens"] == sorted(a["tokens"])
    assert "eval_loss" not in a["curves"] and sum(v is not None for v in c["curves"]["eval_loss"]) == 15
    assert a["summary"]["last_loss"] == a["curves"]["loss"][-1]
    assert c["summary"]["eval_loss"] == [v for v in c["curves"]["eval_loss"] if v is not None][-1]
    assert a["summary"]["probes_after"]["passed"] == 4 and a["summary"]["peak_mem_mb"] > 100


def test_compare_text_and_bad_input():
    res = cockpit("compare", A, B, "--runs-dir", str(FIXTURES), timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == [A, B]
    assert any(ln.startswith("final loss") and "10.5005" in ln and "10.6432" in ln for ln in lines), res.stdout
    assert "config: 3 key(s) differ" in res.stdout and any(ln.split()[:3] == ["learning_rate", "0.005", "0.002"] for ln in lines)
    one = cockpit("compare", A, "--runs-dir", str(FIXTURES), timeout=60)
    assert one.returncode == 2 and "two or more runs" in one.stderr
    missing = cockpit("compare", A, "nope", "--runs-dir", str(FIXTURES), timeout=60)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


def test_compare_screen_from_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))

    async def scenario():
        from cockpit.ui.app import CockpitApp

        app = CockpitApp(FIXTURES, start="runs", follow=False, runs_refresh_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("d")  # nothing marked: says how
            await pilot.pause(0.1)
            assert type(app.screen).__name__ == "RunsScreen"
            assert any("mark two or more" in n.message for n in app._notifications)
            await pilot.press("space", "down", "space")  # the two newest runs
            assert len(app.screen.marked) == 2
            await pilot.press("d")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "CompareScreen" and app.screen.data is not None, 10, "compare")
            scr = app.screen
            assert [r["name"] for r in scr.data["runs"]] == [B, C]
            summary = scr.query_one("#compare-summary")
            assert summary.row_count == 9 and len(summary.columns) == 3
            config = scr.query_one("#compare-config")
            assert {str(k.value) for k in config.rows} == {"learning_rate", "lora_rank", "lora_alpha", "val_size",
                                                           "logging_steps", "max_steps"}
            plt = scr.query_one("#compare-plot").plt
            await pilot.press("t")
            assert scr.by_tokens and "tokens seen" in str(scr.query_one("#compare-title").render())
            await pilot.press("m")
            assert scr.curve == "eval_loss"
            assert plt is scr.query_one("#compare-plot").plt
            await pilot.press("escape")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "RunsScreen", 5, "back to runs")

    asyncio.run(scenario())
