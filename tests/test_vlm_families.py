"""Qwen3-VL and Gemma 3 as LLaMA-Factory 0.9.5 trains them (issue 63): the tiny fixtures' models take a row's
image tokens and pixels as each family's plugin lays them out, and learn from them."""

from __future__ import annotations

from pathlib import Path

import pytest
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
