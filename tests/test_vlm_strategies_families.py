"""Vision-language families other than LLaVA on 2 CPU ranks (gloo), as tests/test_vlm_strategies.py trains LLaVA
(issue 63): one step on two rows, one with an image and one without, so that one rank's micro-batch gets the blank
image (cockpit/train/vlm_ranks.py) with its family's batch keys (Qwen: ``image_grid_thw`` and ``mm_token_type_ids``,
from which the model builds its M-RoPE position ids, the blank's tokens out of the attention and so out of them).

Qwen2.5-VL (template qwen2_vl) under DDP, FSDP2 (its vision blocks units of their own, by its ``_no_split_modules``)
and ZeRO-3: each rank holds about half of each part under FSDP2 and ZeRO-3, all of it under DDP; the step's loss and
gradient norm are DDP's; the adapter is saved whole. DPO with images on 2 ranks under DDP (the stage runs under DDP
only, text models too), LLaVA and Qwen2-VL, a pair with an image on one rank and a text-only pair on the other.

Qwen3-VL (template qwen3_vl: its vision blocks and DeepStack mergers) and Gemma 3 (SigLIP's encoder layers, the
projector's pooling) the same way.

Time: each 2-rank run is 15-50 s on a loaded 2-core box, so the suite runs one family per template of
cockpit.models.vlm's SEVERAL_RANKS (Qwen2.5-VL for qwen2_vl, whose tower differs more from LLaVA's than Qwen2-VL's;
Qwen2-VL's sft passed this same test by hand, 2026-12-06, and its dpo runs below)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_strategy_runs import assert_close, train
from test_vlm_dpo import _pairs
from test_vlm_strategies import STRATEGIES, _held, _one_image_one_text, _steps

# family -> (its tiny model's fixture, template, the class names FSDP2 wraps of the vision tower)
FAMILIES = {
    "qwen2_vl": ("tiny_qwen2_vl_dir", "qwen2_vl", {"Qwen2VLVisionBlock"}),
    "qwen2_5_vl": ("tiny_qwen2_5_vl_dir", "qwen2_vl", {"Qwen2_5_VLVisionBlock"}),
    "qwen3_vl": ("tiny_qwen3_vl_dir", "qwen3_vl", {"Qwen3VLVisionBlock"}),
    "gemma3": ("tiny_gemma3_dir", "gemma3", {"SiglipEncoderLayer"}),
}


ONE_STEP = dict(cutoff_len=96, per_device_train_batch_size=1, max_steps=1, timeout=420)


def _trained(tmp_path: Path, model_dir: Path, template: str) -> dict[str, Path]:
    """One step under DDP, FSDP2 and ZeRO-3 (tests/test_vlm_strategies.py's settings), the tower trained too."""
    data = _one_image_one_text(tmp_path)
    over = dict(template=template, dataset="vlm", dataset_dir=str(data), nproc_per_node=2, **ONE_STEP)
    over["freeze_vision_tower"] = False  # LoRA on the tower too: it trains on every rank
    zero3 = str(tmp_path / "zero3.json")
    return {
        name: train(tmp_path, model_dir, name, **over, **{k: zero3 if v == "ZERO3" else v for k, v in extra.items()})
        for name, extra in STRATEGIES.items()
    }


def _adapter_shapes(run: Path) -> dict[str, tuple]:
    from safetensors import safe_open

    with safe_open(str(run / "adapter" / "adapter_model.safetensors"), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def _assert_sharded_as_ddp(runs: dict[str, Path], tower_classes: set[str]) -> dict:
    """Each sharded run's ranks hold about half of each part (the two together all of it), its step is DDP's, its
    FSDP2 units include the tower's blocks, and its adapter is saved whole. Returns what each rank held."""
    held = {name: _held(run) for name, run in runs.items()}
    whole = held["ddp"][0]
    assert all(whole[part]["global"] > 0 for part in ("vision", "projector", "language")), whole
    assert all(p["local"] == p["global"] for r in (0, 1) for p in held["ddp"][r].values()), held["ddp"]
    ddp_step = _steps(runs["ddp"])[0]
    for name in set(runs) - {"ddp"}:
        for rank in (0, 1):
            for part, p in held[name][rank].items():
                assert p["global"] == whole[part]["global"], (name, part)
                assert 0.4 * p["global"] <= p["local"] <= 0.6 * p["global"], (name, rank, part, p)  # about half
        for part in whole:
            assert sum(held[name][r][part]["local"] for r in (0, 1)) >= whole[part]["global"], (name, part)
        step = _steps(runs[name])[0]
        assert_close([step["loss"], step["grad_norm"]], [ddp_step["loss"], ddp_step["grad_norm"]], rel=1e-4)
        assert _adapter_shapes(runs[name]) == _adapter_shapes(runs["ddp"]), name  # saved whole by rank 0
    for rank in (0, 1):  # FSDP2's units: the tower's blocks among them, its parameters sharded
        rep = json.loads((runs["fsdp2"] / "logs" / f"fsdp.rank{rank}.json").read_text())
        assert tower_classes <= set(rep["layer_classes"]), rep["layer_classes"]
        assert all(p["dtensor"] for p in rep["params"] if "visual" in p["name"] or "vision_tower" in p["name"])
    blank = [r for r in (0, 1) if "a blank image added" in (runs["ddp"] / "logs" / f"rank{r}.log").read_text()]
    assert len(blank) == 1, blank  # the rank whose row had no image
    saved = _adapter_shapes(runs["ddp"])
    assert any("visual" in k or "vision_tower" in k for k in saved) and any("language_model" in k for k in saved)
    return held


@pytest.mark.slow
@pytest.mark.budget(
    150, reason="three 2-rank trainings of one step (DDP, FSDP2, ZeRO-3): what each rank holds and the step compared"
)
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "gemma3"])
def test_a_vlm_family_trains_on_two_ranks_under_fsdp2_and_zero3_as_under_ddp(family, tmp_path, request):
    fixture, template, tower_classes = FAMILIES[family]
    runs = _trained(tmp_path, request.getfixturevalue(fixture), template)
    print(json.dumps(_assert_sharded_as_ddp(runs, tower_classes)))  # the closing note's numbers


def _two_pairs(tmp_path: Path) -> Path:
    """tests/test_vlm_dpo.py's pairs data cut to two pairs, one whose prompt has an image and a text-only one (one
    per rank)."""
    data = _pairs(tmp_path, [{"instruction": "Say hi", "chosen": "hi", "rejected": "bye"}])
    rows = (data / "pairs.jsonl").read_text().splitlines()
    (data / "pairs.jsonl").write_text(f"{rows[0]}\n{rows[-1]}\n")
    return data


@pytest.mark.slow
@pytest.mark.budget(90, reason="two 2-rank dpo trainings of one step (LLaVA, Qwen2-VL) and Qwen2-VL's on one rank")
def test_dpo_with_images_trains_on_two_ranks_under_ddp(tmp_path, tiny_llava_dir, tiny_qwen2_vl_dir):
    """One step of two pairs, a pair with an image on one rank and a text-only pair on the other: it trains, its
    adapter is saved whole, and Qwen2-VL's gradient norm is one rank's of both pairs (images and grids batched
    there as one), to 1e-4 (the loss of a first step is log 2 either way: the policy is its reference)."""
    over = dict(stage="dpo", dataset="pairs", dataset_dir=str(_two_pairs(tmp_path)), pref_beta=0.5, **ONE_STEP)
    for template, model_dir in (("llava", tiny_llava_dir), ("qwen2_vl", tiny_qwen2_vl_dir)):
        run = train(tmp_path, model_dir, f"dpo-{template}", template=template, nproc_per_node=2, **over)
        (step,) = _steps(run)
        assert step["loss"] > 0 and step["grad_norm"] > 0, step
        assert any("language_model" in k for k in _adapter_shapes(run)), template
    one = train(
        tmp_path, tiny_qwen2_vl_dir, "dpo-one", template="qwen2_vl", **{**over, "per_device_train_batch_size": 2}
    )
    (alone,) = _steps(one)
    assert_close([step["loss"], step["grad_norm"]], [alone["loss"], alone["grad_norm"]], rel=1e-4)
    assert _adapter_shapes(one) == _adapter_shapes(run)
