"""``cockpit tune``: real trial steps on the tiny random Llama, a CPU memory cap computed from measured
peaks (fits micro-batch <= 2, not 4), the OOM caught in the same process, the written config loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cockpit import cli
from cockpit.commands.tune import render
from cockpit.config import load_config
from cockpit.train.tune import rewrite_yaml, tune
from conftest import ROOT, cockpit

CONFIG = """\
# a tiny run (comment kept)
model_name_or_path: {model}
template: chatml
dataset: cockpit_identity
finetuning_type: lora
lora_rank: 4
cutoff_len: 128
per_device_train_batch_size: 1   # micro-batch
gradient_accumulation_steps: 4
max_steps: 6
use_cpu: true
"""


def write_config(tmp_path: Path, model: Path, **extra) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(CONFIG.format(model=model) + "".join(f"{k}: {v}\n" for k, v in extra.items()), encoding="utf-8")
    return p


def quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def peaks(tmp_path_factory, tiny_model_dir) -> dict[int, float]:
    """Measured peaks (GiB) of micro-batch 2 and 4 under a cap nothing reaches."""
    tmp = tmp_path_factory.mktemp("measure")
    doc = tune(str(write_config(tmp, tiny_model_dir)), memory_cap_gb=64, candidates=[2, 4], steps=2, log=quiet)
    got = {t["micro_batch"]: t["peak_gb"] for t in doc["trials"]}
    assert set(got) == {2, 4} and all(got.values()), doc
    assert got[2] < got[4]
    return got


def cap_between(peaks: dict[int, float]) -> float:
    """A cap that leaves 2 its 10 % headroom and is under 4's peak (midway, so it is robust)."""
    lo, hi = peaks[2] / 0.9, peaks[4]
    assert lo < hi, f"micro-batch 4 must need clearly more than 2: {peaks}"
    return (lo + hi) / 2


@pytest.mark.slow
def test_cap_fits_two_not_four_oom_caught_in_process(tmp_path, tiny_model_dir, peaks):
    cfg = write_config(tmp_path, tiny_model_dir)
    cap = cap_between(peaks)
    doc = tune(str(cfg), memory_cap_gb=cap, steps=2, log=quiet)
    assert doc["ok"] is True and doc["cap_gb"] == pytest.approx(cap, rel=1e-4)
    by_m = {t["micro_batch"]: t for t in doc["trials"]}
    assert [t["micro_batch"] for t in doc["trials"]] == [1, 2, 4]
    assert by_m[4]["oom"] is True and by_m[4]["peak_gb"] is None and by_m[4]["tokens_per_s"] is None
    assert "memory cap" in by_m[4]["error"]
    assert by_m[2]["peak_gb"] == pytest.approx(peaks[2], rel=0.02)  # the same real steps, the same peak
    assert by_m[1]["peak_gb"] < by_m[2]["peak_gb"]
    for m in (1, 2):
        t = by_m[m]
        assert not t["oom"] and t["status"] == "fits" and t["tokens_per_s"] > 0
        assert t["planned_gb"] > 0
        assert t["micro_batch"] * t["accumulation"] == 4  # the global batch stays 4
    assert {t["pid"] for t in doc["trials"]} == {os.getpid()}  # every trial ran here; this process survived
    ch = doc["chosen"]
    assert ch["per_device_train_batch_size"] in (1, 2)
    assert ch["per_device_train_batch_size"] * ch["gradient_accumulation_steps"] == 4
    assert ch["tokens_per_s"] == max(by_m[1]["tokens_per_s"], by_m[2]["tokens_per_s"])
    assert doc["largest_fitting"]["per_device_train_batch_size"] == 2
    # the tuned config: beside the input, the user's comments and keys, the two values changed; it loads
    out = Path(doc["out"])
    assert out == tmp_path / "run.tuned.yaml"
    text = out.read_text()
    assert "# a tiny run (comment kept)" in text and "# micro-batch" in text and text.startswith("# tuned by cockpit tune")
    tuned = load_config(out)
    assert tuned.per_device_train_batch_size == ch["per_device_train_batch_size"]
    assert tuned.gradient_accumulation_steps == ch["gradient_accumulation_steps"]
    orig = load_config(cfg)
    assert {k: v for k, v in tuned.mapping().items() if k not in ("per_device_train_batch_size", "gradient_accumulation_steps", "_base_dir")} == \
        {k: v for k, v in orig.mapping().items() if k not in ("per_device_train_batch_size", "gradient_accumulation_steps", "_base_dir")}
    assert "per_device_train_batch_size: 1 " in cfg.read_text()  # the input is untouched


@pytest.mark.slow
def test_nothing_fits_exit_1_names_the_smallest_and_what_to_try(tmp_path, tiny_model_dir, peaks, capsys):
    cfg = write_config(tmp_path, tiny_model_dir)
    cap = peaks[2] * 0.25  # micro-batch 1 needs about half of 2's peak
    code = cli.main(["tune", str(cfg), "--memory-cap", f"{cap:.6f}", "--steps", "2", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["ok"] is False and doc["out"] is None and doc["chosen"] is None
    assert doc["trials"][0]["oom"] is True
    assert [t["status"] for t in doc["trials"]] == ["oom", "skipped", "skipped"]  # the search stops upward
    assert "micro-batch 1 ran out of memory" in doc["message"] and "gradient_checkpointing" in doc["message"]
    assert "--memory-cap" in doc["message"]
    assert not (tmp_path / "run.tuned.yaml").exists()


@pytest.mark.parametrize("args, extra, key", [
    (["--memory-cap", "0"], {}, "--memory-cap"),
    (["--memory-cap", "-3"], {}, "--memory-cap"),
    (["--candidates", "1,3"], {}, "--candidates"),
    (["--candidates", "two"], {}, "--candidates"),
    (["--steps", "1"], {}, "--steps"),
    (["--gpus", "0"], {}, "--gpus"),
    ([], {"zero_stage": 2, "nproc_per_node": 2}, "zero_stage"),
    ([], {"fsdp": "full_shard auto_wrap", "nproc_per_node": 2}, "fsdp"),
    ([], {"lora_rnak": 3}, "lora_rnak"),
])
def test_bad_input_exit_2_names_the_key(tmp_path, tiny_model_dir, args, extra, key):
    cfg = write_config(tmp_path, tiny_model_dir, **extra)
    res = cockpit("tune", str(cfg), *args, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert key in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run.tuned.yaml").exists()


def test_out_may_not_overwrite_the_input_and_json_errors(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path, tiny_model_dir)
    res = cockpit("tune", str(cfg), "--out", str(cfg), "--json", timeout=60)
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and "--out" in doc["message"]


def test_rewrite_yaml_keeps_comments_and_appends_missing_keys():
    text = "a: 1  # one\nper_device_train_batch_size: 8 # mb\nenv:\n  X: 1\n"
    out = rewrite_yaml(text, {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}, "head")
    assert out == "# head\na: 1  # one\nper_device_train_batch_size: 2 # mb\nenv:\n  X: 1\ngradient_accumulation_steps: 4\n"


@pytest.mark.slow
def test_cli_json_contract_same_process_and_cockpit_check_accepts(tmp_path, tiny_model_dir, peaks):
    """The Setup screen's call: ``cockpit tune CONFIG --json --out OUT``; then ``cockpit check OUT``."""
    cfg = write_config(tmp_path, tiny_model_dir)
    out = tmp_path / "elsewhere" / "tuned.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cockpit.cli", "tune", str(cfg), "--json", "--out", str(out),
                             "--memory-cap", str(cap_between(peaks)), "--steps", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT), env=env)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    doc = json.loads(stdout)
    for k in ("ok", "out", "chosen", "trials", "cap_gb", "message"):
        assert k in doc
    assert set(doc["chosen"]) >= {"per_device_train_batch_size", "gradient_accumulation_steps", "tokens_per_s", "peak_gb"}
    for t in doc["trials"]:
        assert set(t) >= {"micro_batch", "accumulation", "peak_gb", "planned_gb", "tokens_per_s", "oom"}
    assert [t["oom"] for t in doc["trials"]] == [False, False, True]
    assert {t["pid"] for t in doc["trials"]} == {proc.pid}  # the OOM did not end the process
    assert doc["out"] == str(out) and doc["chosen"]["per_device_train_batch_size"] in (1, 2)
    res = cockpit("check", str(out), "--no-devices", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    # the text form of the same document
    text = render(doc)
    assert "OOM" in text and "chose: micro-batch" in text and f"wrote: {out}" in text
