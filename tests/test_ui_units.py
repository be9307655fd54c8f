"""The UI's pure parts: bounded series, incremental run state and log tail, the form mapping,
validation messages identical to `cockpit check`, presets `cockpit train` accepts, torch-free plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cockpit.config.load import load_config, validate
from cockpit.errors import InputError
from cockpit.store.events import EventWriter
from cockpit.store.rundir import RunDir, create_run_dir
from cockpit.ui.forms import FormModel, fit_line
from cockpit.ui.logtail import LogTail
from cockpit.ui.presets import list_presets, load_preset, save_preset
from cockpit.ui.series import BucketSeries
from cockpit.ui.state import RunFollower

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_RUN = ROOT / "tests" / "fixtures" / "ui_run" / "20261130-094516-cpu-demo-tiny-de8f"


def test_bucket_series_stays_bounded_and_keeps_the_mean():
    s = BucketSeries(capacity=64)
    for i in range(1, 100_001):
        s.add(i, float(i))
    assert len(s) <= 64 and s.n == 100_000 and s.last == 100_000.0
    assert abs(sum(s.sums) / sum(s.counts) - 50_000.5) < 1e-6
    assert s.xs == sorted(s.xs) and s.xs[0] == 1
    s.add(100_001, float("nan"))
    assert s.skipped == 1


def test_run_state_from_the_recorded_run():
    f = RunFollower(RunDir(FIXTURE_RUN))
    assert f.poll()
    st = f.state
    assert st.state == "finished" and st.step == 40 and st.total == 40
    assert len(st.series["loss"]) == 40 and st.series["loss"].last == pytest.approx(10.50047779083252)
    assert st.telemetry["backend"] == "cpu" and set(st.telemetry["unavailable"]) >= {"amdsmi", "nvml"}
    assert [p for p in st.probes] == ["before", "after"]
    assert st.eta(now=0) == 0.0 and st.elapsed(now=0) == pytest.approx(33.0, abs=0.1)
    assert not f.poll()  # nothing new: nothing re-read


def test_follower_reads_only_new_bytes_and_waits_for_whole_lines(tmp_path):
    run = create_run_dir(tmp_path, "t")
    f = RunFollower(run, chunk_bytes=64)
    with EventWriter(run.events_path) as w:
        w.emit("train_begin", total_steps=10)
        for i in range(1, 4):
            w.emit("step", step=i, total_steps=10, loss=1.0 / i, lr=1e-3)
    assert f.poll() and f.state.step == 3
    offset = f.reader.offset
    with open(run.events_path, "ab") as fh:
        fh.write(b'{"v":1,"t":1,"kind":"step","step":4')  # half a line
    assert not f.poll() and f.state.step == 3
    with open(run.events_path, "ab") as fh:
        fh.write(b',"loss":0.2}\n')
    assert f.poll() and f.state.step == 4 and f.reader.offset > offset


def test_log_tail_is_incremental(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text("a\nb\npart")
    tail = LogTail(logs, max_lines=3)
    assert tail.read_new() == ["a", "b"]
    with open(logs / "rank0.log", "a") as fh:
        fh.write("ial\nc\nd\n")
    assert tail.read_new() == ["partial", "c", "d"]
    assert list(tail.lines) == ["partial", "c", "d"] and tail.total == 5
    assert tail.search("PART") == ["partial"]


def test_form_messages_are_the_ones_cockpit_check_prints(tmp_path):
    m = FormModel()
    m.values.update(dataset="cockpit_identity", cutoff_len="4", lora_rank="x", precision="bf16")
    checked = m.check()
    path = tmp_path / "c.yaml"
    path.write_text(m.yaml())
    with pytest.raises(InputError) as err:
        load_config(path)
    # the same problems, minus the file:line prefix the CLI adds
    expected = sorted(f"{p.key}: {p.message}" for p in err.value.problems)
    assert sorted(checked.problems) == expected
    assert any(p.startswith("cutoff_len: must be int >= 8") for p in checked.problems)


def test_form_maps_method_and_strategy_both_ways(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    m = FormModel()
    m.values.update(dataset="cockpit_identity", method="qlora", strategy="zero3", offload=True, nproc_per_node="8")
    raw = m.raw()
    assert raw["finetuning_type"] == "lora" and raw["quantization_bit"] == 4
    # the keys cockpit/strategy/deepspeed.py generates its DeepSpeed config from, no file of ours
    assert raw["zero_stage"] == 3 and raw["offload"] == "optimizer+params" and "deepspeed" not in raw
    assert m.check().ok
    back = FormModel()
    back.fill(m.typed())
    assert (back.values["method"], back.values["strategy"], back.values["offload"]) == ("qlora", "zero3", True)
    m.values.update(strategy="fsdp", method="full")
    raw = m.raw()
    assert raw["fsdp"] == "full_shard auto_wrap offload" and "deepspeed" not in raw and "quantization_bit" not in raw


def test_saved_preset_is_a_config_cockpit_train_accepts(tmp_path):
    preset = next(p for p in list_presets() if p.name == "cpu-demo")
    m = FormModel()
    m.fill(load_preset(preset.path))
    m.values["lora_rank"] = "32"
    path = save_preset("my demo", m.typed(), folder=tmp_path)
    cfg = load_config(path)
    assert cfg.lora_rank == 32 and cfg.dataset == "cockpit_identity,cockpit_bilingual"
    assert cfg == validate(m.typed(), base_dir=tmp_path).replace(base_dir=cfg.base_dir)


def test_plan_and_forms_stay_torch_free():
    code = (
        "import sys\n"
        "from cockpit.ui.forms import FormModel, fit_line\n"
        "m = FormModel(); m.values['dataset'] = 'cockpit_identity'\n"
        "c = m.check(); assert c.ok, c.problems\n"
        "from cockpit.ui.widgets import Machine\n"
        "line = fit_line(c.cfg, Machine('h', 0, '', None, 64.0), 64); assert 'fits' in line, line\n"
        "bad = [x for x in ('torch', 'transformers', 'peft') if x in sys.modules]\n"
        "assert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr


def test_fit_line_reports_an_unknown_model_instead_of_raising():
    cfg = validate({"dataset": "x.jsonl", "model_name_or_path": "nobody/unknown-model"}, check_paths=False)
    from cockpit.ui.widgets import Machine

    assert fit_line(cfg, Machine("h", 0, "", None, 64.0), 64).startswith("fit: cannot estimate")
