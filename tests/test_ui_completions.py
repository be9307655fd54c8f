"""grpo's completions pane on the Live screen (cockpit/ui/panes.py CompletionsPane, formatting.completions):
folded from ``completions`` events (the latest few kept), hidden for runs without them, updated as a
run appends them, redrawn only when its text changes, scrollable with ``c``; and ``cockpit attach``'s
one line per ``completions`` event (cockpit/run/follow.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from rich.cells import cell_len

from tests.test_ui_pilot import wait_for

ROOT = Path(__file__).resolve().parent.parent
DOCTOR = json.loads((ROOT / "tests" / "fixtures" / "ui_run" / "doctor.json").read_text(encoding="utf-8"))
LONG = "The opposite of push is pull: to draw something towards yourself rather than away from you " * 4


def sample(completion: str, contains: float, length: float, advantage: float, prompt: str = "Opposite of push?") -> dict:
    """A sample as cockpit/train/recipes/grpo.py's sampled_completions writes it (weights 0.3, 0.7)."""
    return {
        "prompt": prompt,
        "completion": completion,
        "reward": round(0.3 * contains + 0.7 * length, 4),
        "rewards": {"contains_answer": contains, "length_penalty": length},
        "advantage": advantage,
    }


def step_event(step: int) -> dict:
    return {"kind": "step", "step": step, "total_steps": 10, "loss": 0.1, "lr": 5e-4, "reward": 0.3 + step / 20,
            "reward_std": 0.2, "kl": 0.01, "clip_ratio": 0.0, "entropy": 3.0, "completion_len_mean": 8.0,
            "completion_truncated": 0.5, "rewards": {"contains_answer": {"mean": 0.5, "std": 0.3},
                                                     "length_penalty": {"mean": 0.4, "std": 0.2}}}


def test_state_keeps_only_the_latest_samples_and_the_text_fits_the_width():
    from cockpit.ui import formatting
    from cockpit.ui.state import COMPLETIONS_KEPT, RunState

    state = RunState()
    for step in range(1, 6):
        samples = [sample(f"answer {step}.{i}", 1.0, 1.0 / (i + 1), 0.5 - i / 4) for i in range(4)]
        state.apply([{"kind": "completions", "step": step, "samples": samples}])
    state.apply([{"kind": "completions", "step": 6, "samples": "not a list"}, {"kind": "completions", "step": 7}])
    assert len(state.completions) == COMPLETIONS_KEPT == 8  # bounded: the latest two steps' samples
    assert [s["step"] for s in state.completions] == [4] * 4 + [5] * 4
    state.apply([{"kind": "completions", "step": 6, "samples": [sample(LONG + "\nsecond line\x1b[31m", 0.0, 0.05, -1.2)]}])
    for width in (30, 76, 150):
        text = formatting.completions(state, width)
        lines = text.plain.split("\n")
        assert max(cell_len(line) for line in lines) <= width, width
        assert lines[0].startswith("step 6 Opposite of push?")  # newest first, the prompt once per group
        assert "\x1b" not in text.plain and ("⏎" in text.plain) == (width == 150)  # the newline shown where it fits
        assert lines[1].lstrip().startswith("0.04 ▼ The opposite")  # total reward, below its group's mean
    narrow = formatting.completions(state, 76).plain.split("\n")
    assert narrow.count("step 5 Opposite of push?") == 1 and "answer 5.3" in narrow[narrow.index("step 5 Opposite of push?") + 1]
    # a long completion stops after COMPLETION_LINES lines, with an ellipsis; the reward line follows
    long_lines = narrow[1 : narrow.index("step 5 Opposite of push?")]
    assert len(long_lines) == formatting.COMPLETION_LINES + 1 and long_lines[formatting.COMPLETION_LINES - 1].endswith("…")
    assert "contains_answer 0.00 · length_penalty 0.05 · adv -1.20" in long_lines[-1]
    assert formatting.completions_title(state, "c: scroll") == "Completions · step 6 · 8 newest first  (c: scroll)"


def test_attach_prints_the_latest_sample_in_a_line():
    from cockpit.run.follow import format_event

    ev = {"kind": "completions", "step": 4, "samples": [sample("pull", 1.0, 1.0, 0.8), sample("Shove\nit", 0.0, 1.0, -0.8)]}
    assert format_event(ev, None) == (
        "sample at step 4: 'Opposite of push?' -> 'Shove it'  reward 0.70 (contains_answer 0.00, length_penalty 1.00)"
    )
    long = format_event({**ev, "samples": [sample(LONG, 1.0, 0.1, 0.1, prompt=LONG)]}, None)
    assert "\n" not in long and len(long) < 200 and "…' -> 'The opposite" in long
    assert format_event({"kind": "completions", "step": 5, "samples": []}, None) is None


def test_live_pane_appears_updates_and_scrolls_as_the_run_appends_completions(tmp_path, monkeypatch):
    """Pilot, 80x24: a grpo run's Live screen without completions hides the pane; appended completions
    events show it and move it to the newest step; a step or telemetry without new samples draws nothing;
    ``c`` focuses it for the keys (it scrolls), Esc gives the keys back to the screen."""
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import RunDir, create_run_dir
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.panes import CompletionsPane, TextPane
    from cockpit.ui.screens.live import LiveScreen

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    run = create_run_dir(tmp_path / "runs", "grpo")
    run.update_status(state="running", run_id=run.run_id)
    with EventWriter(run.events_path) as w:
        w.emit("run_started", run_id=run.run_id, model="tiny", dataset="oneword", method="lora", world_size=1, total_steps=10)
        w.emit("state", state="running")
        w.emit("train_begin", total_steps=10)
        w.emit("step", **{k: v for k, v in step_event(1).items() if k != "kind"})

    def append(kind: str, **fields) -> None:
        with EventWriter(run.events_path) as w:
            w.emit(kind, **fields)

    async def scenario() -> None:
        app = CockpitApp(tmp_path / "runs", start="runs", doctor_checks=DOCTOR, poll_s=0.05)
        async with app.run_test(size=(80, 24)) as pilot:
            app.open_live(RunDir(run.path))
            await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen) and app.screen.state.step == 1, 10, "live")
            live = app.screen
            pane = live.query_one(CompletionsPane)
            text = pane.query_one(TextPane)
            await pilot.pause(0.3)
            assert pane.has_class("hidden") and not pane.display  # no completions yet: no pane

            append("completions", step=1, samples=[sample("The opposite of push is pull.", 1.0, 0.17, -0.5),
                                                   sample("pull", 1.0, 1.0, 0.5)])
            await wait_for(pilot, lambda: "pull" in str(text.content), 10, "the first samples")
            assert pane.display and pane.region.height >= 4
            assert pane.border_title == "Completions · step 1 · 2 newest first  (c: scroll)"
            shown = str(text.content).split("\n")
            assert shown[:2] == ["step 1 Opposite of push?", "  1.00 ▲ pull"]  # newest first
            width = pane.scrollable_content_region.width
            assert 60 <= width < 80 and max(cell_len(line) for line in shown) <= width

            updates: list[object] = []
            original = text.update
            monkeypatch.setattr(text, "update", lambda *a, **kw: (updates.append(a), original(*a, **kw))[1])
            append("step", **{k: v for k, v in step_event(2).items() if k != "kind"})
            append("telemetry", backend="cpu", devices=[], ranks=[])
            await wait_for(pilot, lambda: live.state.step == 2, 10, "step 2")
            await pilot.pause(0.2)
            assert updates == []  # nothing new to show: not redrawn

            many = [sample(f"{word} {LONG}", 0.0, 0.05, -0.2, prompt="Say a long thing") for word in ("first", "second", "third")]
            append("completions", step=2, samples=many)
            await wait_for(pilot, lambda: str(text.content).startswith("step 2 Say a long thing"), 10, "step 2's samples")
            assert len(updates) == 1 and pane.border_title.startswith("Completions · step 2 · 5 newest first")
            assert "third" in str(text.content).split("\n")[1] and "step 1 Opposite of push?" in str(text.content)
            assert pane.max_scroll_y > 0  # more than the pane shows at 80x24

            await pilot.press("c")
            assert pane.has_focus and pane.border_title.endswith("(esc: back)")
            await pilot.press("end")
            await wait_for(pilot, lambda: pane.scroll_y == pane.max_scroll_y, 5, "scrolled to the end")
            await pilot.press("escape")
            assert isinstance(app.screen, LiveScreen) and app.focused is None  # back, not left
            await pilot.pause(0.1)
            assert pane.border_title.endswith("(c: scroll)")
            append("completions", step=3, samples=[sample("pull", 1.0, 1.0, 0.1)] * 9)
            await wait_for(pilot, lambda: str(text.content).startswith("step 3"), 10, "step 3's samples")
            assert len(live.state.completions) == 8 and "step 2" not in str(text.content)  # the latest 8 only

    t0 = time.monotonic()
    asyncio.run(scenario())
    assert time.monotonic() - t0 < 60
