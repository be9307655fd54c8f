"""Relative paths in a config are resolved once, where the user runs the command (issue 29, item 2).

LLaMA-Factory's examples have no ``dataset_dir``: their datasets are in ``./data/dataset_info.json``
of the directory the command runs in. The ranks work in the run dir, so the resolved config
(config.yaml) must carry the absolute folder, and a bad name must exit 2 before any run dir exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import cockpit, read_events, tiny_config

ROWS = [
    {"instruction": "Who are you?", "input": "", "output": "I am Cockpit's tiny test model."},
    {"instruction": "Name a colour.", "input": "", "output": "Blue."},
    {"instruction": "Add two and two.", "input": "", "output": "Four."},
    {"instruction": "Say hello", "input": "in French", "output": "Bonjour."},
]


def lf_project(root: Path) -> Path:
    """A LLaMA-Factory-style folder: data/dataset_info.json naming an alpaca JSONL file."""
    data = root / "data"
    data.mkdir(parents=True)
    (data / "dataset_info.json").write_text(json.dumps({"my_alpaca": {"file_name": "my_alpaca.jsonl"}}))
    (data / "my_alpaca.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return data


def test_validate_records_absolute_paths_from_the_working_dir(tmp_path, monkeypatch):
    from cockpit.config.load import validate

    data = lf_project(tmp_path / "proj")
    (tmp_path / "proj" / "extra.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    monkeypatch.chdir(tmp_path / "proj")
    raw = {"model_name_or_path": "tiny", "dataset": "my_alpaca", "eval_dataset": "./extra.jsonl", "output_dir": "out"}
    cfg = validate(raw, base_dir=tmp_path / "elsewhere")
    assert cfg.dataset_dir == str(data.resolve())
    assert cfg.eval_dataset == str((tmp_path / "proj" / "extra.jsonl").resolve())
    assert cfg.output_dir == str((tmp_path / "proj" / "out").resolve())
    assert cfg.dataset == "my_alpaca"  # names stay names, looked up in dataset_dir


def test_default_dataset_dir_prefers_the_folder_that_lists_the_names(tmp_path, monkeypatch):
    """cwd/data and the config's data both exist: the one that has the dataset wins."""
    from cockpit.config.load import validate

    (tmp_path / "cwd" / "data").mkdir(parents=True)
    (tmp_path / "cwd" / "data" / "dataset_info.json").write_text(json.dumps({"other": {"file_name": "o.jsonl"}}))
    cfg_data = lf_project(tmp_path / "cfgdir")
    monkeypatch.chdir(tmp_path / "cwd")
    cfg = validate({"model_name_or_path": "tiny", "dataset": "my_alpaca"}, base_dir=tmp_path / "cfgdir")
    assert cfg.dataset_dir == str(cfg_data.resolve())


def test_unknown_dataset_name_exits_2_and_leaves_no_run_dir(tmp_path, tiny_model_dir):
    lf_project(tmp_path)
    cfg = tiny_config(tmp_path, tiny_model_dir, dataset="not_there", probes=None)
    runs = tmp_path / "runs"
    res = cockpit("train", cfg.name, "--runs-dir", str(runs), "--detach", cwd=str(tmp_path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "'not_there' is not in" in res.stderr and str(tmp_path / "data" / "dataset_info.json") in res.stderr
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.slow
def test_lf_config_without_dataset_dir_trains_from_its_directory(tmp_path, tiny_model_dir):
    data = lf_project(tmp_path)
    cfg = tiny_config(
        tmp_path, tiny_model_dir, dataset="my_alpaca", output_dir="out", max_steps=2, save_steps=2, probes=None
    )
    runs = tmp_path / "runs"
    res = cockpit("train", cfg.name, "--runs-dir", "runs", cwd=str(tmp_path))  # a relative runs dir too
    assert res.returncode == 0, res.stdout + res.stderr  # (its supervisor once looked for runs/<id>/runs/<id>)
    (run_dir,) = runs.iterdir()
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert recorded["dataset_dir"] == str(data.resolve())
    assert recorded["output_dir"] == str((tmp_path / "out").resolve())
    assert json.loads((run_dir / "summary.json").read_text())["state"] == "finished"
    assert sum(1 for e in read_events(run_dir) if e["kind"] == "step") >= 2
    assert (tmp_path / "out" / "adapter").is_dir()
