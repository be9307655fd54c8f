"""Issue 29, "numbers that are wrong or raw" (and the wording of item 5 off the screens): the ETA
timed from the first step (after the probes) with the wrap-up allowed for, what the ranks do
between steps, planned epochs, rounded losses, the run's time over its attempts, a killed run's
state, the plan's CPU verdict and rounding, the bf16-on-CPU warning's flags, the logging note,
compare's cut cells, the reference model in words. Pure: synthetic event logs, no torch."""

from __future__ import annotations

import io
import json

import pytest

from cockpit.store.events import EventWriter, wall_time_s
from cockpit.run.follow import Follower, format_event
from cockpit.run.pace import Pace
from cockpit.store.rundir import TERMINAL_STATES, create_run_dir
from cockpit.run.runstate import final_state
from cockpit.ui.state import RunState
from cockpit.config.run_config import RunConfig


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
    from cockpit.ui.formatting import header

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
    from cockpit.ui.formatting import STATE_STYLE, STATE_SYMBOL, state_text

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


def test_steps_and_epochs_follow_the_trainers_rule():
    from cockpit.config.notes import planned_steps, steps_per_epoch

    assert steps_per_epoch(23, 2) == 12 and steps_per_epoch(1, 8) == 1 and steps_per_epoch(None, 2) is None
    cfg = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_train_epochs": 3.0}
    assert planned_steps(cfg, 90, 1) == 36  # 23 micro-batches -> 12 steps an epoch
    assert planned_steps({**cfg, "max_steps": 8}, 90, 1) == 8
    assert planned_steps(cfg, 90, 2) == 18  # 45 rows per rank -> 12 micro-batches -> 6 steps an epoch


def test_logging_every_more_steps_than_the_run_has_is_a_note_of_validation_and_of_the_form():
    from cockpit.config.load import validate
    from cockpit.config.notes import logging_note
    from cockpit.ui.forms import FormModel

    raw = {"model_name_or_path": "m", "dataset": "cockpit_identity", "max_steps": 8, "logging_steps": 256}
    notes = validate(raw, check_paths=False).notes
    assert any(n.startswith("logging_steps 256 > the run's 8 steps: only the first and the last step") for n in notes)
    assert not validate({**raw, "logging_steps": 2}, check_paths=False).notes
    assert logging_note({"logging_steps": 50, "max_steps": -1}, total_steps=36) is not None  # check: epochs over data
    model = FormModel()
    model.values.update({k: str(v) for k, v in raw.items()})
    checked = model.check(check_paths=False)
    assert checked.ok and any("logging_steps 256" in n for n in checked.notes)  # Setup: "✓ valid" and the warning


def test_schema_bounds_are_whole_numbers():
    from cockpit.config.load import validate
    from cockpit.errors import InputError

    with pytest.raises(InputError) as err:
        validate({"model_name_or_path": "m", "dataset": "d", "cutoff_len": 2**21}, check_paths=False)
    assert "<= 1048576" in str(err.value) and "e+06" not in str(err.value)


def test_plan_gives_a_cpu_run_its_host_ram_verdict_rounded(monkeypatch):
    from cockpit.commands.plan import render
    from cockpit.plan import plan

    cfg = {"model_name_or_path": "smollm2-135m-instruct", "finetuning_type": "lora", "use_cpu": True, "cutoff_len": 256}
    d = plan(cfg, host_memory_gb=23.5401, use_meta=False).as_dict()
    assert d["verdict"]["status"] == "fits" and d["capacity_gib"] == pytest.approx(23.5401)
    text = render(d)
    assert "verdict: planned peak" in text and "FITS on 23.5 GiB of host RAM (a CPU run)" in text
    assert "23.5401" not in text and "no verdict" not in text
    # which figure is which: the plan's (full micro-batches) and what a CPU run measures (its RSS)
    assert "(planned peak: every micro-batch full, " in text and "a CPU run measures its RSS" in text
    two = plan({**cfg, "nproc_per_node": 2}, host_memory_gb=8.0, use_meta=False).as_dict()
    assert two["capacity_gib"] == pytest.approx(4.0) and "shared by 2 ranks" in two["capacity_source"]
    gpu = plan({**cfg, "use_cpu": False}, host_memory_gb=8.0, use_meta=False).as_dict()
    assert gpu["verdict"] is None  # a GPU run still wants --gpu-memory
    assert "no verdict: pass --gpu-memory" in render(gpu) and "RSS" not in render(gpu)


FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {extra}\nbugs\t\t: spectre_v1\n"


def test_the_bf16_on_cpu_warning_names_what_the_cpu_lacks():
    from cockpit.device import bf16_on_cpu_warning

    assert bf16_on_cpu_warning(FLAGS.format(extra="avx512_bf16 amx_bf16 amx_tile amx_int8")) is None
    no_amx = bf16_on_cpu_warning(FLAGS.format(extra="avx512_bf16"))
    assert "has avx512_bf16 but lacks amx_bf16, amx_tile" in no_amx
    none = bf16_on_cpu_warning(FLAGS.format(extra=""))
    assert "lacks avx512_bf16, amx_bf16, amx_tile" in none and "much slower" in none
    assert "flags are unknown" in bf16_on_cpu_warning("Features\t: fp asimd bf16\n")


def test_compare_cuts_cells_with_an_ellipsis():
    from cockpit.cells import clip, fit
    from cockpit.compare import text_report

    assert clip("abcdef", 4) == "abc…" and clip("abc", 4) == "abc" and fit("ab", 4) == "ab  "
    assert clip("训练模型", 5) == "训练…"  # wide characters count two cells
    long = "/very/long/path/to/a/dataset/file/that/does/not/fit.jsonl"
    run = {"summary": {"state": "finished"}, "steps": [], "curves": {}}
    data = {"runs": [{**run, "name": "a"}, {**run, "name": "b"}], "config_diff": {"dataset": [long, "short"]}}
    line = next(ln for ln in text_report(data, width=60).splitlines() if ln.strip().startswith("dataset"))
    assert "…" in line and long not in line and "short" in line


def test_the_reference_model_is_said_the_same_by_the_rank_and_the_plan():
    from cockpit.config.stages import reference_words
    from cockpit.plan import plan

    lora_dpo = {"stage": "dpo", "pref_loss": "sigmoid", "finetuning_type": "lora"}
    assert reference_words(lora_dpo).startswith("the base with the LoRA adapter disabled")
    assert reference_words({**lora_dpo, "pref_loss": "orpo"}) == "none (pref_loss orpo uses none)"
    assert reference_words({**lora_dpo, "finetuning_type": "full"}).startswith("a frozen copy of the base")
    base = {"model_name_or_path": "smollm2-135m-instruct", "cutoff_len": 128, "use_cpu": True}
    notes = plan({**base, **lora_dpo}, use_meta=False).estimate.notes
    assert f"reference model: {reference_words(lora_dpo)}" in notes
    orpo = plan({**base, **lora_dpo, "pref_loss": "orpo"}, use_meta=False).estimate.notes
    assert "reference model: none (pref_loss orpo uses none)" in orpo


def test_the_watchdog_counts_the_probes_after_training_as_progress():
    from cockpit.run.supervisor import node_watchdog, observe_progress

    dog = node_watchdog(RunConfig(hang_timeout_s=30, load_timeout_s=600), start_t=0)
    observe_progress(dog, ev("progress", 100.0, task="probes", phase="before", done=8, total=20))
    assert dog.phase == "load"  # before the first step: the load timeout from the start, as before
    dog.observe_step(1, 200.0)
    observe_progress(dog, ev("progress", 900.0, task="probes", phase="after", done=8, total=20))
    assert dog.phase == "wrapup" and dog.check(1400.0, ranks_alive=True, last_lines={}) is None  # 500 s since
    silent = node_watchdog(RunConfig(hang_timeout_s=30, load_timeout_s=600), start_t=0)
    silent.observe_step(1, 200.0)
    assert silent.check(1400.0, ranks_alive=True, last_lines={})["code"] == "hang"  # without it: a hang
