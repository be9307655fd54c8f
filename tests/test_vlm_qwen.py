"""Qwen2-VL and Qwen2.5-VL (template qwen2_vl) as LLaMA-Factory 0.9.5 trains them (issue 63): each image
becomes <|vision_start|> + <|image_pad|> x (grid_t*grid_h*grid_w // merge_size^2) + <|vision_end|>, its count
by its size (Qwen2VLPlugin's own resizes, then the image processor's smart_resize); the batch carries
pixel_values, image_grid_thw and mm_token_type_ids; LoRA leaves the frozen tower and the merger out."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import prepare_vlm, read_events, write_vlm_dataset, write_yaml
from PIL import Image

from cockpit.cli import main
from cockpit.config import validate
from cockpit.errors import InputError

# 40x30: 28x28 after smart_resize (1 token); 90x50: 84x56 (6); 20x50: 28x50 after the plugin's 28-px floor,
# then 28x56 (2): the fixture's image processor keeps 28x28 to 56x84 pixels, 14-px patches merged 2x2
SIZES = {"a": (40, 30), "b": (90, 50), "c": (20, 50)}
TOKENS = {"a": 1, "b": 6, "c": 2}


def _data(tmp_path: Path) -> Path:
    """data/: a row with 1 image, a row with 2 of different sizes, a text row."""
    colours = dict(zip(SIZES, ((220, 30, 30), (30, 30, 220), (30, 200, 30))))
    rows = [
        {"messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}],
         "images": ["img/a.png"]},
        {"messages": [{"role": "user", "content": "<image> then <image>: which?"},
                      {"role": "assistant", "content": "blue, green"}], "images": ["img/b.png", "img/c.png"]},
        {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]},
    ]
    return write_vlm_dataset(tmp_path, {n: (colours[n], size) for n, size in SIZES.items()}, rows)


def _raw(model_dir: Path, data: Path, **over) -> dict:
    return {"model_name_or_path": str(model_dir), "template": "qwen2_vl", "dataset": "vlm", "dataset_dir": str(data),
            "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all", "cutoff_len": 96,
            "per_device_train_batch_size": 3, "max_steps": 2, "logging_steps": 1, "save_steps": 2,
            "learning_rate": 5e-3, "use_cpu": True, "probes": None, **over}


def _prepared(model_dir: Path, data: Path, **over):
    return prepare_vlm(_raw(model_dir, data, **over))


def _grid_tokens(model_dir: Path, data: Path, names: str) -> list[int]:
    """The oracle: the image processor's own image_grid_thw for the images as the plugin regularises them."""
    from transformers import AutoImageProcessor

    from cockpit.data.mm_plugins import PLUGINS, regularized

    images = [regularized(PLUGINS["qwen2_vl"], str(data / "img" / f"{n}.png"), 768 * 768, 32 * 32) for n in names]
    grids = AutoImageProcessor.from_pretrained(str(model_dir), backend="pil")(images, return_tensors="pt")["image_grid_thw"]
    return [int(g.prod()) // 4 for g in grids]  # merge_size 2


def test_qwen2_vl_rows_become_image_tokens_by_image_size(tiny_qwen2_vl_dir, tmp_path):
    """Rows of 1 and 2 images (different sizes): each <image> becomes <|vision_start|>, its own count of
    <|image_pad|> (the image processor's grid // 4) and <|vision_end|>, in the qwen2_vl template's slots; the
    image tokens stay out of the loss (train_on_prompt too); cutoff_len refuses a row whose image tokens it cuts."""
    from cockpit.data.media import image_report

    data = _data(tmp_path)
    assert _grid_tokens(tiny_qwen2_vl_dir, data, "abc") == [TOKENS[n] for n in "abc"]
    prepared, tok = _prepared(tiny_qwen2_vl_dir, data, train_on_prompt=True)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    one, two, text = prepared.rendered
    wrap = "<|vision_start|>{}<|vision_end|>".format
    assert tok.decode(one.input_ids) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        f"{wrap('<|image_pad|>' * TOKENS['a'])}What colour?<|im_end|>\n<|im_start|>assistant\nred<|im_end|>\n")
    assert f"user\n{wrap('<|image_pad|>' * 6)} then {wrap('<|image_pad|>' * 2)}: which?" in tok.decode(two.input_ids)
    assert pad not in text.input_ids
    for r in (one, two):
        assert all(label == -100 for t, label in zip(r.input_ids, r.labels) if t == pad)
        assert any(label != -100 for label in r.labels)
    assert image_report(prepared.loaded.samples)["tokens_per_image"] == {"min": 1, "p50": 2, "max": 6}
    assert [len(r.get("images", [])) for r in prepared.rows()] == [1, 2, 0]
    # the public path for one row (what LLaMA-Factory's fixtures compare against): the same ids and labels
    from cockpit.data.prepare import image_plan, render_images, render_options

    cfg = validate(_raw(tiny_qwen2_vl_dir, data, train_on_prompt=True))
    sample = prepared.loaded.samples[1]
    alone, why = render_images(tok, image_plan(cfg, [sample]), sample, 96, render_options(cfg))
    assert why is None and (alone.input_ids, alone.labels) == (two.input_ids, two.labels)
    with pytest.raises(InputError) as err:  # row 2: 8 image tokens + 4 wrapping, cut at 30
        _prepared(tiny_qwen2_vl_dir, data, cutoff_len=30)
    why = {p.line: p.message for p in err.value.problems}
    assert sorted(why) == [2] and "cutoff_len 30 cuts this row's image tokens" in why[2], why
    assert "(2 image(s) of 6+2 tokens)" in why[2], why


def test_check_reports_each_images_token_count(tiny_qwen2_vl_dir, tmp_path, capsys):
    """`cockpit check` on a qwen2_vl config: image tokens per image vary by size (min / p50 / max)."""
    cfg = write_yaml(tmp_path / "c.yaml", _raw(tiny_qwen2_vl_dir, _data(tmp_path)))
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "template: qwen2_vl" in out and "samples: 3" in out, out
    line = "images: 3 in 2 rows, 20x50 to 90x50 px; image tokens per image min 1 p50 2 max 6; per row p50 8 max 8"
    assert line in out, out


def test_the_batch_feeds_qwen2_vl_its_images_forward_and_backward(tiny_qwen2_vl_dir, tmp_path):
    """The collator's batch (pixel_values, image_grid_thw, mm_token_type_ids) through the LoRA-wrapped tiny
    Qwen2-VL: a finite loss whose gradient reaches the adapters and none of the frozen tower; the images
    change the loss. LoRA ``all`` adapts the language model only (LLaMA-Factory: tower frozen, merger never)."""
    import torch

    from cockpit.data.packing import build_collator
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model
    from cockpit.train.vlm import with_images

    data = _data(tmp_path)
    prepared, tok = _prepared(tiny_qwen2_vl_dir, data)
    cfg = validate(_raw(tiny_qwen2_vl_dir, data))
    model = build_model(cfg, resolve_model(str(tiny_qwen2_vl_dir), log=lambda *_: None), True, 0)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and ".language_model." in n for n in trainable), sorted(trainable)[:4]
    batch = with_images(build_collator(cfg, tok, model), cfg, model)(prepared.rows())
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 6], [1, 4, 2]]
    assert tuple(batch["pixel_values"].shape) == (4 + 24 + 8, 3 * 2 * 14 * 14)
    assert batch["mm_token_type_ids"].sum().item() == sum(TOKENS.values())
    out = model(**batch)
    out.loss.backward()
    assert out.loss.isfinite()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)
    assert all(p.grad is None for n, p in model.named_parameters() if ".visual." in n)
    with torch.no_grad():  # other pixels, another loss: the images reach the language model
        flipped = {**batch, "pixel_values": batch["pixel_values"].flip(0)}
        assert not torch.isclose(model(**flipped).loss, out.loss)


@pytest.mark.slow
def test_tiny_qwen2_vl_and_qwen2_5_vl_train_two_steps(tiny_qwen2_vl_dir, tiny_qwen2_5_vl_dir, tmp_path, monkeypatch):
    """`cockpit train` 2 steps on rows with 1 and 2 images: Qwen2-VL with LoRA (the adapter changes, none on the
    tower or the merger), Qwen2.5-VL in full (the language model changes, the frozen tower and merger do not)."""
    import torch
    from safetensors.torch import load_file

    monkeypatch.chdir(tmp_path)
    _data(tmp_path)
    for model_dir, over in ((tiny_qwen2_vl_dir, {}), (tiny_qwen2_5_vl_dir, {"finetuning_type": "full"})):
        runs = tmp_path / f"runs-{model_dir.name}"
        assert main(["train", str(write_yaml(tmp_path / "c.yaml", _raw(model_dir, Path("data"), **over))), "--runs-dir",
                     str(runs)]) == 0
        (run,) = [p for p in runs.iterdir() if p.name != "queue"]
        steps = [e for e in read_events(run) if e["kind"] == "step"]
        assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] > 0 for e in steps), steps
        saved = {k: v for f in (run / "adapter").glob("*.safetensors") for k, v in load_file(str(f)).items()}
        if not over:  # LoRA: lora_B starts at zero, so a trained adapter has moved it
            assert saved and all(".language_model." in k for k in saved), sorted(saved)[:4]
            assert any(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k)
            _exported_answers(run, runs, tmp_path / "merged")
            continue
        # full: saved as the base was (the checkpoint's own names: model.* the language model, visual.* the tower)
        base = {k: v for f in model_dir.glob("*.safetensors") for k, v in load_file(str(f)).items()}
        assert saved.keys() == base.keys()
        changed = {k for k in base if not torch.equal(base[k], saved[k].to(base[k].dtype))}
        assert changed and all(k.startswith("model.") for k in changed), sorted(changed)[:4]
        assert any(k.startswith("visual.merger.") for k in base) and not any("visual." in k for k in changed)


def _exported_answers(run: Path, runs: Path, out: Path) -> None:
    """`cockpit export --merge`: the merged Qwen2-VL, its image processor (the base's files, copied: the Qwen-VL
    processor does not load here) and the run's tokenizer load with the Auto classes and answer about an image."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    assert main(["export", run.name, "--runs-dir", str(runs), "--merge", "--out", str(out)]) == 0
    model, tok = AutoModelForImageTextToText.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    pixels = AutoImageProcessor.from_pretrained(out, backend="pil")([Image.open("data/img/b.png")], return_tensors="pt")
    image = "<|vision_start|>" + "<|image_pad|>" * TOKENS["b"] + "<|vision_end|>"
    ids = tok(f"<|im_start|>user\n{image}What colour?<|im_end|>\n<|im_start|>assistant\n", return_tensors="pt").input_ids
    marks = (ids == model.config.image_token_id).long()
    with torch.no_grad():
        answer = model.generate(input_ids=ids, mm_token_type_ids=marks, max_new_tokens=2, do_sample=False, **pixels)
    assert answer.shape[1] == ids.shape[1] + 2


def test_the_freeze_keys_and_lora_targets_name_qwens_parts(tiny_qwen2_5_vl_dir, tmp_path):
    """LLaMA-Factory's qwen2_5_vl registration on transformers 5's names: LoRA ``all`` adapts the language model
    only; with the tower unfrozen, its blocks too, never the merger (projector) nor patch_embed (a LoRA conflict);
    full fine-tuning's train_mm_proj_only trains model.visual.merger alone."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from cockpit.models.vlm import composite_of, lora_targets
    from cockpit.train.vlm import freeze_parts

    config = AutoConfig.from_pretrained(tiny_qwen2_5_vl_dir)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    parts, data = composite_of(config), _data(tmp_path)
    modules = [(n, isinstance(m, torch.nn.Linear)) for n, m in model.named_modules() if n]

    def adapted(**over) -> set[str]:
        names = lora_targets(validate(_raw(tiny_qwen2_5_vl_dir, data, **over)), parts, modules)
        return {".".join(n.split(".")[:3]) for n in names}

    assert adapted() == {"model.language_model.layers"}
    assert adapted(freeze_vision_tower=False) == {"model.language_model.layers", "model.visual.blocks"}
    freeze_parts(model, validate(_raw(tiny_qwen2_5_vl_dir, data, finetuning_type="full", train_mm_proj_only=True)), parts)
    assert {".".join(n.split(".")[:3]) for n, p in model.named_parameters() if p.requires_grad} == {"model.visual.merger"}


def test_the_planner_counts_qwens_tower_and_merger(tiny_qwen2_vl_dir, tmp_path):
    """cockpit plan on a Qwen2-VL: the tower (model.visual.patch_embed / blocks) and the merger (the projector),
    counted on the meta-built model by LLaMA-Factory's keys, are in the weights; full fine-tuning leaves them out
    of the trainable parameters (frozen by default), train_mm_proj_only trains the merger alone."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from cockpit.plan import estimate_config

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tiny_qwen2_vl_dir))
    size = {part: sum(p.numel() for n, p in model.named_parameters() if part in n) for part in ("visual.", "visual.merger")}
    data = _data(tmp_path)

    def planned(**over):
        return estimate_config(_raw(tiny_qwen2_vl_dir, data, finetuning_type="full", **over))[1].params

    full = planned()
    assert full["total"] - full["trainable"] == size["visual."] > 0
    assert planned(train_mm_proj_only=True)["trainable"] == size["visual.merger"] > 0
