"""A tiny LLaVA trained on 2 CPU ranks (gloo) under DDP, FSDP2 and ZeRO-3 (issue 63), through the real CLI as
the text strategies are (tests/test_strategy_runs.py). One step on two rows, one with an image and one
without, so that one rank's micro-batch carries no image: it gets LLaMA-Factory's blank image
(cockpit/train/vlm_ranks.py), without which FSDP2's and ZeRO-3's all-gathers of the vision tower do not match
across ranks (gloo: "Received data size doesn't match expected size").

What each rank holds, from its ``rank_memory`` event after training (``parameters_held``: elements of each
part's parameters in this rank's memory): under DDP every rank holds the whole vision tower, projector and
language model; under FSDP2 (the CLIP encoder layers and vision embeddings wrapped as units of their own, the
projector in the root) and ZeRO-3 (every parameter partitioned) each rank holds about half of each, the
ranks together all of it. The losses and gradient norms match DDP's; the saved adapter is whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import read_events
from PIL import Image
from test_strategy_runs import assert_close, train

# ZeRO-3 with DeepSpeed's own settings but stage3_param_persistence_threshold 0: its default (10 x hidden, 640
# elements here) keeps every smaller parameter whole on every rank (measured: the tower's LoRA matrices and
# biases put rank 0 at 18752 of the tower's 27520 elements), which at this size is most of the tower's tensors
ZERO3 = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_allow_untested_optimizer": True,
    "communication_data_type": "fp32",
    "zero_optimization": {"stage": 3, "overlap_comm": False, "stage3_param_persistence_threshold": 0},
}
STRATEGIES = {"ddp": {}, "fsdp2": {"fsdp": "full_shard auto_wrap"}, "zero3": {"deepspeed": "ZERO3"}}


def _one_image_one_text(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    Image.blend(Image.new("RGB", (40, 30), (220, 30, 30)), Image.effect_noise((40, 30), 60).convert("RGB"), 0.3).save(
        data / "img" / "red.png"
    )
    rows = [
        {
            "messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}],
            "images": ["img/red.png"],
        },
        {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]},
    ]
    (data / "vlm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {
        "file_name": "vlm.jsonl",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    }
    (data / "dataset_info.json").write_text(json.dumps({"vlm": entry}))
    probes = [
        {"prompt": "Say hi", "expect": "hi"},
        {"prompt": "<image>What colour?", "image": "data/img/red.png", "expect": "red"},
    ]
    (tmp_path / "probes.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probes))
    (tmp_path / "zero3.json").write_text(json.dumps(ZERO3))
    return data


def _held(run: Path) -> dict[int, dict]:
    return {
        e["rank"]: e["parameters_held"]
        for e in read_events(run)
        if e["kind"] == "rank_memory" and e["phase"] == "trained"
    }


def _steps(run: Path) -> list[dict]:
    return [e for e in read_events(run) if e["kind"] == "step"]


@pytest.mark.slow
@pytest.mark.budget(
    150, reason="three 2-rank trainings of one step (DDP, FSDP2, ZeRO-3): what each rank holds is compared across them"
)
def test_a_llava_trains_on_two_ranks_under_ddp_fsdp2_and_zero3(tmp_path, tiny_llava_dir):
    from safetensors import safe_open

    data = _one_image_one_text(tmp_path)
    over = dict(
        template="llava",
        dataset="vlm",
        dataset_dir=str(data),
        cutoff_len=96,
        per_device_train_batch_size=1,
        max_steps=1,
        nproc_per_node=2,
        freeze_vision_tower=False,  # LoRA on the tower too: it trains on every rank (DDP's unused parameters)
        timeout=420,
    )
    probes = dict(probes=str(tmp_path / "probes.jsonl"), probe_max_new_tokens=2)  # generation with the tower sharded
    runs = {
        name: train(
            tmp_path,
            tiny_llava_dir,
            name,
            **over,
            **{k: str(tmp_path / "zero3.json") if v == "ZERO3" else v for k, v in extra.items()},
            **({} if name == "ddp" else probes),
        )
        for name, extra in STRATEGIES.items()
    }
    held = {name: _held(run) for name, run in runs.items()}
    print(json.dumps(held))  # the closing note's numbers
    whole = held["ddp"][0]
    assert whole["vision"]["global"] > 0 and whole["projector"]["global"] > 0
    for rank in (0, 1):
        assert all(p["local"] == p["global"] for p in held["ddp"][rank].values()), held["ddp"]  # replicated
        for name in ("fsdp2", "zero3"):
            for part, p in held[name][rank].items():
                assert p["global"] == whole[part]["global"], (name, part)
                assert 0.4 * p["global"] <= p["local"] <= 0.6 * p["global"], (name, rank, part, p)  # about half
    for name in ("fsdp2", "zero3"):
        for part in whole:  # the two ranks together hold all of it
            assert sum(held[name][r][part]["local"] for r in (0, 1)) >= whole[part]["global"], (name, part)
        ddp_step, step = _steps(runs["ddp"])[0], _steps(runs[name])[0]
        assert_close([step["loss"], step["grad_norm"]], [ddp_step["loss"], ddp_step["grad_norm"]], rel=1e-4)
        asked = [e for e in read_events(runs[name]) if e["kind"] == "probe_results"]
        assert [e["phase"] for e in asked] == ["before", "after"]
        assert all([r.get("image") for r in e["results"]] == [None, "red.png"] for e in asked), asked  # an image probe
    blank = [
        rank for rank in (0, 1) if "a blank image added" in (runs["zero3"] / "logs" / f"rank{rank}.log").read_text()
    ]
    assert len(blank) == 1, blank  # the rank whose row had no image
    for rank in (
        0,
        1,
    ):  # FSDP2's units: the tower's layers and embeddings, the decoder layers; the projector in the root
        rep = json.loads((runs["fsdp2"] / "logs" / f"fsdp.rank{rank}.json").read_text())
        assert rep["wrapped_modules"] == 5 and {"CLIPEncoderLayer", "CLIPVisionEmbeddings", "LlamaDecoderLayer"} <= set(
            rep["layer_classes"]
        )
        assert all(p["dtensor"] for p in rep["params"] if "vision_tower" in p["name"])

    def shapes(run: Path) -> dict[str, tuple]:
        with safe_open(str(run / "adapter" / "adapter_model.safetensors"), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}

    saved = shapes(runs["ddp"])
    assert any("vision_tower" in k for k in saved) and any("language_model" in k for k in saved), sorted(saved)
    assert shapes(runs["fsdp2"]) == shapes(runs["zero3"]) == saved  # saved whole by rank 0


def test_a_vlm_streams_its_parts_and_trains_on_several_ranks_what_several_ranks_names(tiny_llava_dir):
    """The rule the ranks and the planner share: a LLaVA folder streams: under ZeRO-3 / FSDP2 each rank
    reads its own part, under the names transformers renames its checkpoint's keys to
    (tests/test_vlm_sharded_load.py), the embedded VLM too; on
    several ranks a VLM trains what models.vlm.SEVERAL_RANKS names (tested), anything else is refused by name at check."""
    from cockpit.config import validate
    from cockpit.models.embedded_vlm import embedded_vlm_dir
    from cockpit.models.resolve import resolve_model
    from cockpit.models.vlm import untested_with_vlm
    from cockpit.models.weights import planned_weights, sharded_load_mode, weights_of

    weights = weights_of(resolve_model(str(tiny_llava_dir), log=lambda *_: None), fetch=False)
    assert weights.folder == str(tiny_llava_dir) and not weights.why_whole, weights
    assert sharded_load_mode(weights, world_size=2, quantized=False, fsdp=True, zero3=False) == "fsdp_meta"
    raw = {"model_name_or_path": str(tiny_llava_dir), "template": "llava", "dataset": "vlm", "use_cpu": True}
    assert planned_weights(validate({**raw, "model_name_or_path": "embedded-vlm"})).folder == str(embedded_vlm_dir())
    for over in (
        {"nproc_per_node": 2},
        {"nproc_per_node": 2, "zero_stage": 3},
        {"nproc_per_node": 2, "fsdp": "full_shard"},
    ):
        assert untested_with_vlm(validate({**raw, **over})) == [], over
    for template in ("qwen2_vl", "qwen3_vl", "qwen3_vl_nothink", "gemma3"):  # tests/test_vlm_strategies_families.py
        for over in ({}, {"zero_stage": 3}, {"fsdp": "full_shard auto_wrap"}):
            assert untested_with_vlm(validate({**raw, "template": template, "nproc_per_node": 2, **over})) == [], over
    for template in ("llava", "qwen2_vl"):  # dpo: DDP, the stage's only strategy
        assert untested_with_vlm(validate({**raw, "stage": "dpo", "template": template, "nproc_per_node": 2})) == []
    for over, key in (  # not in the tests: refused by the key that asks for it
        ({"template": "qwen2_vl", "zero_stage": 2}, "zero_stage"),
        ({"template": "qwen2_vl", "fsdp": "shard_grad_op"}, "fsdp"),
        ({"template": "qwen3_vl_nothink", "zero_stage": 2}, "zero_stage"),
        ({"template": "gemma3", "fsdp": "hybrid_shard"}, "fsdp"),
        ({"template": "gemma3", "stage": "dpo"}, "nproc_per_node"),
        ({"stage": "pt"}, "nproc_per_node"),
    ):
        assert [k for k, _ in untested_with_vlm(validate({**raw, "nproc_per_node": 2, **over}))] == [key], over
