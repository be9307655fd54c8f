"""A tiny LLaVA that trains (issue 63): the llava template's rows with their images expanded to image
tokens as LLaMA-Factory's LlavaPlugin does, pixel_values through the collator, the vision-language freeze
keys as LLaMA-Factory applies them, and `cockpit train` for 2 steps on rows with 1 and 2 images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import prepare_vlm, read_events, write_vlm_dataset, write_yaml
from PIL import Image

from cockpit.cli import main
from cockpit.config import validate
from cockpit.errors import InputError

IMAGE_SEQLEN = 16  # the fixture's 32x32 images in 8x8 patches, CLIP's class token dropped ("default")


def _data(tmp_path: Path) -> Path:
    """A sharegpt dataset in data/ (dataset_info.json, images under data/img/): rows with 1, 2 and no images."""
    rows = [
        {"messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}],
         "images": ["img/red.png"]},
        {"messages": [{"role": "user", "content": "<image> then <image>: which?"},
                      {"role": "assistant", "content": "blue, red"}], "images": ["img/blue.png", "img/red.png"]},
        {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "<image>And this?"}, {"role": "assistant", "content": "blue"}],
         "images": ["img/blue.png"]},
    ]
    return write_vlm_dataset(tmp_path, {"red": ((220, 30, 30), (40, 30)), "blue": ((30, 30, 220), (20, 50))}, rows)


def _raw(model_dir: Path, data: Path, **over) -> dict:
    return {"model_name_or_path": str(model_dir), "template": "llava", "dataset": "vlm", "dataset_dir": str(data),
            "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all", "cutoff_len": 96,
            "per_device_train_batch_size": 2, "max_steps": 2, "logging_steps": 1, "save_steps": 2,
            "learning_rate": 5e-3, "use_cpu": True, **over}


def _prepared(model_dir: Path, data: Path, **over):
    return prepare_vlm(_raw(model_dir, data, **over))


def test_llava_rows_become_image_tokens_as_llamafactory_expands_them(tiny_llava_dir, tmp_path):
    """Each <image> becomes 16 image tokens inside vicuna's slots (LLaMA-Factory's llava template), never in
    the loss (train_on_prompt too); a row whose image tokens cutoff_len would cut is refused by its line."""
    data = _data(tmp_path)
    prepared, tok = _prepared(tiny_llava_dir, data, train_on_prompt=True)
    image_id = tok.convert_tokens_to_ids("<image>")
    one, two, text, _ = prepared.rendered
    assert one.input_ids.count(image_id) == IMAGE_SEQLEN and two.input_ids.count(image_id) == 2 * IMAGE_SEQLEN
    assert image_id not in text.input_ids
    prompt = tok.decode(one.input_ids)
    assert prompt.startswith("A chat between a curious user") and f"USER: {'<image>' * IMAGE_SEQLEN}What colour? ASSISTANT:" in prompt
    for r in (one, two):
        assert all(label == -100 for t, label in zip(r.input_ids, r.labels) if t == image_id)
        assert any(label != -100 for label in r.labels)  # train_on_prompt: the text of the prompt trains
    assert [s.get("images", [{}])[0].get("size") for s in prepared.loaded.samples] == [[40, 30], [20, 50], None, [20, 50]]
    from cockpit.data.media import image_report

    assert image_report(prepared.loaded.samples) == {
        "rows": 3, "images": 4, "smallest": [20, 50], "largest": [40, 30],
        "tokens_per_image": {"min": IMAGE_SEQLEN, "p50": IMAGE_SEQLEN, "max": IMAGE_SEQLEN},
        "image_tokens_per_row": {"p50": IMAGE_SEQLEN, "max": 2 * IMAGE_SEQLEN}}
    with pytest.raises(InputError) as err:
        _prepared(tiny_llava_dir, data, cutoff_len=64)
    lines = {p.line for p in err.value.problems}
    assert lines == {2} and "cuts this row's image tokens" in str(err.value), err.value  # 2 images: 32 tokens
    with pytest.raises(InputError) as err:  # row 2's 32 image tokens alone reach cutoff_len 32
        _prepared(tiny_llava_dir, data, cutoff_len=32)
    why = {p.line: p.message for p in err.value.problems}
    assert sorted(why) == [1, 2, 4] and "its 32 image tokens (2 image(s) of 16 tokens) alone reach cutoff_len 32" in why[2]
    assert "cutoff_len 32 cuts this row's image tokens" in why[1], why


def test_images_need_a_vision_language_model(tiny_model_dir, tmp_path, capsys):
    """A text model: rows with images are refused by the model's name, and so is each VLM key set."""
    data = _data(tmp_path)
    with pytest.raises(InputError, match="is a text model; images train with a vision-language model"):
        _prepared(tiny_model_dir, data)
    cfg = write_yaml(tmp_path / "c.yaml", _raw(tiny_model_dir, tmp_path / "data", dataset="vlm",
                                               freeze_vision_tower=False))
    assert main(["check", str(cfg)]) == 2
    assert "freeze_vision_tower: a vision-language model's key, and model type 'llama' is a text model" in capsys.readouterr().err


def _trainable(model_dir: Path, data: Path, **over) -> set[str]:
    """Which parts train: vision_tower / multi_modal_projector / language_model, and whether by LoRA."""
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model

    cfg = validate(_raw(model_dir, data, **over))
    model = build_model(cfg, resolve_model(str(model_dir), log=lambda *_: None), True, 0)
    parts = set()
    for name, p in model.named_parameters():
        if p.requires_grad:
            part = next((k for k in ("vision_tower", "multi_modal_projector", "language_model", "lm_head") if k in name), name)
            parts.add(part + (" lora" if "lora_" in name else ""))
    return parts


def test_freeze_keys_choose_the_parts_that_train(tiny_llava_dir, tmp_path):
    """LLaMA-Factory's defaults (tower and projector frozen; LoRA on the language model) and each key's effect."""
    data = _data(tmp_path)
    assert _trainable(tiny_llava_dir, data) == {"language_model lora"}
    assert _trainable(tiny_llava_dir, data, freeze_vision_tower=False) == {"language_model lora", "vision_tower lora"}
    # full: the tied lm_head is the language model's embedding (one parameter, named there)
    assert _trainable(tiny_llava_dir, data, finetuning_type="full") == {"language_model"}
    assert _trainable(tiny_llava_dir, data, finetuning_type="full", freeze_multi_modal_projector=False) == {
        "language_model", "multi_modal_projector"}
    assert _trainable(tiny_llava_dir, data, finetuning_type="full", freeze_vision_tower=False,
                      freeze_language_model=True) == {"vision_tower"}
    assert _trainable(tiny_llava_dir, data, finetuning_type="full", train_mm_proj_only=True) == {"multi_modal_projector"}
    from transformers import AutoConfig

    from cockpit.models.vlm import model_problems

    llava = AutoConfig.from_pretrained(tiny_llava_dir)  # keys without an effect: refused (check, then the rank)
    for over, key in (({"train_mm_proj_only": True}, "train_mm_proj_only"),
                      ({"freeze_multi_modal_projector": False}, "freeze_multi_modal_projector"),
                      ({"finetuning_type": "freeze"}, "finetuning_type"),
                      ({"nproc_per_node": 2, "stage": "pt"}, "nproc_per_node"),  # sft and dpo train on several ranks
                      ({"do_predict": True, "predict_with_generate": True, "val_size": 1, "nproc_per_node": 2}, "do_predict")):
        assert [k for k, _ in model_problems(validate(_raw(tiny_llava_dir, data, **over)), llava)] == [key], over
    assert model_problems(validate(_raw(tiny_llava_dir, data)), llava) == []


def test_the_collator_feeds_each_rows_images_as_pixel_values(tiny_llava_dir, tmp_path):
    """Rows of 1 and 2 images: 3 images' pixel_values in the rows' order; image_max_pixels / image_min_pixels
    resize before the processor (LLaMA-Factory's _preprocess_image), so they change the pixels."""
    from cockpit.data.packing import build_collator
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model
    from cockpit.train.vlm import with_images

    data = _data(tmp_path)
    prepared, tok = _prepared(tiny_llava_dir, data)
    rows = prepared.rows()[:2]  # the trainer's rows (SFT's and eval_dataset's): 1 image, then 2
    assert [len(r.get("images", [])) for r in prepared.rows()] == [1, 2, 0, 1]
    cfg = validate(_raw(tiny_llava_dir, data, packing=False))
    model = build_model(cfg, resolve_model(str(tiny_llava_dir), log=lambda *_: None), True, 0)  # LoRA-wrapped
    batch = with_images(build_collator(cfg, tok, model), cfg, model)(rows)
    assert tuple(batch["pixel_values"].shape) == (3, 3, 32, 32)
    assert batch["pixel_values"][0][0].mean() > batch["pixel_values"][1][0].mean()  # red channel: red first, then blue
    assert model(**batch).loss.isfinite()  # 48 image tokens, 3 images' features: LLaVA checks they match
    for key, value in (("image_max_pixels", 64), ("image_min_pixels", 64 * 64)):
        other = with_images(build_collator(cfg, tok, model), validate(_raw(tiny_llava_dir, data, **{key: value})), model)
        assert not other(rows)["pixel_values"].equal(batch["pixel_values"]), key


@pytest.mark.slow
@pytest.mark.budget(120, reason="trains 2 steps, exports and reloads the merged LLaVA, then chats (one worker start)")
def test_a_tiny_llava_trains_two_steps_on_rows_with_images(tiny_llava_dir, tmp_path, capsys, monkeypatch):
    """`cockpit check` passes and `cockpit train` runs 2 steps on rows with 1 and 2 images (the loss in the events);
    `cockpit export --merge` writes a folder that AutoModelForImageTextToText / AutoProcessor load and that answers;
    `cockpit chat RUN --image PATH` answers about an image."""
    monkeypatch.chdir(tmp_path)
    _data(tmp_path)
    probes = {"probes": "@demo/identity_probes.jsonl", "probe_max_new_tokens": 2}  # text probes: the LM answers
    cfg = write_yaml(tmp_path / "c.yaml", _raw(tiny_llava_dir, Path("data"), **probes))
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "template: llava" in out and "samples: 4" in out, out
    assert "images: 4 in 3 rows, 20x50 to 40x30 px; 16 image tokens each; per row p50 16 max 32" in out, out
    assert "batches: packing auto: llava cannot attend per sample in a packed row; padded batches" in out, out
    runs = tmp_path / "runs"
    assert main(["train", str(cfg), "--runs-dir", str(runs)]) == 0
    (run,) = [p for p in runs.iterdir() if p.name != "queue"]
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] > 0 for e in steps), steps
    assert {e["phase"] for e in read_events(run) if e["kind"] == "probe_results"} == {"before", "after"}
    log = (run / "logs" / "rank0.log").read_text()
    assert "padded batches" in log and "adapting model.language_model.layers.0" in log and "vision_tower" not in log
    # export --merge: the merged LLaVA and its processor load with the Auto classes and answer about an image
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "merged"
    assert main(["export", run.name, "--runs-dir", str(runs), "--merge", "--out", str(out)]) == 0
    model, processor = AutoModelForImageTextToText.from_pretrained(out), AutoProcessor.from_pretrained(out)
    inputs = processor(text="USER: <image>What colour? ASSISTANT:", images=[Image.open("data/img/red.png")], return_tensors="pt")
    assert inputs["input_ids"][0].tolist().count(model.config.image_token_index) == IMAGE_SEQLEN
    with torch.no_grad():
        answer = model.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert answer.shape[1] == inputs["input_ids"].shape[1] + 2
    _chat_answers_about_an_image(run, runs, capsys)


def _chat_answers_about_an_image(run: Path, runs: Path, capsys) -> None:
    """`cockpit chat RUN --image PATH`: base and tuned answer a prompt given without <image> (put before its
    text: 16 image tokens in the prompt); the worker's inputs carry the image's pixels (two images, two logits)."""
    import torch

    argv = ["chat", run.name, "--runs-dir", str(runs), "--device", "cpu", "--max-new-tokens", "3", "--json"]
    capsys.readouterr()
    assert main([*argv, "--image", "data/img/red.png", "--prompt", "What colour?"]) == 0
    (res,) = json.loads(capsys.readouterr().out)["results"]
    assert res["images"] == [str(Path("data/img/red.png").resolve())] and "error" not in res, res
    assert len(res["base_token_ids"]) == len(res["tuned_token_ids"]) == 3, res
    from cockpit.serve.artifacts import load_run
    from cockpit.serve.chat_worker import Generator, with_images
    from cockpit.store.rundir import RunDir

    gen = Generator(load_run(RunDir(run)))
    asked = [{"role": "user", "content": "<image>What colour?"}]
    assert with_images(gen, [{"role": "user", "content": "What colour?"}], res["images"]) == asked
    ids = gen.prompt_ids(asked, res["images"])  # the prompt the worker answered: its 16 image tokens
    assert len(ids) == res["base_prompt_tokens"] and ids.count(gen.model.config.image_token_index) == IMAGE_SEQLEN
    logits = []
    for image in ("data/img/red.png", "data/img/blue.png"):
        inputs = gen.inputs(with_images(gen, asked, [image]), [image])
        assert tuple(inputs["pixel_values"].shape) == (1, 3, 32, 32)
        with torch.no_grad():
            logits.append(gen.model(**inputs).logits[0, -1])
    assert not torch.allclose(logits[0], logits[1]), "the image did not reach the model"
    with pytest.raises(ValueError, match="1 <image> placeholder"):
        with_images(gen, asked, [])  # a VLM's <image> with no image: refused, not sent without pixels


def test_the_planner_counts_the_vision_tower_and_projector(tiny_llava_dir, tmp_path):
    """cockpit plan on a LLaVA: the vision tower's and the projector's parameters in the weights (as the real
    model has them), and full fine-tuning's trainable parameters leave out the parts the freeze keys freeze."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from cockpit.plan import estimate_config

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tiny_llava_dir))
    size = {part: sum(p.numel() for n, p in model.named_parameters() if part in n)
            for part in ("vision_tower", "multi_modal_projector")}
    total = sum(p.numel() for p in model.parameters())
    data = _data(tmp_path)

    def planned(**over):
        _, est, _ = estimate_config(_raw(tiny_llava_dir, data, **over))
        return est.params

    run, est, _ = estimate_config(_raw(tiny_llava_dir, data))
    lora = est.params
    assert lora["total"] == total and lora["trainable"] == lora["lora"] > 0
    # as the rank trains it: padded batches and the full logits (LLaVA's head is not a plain lm_head)
    assert not run.packing and not any("chunked loss" in t.formula for t in est.terms if t.name == "logits / loss")
    assert any(n.startswith("vision-language model: vision tower 0.02M + projector 0.01M") for n in est.notes)
    assert planned(finetuning_type="full")["trainable"] == total - size["vision_tower"] - size["multi_modal_projector"]
    assert planned(finetuning_type="full", train_mm_proj_only=True)["trainable"] == size["multi_modal_projector"]
    assert planned(finetuning_type="full", freeze_vision_tower=False, freeze_multi_modal_projector=False)["trainable"] == total


def test_a_llava_trains_on_padded_batches(tiny_llava_dir, tmp_path):
    """packing auto falls back to padded batches for a LLaVA, FlashAttention or not (its image features go to
    their tokens row by row); packing: true is refused by name."""
    from transformers import AutoConfig

    from cockpit.data.packing import resolve_for_model
    from cockpit.data.padding import padding_free

    llava = AutoConfig.from_pretrained(tiny_llava_dir)
    cfg = validate(_raw(tiny_llava_dir, _data(tmp_path)))
    for asked in (cfg, cfg.replace(flash_attn="fa2")):
        said: list[str] = []
        assert padding_free(asked) and not padding_free(resolve_for_model(asked, llava, said.append))
        assert said == ["packing auto: llava cannot attend per sample in a packed row; padded batches"], said
    with pytest.raises(InputError, match="packing: llava: a vision-language model trains on padded batches"):
        resolve_for_model(cfg.replace(packing=True), llava)


def test_cockpit_tune_refuses_a_dataset_with_images(tiny_llava_dir, tmp_path, capsys):
    """Its trial rows would carry no images (the vision tower unmeasured): refused by name, not measured wrong."""
    cfg = write_yaml(tmp_path / "c.yaml", _raw(tiny_llava_dir, _data(tmp_path)))
    assert main(["tune", str(cfg), "--candidates", "1", "--steps", "2"]) == 2
    assert "cockpit tune on a dataset with images: not built yet" in capsys.readouterr().err
