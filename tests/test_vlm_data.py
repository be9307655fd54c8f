"""Image datasets as LLaMA-Factory writes them (issue 63): the images column, paths under media_dir,
``<image>`` placeholders; every bad image row refused by file:line before a run dir exists. No model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_CONFIG, write_yaml
from PIL import Image

from cockpit.cli import main
from cockpit.config.run_config import RunConfig
from cockpit.data.dataset_info import resolve_datasets
from cockpit.data.formats import load_dataset_file
from cockpit.data.pairs import load_stage_file


def _png(path: Path, size: tuple[int, int] = (8, 6), colour: str = "red") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _registry(data: Path, entries: dict) -> None:
    (data / "dataset_info.json").write_text(json.dumps(entries, indent=2))


def _sharegpt(text: str, images=None, answer: str = "a red square") -> dict:
    row: dict = {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]}
    if images is not None:
        row["images"] = images
    return row


_SHAREGPT_ENTRY = {
    "formatting": "sharegpt",
    "columns": {"messages": "messages", "images": "images"},
    "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
}


def test_image_paths_resolve_as_llamafactory_finds_them(tmp_path):
    """media_dir unset: under dataset_dir (LLaMA-Factory's default); a path not there, as given (an
    absolute one); alpaca rows read their images column as sharegpt rows do; media_dir set: under it."""
    data = tmp_path / "data"
    _png(data / "mllm" / "a.png", (8, 6))
    outside = _png(tmp_path / "elsewhere" / "b.png", (5, 7))
    _jsonl(data / "vlm.jsonl", [_sharegpt("<image>what is it?", ["mllm/a.png"]),
                                _sharegpt("<image><image>both?", ["mllm/a.png", str(outside)])])
    _jsonl(data / "alp.jsonl", [{"instruction": "<image>name it", "output": "a", "images": "mllm/a.png"},
                                {"instruction": "no image here", "output": "b"}])
    _registry(data, {"vlm": {"file_name": "vlm.jsonl", **_SHAREGPT_ENTRY},
                     "alp": {"file_name": "alp.jsonl", "columns": {"prompt": "instruction", "response": "output",
                                                                   "images": "images"}}})
    cfg = RunConfig(dataset="vlm,alp", dataset_dir=str(data), base_dir=str(tmp_path))
    vlm, alp = resolve_datasets(cfg)
    assert vlm.media_dir == data
    res = load_dataset_file(vlm)
    assert not res.problems, res.problems
    first, second = res.samples
    assert first["images"] == [{"path": str((data / "mllm" / "a.png").resolve()), "size": [8, 6]}]
    assert [i["size"] for i in second["images"]] == [[8, 6], [5, 7]]
    assert second["images"][1]["path"] == str(outside.resolve())
    res = load_dataset_file(alp)
    assert not res.problems, res.problems
    assert res.samples[0]["images"][0]["size"] == [8, 6] and "images" not in res.samples[1]
    # media_dir set: the same relative path is looked up under it first
    media = tmp_path / "media"
    _png(media / "mllm" / "a.png", (3, 4))
    (vlm2, _) = resolve_datasets(cfg.replace(media_dir=str(media)))
    assert load_dataset_file(vlm2).samples[0]["images"][0]["size"] == [3, 4]


def test_each_bad_image_row_is_refused_by_its_line(tmp_path):
    """A placeholder count that does not match, a missing image, an undecodable one (not an image; a
    truncated PNG), a URL, a non-path, a video column: each a problem at its own line."""
    data = tmp_path / "data"
    good = _png(data / "ok.png")
    (data / "not_an_image.png").write_text("hello\n")
    whole = good.read_bytes()
    (data / "truncated.png").write_bytes(whole[: len(whole) // 2])
    rows = [
        _sharegpt("<image>fine", ["ok.png"]),  # 1: good
        _sharegpt("<image><image>two marks", ["ok.png"]),  # 2
        _sharegpt("no mark", ["ok.png"]),  # 3
        _sharegpt("<image>", ["missing.png"]),  # 4
        _sharegpt("<image>", ["not_an_image.png"]),  # 5
        _sharegpt("<image>", ["truncated.png"]),  # 6
        _sharegpt("<image>", ["https://example.com/cat.png"]),  # 7
        _sharegpt("<image>", [{"bytes": "..."}]),  # 8
        {**_sharegpt("<video>", None), "videos": ["clip.mp4"]},  # 9
        _sharegpt("<image> but the row names none"),  # 10: the dataset declares an images column
        _sharegpt("plain text, no images"),  # 11: good
    ]
    _jsonl(data / "bad.jsonl", rows)
    _registry(data, {"bad": {"file_name": "bad.jsonl", **_SHAREGPT_ENTRY}})
    (spec,) = resolve_datasets(RunConfig(dataset="bad", dataset_dir=str(data), base_dir=str(tmp_path)))
    res = load_dataset_file(spec)
    by_line = {p.line: p.message for p in res.problems}
    assert all(p.file == str(data / "bad.jsonl") for p in res.problems)
    assert sorted(by_line) == list(range(2, 11)), by_line
    assert "2 <image> placeholder(s) in the text but 1 image(s)" in by_line[2]
    assert "0 <image> placeholder(s) in the text but 1 image(s)" in by_line[3]
    assert "no such image 'missing.png'" in by_line[4]
    assert "cannot decode image 'not_an_image.png'" in by_line[5]
    assert "cannot decode image 'truncated.png'" in by_line[6]
    assert "is a URL" in by_line[7] and "no network" in by_line[7]
    assert "an image is a path" in by_line[8]
    assert "videos" in by_line[9] and "images only, not video or audio" in by_line[9]
    assert "1 <image> placeholder(s) in the text but 0 image(s)" in by_line[10]
    assert [s["source"].rpartition(":")[2] for s in res.samples] == ["1", "11"]


def test_a_text_stage_refuses_rows_with_images(tmp_path):
    data = _jsonl(tmp_path / "pairs.jsonl", [
        {"instruction": "<image>which?", "chosen": "a", "rejected": "b", "images": ["x.png"]},
        {"instruction": "which?", "chosen": "a", "rejected": "b"},
    ])
    (spec,) = resolve_datasets(RunConfig(dataset=str(data), stage="rm"))  # dpo takes images: tests/test_vlm_dpo.py
    spec.ranking = True
    res = load_stage_file(spec, "rm")
    assert [(p.line, "stage rm trains text only" in p.message) for p in res.problems] == [(1, True)]
    assert len(res.samples) == 1


@pytest.mark.parametrize("row, expected", [
    (_sharegpt("<image>what?", ["cat.png"]), "no such image 'cat.png'"),
    (_sharegpt("<image>what?", ["ok.png"]), "template 'chatml' renders text only"),
])
def test_image_rows_are_refused_at_check_before_a_run_dir(tmp_path, capsys, row, expected):
    """``cockpit check`` and ``cockpit train`` exit 2 naming the row's file:line; no run dir."""
    _png(tmp_path / "ok.png")
    data = _jsonl(tmp_path / "d.jsonl", [_sharegpt("hi"), row])
    cfg = write_yaml(tmp_path / "c.yaml", {**TINY_CONFIG, "probes": None, "max_steps": 1, "dataset": str(data)})
    runs = tmp_path / "runs"
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2" in err and expected in err, err
    assert main(["train", str(cfg), "--runs-dir", str(runs), "--detach"]) == 2
    assert expected in capsys.readouterr().err
    assert not runs.exists() or not [p for p in runs.iterdir() if p.name != "queue"]
