"""Issue 62 item 1: what a run produced stays that run's. A second run whose ``output_dir`` an
active run (or a queued one) writes is refused at ``check``, ``train`` and ``queue add``, naming
the other run; a finished run whose ``output_dir`` a later run wrote over (``overwrite_output_dir``)
says so in its Summary and refuses export, chat and serve instead of using the other run's weights.
The sweep's path (each trial its own folder) is ``tests/test_sweep.py``; Slurm's, ``tests/test_slurm_live.py``."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from conftest import cockpit, tiny_config

from cockpit.run import queue as q
from cockpit.run.liveness import start_time
from cockpit.store import output_mark
from cockpit.store.rundir import RunDir, create_run_dir, list_runs

LF_OUT = {"output_dir": "saves/smol/lora/sft", "overwrite_output_dir": True}  # as LLaMA-Factory users write it


def active_run(runs: Path, out: Path) -> RunDir:
    """A run dir whose supervisor is this test process (alive, this host), writing ``out``."""
    run = create_run_dir(runs, "first")
    run.update_status(
        state="running",
        output_dir=str(out),
        supervisor_pid=os.getpid(),
        supervisor_start=start_time(os.getpid()),
        supervisor_host=socket.gethostname(),
    )
    return run


def test_a_second_writer_of_an_output_dir_is_refused_at_check_train_and_queue_add(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    out = tmp_path / "saves" / "smol" / "lora" / "sft"  # the config's relative output_dir, where the command runs
    cfg = tiny_config(tmp_path, tiny_model_dir, **LF_OUT)
    first = active_run(runs, out)
    line = cfg.read_text().splitlines().index("output_dir: saves/smol/lora/sft") + 1
    where = ("--runs-dir", str(runs))
    for argv in (("check", str(cfg)), ("train", str(cfg), "--detach"), ("queue", "add", str(cfg))):
        res = cockpit(*argv, *where, cwd=str(tmp_path))
        assert res.returncode == 2, (argv, res.stdout + res.stderr)
        said = f"{cfg}:{line}: output_dir: {out} is also the output_dir of run {first.run_id} (running"
        assert said in res.stderr, (argv, res.stderr)  # file, line and key named
    assert [r.run_id for r in list_runs(runs)] == [first.run_id]  # no run dir made
    assert not q.read_queue(runs)["entries"]  # nothing queued
    # the same config from another folder names another output_dir: its own, so it passes this gate
    from cockpit.config import load_config
    from cockpit.run.shared_output import shared_output_problem

    assert shared_output_problem(load_config(str(cfg)), runs) is None  # cwd: the repo, not tmp_path
    # a queued entry holds its output_dir too: `cockpit train` names it
    entry = q.add_entry(runs, str(cfg), [], str(tmp_path), output_dir=str(out))
    first.update_status(state="finished", ended=time.time())  # an ended run's folder may be reused
    res = cockpit("train", str(cfg), "--detach", *where, cwd=str(tmp_path))
    assert res.returncode == 2 and f"queue entry {entry['id']}" in res.stderr, res.stdout + res.stderr
    assert f"cockpit queue rm {entry['id']}" in res.stderr and f"run {first.run_id}" not in res.stderr
    q.remove_entry(runs, entry["id"])
    assert [r.run_id for r in list_runs(runs)] == [first.run_id]


def test_a_run_resumes_only_into_an_output_dir_still_its_own(tmp_path, tiny_model_dir):
    """``cockpit resume`` of a stopped run is refused while another run writes its output_dir, and
    after another run has written there (its checkpoints would be that run's), naming it."""
    from cockpit.config import load_config
    from cockpit.config.load import dump_resolved

    runs, out = tmp_path / "runs", tmp_path / "saves"
    stopped = create_run_dir(runs, "stopped")
    stopped.config_path.write_text(dump_resolved(load_config(str(tiny_config(tmp_path, tiny_model_dir, output_dir=str(out))))))
    stopped.update_status(state="stopped", output_dir=str(out))
    out.mkdir()
    output_mark.claim(out, stopped)
    other = active_run(runs, out)
    res = cockpit("resume", stopped.run_id, "--runs-dir", str(runs))
    assert res.returncode == 2 and f"{out} is also the output_dir of run {other.run_id} (running" in res.stderr, res.stderr
    other.update_status(state="finished", ended=time.time())
    output_mark.claim(out, other)  # it trained there
    res = cockpit("resume", stopped.run_id, "--runs-dir", str(runs))
    assert res.returncode == 2 and f"run {other.run_id} has written into its output_dir {out} since" in res.stderr, res.stderr


def test_an_adapter_overwritten_after_its_run_is_not_its_own(tmp_path):
    """The mark and the fingerprint (no training): a run's adapter is its own until another run
    marks the folder and writes other files there; a changed file without a mark is said too."""
    out = tmp_path / "out"
    a, b = create_run_dir(tmp_path / "runs", "a"), create_run_dir(tmp_path / "runs", "b")
    adapter = out / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"a's weights")
    output_mark.claim(out, a)
    summary = {"adapter_dir": str(adapter), "adapter_fingerprint": output_mark.stamp(out, a, adapter)}
    assert output_mark.read_mark(out)["run_id"] == a.run_id
    assert output_mark.foreign_adapter(a, summary) is None
    output_mark.claim(out, b)  # b starts in the same folder: a's adapter is still a's until b writes one
    assert output_mark.foreign_adapter(a, summary) is None
    (adapter / "adapter_model.safetensors").write_bytes(b"b's weights")
    output_mark.stamp(out, b, adapter)
    why = output_mark.foreign_adapter(a, summary)
    assert why and f"no longer {a.run_id}'s: run {b.run_id} wrote into the same output_dir {out}" in why
    (out / output_mark.MARK).unlink()  # no mark (another tool wrote there): the fingerprint still tells
    assert "differ from summary.json's adapter_fingerprint" in (output_mark.foreign_adapter(a, summary) or "")
    assert output_mark.foreign_adapter(a, {"adapter_dir": str(adapter)}) is None  # an old run, unmarked


@pytest.mark.slow
@pytest.mark.budget(120, "two one-step runs of the tiny Llama into one output_dir, then export / chat / serve refused")
def test_a_later_run_in_the_same_output_dir_marks_the_first_runs_adapter_as_not_its_own(tmp_path, tiny_model_dir):
    from cockpit.ui.screens.summary import summary_text

    runs = tmp_path / "runs"
    out = tmp_path / "saves" / "smol" / "lora" / "sft"
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=1, save_steps=1, probes=None, **LF_OUT)
    where = ("--runs-dir", str(runs))

    def train() -> RunDir:
        before = {r.run_id for r in list_runs(runs)}
        res = cockpit("train", str(cfg), *where, cwd=str(tmp_path))
        assert res.returncode == 0, res.stdout + res.stderr
        (run,) = [r for r in list_runs(runs) if r.run_id not in before]
        return run

    first = train()
    summary = first.read_summary()
    assert summary["adapter_dir"] == str(out / "adapter") and summary["adapter_fingerprint"].startswith("sha256:")
    mark = output_mark.read_mark(out)
    assert mark["run_id"] == first.run_id and mark["adapter_fingerprint"] == summary["adapter_fingerprint"]
    assert output_mark.foreign_adapter(first, summary) is None

    second = train()  # the first has ended: the user asked for the folder again (overwrite_output_dir)
    assert output_mark.read_mark(out)["run_id"] == second.run_id
    assert second.read_summary()["adapter_fingerprint"] != summary["adapter_fingerprint"]
    said = f"the adapter in {out / 'adapter'} is no longer {first.run_id}'s: run {second.run_id} wrote into"
    assert said in summary_text(first, first.read_summary(), first.read_status()).plain
    for argv in (("export", first.run_id), ("chat", first.run_id, "--prompt", "hi"), ("serve", first.run_id)):
        res = cockpit(*argv, *where)
        assert res.returncode == 2 and said in res.stderr, (argv, res.stdout + res.stderr)
    assert not (out / "export").exists()
    res = cockpit("export", second.run_id, *where)  # the folder's adapter is the second run's own
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads((out / "export" / "cockpit_export.json").read_text())
    assert record["run_id"] == second.run_id and record["adapter_dir"] == str(out / "adapter")
    assert "no longer" not in summary_text(second, second.read_summary(), second.read_status()).plain
