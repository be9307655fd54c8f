"""The vision-language demo (issue 63): image probes (the probes file's ``image``, answered by the ranks with
the image through the model's processor), the demo's generated shapes, the embedded VLM built from the
embedded model's real weights, and ``presets/cpu-vlm-demo.yaml`` end to end: held-out images named after
training, the language model's control probes kept."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, TINY_CONFIG, cockpit, write_yaml
from PIL import Image

from cockpit.cli import main
from cockpit.data.probes import load_probes
from cockpit.errors import InputError

DEMO = ROOT / "cockpit" / "demo_data"


def _probes_file(folder: Path, rows: list[dict]) -> Path:
    path = folder / "probes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_image_probe_names_its_image_and_bad_images_are_refused_by_line(tmp_path):
    """``image`` is relative to the probes file; the probe gets its file name, size and absolute path (the
    fields the Summary shows); a missing, undecodable or non-path image is refused by file, line and key."""
    (tmp_path / "img").mkdir()
    Image.new("RGB", (40, 24), (200, 10, 10)).save(tmp_path / "img" / "red.png")
    (tmp_path / "img" / "broken.png").write_bytes(b"\x89PNG not really")
    good = {"prompt": "<image>What colour?", "expect": "red", "set": "image", "image": "img/red.png"}
    text = {"prompt": "What is 2 + 2?", "expect": "4", "set": "control"}
    probes = load_probes(_probes_file(tmp_path, [good, text]))
    assert probes[0] == {
        "prompt": "<image>What colour?",
        "expect": ["red"],
        "set": "image",
        "image": "red.png",
        "image_size": [40, 24],
        "image_path": str((tmp_path / "img" / "red.png").resolve()),
    }
    assert probes[1] == {"prompt": "What is 2 + 2?", "expect": ["4"], "set": "control"}
    bad = [{**good, "image": "img/missing.png"}, {**good, "image": "img/broken.png"}, {**good, "image": 3}, text]
    path = _probes_file(tmp_path, bad)
    with pytest.raises(InputError) as err:
        load_probes(path)
    why = {p.line: p.message for p in err.value.problems}
    assert sorted(why) == [1, 2, 3] and {p.file for p in err.value.problems} == {str(path)}
    assert {p.key for p in err.value.problems} == {"image"}
    assert why[1].startswith("no such image 'img/missing.png'"), why
    assert why[2].startswith("cannot decode image 'img/broken.png'"), why
    assert "must be a path to an image file" in why[3], why


def test_check_refuses_image_probes_for_a_text_model(tmp_path, capsys):
    """A probes file with an image probe, for a text model: refused at check by key (the ranks would refuse it
    only after loading the model); the same file's text probes alone pass."""
    Image.new("RGB", (32, 32), (200, 10, 10)).save(tmp_path / "red.png")
    text = {"prompt": "Say hi", "expect": "hi"}
    probes = _probes_file(tmp_path, [{"prompt": "<image>What colour?", "expect": "red", "image": "red.png"}, text])
    cfg = write_yaml(tmp_path / "c.yaml", {**TINY_CONFIG, "probes": str(probes), "max_steps": 1})
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "probes" in err and "1 image probe(s)" in err and "'llama' is a text model" in err, err
    _probes_file(tmp_path, [text])
    assert main(["check", str(cfg)]) == 0, capsys.readouterr().err


def test_the_rank_answers_an_image_probe_with_its_image(tiny_llava_dir, tiny_model_dir, tmp_path):
    """A LLaVA answers a batch of image and text probes (the image tokens and pixel_values through its processor);
    each image probe's result keeps image, image_size and image_path. A text model is refused by name."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from cockpit.data.render import apply_template_choice
    from cockpit.train.probes import probes_of, run_probes

    for name, colour in (("red", (220, 20, 20)), ("blue", (20, 20, 220))):
        Image.new("RGB", (32, 32), colour).save(tmp_path / f"{name}.png")
    rows = [
        {"prompt": "<image>What colour?", "expect": "red", "set": "image", "image": "red.png"},
        {"prompt": "Say hi", "expect": "hi", "set": "control"},
        {"prompt": "<image>What colour?", "expect": "blue", "set": "image", "image": "blue.png"},
    ]
    probes = load_probes(_probes_file(tmp_path, rows))
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(tiny_llava_dir)
    tok = AutoTokenizer.from_pretrained(tiny_llava_dir)
    apply_template_choice(tok, "llava")  # the run's template, as the rank's tokenizer has it
    seen: list[dict] = []
    towered: list = []
    model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(kwargs) and None, with_kwargs=True)
    model.model.vision_tower.register_forward_pre_hook(lambda _m, args: towered.append(args[0]) and None)
    result = run_probes(model, tok, probes, max_new_tokens=3, batch_size=8)
    red, text, blue = result["results"]
    assert (red["image"], red["image_size"], red["image_path"]) == ("red.png", [32, 32], str(tmp_path / "red.png"))
    assert blue["image"] == "blue.png" and not {"image", "image_size", "image_path"} & set(text)
    counts = (seen[0]["input_ids"] == model.config.image_token_index).sum(dim=1).tolist()
    assert counts == [16, 0, 16], counts  # the batch's prefill: each image probe's 16 image tokens
    (pixels,) = towered  # the two images, once, red first
    assert tuple(pixels.shape) == (2, 3, 32, 32) and pixels[0].mean() > pixels[1].mean()
    assert result["total"] == 3 and set(result["sets"]) == {"image", "control"}
    # the run's image_max_pixels reaches the probes as it reaches the rows (probes_of): a two-colour image
    # shrunk to 4x4 first comes to the tower blurred across its edge
    half = Image.new("RGB", (32, 32), (220, 20, 20))
    half.paste((20, 20, 220), (0, 0, 16, 32))
    half.save(tmp_path / "red.png")
    run_cfg = SimpleNamespace(probes=str(_probes_file(tmp_path, rows[:1])), image_max_pixels=16, image_min_pixels=1)
    bounded = probes_of(run_cfg)
    assert bounded[0]["image_pixels"] == (16, 1)
    towered.clear()
    run_probes(model, tok, load_probes(run_cfg.probes), max_new_tokens=1)
    run_probes(model, tok, bounded, max_new_tokens=1)
    as_given, shrunk = towered
    assert not torch.allclose(as_given, shrunk, atol=1e-3)
    text_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(InputError, match="image probes need a vision-language model; 'llama' is a text model"):
        run_probes(text_model, AutoTokenizer.from_pretrained(tiny_model_dir), probes, max_new_tokens=1)


def test_the_demo_shapes_are_what_the_generator_writes(tmp_path):
    """The committed demo data is the seeded generator's output (rows, probes, and every image's pixels); the
    held-out probe images are none of the training images."""
    from cockpit.data.shapes_demo import DATA_FILE, PROBES_FILE, write

    written = write(tmp_path)
    for file in (DATA_FILE, PROBES_FILE):
        assert (tmp_path / file).read_text() == (DEMO / file).read_text(), file
    pngs = [p.relative_to(tmp_path) for p in written if p.suffix == ".png"]
    assert len(pngs) == 1080 + 18
    for rel in pngs:
        assert Image.open(tmp_path / rel).tobytes() == Image.open(DEMO / rel).tobytes(), rel
    train = {Image.open(DEMO / r).tobytes() for r in pngs if r.parts[1] == "train"}
    assert not any(Image.open(DEMO / r).tobytes() in train for r in pngs if r.parts[1] == "probe")
    probes = load_probes(DEMO / PROBES_FILE)
    assert sum(p.get("set") == "image" for p in probes) == 18 and sum(p.get("set") == "control" for p in probes) >= 4


@pytest.mark.budget(300, reason="the VLM demo preset on the embedded 135M model: learning to see is what it asserts")
@pytest.mark.slow
def test_cpu_vlm_demo_preset_learns_to_name_held_out_shapes(tmp_path, embedded_dir):
    """`cockpit train presets/cpu-vlm-demo.yaml`: the held-out image probes go from chance to at least 90 % right,
    the text control probes answer as before."""
    runs = tmp_path / "runs"
    res = cockpit("train", str(ROOT / "presets" / "cpu-vlm-demo.yaml"), "--runs-dir", str(runs), timeout=1500)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in runs.iterdir() if d.is_dir())
    summary = json.loads((run / "summary.json").read_text())
    print(
        json.dumps(
            {k: summary[k] for k in ("train_runtime_s", "first_loss", "last_loss", "probes_before", "probes_after")}
        )
    )
    assert summary["state"] == "finished"
    before, after = summary["probes_before"]["sets"], summary["probes_after"]["sets"]
    assert before["image"]["total"] == after["image"]["total"] == 18
    assert before["image"]["rate"] <= 2 / 9  # chance: 1 in 9 colour-and-shape pairs
    assert after["image"]["rate"] >= 0.9
    assert before["control"]["passed"] == before["control"]["total"] == after["control"]["passed"] >= 3
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    (answered,) = [e for e in events if e["kind"] == "probe_results" and e["phase"] == "after"]
    shown = [r for r in answered["results"] if r.get("set") == "image"]
    assert all(r["image_size"] == [32, 32] and Path(r["image_path"]).name == r["image"] for r in shown)


def test_a_demo_datasets_images_are_looked_up_in_the_demo_folder(tmp_path):
    """cockpit_shapes names its images relative to cockpit/demo_data, whatever dataset_dir is (a data folder of
    the user's that does not list it); media_dir still wins when set."""
    from cockpit.config.run_config import RunConfig
    from cockpit.data.dataset_info import resolve_datasets

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "mine.jsonl"}}))
    (spec,) = resolve_datasets(RunConfig(dataset="cockpit_shapes", dataset_dir=str(tmp_path / "data")))
    assert spec.media_dir == DEMO and (spec.media_dir / "shapes" / "probe" / "00-red-circle.png").is_file()
    (spec,) = resolve_datasets(
        RunConfig(dataset="cockpit_shapes", dataset_dir=str(tmp_path / "data"), media_dir=str(tmp_path))
    )
    assert spec.media_dir == tmp_path
