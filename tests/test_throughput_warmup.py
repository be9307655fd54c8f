"""tokens/s with the warm-up steps left out (step events and the summary)."""

from __future__ import annotations

from types import SimpleNamespace

from transformers import TrainerControl

from cockpit.config.run_config import RunConfig
from cockpit.store.events import EventWriter, read_all
from cockpit.store.rundir import RunDir
from cockpit.train import callbacks as cb


def test_warmup_steps_for_is_a_tenth_between_1_and_5():
    assert [cb.warmup_steps_for(n) for n in (1, 6, 20, 49, 1000)] == [1, 1, 2, 4, 5]


def callback_on_a_clock(tmp_path, monkeypatch):
    """Rank 0's callback writing to a run dir in ``tmp_path``, its time read from ``clock["t"]``."""
    run = RunDir(tmp_path)
    writer = EventWriter(run.events_path)
    callback = cb.CockpitCallback(run, RunConfig(nan_policy="warn", spike_policy="warn", spike_factor=3.0), 0, 1, writer)
    callback._gather_memory = lambda: {}
    callback._check_memory = lambda *a: None
    clock = {"t": 1000.0}
    monkeypatch.setattr(cb.time, "time", lambda: clock["t"])
    return run, callback, clock


def test_slow_first_steps_are_left_out_of_tokens_per_s(tmp_path, monkeypatch):
    run, callback, clock = callback_on_a_clock(tmp_path, monkeypatch)
    args = SimpleNamespace(per_device_train_batch_size=1, gradient_accumulation_steps=1, num_train_epochs=1)
    state = SimpleNamespace(global_step=0, max_steps=20, num_input_tokens_seen=0, epoch=0.0)
    control = TrainerControl()  # HF's own: every flag a callback reads
    callback.on_train_begin(args, state, control)
    # steps 1-2 (the warm-up of 20 steps) take 10 s each, then 1 s each for 100 tokens
    for step in range(1, 21):
        clock["t"] += 10.0 if step <= 2 else 1.0
        state.global_step, state.num_input_tokens_seen = step, step * 100
        callback.on_step_end(args, state, control)
        if step in (1, 2, 4, 20):
            callback.on_log(args, state, control, logs={"loss": 1.0, "epoch": 0.1})
    steps = [e for e in read_all(run.events_path) if e["kind"] == "step"]
    assert [(e["step"], e["warmup"], e["tokens_per_s"]) for e in steps] == [(1, True, None), (2, True, None), (4, False, 100.0), (20, False, 100.0)]
    assert callback.steady_tokens_per_s() == 100.0
    assert callback.tokens_total / 38.0 < 60  # all steps together: about half as fast


def test_the_first_steps_samples_per_s_leaves_out_the_probes_before_training(tmp_path, monkeypatch):
    run, callback, clock = callback_on_a_clock(tmp_path, monkeypatch)
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=1)
    state = SimpleNamespace(global_step=0, max_steps=10, num_input_tokens_seen=0, epoch=0.0)
    control = TrainerControl()  # HF's own: every flag a callback reads
    callback.on_train_begin(args, state, control)
    clock["t"] += 600.0  # the probes before training (another callback's on_train_begin)
    for step in (1, 2):
        callback.on_step_begin(args, state, control)
        clock["t"] += 4.0
        state.global_step, state.num_input_tokens_seen = step, step * 800
        callback.on_step_end(args, state, control)
        callback.on_log(args, state, control, logs={"loss": 1.0, "epoch": 0.1})
    steps = [e for e in read_all(run.events_path) if e["kind"] == "step"]
    assert [e["samples_per_s"] for e in steps] == [2.0, 2.0]  # 8 samples in 4 s each (600 s before: 0.013)
