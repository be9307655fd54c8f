"""Issue 62, item 9's small things in the cockpit, on the real screens with Textual's Pilot."""

from __future__ import annotations

import asyncio

from test_ui_rough_edges import RUN_ID, copy_run, env, make_app, screen_text, set_status  # noqa: F401 - env: a fixture

from tests.test_ui_pilot import wait_for


def test_the_resume_question_reads_whole_at_80x24(env):
    """R on a stopped run: the question is a sentence, wrapped in the dialog (a long run id cropped
    it to "Resume … (stopped) from it")."""
    runs = env / "runs"
    set_status(copy_run(runs), state="stopped", reason="stopped on request")

    async def scenario():
        app = make_app(runs, follow=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.query("#runs-table") and app.screen.query_one("#runs-table").row_count, 10, "the runs")
            await pilot.press("R")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "Confirm", 10, "the question")
            await pilot.pause(0.2)
            return " ".join(screen_text(app).replace("█", " ").split())

    text = asyncio.run(scenario())
    assert f"Resume {RUN_ID}?" in text and "It was stopped before its last step." in text, text
    assert "from its last good checkpoint, as a new attempt in the same run dir." in text, text


def test_f8_shows_each_stage_of_the_launch_as_it_begins(env, monkeypatch):
    """Issue 62, item 8: Setup's F8 said "launching …" for the whole launch (~53 s). The stages
    `cockpit train --progress` writes (cli_calls.train_detached's on_stage, streamed as they come:
    tests/test_launch_progress.py) replace that line as each begins; other stderr lines do not."""
    import threading

    from test_ui_setup_live import make_app, text_of

    from cockpit.ui import cli_calls

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    go = threading.Event()

    def train_detached(path, runs_dir, timeout=600, secrets=None, on_stage=None):
        on_stage("stage: checking the config and every data row")
        on_stage("a library's warning")
        go.wait(60)  # the command still runs: the stage is on screen meanwhile
        return cli_calls.CliResult(1, None, "", "fake: ended here")

    monkeypatch.setattr(cli_calls, "train_detached", train_detached)

    async def scenario():
        app = make_app(env / "runs")
        async with app.run_test(size=(120, 40)) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: "config valid" in text_of(scr, "#problems"), 30, "a valid config")
            await pilot.press("f8")
            try:
                await wait_for(pilot, lambda: "checking the config and every data row" in text_of(scr, "#problems"), 30, "the stage")
                shown = text_of(scr, "#problems")
            finally:
                go.set()
            await wait_for(pilot, lambda: "launch failed" in text_of(scr, "#problems"), 30, "the end")
            return shown

    shown = asyncio.run(scenario())
    assert "launching: cockpit train" in shown and "warning" not in shown, shown
