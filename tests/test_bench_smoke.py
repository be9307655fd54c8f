"""Issue 68: every script in bench/ runs to its end, as a user runs it (``python bench/NAME.py ...``, a process of its
own), with its smallest honest setting: a tiny model, 1-3 steps, one round (``--smoke`` where a script has one). The
figures they print mean nothing here; what is asserted is that each reached its end and printed its result's shape, so
a refactor under a benchmark (the typed RunConfig broke three of them, unseen) fails the suite. The LLaMA-Factory
side scripts run up to the point of needing LLaMA-Factory (``--dry-run`` / ``--no-lf``: no side venv in the suite), and
``scripts/gpu_lent.sh --cpu-dry-run`` goes through every step a lent GPU runs short of the GPU work.
``bench/gpu_8b_job.py``'s training flow on the CPU is tests/test_gpu_check_script.py's; ``bench/jobs.py`` is the job
the throughput scripts import."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, prerequisite

BENCH = ROOT / "bench"
FIXTURES = ROOT / "tests" / "fixtures" / "llamafactory"


def bench(script: str, *args: str, env: dict | None = None, timeout: float = 600, ok: bool = True):
    """``python bench/<script> ARGS`` from the repository root; its exit code 0 unless ``ok`` is False."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", **(env or {})}
    res = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
        env=full_env,
    )
    if ok:
        assert res.returncode == 0, f"{script} exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def last_json(text: str) -> dict:
    """The JSON document a script prints last (from its last line that is a lone ``{``)."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return json.loads("\n".join(lines[start:]))


def test_every_bench_script_has_a_smoke_test():
    """A new script in bench/ gets its smoke run here, or in the test file named for it below."""
    here = Path(__file__).read_text()
    elsewhere = {
        "gpu_8b_job.py": "test_gpu_check_script.py",  # its CPU flow; its --dry-run through gpu_lent.sh below
        "alloc_conf.py": "test_rocm_field.py",  # a GPU's measurement: without one it says so
        "jobs.py": "test_bench_smoke.py",  # the job the throughput scripts import
    }
    for name, test_file in elsewhere.items():
        assert f"{name}" in (ROOT / "tests" / test_file).read_text(), (name, test_file)
    missing = [p.name for p in sorted(BENCH.glob("*.py")) if p.name not in elsewhere and f'"{p.name}"' not in here]
    assert not missing, f"bench scripts without a smoke run in {Path(__file__).name}: {missing}"


# -- seconds, no torch: the fast tier -------------------------------------------------------------------------------


def test_telemetry_volume_runs():
    res = bench("telemetry_volume.py", "--seconds", "10", "--gpus", "16", "64")
    rows = last_json(res.stdout)["results"]
    assert [r["gpus"] for r in rows] == [16, 64] and all(r["bytes_per_s"] > 0 for r in rows), rows


def test_the_llamafactory_generators_dry_run_without_llamafactory(tmp_path):
    """The side venv's scripts (they re-run themselves there) check their own code and say what they would run and
    write; nothing is installed and LLaMA-Factory is not imported (the cache dir is empty: not installed)."""
    env = {"COCKPIT_CACHE_DIR": str(tmp_path / "cache")}
    side_python = tmp_path / "cache" / "bench" / "llamafactory-0.9.5" / "venv" / "bin" / "python"
    venv = bench("lf_venv.py", "--dry-run", env=env).stdout
    assert f"would run: {side_python} -m pip --disable-pip-version-check install torch==" in venv, venv
    assert "llamafactory==0.9.5" in venv and not (tmp_path / "cache").exists(), venv
    keys = bench("lf_key_list.py", "--dry-run", env=env).stdout
    assert (
        "would write tests/fixtures/llamafactory/lf_keys.json and tests/fixtures/llamafactory/lf_v1_keys.json" in keys
    )
    assert f"would run: PYTHONPATH= {side_python} {BENCH / 'lf_key_list.py'}" in keys, keys
    port = bench("lf_template_port.py", "--dry-run", env=env).stdout
    assert "would write cockpit/data/lf_templates.py; its header kept" in port, port
    fixtures = bench("lf_template_fixtures.py", "--mistral", "--own", "--dry-run", env=env).stdout
    assert "--mistral: would write tests/fixtures/lf_templates/lf_templates_mistral.json.gz with" in fixtures, fixtures
    assert "(32768 tokens)" in fixtures and "--own: would write" in fixtures and "--qwen" not in fixtures, fixtures
    assert f"{BENCH / 'lf_template_fixtures.py'} --mistral --own" in fixtures, fixtures
    mm = bench("lf_mm_fixtures.py", "--dry-run", env=env).stdout  # issue 63's image rows
    assert "5 templates (llava, qwen2_vl, qwen3_vl, qwen3_vl_nothink, gemma3), 4 rows" in mm, mm
    assert "would write tests/fixtures/lf_templates/lf_mm_templates.json.gz" in mm, mm
    assert f"would run: PYTHONPATH= {side_python} {BENCH / 'lf_mm_fixtures.py'} --pillow=" in mm, mm
    refused = bench("lf_template_fixtures.py", "--mistrl", "--dry-run", env=env, ok=False)
    assert refused.returncode != 0 and "unknown argument --mistrl" in refused.stderr, refused.stderr
    assert not (tmp_path / "cache").exists()


# -- trains or loads a model: the slow tier --------------------------------------------------------------------------


@pytest.mark.slow
def test_host_syncs_runs(tiny_model_dir):
    syncs = bench("host_syncs.py", "--model", str(tiny_model_dir), "--steps", "1").stdout
    for variant in ("bare", "cockpit"):
        assert f"\n{variant}: " in syncs and " host reads per step (1 steps)" in syncs, syncs


@pytest.mark.slow
def test_step_overhead_runs(tiny_model_dir):
    steps = bench("step_overhead.py", "--model", str(tiny_model_dir), "--steps", "3", "--rounds", "1", "--fp32").stdout
    table = steps.split("variant     s/step (median of rounds)   / bare\n")[1].splitlines()
    assert [line.split()[0] for line in table] == ["bare", "+args", "+collator", "cockpit"], steps
    assert table[0].split()[-1] == "1.000", steps


@pytest.mark.slow
@pytest.mark.budget(
    90,
    reason="two trainings in processes of their own: cockpit train (its check, supervisor, rank) and the plain child",
)
def test_throughput_runs(tiny_model_dir):
    """Cockpit through its CLI beside the plain HF Trainer + PEFT child (which reads the typed config too)."""
    out = bench("throughput.py", "--model", str(tiny_model_dir), "--steps", "1", "--rounds", "1").stdout
    assert "round 1: cockpit " in out and "median: cockpit " in out and ", ratio = " in out, out


@pytest.mark.slow
@pytest.mark.budget(90, reason="a cockpit train of two torchrun ranks over gloo")
def test_strategies_runs(tiny_model_dir):
    """DDP alone (two torchrun ranks): the 1-rank baseline is the same code, one more training (CI time)."""
    out = bench("strategies.py", "--model", str(tiny_model_dir), "--steps", "1", "--only", "ddp").stdout
    (row,) = [line.split() for line in out.splitlines() if line.startswith("DDP x2 ")]
    assert float(row[2]) > 0 and row[3] == "-" and "failed" not in out, out


@pytest.mark.slow
def test_memory_fit_runs():
    fit = bench("memory_fit.py", "--smoke").stdout
    assert "2 points in " in fit and "0 outside +-15%" in fit, fit


@pytest.mark.slow
def test_padding_free_runs(tiny_model_dir):
    """Its default rows, LLaMA-Factory's alpaca_en_demo (the fixtures' copy), not --synthetic's."""
    data = ("--lf-data", str(FIXTURES / "data"))
    args = ("--model", str(tiny_model_dir), "--cutoffs", "64", "--batch", "2", "--rounds", "1", *data)
    padding = bench("padding_free.py", *args).stdout
    assert "alpaca_en_demo rows" in padding and "cutoff 64: fill " in padding, padding
    assert "/ padded: padding-free " in padding, padding


@pytest.mark.slow
def test_chunked_loss_memory_runs():
    args = ("--vocab", "4096", "--tokens", "128", "--hidden", "64", "--layers", "1")
    chunked = bench("chunked_loss_memory.py", *args).stdout
    assert "live tensors: chunked / full " in chunked and "loss |full - chunked| / full: " in chunked, chunked


@pytest.mark.slow
@pytest.mark.budget(90, reason="a layer at Llama-3.1-8B's width and its 128256 x 4096 embedding, two rows")
def test_lora_layer_memory_runs():
    """8B's layer width (the embedding too): one layer, 32 tokens."""
    out = bench("lora_layer_memory.py", "--layers", "1", "--cutoff", "32", "--micro-batch", "1").stdout
    assert "1 peft cast" in " ".join(out.split()) and "1 cockpit" in " ".join(out.split()), out
    assert "1 layer(s): the fp32 input copies cost" in out, out


@pytest.mark.slow
@pytest.mark.budget(90, reason="a cockpit train of two gloo ranks")
def test_sharded_load_memory_runs():
    out = bench("sharded_load_memory.py", "--layers", "2", "--hidden", "64", "--only", "ddp").stdout
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("ddp ")] == [["ddp", "0"], ["ddp", "1"]], (
        out
    )


@pytest.mark.slow
def test_lowrank_import_runs(lowrank_env):
    out = bench("lowrank_import.py", "--repeats", "1").stdout
    assert "bitsandbytes imported: False" in out and "bitsandbytes imported: True" in out, out


@pytest.mark.slow
@pytest.mark.budget(
    180, reason="the UI started five times in tmux, a followed run, an attach, then the many-GPU Live screen"
)
def test_ui_bench_runs():
    prerequisite(shutil.which("tmux") is not None, "tmux not installed")
    out = bench("ui.py", "--smoke", timeout=900).stdout
    result = last_json(out)
    first = result["first_frame"]
    assert all(first[name]["median_s"] for name in ("cockpit", "python -m cockpit", "cockpit, runs", "bare Textual"))
    assert first["cockpit"]["setup_ready_s_median"], first  # Setup's form filled and validated: 'config valid'
    assert result["follow"]["steps_seen"] > 0 and result["attach"]["full_history_s"], result
    nodes = last_json(bench("ui.py", "--smoke", "--gpus", "16").stdout)["nodes"]
    assert nodes[0]["nodes"] == 2 and nodes[0]["live_first_frame_s"] and nodes[0]["steps_seen"] > 0, nodes


@pytest.mark.slow
@pytest.mark.budget(90, reason="an fp32 copy of the model and a cockpit train")
def test_vs_llamafactory_runs_cockpits_side(tiny_model_dir, tmp_path):
    """``--no-lf``: Cockpit's side for real (data, YAML, fp32 copy, its run's summary read), LLaMA-Factory's command
    line printed (no side venv in the suite)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    args = ("--no-lf", "--model", str(model), "--shape", "lora-fp32", "--steps", "1", "--rounds", "1", "--fp32-model")
    out = bench("vs_llamafactory.py", *args).stdout
    assert "llamafactory-cli train " in out and "include_num_input_tokens_seen=non_padding" in out, out
    assert "round 1 lora-fp32: cockpit wall " in out and ", 1 steps, " in out, out
    assert "| lora-fp32 | not run | " in out and (tmp_path / "model-fp32" / "config.json").exists(), out


@pytest.mark.slow
def test_lf_examples_check_runs(tmp_path):
    """Over a LLaMA-Factory tree made of its examples in the fixtures: an SFT config passes, a v1 config with a key
    that has no v0 form fails with the first line of the refusal, an inference config is not a training config."""
    tree = tmp_path / "lf"
    (tree / "examples" / "v1").mkdir(parents=True)
    (tree / "examples" / "inference").mkdir()
    shutil.copy(FIXTURES / "qwen3_lora_sft.yaml", tree / "examples")
    shutil.copy(FIXTURES / "v1" / "train_freeze_sft.yaml", tree / "examples" / "v1")
    (tree / "examples" / "inference" / "qwen3.yaml").write_text("model_name_or_path: Qwen/Qwen3-4B\ntemplate: qwen3\n")
    shutil.copytree(FIXTURES / "data", tree / "data")
    out = bench("lf_examples_check.py", str(tree)).stdout.splitlines()
    assert out[0] == "PASS examples/qwen3_lora_sft.yaml", out
    assert out[1].startswith("FAIL examples/v1/train_freeze_sft.yaml: ") and len(out) == 3, out
    assert out[2] == "1 of 2 training configs pass (1 other files)", out


@pytest.mark.slow
@pytest.mark.budget(150, reason="the stand-in model, the 8B job's tiny model and three cockpit plans, gpu_check.sh")
def test_gpu_lent_cpu_dry_run(tmp_path):
    """scripts/gpu_lent.sh as a lent GPU runs it, on the CPU, short of the GPU work: the 8B job's variants (tiny shape)
    are built, written and planned, their table written; the twins' command printed; gpu_check.sh skips."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_lent.sh"), "--cpu-dry-run", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=str(ROOT),
        env=env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "embedded stand-in (random weights) in " in res.stdout and "8b lora: rc=0" in res.stdout, res.stdout
    assert "8b unsloth_gc,qlora: rc=0" in res.stdout and "dry run: would run timeout 330 " in res.stdout, res.stdout
    rows = json.loads((out / "job8b_lora.json").read_text()) + json.loads((out / "job8b_more.json").read_text())
    assert [r["variant"] for r in rows] == ["lora", "unsloth_gc", "qlora"], rows
    assert all(r["state"] == "dry run" and r["planned_allocated_gib"] > 0 for r in rows), rows
    assert "gpu_check: skipped: no GPU visible" in (out / "gpu_check.log").read_text()
    assert (out / "artefacts.tgz").exists() and (out / "work" / "job8b" / "qlora.yaml").exists()
