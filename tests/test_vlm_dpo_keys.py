"""Stage dpo honours the image keys as sft does (issue 63): its pairs are planned by sft's image plan
(image_max_pixels / image_min_pixels, media_dir) and its model is loaded by sft's load (the freeze keys choose what
trains); LLaMA-Factory's own multimodal DPO example passes check and trains."""

from __future__ import annotations

import pytest
from PIL import Image
from test_vlm_dpo import COLOURS, _dpo_trainer, _pairs, _raw
from test_vlm_families import CPU_SIZES, FIXTURES

from cockpit.config import validate


def _image_pairs(tmp_path):
    """test_vlm_dpo's pairs twice: ``big`` with 56x56 images (within the tiny processor's bounds) and ``small``
    with its ~28x32 images moved to a media_dir (their paths no longer under the dataset's folder)."""
    big = _pairs(tmp_path / "big")
    for name, colour in COLOURS.items():
        Image.new("RGB", (56, 56), colour).save(big / "img" / f"{name}.png")
    small = _pairs(tmp_path / "small")
    (tmp_path / "media").mkdir()
    (small / "img").rename(tmp_path / "media" / "img")
    return big, small, str(tmp_path / "media")


def _policy(model_dir, data, tmp_path, **over):
    """The policy of a DPO run on test_vlm_dpo's pairs, as the dpo recipe builds it (in-process)."""
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.recipes import get_recipe
    from cockpit.train.recipes.base import RecipeContext

    cfg = validate(_raw(model_dir, data, output_dir=str(tmp_path / "out"), **over))
    ref = resolve_model(str(model_dir), log=lambda *_: None)
    tok = load_tokenizer(cfg, ref, log=lambda *_: None)
    ctx = RecipeContext(None, cfg, 0, 1, 0, None, 0.0, True, {"checkpoints": tmp_path / "ck"}, ref, tok, print)
    return get_recipe("dpo").build_models(ctx)[0]


@pytest.mark.slow  # two fixtures' builds (~15 s each when not yet built by another test)
def test_dpo_pairs_follow_the_image_keys_and_the_freeze_keys(tiny_qwen2_vl_dir, tiny_llava_dir, tmp_path):
    """image_max_pixels / image_min_pixels bound a DPO pair's images: the image tokens in its prompt and the
    pixel_values rows of its batch (tiny Qwen2-VL); media_dir is where its image paths are found. The freeze keys
    choose what trains in a DPO run (LLaVA): LoRA on the tower with freeze_vision_tower false, on the tower alone
    with freeze_language_model too; full: the projector alone (train_mm_proj_only), or with the LM."""
    big, small, media = _image_pairs(tmp_path)
    seen = {}
    for case, data, over in (("big", big, {}), ("max", big, {"image_max_pixels": 28 * 28}),
                             ("small", small, {"media_dir": media}),
                             ("min", small, {"media_dir": media, "image_min_pixels": 56 * 56})):  # fmt: skip
        over = {"template": "qwen2_vl", "cutoff_len": 256, **over}
        _, ctx, pairs, trainer = _dpo_trainer(tiny_qwen2_vl_dir, data, tmp_path / case, **over)
        batch = next(iter(trainer.get_train_dataloader()))
        pad = ctx.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        tokens = {i["tokens"] for row in pairs.train for i in row["images"]}
        seen[case] = (tokens, int((batch["input_ids"][0] == pad).sum()), batch["pixel_values"].shape[0])
    # 56x56 in 28x28 merged patches: 2x2 tokens of 4 patch rows each; 2 pairs' images twice (chosen, rejected)
    assert seen == {"big": ({4}, 4, 4 * 4 * 4), "max": ({1}, 1, 4 * 1 * 4),  # image_max_pixels 784: 28x28
                    "small": ({1}, 1, 4 * 1 * 4), "min": ({4}, 4, 4 * 4 * 4)}, seen  # fmt: skip
    parts = ("vision_tower", "multi_modal_projector", "language_model")
    trains = {}
    for case, over in (("lora", {}), ("tower", {"freeze_vision_tower": False}),
                       ("tower only", {"freeze_vision_tower": False, "freeze_language_model": True}),
                       ("proj only", {"finetuning_type": "full", "train_mm_proj_only": True}),
                       ("full proj", {"finetuning_type": "full", "freeze_multi_modal_projector": False})):  # fmt: skip
        names = [n for n, p in _policy(tiny_llava_dir, small, tmp_path / case, media_dir=media, **over).named_parameters()
                 if p.requires_grad]  # fmt: skip
        trains[case] = {part for part in parts if any(part in n for n in names)}
        assert over.get("finetuning_type") == "full" or all("lora_" in n for n in names), names
    assert trains == {"lora": {"language_model"}, "tower": {"language_model", "vision_tower"},
                      "tower only": {"vision_tower"}, "proj only": {"multi_modal_projector"},
                      "full proj": {"language_model", "multi_modal_projector"}}, trains  # fmt: skip


@pytest.mark.slow
@pytest.mark.budget(90, reason="2 cockpit subprocesses (check, 2 DPO steps) + a fixture's build")
def test_llamafactorys_multimodal_dpo_example_passes_check_and_trains_two_steps(tiny_qwen2_5_vl_dir, tmp_path):
    """examples/train_lora/qwen2_5vl_lora_dpo.yaml (its dataset rlhf_v: sharegpt pairs with images), only the model
    swapped for the tiny Qwen2.5-VL: check passes (image_max_pixels honoured, not refused) and 2 steps train."""
    from conftest import cockpit, read_events

    config = str(FIXTURES / "qwen2_5vl_lora_dpo.yaml")
    swap = ["--set", f"model_name_or_path={tiny_qwen2_5_vl_dir}"]
    res = cockpit("check", config, *swap, cwd=str(tmp_path), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sizes = [a for o in CPU_SIZES for a in ("--set", o)]
    res = cockpit("train", config, "--runs-dir", str(tmp_path / "runs"), *swap, *sizes, cwd=str(tmp_path), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]
