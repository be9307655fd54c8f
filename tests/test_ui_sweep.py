"""The Sweep screen (cockpit/ui/screens/sweep.py) over a real sweep store: Optuna's SQLite study made
through cockpit/sweep's own code (``ui_screenshots.write_sweep``: seven trials, four complete, one
pruned, two running, each with its run dir), read through ``cockpit sweep status NAME --json`` in a
subprocess as the screen reads it. No trainings: the trials' runs are written as their ranks write them.
Snapshots: test_ui_snapshots (scene "sweep")."""

from __future__ import annotations

import asyncio
import json
import os

import ui_screenshots as shots

from cockpit.run.liveness import start_time
from tests.conftest import cockpit
from tests.test_ui_pilot import runs_listed, text_of, wait_for


def sweep_store(tmp_path, trials=None):
    runs = tmp_path / "runs"
    shots.write_sweep(runs, trials=trials)
    for path in runs.glob("*/status.json"):  # the running trials' supervisor: this (live) process
        st = json.loads(path.read_text())
        if st["state"] == "running":
            st.update(supervisor_pid=os.getpid(), supervisor_start=start_time(os.getpid()))
            path.write_text(json.dumps(st))
    return runs


def test_status_json_carries_the_trials_the_best_and_the_importance(tmp_path):
    runs = sweep_store(tmp_path)
    res = cockpit("sweep", "status", "lr-rank", "--json", "--runs-dir", str(runs), timeout=120)
    assert res.returncode == 0, res.stderr
    st = json.loads(res.stdout)
    assert [t["state"] for t in st["trials"]] == ["complete", "complete", "pruned", "complete", "complete", "running", "running"]
    assert st["best"]["number"] == 3 and st["best"]["value"] == 1.093
    assert [t["objective"] for t in st["trials"]][2] == 2.61  # a pruned trial: its last reported value
    imp = st["importance"]
    assert imp["trials"] == 4 and set(imp["params"]) == {"learning_rate", "lora_rank"}
    assert abs(sum(imp["params"].values()) - 1) < 1e-6 and list(imp["params"])[0] == "learning_rate"
    text = cockpit("sweep", "status", "lr-rank", "--runs-dir", str(runs), timeout=120)
    assert "importance: learning_rate" in text.stdout, text.stdout
    # three trials, two complete: no importance yet
    few = sweep_store(tmp_path / "few", trials=shots.SWEEP_TRIALS[:3])
    res = cockpit("sweep", "status", "lr-rank", "--json", "--runs-dir", str(few), timeout=120)
    assert res.returncode == 0 and json.loads(res.stdout)["importance"] is None


def test_sweep_screen_from_runs_and_palette(tmp_path, monkeypatch):
    from cockpit.ui.app import sweep_names

    monkeypatch.chdir(shots.ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    runs = sweep_store(tmp_path)
    assert sweep_names(runs) == ["lr-rank"]

    async def scenario():
        from cockpit.ui.app import CockpitApp

        app = CockpitApp(runs, start="runs", follow=False, runs_refresh_s=3600, notify_poll_s=0)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: runs_listed(app), 20, "the runs")
            await pilot.press("S")  # the newest run: trial 6's
            await wait_for(pilot, lambda: type(app.screen).__name__ == "SweepScreen" and app.screen.data, 60, "the sweep")
            scr = app.screen
            table = scr.query_one("#sweep-trials")
            assert table.row_count == 7
            rows = [[str(c) for c in table.get_row(k)] for k in table.rows]
            assert rows[2][1:5] == ["2", "■ pruned", "20", "2.61"] and rows[3][1:5] == ["3", "✓ complete", "40", "1.093"]
            assert rows[5][2] == "▶ running" and rows[0][5:7] == ["0.0003", "8"]
            assert "best: trial 3" in text_of(app, "#sweep-best") and "lora_rank=16" in text_of(app, "#sweep-best")
            importance = text_of(app, "#sweep-importance")
            assert "learning_rate" in importance and "lora_rank" in importance and "4 trials" in importance
            assert scr.query_one("#sweep-spark").data == [1.412, 1.187, 2.61, 1.093, 1.874, 1.62, 1.97]

            # Enter: a finished trial's Summary, a running one's Live, on top of the Sweep screen
            table.move_cursor(row=3)
            await pilot.press("enter")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "SummaryScreen", 20, "the summary")
            assert app.screen.run.run_id.endswith("lr-rank-t3-3a5e")
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is scr, 10, "back on the sweep")
            table.move_cursor(row=5)
            await pilot.press("enter")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "LiveScreen", 20, "the live screen")
            assert app.screen.run.run_id.endswith("lr-rank-t5-5a5e")
            app.pop_screen()
            await wait_for(pilot, lambda: app.screen is scr, 10, "back on the sweep")

            # d: the selected trial and the best without marks; the marked ones with them
            await pilot.press("d")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "CompareScreen", 20, "compare")
            assert [r.run_id[-4:] for r in app.screen.runs] == ["3a5e", "5a5e"]
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is scr, 10, "back on the sweep")
            table.move_cursor(row=0)
            await pilot.press("space", "down", "space", "d")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "CompareScreen", 20, "compare")
            assert [r.run_id[-4:] for r in app.screen.runs] == ["0a5e", "1a5e"]
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is scr, 10, "back on the sweep")
            reads = scr.reads
            await pilot.press("r")  # read again: the same trials, updated in place, the marks and cursor kept
            await wait_for(pilot, lambda: scr.reads > reads, 60, "the sweep read again")
            assert [str(table.get_row(k)[0]) for k in table.rows][:3] == ["●", "●", " "] and table.cursor_row == 1

            # b: the best trial's config as a preset, through cockpit sweep best --save-preset
            await pilot.press("b")
            await wait_for(pilot, lambda: getattr(scr, "saved_preset", None), 60, "the preset")
            preset = scr.saved_preset
            assert preset == tmp_path / "config" / "cockpit" / "presets" / "lr-rank-best.yaml"

            # the palette's "Sweep: lr-rank" (from the Runs screen)
            app.action_go("runs")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "RunsScreen", 10, "runs")
            await pilot.press("ctrl+p")
            await pilot.press(*"sweep: lr-rank")
            await pilot.pause(0.5)
            await pilot.press("enter")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "SweepScreen" and app.screen.data, 60, "the sweep")
            return preset

    preset = asyncio.run(scenario())
    text = preset.read_text()
    assert text.startswith("# sweep lr-rank, trial 3: eval_loss 1.093") and "learning_rate: 0.005" in text
    assert "run_name" not in text
    check = cockpit("check", str(preset), "--no-devices", "--json", timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["ok"] is True


def test_a_sweep_that_can_no_longer_change_is_not_read_again():
    from cockpit.ui.screens.sweep import changing

    done = {"state": "complete", "run_state": "finished"}
    assert changing(None)  # nothing read yet (or the read failed)
    assert not changing({"driver_alive": False, "trials": [done, {"state": "running", "run_state": "lost"}]})
    assert changing({"driver_alive": True, "trials": [done]})
    assert changing({"driver_alive": False, "trials": [done, {"state": "running", "run_state": "running"}]})
