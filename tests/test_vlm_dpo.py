"""DPO on pairs with images (issue 63), as LLaMA-Factory 0.9.5's pairwise processor takes them: a pair's images
go with its prompt (one ``<image>`` each there), chosen and rejected share them; the prompt's image tokens are
expanded as SFT's, and the trainer's batch (TRL's chosen half, then rejected half) carries the images' pixel_values
for both halves. The other stages refuse rows with images by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_yaml
from PIL import Image

from cockpit.cli import main
from cockpit.config import validate
from cockpit.data.dataset_info import DatasetSpec
from cockpit.data.pairs import load_stage_file

IMAGE_SEQLEN = 16  # the fixture's 32x32 images in 8x8 patches, CLIP's class token dropped

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30), "yellow": (220, 220, 30)}


def _pairs(tmp_path: Path, extra: list | None = None) -> Path:
    """data/pairs.jsonl (alpaca, ranking) + dataset_info.json: 4 pairs, one image each under data/img/."""
    data = tmp_path / "data"
    (data / "img").mkdir(parents=True, exist_ok=True)
    for name, colour in COLOURS.items():
        Image.new("RGB", (24 + len(name), 32), colour).save(data / "img" / f"{name}.png")
    names = list(COLOURS)
    rows = [
        {
            "instruction": "<image>What colour is it?",
            "chosen": name,
            "rejected": names[(i + 1) % 4],
            "images": [f"img/{name}.png"],
        }
        for i, name in enumerate(names)
    ] + (extra or [])
    (data / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {
        "file_name": "pairs.jsonl",
        "ranking": True,
        "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected", "images": "images"},
    }
    (data / "dataset_info.json").write_text(json.dumps({"pairs": entry}))
    return data


def _raw(model_dir: Path, data: Path, **over) -> dict:
    return {
        "model_name_or_path": str(model_dir),
        "template": "llava",
        "stage": "dpo",
        "dataset": "pairs",
        "dataset_dir": str(data),
        "finetuning_type": "lora",
        "lora_rank": 4,
        "lora_target": "all",
        "cutoff_len": 64,
        "per_device_train_batch_size": 2,
        "max_steps": 2,
        "logging_steps": 1,
        "learning_rate": 5e-2,
        "pref_beta": 0.5,
        "use_cpu": True,
        "probes": None,
        **over,
    }


def test_dpo_pairs_carry_their_images_and_the_text_stages_refuse_them(tmp_path):
    """stage dpo: each pair's images (the prompt's count rule; none in an answer); rm / kto / pt / grpo refuse a
    row with images by name."""
    bad = [
        {"instruction": "no placeholder", "chosen": "a", "rejected": "b", "images": ["img/red.png"]},  # line 5
        {"instruction": "<image>which?", "chosen": "<image> a", "rejected": "b", "images": ["img/red.png"]},  # 6
        {"instruction": "<image>which?", "chosen": "a", "rejected": "b", "images": ["img/none.png"]},
    ]  # 7
    data = _pairs(tmp_path, bad)
    columns = {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected", "images": "images"}
    spec = DatasetSpec("pairs", data / "pairs.jsonl", ranking=True, columns=columns, media_dir=data)
    res = load_stage_file(spec, "dpo")
    assert [s["images"][0]["path"] for s in res.samples] == [str(data / "img" / f"{c}.png") for c in COLOURS]
    assert res.samples[0]["prompt"] == [{"role": "user", "content": "<image>What colour is it?"}]
    why = {p.line: p.message for p in res.problems}
    assert sorted(why) == [5, 6, 7], why
    assert "0 <image> placeholder(s) in the text but 1 image(s)" in why[5]
    assert "the chosen answer holds <image>: a pair's images go with its prompt" in why[6]
    assert "no such image 'img/none.png'" in why[7]
    row = {
        "instruction": "<image>which?",
        "output": "a",
        "chosen": "a",
        "rejected": "b",
        "label": True,
        "images": ["img/red.png"],
    }
    (data / "one.jsonl").write_text(json.dumps(row) + "\n")
    for stage in ("rm", "kto", "pt", "grpo"):
        spec = DatasetSpec(
            "one",
            data / "one.jsonl",
            ranking=stage == "rm",
            media_dir=data,
            columns={"kto_tag": "label", "images": "images"},
        )
        res = load_stage_file(spec, stage)
        assert not res.samples, stage
        (problem,) = res.problems
        assert (
            problem.line == 1
            and f"stage {stage} trains text only (images train with stage sft or dpo)" in problem.message
        )


def test_check_takes_dpo_pairs_with_images_and_refuses_a_cut_image(tiny_llava_dir, tmp_path, capsys):
    """cockpit check: a dpo config of pairs with images passes, its images reported (16 image tokens each in the
    prompt); a pair whose prompt cutoff_len cuts is refused by file:line; stage kto with the images by name."""
    data = _pairs(tmp_path)
    cfg = write_yaml(tmp_path / "c.yaml", _raw(tiny_llava_dir, data))
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "pairs: 4" in out and "images: 4 in 4 rows" in out and "16 image tokens each" in out, out
    cfg = write_yaml(tmp_path / "cut.yaml", _raw(tiny_llava_dir, data, cutoff_len=40))
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{data / 'pairs.jsonl'}:1" in err and "cuts this pair's prompt and its 16 image tokens" in err, err
    cfg = write_yaml(tmp_path / "orpo.yaml", _raw(tiny_llava_dir, data, pref_loss="orpo"))
    assert main(["check", str(cfg)]) == 2
    assert "pref_loss orpo on pairs with images: not built yet" in capsys.readouterr().err


def _lora(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _dpo_trainer(model_dir: Path, data: Path, tmp_path: Path, **over):
    """(the dpo recipe, its context, its data, its trainer) as a rank builds them, in-process."""
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.recipes import get_recipe
    from cockpit.train.recipes.base import RecipeContext

    cfg = validate(_raw(model_dir, data, output_dir=str(tmp_path / "out"), **over))
    ref = resolve_model(str(model_dir), log=lambda *_: None)
    tok = load_tokenizer(cfg, ref, log=lambda *_: None)
    ctx = RecipeContext(None, cfg, 0, 1, 0, None, 0.0, True, {"checkpoints": tmp_path / "ck"}, ref, tok, print)
    recipe = get_recipe("dpo")
    pairs = recipe.build_data(ctx)
    policy, reference = recipe.build_models(ctx)
    assert reference is None  # LoRA: TRL's reference is the policy with its adapter disabled (the same inputs)
    return recipe, ctx, pairs, recipe.build_trainer(ctx, policy, reference, pairs, [])


def test_qwen2_vl_pairs_batch_their_image_grids_for_both_halves(tiny_qwen2_vl_dir, tmp_path):
    """Qwen2-VL (template qwen2_vl): the pair batch carries pixel_values, image_grid_thw and mm_token_type_ids
    (its plugin's keys, as SFT's collator) for the chosen and the rejected half; DPO's loss reads them."""
    import torch

    _, ctx, _, trainer = _dpo_trainer(
        tiny_qwen2_vl_dir, _pairs(tmp_path), tmp_path, template="qwen2_vl", cutoff_len=256
    )
    batch = next(iter(trainer.get_train_dataloader()))
    pad = ctx.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    grids = batch["image_grid_thw"]
    assert grids.shape == (4, 3) and grids[:2].equal(grids[2:])  # 2 pairs' images, then the same for the rejected half
    assert batch["pixel_values"].shape[0] == int(grids.prod(dim=1).sum())
    assert batch["mm_token_type_ids"].equal((batch["input_ids"] == pad).long()) and (batch["input_ids"] == pad).any()
    with torch.no_grad():
        assert torch.isfinite(trainer.compute_loss(trainer.model, batch))


@pytest.mark.slow
def test_a_tiny_llava_trains_two_dpo_steps_on_pairs_with_images(tiny_llava_dir, tmp_path):
    """The dpo recipe on 4 pairs with images (+1 held out), LoRA, 2 steps: TRL's batch carries each pair's image
    for its chosen and its rejected row (pixel_values of 2x the images, one per 16 image tokens), the loss is finite,
    the adapter moves, and the images reach the DPO loss (blank images change it) and the held-out measure."""
    import torch

    from cockpit.train.recipes.heldout import policy_preference

    extra = [
        {"instruction": "<image>Name the colour.", "chosen": "red", "rejected": "green", "images": ["img/red.png"]}
    ]
    recipe, ctx, pairs, trainer = _dpo_trainer(tiny_llava_dir, _pairs(tmp_path, extra), tmp_path, val_size=1)
    assert len(pairs.train) == 4 and len(pairs.held_out) == 1
    batch = next(iter(trainer.get_train_dataloader()))
    image_id = ctx.tokenizer.convert_tokens_to_ids("<image>")
    assert batch["input_ids"].shape[0] == 4 and batch["pixel_values"].shape == (
        4,
        3,
        32,
        32,
    )  # 2 pairs: chosen, rejected
    assert (batch["input_ids"] == image_id).sum(dim=1).tolist() == [IMAGE_SEQLEN] * 4
    assert batch["pixel_values"][:2].equal(batch["pixel_values"][2:])  # the rejected half sees the chosen half's images
    before = _lora(trainer.model)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses))), trainer.state.log_history
    after = _lora(trainer.model)
    assert any(not before[n].equal(after[n]) for n in before)
    trainer.model.eval()
    with torch.no_grad():  # the trained policy against its reference: both read the images
        loss = trainer.compute_loss(trainer.model, batch)
        blank = trainer.compute_loss(trainer.model, {**batch, "pixel_values": torch.zeros_like(batch["pixel_values"])})
    assert torch.isfinite(loss) and not torch.isclose(loss, blank), (loss, blank)
    held = recipe.held_out(ctx, trainer.model, pairs)
    blind = policy_preference(trainer.model, ctx.tokenizer, pairs.held_out)  # the same pair without its image
    assert held["pairs"] == 1 and held["mean_logp_margin"] != blind["mean_logp_margin"], (held, blind)
