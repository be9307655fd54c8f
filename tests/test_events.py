"""The event log: schema, append from several writers, incremental reading."""

from __future__ import annotations

import json
import math
import os

from cockpit.store.events import SCHEMA_VERSION, EventReader, EventWriter, as_float, encode
from cockpit.store.rundir import create_run_dir, list_runs, resolve_run


def test_encode_has_version_time_kind_and_no_nan():
    line = encode("step", step=1, loss=float("nan"), lr=float("inf"))
    ev = json.loads(line)
    assert ev["v"] == SCHEMA_VERSION and ev["kind"] == "step" and ev["t"] > 0
    assert ev["loss"] == "nan" and math.isnan(as_float(ev["loss"])) and as_float(ev["lr"]) == math.inf


def test_reader_reads_only_new_bytes_and_waits_for_partial_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    w = EventWriter(path)
    r = EventReader(path)
    w.emit("state", state="running")
    assert [e["kind"] for e in r.read_new()] == ["state"]
    assert r.read_new() == []
    with open(path, "a") as fh:  # a writer caught mid-line
        fh.write('{"v":1,"t":1,"kind":"step","step":')
    assert r.read_new() == []
    with open(path, "a") as fh:
        fh.write("2}\n")
    assert [e["step"] for e in r.read_new()] == [2]


def test_two_writers_interleave_whole_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    a, b = EventWriter(path), EventWriter(path)
    for i in range(200):
        a.emit("step", step=i, text="x" * 500)
        b.emit("telemetry", i=i, text="y" * 500)
    events = EventReader(path).read_new()
    assert len(events) == 400


def test_run_dirs_unique_private_and_resolvable(tmp_path):
    runs = [create_run_dir(tmp_path, "same") for _ in range(5)]
    assert len({r.path for r in runs}) == 5
    for r in runs:
        assert (os.stat(r.path).st_mode & 0o777) == 0o700
        r.update_status(state="running")
    assert len(list_runs(tmp_path)) == 5
    assert resolve_run(runs[0].run_id, tmp_path) == runs[0]
    p = runs[0].request("stop")
    assert (os.stat(p).st_mode & 0o777) == 0o600
    assert runs[0].consume("stop") and not runs[0].consume("stop")
