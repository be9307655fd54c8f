"""Issue 29, "numbers that are wrong or raw": the ETA timed from the first step (after the probes)
with the wrap-up allowed for, what the ranks do between steps, planned epochs, rounded losses,
the run's time over its attempts, a killed run's state. Pure: synthetic event logs."""

from __future__ import annotations

import io
import json

import pytest

from cockpit.run.events import EventWriter, wall_time_s
from cockpit.run.follow import Follower, format_event
from cockpit.run.pace import Pace
from cockpit.run.rundir import TERMINAL_STATES, create_run_dir
from cockpit.run.runstate import final_state
from cockpit.ui.state import RunState


def ev(kind: str, t: float, **fields) -> dict:
    return {"v": 1, "t": t, "kind": kind, **fields}


def probes_then_steps() -> list[dict]:
    """An SFT attempt: train_begin, 2 min of probes before (20 probes, a batch of 8 at a time),
    then steps of 10 s each."""
    return [
        ev("run_started", 0.0, run_id="r", attempt=1),
        ev("train_begin", 10.0, total_steps=36, epochs=3.0, start_step=0),
        ev("progress", 10.0, task="probes", phase="before", done=0, total=20),
        ev("progress", 60.0, task="probes", phase="before", done=8, total=20),
        ev("progress", 110.0, task="probes", phase="before", done=16, total=20),
        ev("progress", 130.0, task="probes", phase="before", done=20, total=20),
        ev("probe_results", 130.0, phase="before", passed=0, total=20, rate=0.0),
        ev("step", 140.0, step=1, total_steps=36, loss=2.0),
        ev("step", 150.0, step=2, total_steps=36, loss=1.9),
    ]


def fold(events: list[dict]) -> Pace:
    pace = Pace()
    for e in events:
        pace.observe(e)
    return pace


def test_eta_counts_the_steps_from_after_the_probes_and_allows_for_the_probes_after():
    pace = fold(probes_then_steps())
    assert pace.step_s() == pytest.approx(10.0)  # (150 - 130) / 2: the probes' 2 minutes are not steps
    # 34 steps left at 10 s, plus the probes after training (as long as the ones before: 120 s)
    assert pace.eta(150.0) == pytest.approx(34 * 10 + 120)
    assert pace.eta(160.0) == pytest.approx(34 * 10 + 120 - 10)  # counts down between step events
    st = RunState()
    st.apply(probes_then_steps())
    assert st.eta(150.0) == pytest.approx(460.0)


def test_an_old_log_without_progress_events_times_the_steps_from_the_probe_results():
    events = [e for e in probes_then_steps() if e["kind"] != "progress"]
    pace = fold(events)
    assert pace.step_s() == pytest.approx(10.0) and pace.wrapup_allowance_s == pytest.approx(120.0)


def test_no_eta_before_a_step_is_timed():
    pace = fold(probes_then_steps()[:4])
    assert pace.eta(70.0) is None


def test_the_activity_between_steps_in_the_state_the_header_and_attach():
    from cockpit.ui.render import header

    st = RunState(run_id="r")
    st.apply(probes_then_steps()[:4])
    assert st.activity() == "asking probes before training 8/20"
    assert "asking probes before training 8/20" in header(st, now=70.0).plain
    st.apply(probes_then_steps()[4:6])  # 20/20: done
    assert st.activity() is None
    st.apply(probes_then_steps()[6:])
    assert st.activity() is None and "asking" not in header(st, now=150.0).plain

def test_attach_prints_when_the_work_begins_and_its_progress_line_says_how_far_it_is(tmp_path):
    run = create_run_dir(tmp_path, "r")
    run.events_path.write_text("".join(json.dumps(e) + "\n" for e in probes_then_steps()[:4]))
    out = io.StringIO()
    f = Follower(run, out=out, show_progress=True)
    f.pump()
    assert "training: 36 steps, 3.00 epochs" in out.getvalue()
    assert "asking probes before training (20)\n" in out.getvalue()  # the 8/20 event prints no line
    assert f.progress_line(70.0) == "0/36  elapsed 01:10  ETA --:--  asking probes before training 8/20"
    assert out.getvalue().endswith("asking probes before training 8/20")  # the live line (a tty)


def test_held_out_scoring_before_training_counts_as_the_work_before_the_first_step():
    events = [
        ev("run_started", 0.0),
        ev("progress", 5.0, task="held_out", phase="before", done=0, total=4),
        ev("progress", 15.0, task="held_out", phase="before", done=2, total=4),
        ev("progress", 25.0, task="held_out", phase="before", done=4, total=4),
        ev("held_out", 25.0, phase="before", stage="dpo", pairs=4, accuracy=0.5, mean_logp_margin=0.1),
        ev("train_begin", 30.0, total_steps=10, start_step=0),
        ev("step", 35.0, step=1, total_steps=10),
    ]
    pace = fold(events[:3])
    assert pace.activity_text() == "scoring held-out pairs before training 2/4"
    pace = fold(events)
    assert pace.step_s() == pytest.approx(5.0) and pace.wrapup_allowance_s == pytest.approx(20.0)
    assert pace.eta(35.0) == pytest.approx(9 * 5 + 20)


def test_the_wrap_up_is_timed_by_its_own_progress_then_unknown_once_its_allowance_is_used():
    events = [
        *probes_then_steps(),
        ev("train_end", 500.0, step=36),
        ev("progress", 501.0, task="probes", phase="after", done=0, total=20),
    ]
    pace = fold(events)
    assert pace.eta(510.0) == pytest.approx(120 - 10)  # the allowance: the probes before took 120 s
    pace.observe(ev("progress", 551.0, task="probes", phase="after", done=10, total=20))
    assert pace.eta(551.0) == pytest.approx(50.0)  # 10 probes in 50 s: 10 more
    assert pace.activity_text() == "asking probes after training 10/20"
    pace.observe(ev("progress", 601.0, task="probes", phase="after", done=20, total=20))
    assert pace.eta(700.0) is None  # 120 s allowed, 200 s gone: unknown, not 00:00


def test_a_resumed_attempt_measures_its_own_work_before_the_steps():
    events = [
        *probes_then_steps(),
        ev("state", 200.0, state="stopped"),
        ev("state", 1000.0, state="starting", reason="resume attempt 2"),
        ev("run_started", 1001.0, attempt=2),
        ev("train_begin", 1010.0, total_steps=36, start_step=2),
        ev("step", 1030.0, step=4, total_steps=36),
    ]
    pace = fold(events)
    assert pace.wrapup_allowance_s == 0.0 and pace.step_s() == pytest.approx(10.0)  # (1030 - 1010) / 2


def test_the_runs_wall_time_counts_every_attempt_and_leaves_the_pause_out():
    events = [
        ev("run_started", 0.0),
        ev("step", 100.0, step=1),
        ev("state", 120.0, state="killed", reason="killed on request"),
        ev("state", 5000.0, state="starting", reason="resume attempt 2"),
        ev("run_started", 5001.0),
        ev("step", 5100.0, step=2),
    ]
    assert wall_time_s(events, until=5200.0) == pytest.approx(120.0 + 200.0)
    assert wall_time_s(events[:3], until=9999.0) == pytest.approx(120.0)  # ended: ``until`` adds nothing


def test_train_begin_says_the_epochs_the_steps_make():
    line = format_event(ev("train_begin", 0.0, total_steps=8, epochs=0.7018, global_batch=8), None)
    assert line == "training: 8 steps, 0.70 epochs, global batch 8"


def test_the_finished_line_rounds_the_losses_and_says_when_one_step_was_logged():
    loss = 1.8134845495224
    one = ev("run_finished", 0.0, steps=3, runtime_s=281.0, first_loss=loss, last_loss=loss)
    line = format_event({**one, "first_loss_step": 3, "last_loss_step": 3}, None)
    assert line == "finished: 3 steps in 04:41, loss 1.8135 (one logged step: step 3)"
    two = ev("run_finished", 0.0, steps=36, runtime_s=60.0, first_loss=2.71828, last_loss=0.00012345)
    assert format_event({**two, "first_loss_step": 2, "last_loss_step": 36}, None).endswith("loss 2.7183 -> 0.000123")
    assert format_event({**two, "first_loss": None, "last_loss": None}, None).endswith("no training loss logged")


def test_held_out_results_are_event_lines_placed_before_the_finished_line():
    from cockpit.ui.logtail import ReadableLog

    held = ev("held_out", 1.0, phase="after", stage="dpo", pairs=4, accuracy=0.75, mean_logp_margin=1.23456)
    assert format_event(held, None) == "held-out after: 4 pairs, accuracy 75.0%, mean log-prob margin 1.2346"
    st = RunState()
    st.apply([held, ev("run_finished", 2.0, steps=2, runtime_s=3.0, first_loss=1.0, last_loss=0.5)])
    log = ReadableLog()
    # the rank's own line is read from its log after both events arrived: the event says it, in order
    log.add(["[rank0] held-out after: pairs 4, accuracy 0.75, mean_logp_margin 1.23456"], marker=st.log_seq)
    lines = log.view(list(st.recent), rows=10)
    assert lines == [format_event(held, None), "finished: 2 steps in 00:03, loss 1.0000 -> 0.5000"]


def test_a_kill_on_request_ends_killed_and_other_kills_fail():
    assert "killed" in TERMINAL_STATES
    kw = dict(killing=True, kill_reason="killed on request", outcome=None, exit_text="killed by signal SIGTERM")
    assert final_state(-15, kill_requested=True, **kw) == ("killed", "killed on request")
    assert final_state(-15, **{**kw, "kill_reason": "supervisor terminated (SIGTERM)"})[0] == "failed"


def test_every_reader_shows_a_killed_run(tmp_path):
    from cockpit.commands.runs import run_row
    from cockpit.compare import fmt_cell
    from cockpit.ui.render import STATE_STYLE, STATE_SYMBOL, state_text

    assert STATE_SYMBOL["killed"] != STATE_SYMBOL["failed"] and STATE_STYLE["killed"] != STATE_STYLE["failed"]
    assert state_text("killed").plain == "■ killed"
    run = create_run_dir(tmp_path, "k")
    run.update_status(state="killed", reason="killed on request", started=1.0, ended=61.0, step=3)
    with EventWriter(run.events_path) as w:
        w.emit("state", state="killed", reason="killed on request")
    assert run_row(run)["state"] == "killed"  # terminal: the liveness check leaves it alone
    assert fmt_cell("state", {"state": "killed"}) == "killed"
    st = RunState()
    st.apply([ev("state", 1.0, state="killed", reason="killed on request")])
    assert st.ended and st.eta(2.0) is None
