"""The demo preset for real: the embedded model learns a new identity on this CPU, and keeps
answering the general questions it answered before (the control probes: no forgetting)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, cockpit, read_events


@pytest.mark.budget(150, reason="the SFT demo preset on the embedded 135M model: learning is what it asserts")
@pytest.mark.slow
def test_cpu_demo_preset_learns_identity(tmp_path, embedded_dir):
    runs = tmp_path / "runs"
    res = cockpit("train", str(ROOT / "presets" / "cpu-demo.yaml"), "--runs-dir", str(runs), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in runs.iterdir() if d.is_dir())
    summary = json.loads((run / "summary.json").read_text())
    print(json.dumps({k: summary[k] for k in ("runtime_s", "train_runtime_s", "tokens_per_s", "first_loss", "last_loss", "probes_before", "probes_after")}))
    assert summary["state"] == "finished"
    before, after = summary["probes_before"]["sets"], summary["probes_after"]["sets"]
    assert before["identity"]["rate"] <= 0.2
    assert after["identity"]["rate"] >= 0.8
    # control: general questions (arithmetic, capitals, translation, a definition; English and
    # Chinese) the base model answers: none forgotten. Measured 2026-12-01: 10/10 -> 10/10 with one
    # thread and with two (before the replay rows took the base model's own phrasing, 9/10).
    assert before["control"]["total"] == after["control"]["total"] >= 8
    assert before["control"]["passed"] >= 8
    assert after["control"]["passed"] >= before["control"]["passed"]
    assert summary["last_loss"] < 0.5 * summary["first_loss"]
    losses = [e["loss"] for e in read_events(run) if e["kind"] == "step"]
    assert len(losses) >= 5
