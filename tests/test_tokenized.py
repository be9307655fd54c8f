"""tokenized_path / overwrite_cache (LLaMA-Factory's keys): SFT's rendered samples kept on disk and
reused by a later run with the same settings; other settings are refused by name, overwrite_cache
tokenises afresh; a folder that is not Cockpit's cache is refused."""

from __future__ import annotations

import json

import pytest

from cockpit.config import load_config
from cockpit.data import prepare
from cockpit.errors import InputError


def _cfg(tmp_path, extra: str = ""):
    data = tmp_path / "d.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"instruction": f"q{i}", "output": f"answer {i}"}) + "\n" for i in range(5)))
    (tmp_path / "c.yaml").write_text(
        f"model_name_or_path: smollm2-135m-instruct\ndataset: d.jsonl\ntemplate: chatml\ntokenized_path: {tmp_path / 'tok'}\n{extra}"
    )
    return load_config(str(tmp_path / "c.yaml"))


def _no_rendering(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("rendered again instead of reading the cache")

    monkeypatch.setattr(prepare, "render_all", refuse)


def test_a_second_run_reads_the_tokens_from_the_cache(tmp_path, tokenizer, monkeypatch):
    first = prepare.prepare_dataset(_cfg(tmp_path), tokenizer)
    assert (tmp_path / "tok" / "cockpit_tokenized.json").is_file() and (tmp_path / "tok" / "dataset").is_dir()
    _no_rendering(monkeypatch)
    again = prepare.prepare_dataset(_cfg(tmp_path), tokenizer)
    assert [(r.input_ids, r.labels) for r in again.rendered] == [(r.input_ids, r.labels) for r in first.rendered]
    assert again.report.as_dict() == first.report.as_dict()
    assert [s["source"] for s in again.loaded.samples] == [s["source"] for s in first.loaded.samples]


def test_other_settings_are_refused_by_name_and_overwrite_cache_retokenises(tmp_path, tokenizer, monkeypatch):
    prepare.prepare_dataset(_cfg(tmp_path), tokenizer)
    with pytest.raises(InputError) as err:
        prepare.prepare_dataset(_cfg(tmp_path, "cutoff_len: 64\n"), tokenizer)
    assert "tokenized_path" in str(err.value) and "cutoff_len" in str(err.value) and "overwrite_cache" in str(err.value)
    fresh = prepare.prepare_dataset(_cfg(tmp_path, "cutoff_len: 64\noverwrite_cache: true\n"), tokenizer)
    _no_rendering(monkeypatch)
    reused = prepare.prepare_dataset(_cfg(tmp_path, "cutoff_len: 64\n"), tokenizer)  # the replaced cache fits now
    assert [r.input_ids for r in reused.rendered] == [r.input_ids for r in fresh.rendered]


def test_changed_data_file_is_refused(tmp_path, tokenizer):
    prepare.prepare_dataset(_cfg(tmp_path), tokenizer)
    with open(tmp_path / "d.jsonl", "a") as fh:
        fh.write(json.dumps({"instruction": "new", "output": "row"}) + "\n")
    with pytest.raises(InputError) as err:
        prepare.prepare_dataset(_cfg(tmp_path), tokenizer)
    assert "files" in str(err.value)


def test_a_folder_that_is_not_cockpits_cache_is_refused(tmp_path, tokenizer):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "dataset_dict.json").write_text("{}")  # what a LLaMA-Factory cache holds
    with pytest.raises(InputError) as err:
        prepare.prepare_dataset(_cfg(tmp_path), tokenizer)
    assert "not a Cockpit tokenized cache" in str(err.value)


def test_only_sft_keeps_a_cache(tmp_path):
    with pytest.raises(InputError) as err:
        _cfg(tmp_path, "stage: pt\n")
    assert "tokenized_path" in str(err.value)
