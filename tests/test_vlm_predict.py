"""do_predict with a vision-language model (issue 63): each eval row's images reach ``generate`` through the
template's image plugin as the probes' and the collator's do (``cockpit.train.vlm.ModelImages`` ->
``mm_plugins.image_inputs``). ``generated_predictions.jsonl`` is written in LLaMA-Factory 0.9.5's format: its
``save_predictions`` decodes the eval set's ``input_ids`` with ``skip_special_tokens=False``, and for an image row
those are the prompt with each ``<image>`` expanded by its ``mm_plugin`` (``UnsupervisedDatasetProcessor``), so the
prompt column keeps the image tokens. Each prediction equals transformers' own ``generate`` on the image processed
by the model's processor, and the same prompt with another image predicts otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_vlm_dataset, write_yaml
from PIL import Image

from cockpit.cli import main
from cockpit.config import validate
from cockpit.errors import InputError

# LLaVA (the fixture): 16 image tokens an image; Qwen2-VL (the fixture's 14-px patches merged 2x2): 40x30 -> 1, 90x50 -> 6
IMAGES = {"red": ((220, 30, 30), (40, 30)), "blue": ((30, 30, 220), (40, 30)), "wide": ((30, 200, 30), (90, 50))}
ROWS = [
    {"messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}],
     "images": ["img/red.png"]},
    {"messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "blue"}],
     "images": ["img/blue.png"]},  # the same prompt as row 1, another image
    {"messages": [{"role": "user", "content": "<image> then <image>: which?"},
                  {"role": "assistant", "content": "green, red"}], "images": ["img/wide.png", "img/red.png"]},
    {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]},
]  # fmt: skip
NEW_TOKENS = 4


def _data(tmp_path: Path) -> Path:
    """The rows in data/ as LLaMA-Factory lays them out, each image one plain colour (no noise: the same pixels
    every run)."""
    data = write_vlm_dataset(tmp_path, IMAGES, ROWS)
    for name, (colour, size) in IMAGES.items():
        Image.new("RGB", size, colour).save(data / "img" / f"{name}.png")
    return data


def _seeing(model_dir: Path, out: Path) -> Path:
    """A copy of the tiny random model whose answer depends on the image: its language model's attention outputs
    x30. As built, its greedy answer repeats the prompt's last token whatever the image (the residual at the last
    position is that token's own embedding); so scaled, what the last position attends to, the image tokens
    included, decides the answer."""
    import shutil

    import torch
    from transformers import AutoModelForImageTextToText

    shutil.copytree(model_dir, out)
    model = AutoModelForImageTextToText.from_pretrained(out)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("o_proj.weight"):
                param.mul_(30)
    model.save_pretrained(out)
    return out


def _raw(model_dir: Path, data: Path, template: str, **over) -> dict:
    return {"model_name_or_path": str(model_dir), "template": template, "dataset": "vlm", "dataset_dir": str(data),
            "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all", "cutoff_len": 96,
            "per_device_train_batch_size": 2, "max_steps": 1, "logging_steps": 1, "save_steps": 1,
            "learning_rate": 5e-3, "use_cpu": True, "probes": None, "do_predict": True, "predict_with_generate": True,
            "eval_dataset": "vlm", "max_new_tokens": NEW_TOKENS, "per_device_eval_batch_size": 2, **over}  # fmt: skip


def _predictions(out: Path) -> list[dict]:
    """generated_predictions.jsonl's rows (LLaMA-Factory's keys, one line a row, the labels the answers); its
    BLEU-4 / ROUGE in predict_results.json are the scorer's over those rows."""
    from cockpit.data.similarity import mean_scores

    rows = [json.loads(line) for line in (out / "generated_predictions.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [r["messages"][-1]["content"] for r in ROWS]
    assert all(set(r) == {"prompt", "predict", "label"} for r in rows)
    results = json.loads((out / "predict_results.json").read_text())
    scores = mean_scores((r["predict"], r["label"]) for r in rows)
    assert {k: results[f"predict_{k}"] for k in scores} == scores, results
    return rows


def _images(data: Path, row: dict) -> list:
    return [Image.open(data / p).convert("RGB") for p in row.get("images", ())]


@pytest.mark.slow
def test_llava_trains_then_predicts_each_image_row_as_transformers_generates(tiny_llava_dir, tmp_path):
    """`cockpit train` (1 step, do_predict on an eval_dataset of image rows, batches of 2: one and two images, an
    image row beside a text row), then a prediction-only run on its adapter: the same predictions. Each prompt
    column is LlavaProcessor's expansion of the row's prompt (16 ``<image>`` an image); each prediction is
    ``generate`` on the processor's inputs with the trained adapter; red and blue under one prompt differ."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    data, model_dir = _data(tmp_path), _seeing(tiny_llava_dir, tmp_path / "llava")
    runs = tmp_path / "runs"
    assert main(["train", str(write_yaml(tmp_path / "c.yaml", _raw(model_dir, data, "llava"))),
                 "--runs-dir", str(runs)]) == 0  # fmt: skip
    (run,) = [p for p in runs.iterdir() if p.name != "queue"]
    rows = _predictions(run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["predict"]["samples"] == 4 and summary["predict"]["adapter"] == str(run / "adapter")
    assert "USER: " + "<image>" * 16 + "What colour? ASSISTANT:" in rows[0]["prompt"]
    assert rows[0]["prompt"] == rows[1]["prompt"] and rows[0]["predict"] != rows[1]["predict"]

    processor = AutoProcessor.from_pretrained(model_dir)
    model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(model_dir), run / "adapter")
    for sample, row in zip(ROWS, rows):
        text = row["prompt"].replace("<image>" * 16, "<image>")  # the processor expands each <image> itself
        inputs = processor(text=text, images=_images(data, sample) or None, return_tensors="pt")
        assert processor.tokenizer.decode(inputs["input_ids"][0]) == row["prompt"]
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        answer = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        assert answer == row["predict"], text

    predict_only = {k: v for k, v in _raw(model_dir, data, "llava").items() if k != "dataset"}
    predict_only.update(do_train=False, adapter_name_or_path=str(run / "adapter"), output_dir=str(tmp_path / "out"))
    assert main(["train", str(write_yaml(tmp_path / "p.yaml", predict_only)), "--runs-dir", str(runs)]) == 0
    assert _predictions(tmp_path / "out") == rows


@pytest.mark.slow
def test_qwen2_vl_predictions_see_each_rows_images_with_their_grids(tiny_qwen2_vl_dir, tiny_qwen2_5_vl_dir, tmp_path):
    """Template qwen2_vl (Qwen2-VL and Qwen2.5-VL: generate needs image_grid_thw and the M-RoPE image mark), rows of
    1 and 2 images of different sizes batched by 2: the prompt column as LLaMA-Factory's qwen2_vl rows (the image
    tokens by size, wrapped in <|vision_start|>/<|vision_end|>); each prediction is ``generate`` on the image
    processor's own outputs for the row alone; red and blue under one prompt differ. A cutoff_len that would cut
    a row's image tokens refuses that row by its line."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.predict import generate_predictions, prediction_samples

    data = _data(tmp_path)
    wrap = "<|vision_start|>{}<|vision_end|>".format
    for model_dir in (_seeing(tiny_qwen2_vl_dir, tmp_path / "q2"), _seeing(tiny_qwen2_5_vl_dir, tmp_path / "q25")):
        cfg = validate(_raw(model_dir, data, "qwen2_vl"))
        tok = load_tokenizer(cfg, resolve_model(str(model_dir), log=lambda *_: None), log=lambda *_: None)
        samples = prediction_samples(cfg, tok)
        model = AutoModelForImageTextToText.from_pretrained(model_dir)
        rows, stopped = generate_predictions(model, tok, samples, cfg)
        assert not stopped and [r["label"] for r in rows] == ["red", "blue", "green, red", "hi"]
        assert rows[0]["prompt"] == (
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            f"{wrap('<|image_pad|>')}What colour?<|im_end|>\n<|im_start|>assistant\n"
        )
        assert f"user\n{wrap('<|image_pad|>' * 6)} then {wrap('<|image_pad|>')}: which?<|im_end|>" in rows[2]["prompt"]
        assert rows[0]["prompt"] == rows[1]["prompt"] and rows[0]["predict"] != rows[1]["predict"], model_dir.name

        processor = AutoImageProcessor.from_pretrained(model_dir, backend="pil")  # no resize: sizes within bounds
        for sample, row in zip(ROWS, rows):
            ids = tok(row["prompt"], return_tensors="pt", add_special_tokens=False).input_ids
            images = _images(data, sample)
            pixels = dict(processor(images, return_tensors="pt")) if images else {}
            marks = (ids == model.config.image_token_id).long()
            with torch.no_grad():
                out = model.generate(input_ids=ids, mm_token_type_ids=marks, max_new_tokens=NEW_TOKENS,
                                     do_sample=False, **pixels)  # fmt: skip
            assert tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True) == row["predict"], (model_dir.name, row)
    with pytest.raises(InputError, match=r"vlm.jsonl:1: cannot predict this row: its prompt \(\d+ tokens\) is longer "
                       r"than cutoff_len 8: the cut keeps 0 of its 1 image tokens"):  # fmt: skip
        generate_predictions(model, tok, samples, cfg.replace(cutoff_len=8))


def test_prediction_from_images_is_refused_by_name_where_not_built(tiny_llava_dir, tiny_qwen2_vl_dir, tmp_path, capsys):
    """One rank with template llava or qwen2_vl predicts (sft, with or without training); several ranks and the
    other image templates are refused at check, by the key do_predict, before any run dir."""
    from transformers import AutoConfig

    from cockpit.models.vlm import model_problems

    data = write_vlm_dataset(tmp_path, IMAGES, ROWS[:1])
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    for model_dir, template in ((tiny_llava_dir, "llava"), (tiny_qwen2_vl_dir, "qwen2_vl")):
        config = AutoConfig.from_pretrained(model_dir)
        assert model_problems(validate(_raw(model_dir, data, template)), config) == []
        only = {k: v for k, v in _raw(model_dir, data, template, do_train=False).items() if k != "dataset"}
        assert model_problems(validate({**only, "adapter_name_or_path": str(adapter)}), config) == []
    qwen = AutoConfig.from_pretrained(tiny_qwen2_vl_dir)
    (problem,) = model_problems(validate(_raw(tiny_qwen2_vl_dir, data, "gemma3")), qwen)
    assert problem == ("do_predict", "prediction (generation from the images) with template gemma3 with a "
                       "vision-language model: not built yet (issue 63); llava's and qwen2_vl's on one rank only")  # fmt: skip
    with pytest.raises(InputError, match="do_predict: prediction answers with an SFT model"):
        validate(_raw(tiny_llava_dir, data, "llava", stage="dpo"))
    capsys.readouterr()
    cfg = write_yaml(tmp_path / "c.yaml", _raw(tiny_llava_dir, data, "llava", nproc_per_node=2))
    assert main(["check", str(cfg), "--no-devices"]) == 2  # llava's sft trains on 2 ranks; it does not predict there
    out = "".join(capsys.readouterr())
    assert "do_predict: prediction (generation from the images) on several ranks" in out, out
