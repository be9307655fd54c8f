"""Compare runs: ``cockpit compare`` on the recorded runs in tests/fixtures/ui_run (three real
tiny runs: learning rate / LoRA rank / an eval split differ), and the compare screen (Runs:
space marks, d compares; t: by tokens seen; m: the next curve). Snapshots: test_ui_snapshots."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.conftest import cockpit
from tests.test_ui_pilot import runs_listed, wait_for

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
    assert "config: 3 key(s) differ" in res.stdout and any(
        ln.split()[:3] == ["learning_rate", "0.005", "0.002"] for ln in lines
    )
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
            await wait_for(pilot, lambda: runs_listed(app), 10, "the runs")
            await pilot.press("d")  # nothing marked: says how
            await pilot.pause(0.1)
            assert type(app.screen).__name__ == "RunsScreen"
            assert any("mark two or more" in n.message for n in app._notifications)
            await pilot.press("space", "down", "space")  # the two newest runs
            assert len(app.screen.marked) == 2
            await pilot.press("d")
            await wait_for(
                pilot,
                lambda: type(app.screen).__name__ == "CompareScreen" and app.screen.data is not None,
                10,
                "compare",
            )
            scr = app.screen
            assert [r["name"] for r in scr.data["runs"]] == [B, C]
            summary = scr.query_one("#compare-summary")
            assert summary.row_count == 12 and len(summary.columns) == 3  # MFU and per-device tokens/s, samples/s
            assert [str(c) for c in summary.get_row("mfu")] == ["MFU", "8.1%", "8.7%"]
            config = scr.query_one("#compare-config")
            assert {str(k.value) for k in config.rows} == {
                "learning_rate",
                "lora_rank",
                "lora_alpha",
                "val_size",
                "logging_steps",
                "max_steps",
            }
            plt = scr.query_one("#compare-plot").plt
            await pilot.press("t")
            assert scr.by_tokens and "tokens seen" in str(scr.query_one("#compare-title").render())
            await pilot.press("m")
            assert scr.curve == "eval_loss"
            assert plt is scr.query_one("#compare-plot").plt
            await pilot.press("escape")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "RunsScreen", 5, "back to runs")

    asyncio.run(scenario())


def grpo_run(runs_dir: Path, name: str, rewards: list[float], held_out: tuple[float, float]) -> str:
    """A grpo run dir as its rank 0 leaves it: step events with the reward, summary.json's held-out reward."""
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import atomic_write_json, create_run_dir

    run = create_run_dir(runs_dir, name)
    with EventWriter(run.events_path) as writer:
        for step, reward in enumerate(rewards, 1):
            writer.emit(
                "step",
                step=step,
                total_steps=len(rewards),
                loss=0.01 * step,
                reward=reward,
                kl=0.001 * step,
                rewards={"contains_answer": {"mean": reward, "std": 0.1}},
            )
    before, after = held_out
    atomic_write_json(run.status_path, {"state": "finished", "step": len(rewards)})
    atomic_write_json(
        run.summary_path,
        {
            "state": "finished",
            "steps": len(rewards),
            "stage": "grpo",
            "held_out_before": {"mean_reward": before},
            "held_out_after": {"mean_reward": after},
        },
    )
    return run.run_id


def test_compare_shows_grpo_rewards_and_leaves_them_out_for_other_stages(tmp_path):
    runs = tmp_path / "runs"
    a = grpo_run(runs, "grpo-a", [0.2, 0.3, 0.5, 0.6], (0.234, 0.75))
    b = grpo_run(runs, "grpo-b", [0.1, 0.1, 0.2, 0.25], (0.2, 0.31))
    res = cockpit("compare", a, b, "--runs-dir", str(runs), timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    held = next(ln for ln in lines if ln.startswith("held-out reward"))
    assert "0.234 → 0.750" in held and "0.200 → 0.310" in held, held
    assert next(ln for ln in lines if ln.startswith("final reward")).split()[2:] == ["0.6000", "0.2500"]
    at = lines.index("reward by step")
    assert lines[at + 1].split() == ["step", "1", "0.2000", "0.1000"] and lines[-1].split() == [
        "step",
        "4",
        "0.6000",
        "0.2500",
    ]
    data = json.loads(cockpit("compare", a, b, "--runs-dir", str(runs), "--json", timeout=60).stdout)
    assert data["runs"][0]["curves"]["reward"] == [0.2, 0.3, 0.5, 0.6] and data["runs"][1]["curves"]["kl"][-1] == 0.004
    sft = cockpit("compare", A, B, "--runs-dir", str(FIXTURES), timeout=60).stdout
    assert "reward" not in sft  # an SFT comparison keeps its rows


def test_compare_shows_each_reward_functions_held_out_change_and_curve(tmp_path):
    """Issue 52: a row per reward function under the held-out reward (a fall marked), its curve by step."""
    from cockpit.compare import compare, text_report
    from cockpit.store.rundir import RunDir, atomic_write_json

    runs = tmp_path / "runs"
    ids = [grpo_run(runs, "hack", [0.2, 0.4, 0.6, 0.7], (0.234, 0.75)), grpo_run(runs, "fair", [0.2] * 4, (0.2, 0.5))]
    held = {
        "hack": (
            {"contains_answer": 0.458, "length_penalty": 0.138},
            {"contains_answer": 0.167, "length_penalty": 1.0},
        ),
        "fair": (
            {"contains_answer": 0.458, "concise_answer": 0.072},
            {"contains_answer": 0.625, "concise_answer": 0.5},
        ),
    }
    dirs = [RunDir(runs / i) for i in ids]
    for run, (name, (before, after)) in zip(dirs, held.items()):
        summary = run.read_summary()
        summary["held_out_before"]["rewards"], summary["held_out_after"]["rewards"] = before, after
        if name == "hack":
            summary["held_out_fell"] = [
                {"reward": "contains_answer", "before": 0.458, "after": 0.167, "fell_by": 0.291}
            ]
        atomic_write_json(run.summary_path, summary)
    lines = text_report(compare(dirs), width=120).splitlines()
    row = next(ln for ln in lines if ln.strip().startswith("contains_answer"))
    assert "0.458 → 0.167 ▼ fell" in row and "0.458 → 0.625" in row and row.count("fell") == 1, row
    assert "1.000" in next(ln for ln in lines if ln.strip().startswith("length_penalty"))
    concise = next(ln for ln in lines if ln.strip().startswith("concise_answer"))
    assert concise.split()[1] == "-" and "0.072 → 0.500" in concise, concise  # the hack run has no such function
    at = lines.index("reward/contains_answer by step")
    assert lines[at + 1].split() == ["step", "1", "0.2000", "0.2000"]
