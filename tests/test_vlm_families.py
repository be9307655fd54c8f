"""Qwen3-VL and Gemma 3 as LLaMA-Factory 0.9.5 trains them (issue 63): the tiny fixtures' models take a row's
image tokens and pixels as each family's plugin lays them out, and learn from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from PIL import Image


def _forward_backward(model_dir: Path, extra) -> float:
    """One forward + backward of the saved model on a chat with one image, laid out as the family's plugin
    lays it out (``extra``: the family's model inputs beside input_ids and pixel_values)."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(str(model_dir))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    pixels = AutoImageProcessor.from_pretrained(str(model_dir))([Image.new("RGB", (64, 48), (200, 30, 30))],
                                                                 return_tensors="pt")  # fmt: skip
    text, inputs = extra(model, pixels)
    ids = tok(text, return_tensors="pt").input_ids
    out = model(input_ids=ids, labels=ids, pixel_values=pixels["pixel_values"], **inputs(ids))
    out.loss.backward()
    grads: dict[str, bool] = {}
    for name, param in model.named_parameters():
        part = name.split(".")[1]
        grads[part] = grads.get(part, False) or (param.grad is not None and bool(torch.any(param.grad != 0)))
    assert all(grads.values()), grads  # the image reached the loss: each part has weights with gradients
    return float(out.loss.detach())


@pytest.mark.slow  # the two fixtures take ~20 s to build
def test_the_tiny_qwen3_vl_and_gemma3_take_images_forward_and_backward(tiny_qwen3_vl_dir, tiny_gemma3_dir):
    def qwen3_vl(model, pixels):
        grid = pixels["image_grid_thw"]
        n = int(grid.prod()) // model.config.vision_config.spatial_merge_size**2
        text = f"<|im_start|>user\n<|vision_start|>{'<|image_pad|>' * n}<|vision_end|>What?<|im_end|>\n"
        return text, lambda ids: {"image_grid_thw": grid,
                                  "mm_token_type_ids": (ids == model.config.image_token_id).long()}  # fmt: skip

    def gemma3(model, pixels):
        image = "<image_soft_token>" * model.config.mm_tokens_per_image
        text = f"<start_of_turn>user\n\n\n<start_of_image>{image}<end_of_image>\n\nWhat?<end_of_turn>\n"
        return text, lambda ids: {"token_type_ids": (ids == model.config.image_token_id).long()}

    assert _forward_backward(tiny_qwen3_vl_dir, qwen3_vl) > 0
    assert _forward_backward(tiny_gemma3_dir, gemma3) > 0


def _data(tmp_path: Path) -> Path:
    """A sharegpt dataset (dataset_info.json, images under data/img/): rows with 1 image, 2 images, none."""
    import json

    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    for name, colour, size in (("red", (220, 30, 30), (40, 30)), ("blue", (30, 30, 220), (20, 50))):
        noise = Image.effect_noise(size, 60).convert("RGB")
        Image.blend(Image.new("RGB", size, colour), noise, 0.3).save(data / "img" / f"{name}.png")
    rows = [
        {"messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}],
         "images": ["img/red.png"]},
        {"messages": [{"role": "user", "content": "<image> then <image>: which?"},
                      {"role": "assistant", "content": "blue, red"}], "images": ["img/blue.png", "img/red.png"]},
        {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]},
    ]  # fmt: skip
    (data / "vlm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"file_name": "vlm.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}  # fmt: skip
    (data / "dataset_info.json").write_text(json.dumps({"vlm": entry}))
    return data


def _raw(model_dir: Path, data: Path, template: str, **over) -> dict:
    return {"model_name_or_path": str(model_dir), "template": template, "dataset": "vlm", "dataset_dir": str(data),
            "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all", "cutoff_len": 128,
            "per_device_train_batch_size": 2, "max_steps": 2, "logging_steps": 1, "save_steps": 2,
            "learning_rate": 5e-3, "use_cpu": True, "probes": None, **over}  # fmt: skip


# template -> (fixture, the image token, tokens per image of the 40x30 red and the 20x50 blue image, the text
# around each image). Qwen3-VL: red 40x30 -> smart_resize (factor 16 x merge 2 = 32) 32x32: a 2x2 patch grid, 1
# token; blue 20x50 -> image_min_pixels 1024 (int scaling keeps 20x50), at least 28 a side: 28x50 -> 32x64: 2x4,
# 2 tokens. Gemma 3: image_seq_length 4 each, between "\n\n<start_of_image>" and "<end_of_image>\n\n".
FAMILIES = {
    "qwen3_vl": ("tiny_qwen3_vl_dir", "<|image_pad|>", (1, 2), ("<|vision_start|>", "<|vision_end|>")),
    "qwen3_vl_nothink": ("tiny_qwen3_vl_dir", "<|image_pad|>", (1, 2), ("<|vision_start|>", "<|vision_end|>")),
    "gemma3": ("tiny_gemma3_dir", "<image_soft_token>", (4, 4), ("\n\n<start_of_image>", "<end_of_image>\n\n")),
}


@pytest.mark.slow  # the fixtures take ~20 s to build
@pytest.mark.parametrize("template", sorted(FAMILIES))
def test_rows_of_one_and_two_images_render_each_familys_image_tokens(template, request, tmp_path):
    """Each <image> becomes the family's image text (LLaMA-Factory's plugin: Qwen3-VL's count by image size,
    Gemma 3's fixed count between boi and eoi) inside the template's slots; image tokens never in the loss."""
    from cockpit.config import validate
    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model

    fixture, image, (red, blue), (start, end) = FAMILIES[template]
    model_dir = request.getfixturevalue(fixture)
    cfg = validate(_raw(model_dir, _data(tmp_path), template))
    tok = load_tokenizer(cfg, resolve_model(str(model_dir), log=lambda *_: None), log=lambda *_: None)
    one, two, text = prepare_dataset(cfg, tok).rendered
    image_id = tok.convert_tokens_to_ids(image)
    assert [r.input_ids.count(image_id) for r in (one, two, text)] == [red, blue + red, 0]
    shown = tok.decode(two.input_ids)
    assert f"{start}{image * blue}{end} then {start}{image * red}{end}: which?" in shown, shown
    opening = {"gemma3": "<start_of_turn>user\n", "qwen3_vl": "<|im_start|>user\n"}
    assert opening.get(template, "<|im_start|>user\n") in shown
    for r in (one, two):
        assert all(label == -100 for t, label in zip(r.input_ids, r.labels) if t == image_id)
    answer = tok.decode([t for t, label in zip(one.input_ids, one.labels) if label != -100])
    think = "<think>\n\n</think>\n\n" if template == "qwen3_vl" else ""  # the reasoning template's empty thought
    assert answer.startswith(f"{think}red"), answer


@pytest.mark.slow
@pytest.mark.parametrize("template", ["qwen3_vl", "gemma3"])
def test_each_family_trains_two_lora_steps_on_images(template, request, tmp_path, monkeypatch):
    """`cockpit train` 2 LoRA steps on rows with 1 and 2 images: the loss logged, LoRA on the language model only
    (LLaMA-Factory's defaults: tower and projector frozen, never adapted), its weights moved by training."""
    import torch
    from conftest import read_events, write_yaml
    from safetensors.torch import load_file

    from cockpit.cli import main

    monkeypatch.chdir(tmp_path)
    model_dir = request.getfixturevalue(FAMILIES[template][0])
    cfg = write_yaml(tmp_path / "c.yaml", _raw(model_dir, _data(tmp_path), template))
    runs = tmp_path / "runs"
    assert main(["train", str(cfg), "--runs-dir", str(runs)]) == 0
    (run,) = [p for p in runs.iterdir() if p.name != "queue"]
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] > 0 for e in steps), steps
    (adapter,) = [a for a in run.rglob("adapter_model.safetensors") if "checkpoint-" not in str(a)]  # the final one
    weights = load_file(str(adapter))
    assert weights and all(".language_model." in k for k in weights), sorted(weights)[:5]  # no tower, no projector
    lora_b = [v for k, v in weights.items() if "lora_B" in k]  # zeros at the start (PEFT): trained if not
    assert lora_b and any(bool(torch.any(v != 0)) for v in lora_b)


# LLaMA-Factory's own VLM examples (tests/fixtures/llamafactory/, only model_name_or_path swapped): each passes
# `cockpit check` and trains 2 steps with the CPU's sizes by --set, as tests/test_lf_examples.py runs the text ones.
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llamafactory"
CPU_SIZES = ["max_steps=2", "cutoff_len=256", "gradient_accumulation_steps=1", "dataloader_num_workers=0",
             "preprocessing_num_workers=1", "use_cpu=true", "bf16=false", "save_steps=2", "logging_steps=1",
             "probes=null"]  # fmt: skip
EXAMPLES = [("qwen3vl_lora_sft", "tiny_qwen3_vl_dir"), ("qwen2_5vl_lora_sft", "tiny_qwen2_5_vl_dir"),
            ("llava1_5_lora_sft", "tiny_llava_dir")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.budget(
    120, reason="3 cockpit subprocesses (check, the video dataset's check, 2 steps) + a fixture's build"
)
@pytest.mark.parametrize("example, model", EXAMPLES, ids=[e for e, _ in EXAMPLES])
def test_llamafactorys_vlm_examples_pass_check_and_train_two_steps(example, model, request, tmp_path):
    from conftest import cockpit, read_events

    model_dir = request.getfixturevalue(model)
    config = str(FIXTURES / f"{example}.yaml")
    swap = ["--set", f"model_name_or_path={model_dir}"]
    res = cockpit("check", config, *swap, cwd=str(tmp_path), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    raw = yaml.safe_load((FIXTURES / f"{example}.yaml").read_text())
    if "video_max_pixels" in raw:  # accepted as inert, and said so: no row can have a video
        assert f"video_max_pixels {raw['video_max_pixels']}: no effect: it bounds video frames" in res.stdout, (
            res.stdout
        )
        video = cockpit("check", config, *swap, "--set", "dataset=mllm_video_demo", cwd=str(tmp_path), timeout=600)
        assert video.returncode != 0 and "videos" in video.stdout + video.stderr, video.stdout + video.stderr
        assert not (tmp_path / "runs").exists()
    sizes = [a for o in CPU_SIZES for a in ("--set", o)]
    res = cockpit("train", config, "--runs-dir", str(tmp_path / "runs"), *swap, *sizes, cwd=str(tmp_path), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert [e["step"] for e in read_events(run) if e["kind"] == "step"] == [1, 2]


@pytest.mark.slow  # the fixture takes ~15 s to build
def test_dpo_check_says_the_video_keys_have_no_effect(tiny_qwen3_vl_dir, tmp_path, capsys):
    """The DPO stage's check (LLaMA-Factory's qwen3vl_lora_dpo.yaml sets video_max_pixels too) accepts the video
    keys on a vision-language model with the same note as SFT's."""
    import json

    from conftest import write_yaml

    from cockpit.cli import main

    data = _data(tmp_path)
    pairs = [{"instruction": "<image>What colour is it?", "chosen": c, "rejected": o, "images": [f"img/{c}.png"]}
             for c, o in (("red", "blue"), ("blue", "red"))]  # fmt: skip
    (data / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    columns = {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected", "images": "images"}
    (data / "dataset_info.json").write_text(json.dumps({"pairs": {"file_name": "pairs.jsonl", "ranking": True,
                                                                  "columns": columns}}))  # fmt: skip
    raw = _raw(tiny_qwen3_vl_dir, data, "qwen3_vl", stage="dpo", dataset="pairs", video_max_pixels=16384,
               video_min_pixels=64)  # fmt: skip
    assert main(["check", str(write_yaml(tmp_path / "dpo.yaml", raw))]) == 0
    out = capsys.readouterr().out
    for note in ("video_max_pixels 16384: no effect", "video_min_pixels 64: no effect"):
        assert note in out, out


@pytest.mark.slow  # the fixture takes ~15 s to build
def test_qwen3_vl_batches_give_llamafactorys_mrope_positions(tiny_qwen3_vl_dir, tmp_path):
    """Cockpit's batch hands Qwen3-VL ``mm_token_type_ids`` and lets the model place M-RoPE; LLaMA-Factory's collator
    computes ``position_ids`` itself (``get_rope_index`` with the image tokens marked, the text row put first):
    on a padded batch of rows with 1 and 2 images of different sizes the loss is the same."""
    import torch

    from cockpit.config import validate
    from cockpit.data.packing import build_collator
    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.model import build_model
    from cockpit.train.vlm import with_images

    cfg = validate(_raw(tiny_qwen3_vl_dir, _data(tmp_path), "qwen3_vl", packing=False))
    ref = resolve_model(str(tiny_qwen3_vl_dir), log=lambda *_: None)
    tok = load_tokenizer(cfg, ref, log=lambda *_: None)
    rows = prepare_dataset(cfg, tok).rows()[:2]
    model = build_model(cfg, ref, True, 0)
    batch = with_images(build_collator(cfg, tok, model), cfg, model)(rows)
    assert batch["attention_mask"].min() == 0 and batch["image_grid_thw"].shape == (3, 3)  # padded; 3 images
    inner = model.get_base_model().model
    marks = batch["mm_token_type_ids"]
    with torch.no_grad():
        ours = model(**batch).loss
        positions, _ = inner.get_rope_index(batch["input_ids"], mm_token_type_ids=marks,
                                            image_grid_thw=batch["image_grid_thw"],
                                            attention_mask=batch["attention_mask"].float())  # fmt: skip
        lf = {k: v for k, v in batch.items() if k != "mm_token_type_ids"}
        theirs = model(**lf, position_ids=torch.cat([positions[:1], positions], 0)).loss
    assert torch.allclose(ours, theirs), (ours, theirs)


@pytest.mark.slow  # the fixtures take ~20 s to build
@pytest.mark.parametrize("fixture", ["tiny_qwen3_vl_dir", "tiny_gemma3_dir"])
def test_the_composite_keys_name_every_part_of_transformers_modules(fixture, request):
    """Each parameter of the real model (transformers 5's names) falls in exactly one of LLaMA-Factory's parts
    (tower, projector, language model: models/vlm.COMPOSITE), so the freeze keys freeze what they say; and
    LoRA's ``all`` adapts the language model's linear layers only (tower and projector frozen by default)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from cockpit.config import validate
    from cockpit.models import vlm

    config = AutoConfig.from_pretrained(str(request.getfixturevalue(fixture)))
    parts = vlm.composite_of(config)
    assert parts is not None
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    keys = {"vision": parts.vision_model_keys, "projector": parts.projector_keys, "language": parts.language_model_keys}
    for name, _ in model.named_parameters():
        owners = [part for part, names in keys.items() if any(k in name for k in names)]
        assert len(owners) == 1, (name, owners)
    modules = [(n, isinstance(m, torch.nn.Linear)) for n, m in model.named_modules() if n]
    cfg = validate({"model_name_or_path": "m", "dataset": "d", "finetuning_type": "lora", "lora_target": "all"})
    adapted = vlm.lora_targets(cfg, parts, modules)
    assert adapted and all(".language_model." in n for n in adapted), adapted
