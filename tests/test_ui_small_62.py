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
