"""The Setup form's sizes of a vision-language model (issue 63): the torch-free count (cockpit.plan.vlm_counts,
the UI's planner) of the vision tower, the projector and the language model of a Qwen2-VL, Qwen2.5-VL, Qwen3-VL
and Gemma 3 from their config.json alone equals the real transformers classes built on the meta device: for the
tiny fixtures and for the configs the models publish (no hub here: written below from their config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Qwen/Qwen2.5-VL-7B-Instruct's config.json as published on the hub (a flat config: the language model's keys at
# the top level, transformers_version 4.41.2); copied from public copies of it found with the code search (a
# repository's docs quoting the file, and TensorRT-LLM's Qwen2.5-VL test config with the depth cut)
QWEN2_5_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064,
}  # fmt: skip
# Qwen/Qwen3-VL-4B-Instruct's config.json (transformers_version 4.57.0.dev0), as a public Qwen3-VL text-encoder
# wrapper (DiffSynth's WanMLLMEncoder) builds Qwen3VLConfig from it verbatim; a Rust port's test of the 4B
# config has the same numbers
QWEN3_VL_4B = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655, "model_type": "qwen3_vl",
    "text_config": {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643, "dtype": "bfloat16",
                    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
                    "initializer_range": 0.02, "intermediate_size": 9728, "max_position_embeddings": 262144,
                    "model_type": "qwen3_vl_text", "num_attention_heads": 32, "num_hidden_layers": 36,
                    "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
                    "rope_theta": 5000000, "tie_word_embeddings": True, "use_cache": True, "vocab_size": 151936},
    "tie_word_embeddings": True, "transformers_version": "4.57.0.dev0", "video_token_id": 151656,
    "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh",
                      "hidden_size": 1024, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4096,
                      "model_type": "qwen3_vl", "num_heads": 16, "num_position_embeddings": 2304,
                      "out_hidden_size": 2560, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "vision_end_token_id": 151653, "vision_start_token_id": 151652,
}  # fmt: skip
# google/gemma-3-4b-it's config.json (transformers_version 4.50.0.dev0): it names few keys (no head counts, no
# vocabulary size: Gemma3TextConfig's defaults); as quoted by public ports' tests (one with the vision tower left
# out, one whole)
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}  # fmt: skip
PUBLISHED = {"Qwen2.5-VL-7B-Instruct": QWEN2_5_VL_7B, "Qwen3-VL-4B-Instruct": QWEN3_VL_4B, "gemma-3-4b-it": GEMMA3_4B}


def meta_parts(folder: Path) -> dict[str, int]:
    """The model in ``folder`` built whole on the meta device (AutoModelForImageTextToText from its config.json):
    its parameters, split as LLaMA-Factory splits them (cockpit.models.vlm.COMPOSITE), and its parts' nn.Linear
    weights."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from cockpit.models.vlm import COMPOSITE

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    parts = COMPOSITE[config.model_type]
    named = list(model.named_parameters())  # tied weights once
    keys = (*parts.vision_model_keys, *parts.projector_keys)
    return {
        "total": sum(p.numel() for _, p in named),
        "vision": sum(p.numel() for n, p in named if any(k in n for k in parts.vision_model_keys)),
        "projector": sum(p.numel() for n, p in named if any(k in n for k in parts.projector_keys)),
        "linear": sum(m.weight.numel() for n, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and any(k in n for k in keys)),
    }  # fmt: skip


def torch_free_parts(folder: Path) -> dict[str, int]:
    """The Setup form's count: the planner's, torch-free (``allow_meta=False``), from config.json alone."""
    from cockpit.plan.catalogue import resolve_model_config
    from cockpit.plan.params import count_params

    counts = count_params(resolve_model_config(str(folder))[0], allow_meta=False)
    return {"total": counts.total, "vision": counts.vision, "projector": counts.projector,
            "linear": getattr(counts, "vision_linear", None)}  # fmt: skip


@pytest.mark.parametrize(
    "fixture", ["tiny_qwen2_vl_dir", "tiny_qwen2_5_vl_dir", "tiny_qwen3_vl_dir", "tiny_gemma3_dir"]
)
def test_the_torch_free_count_of_a_tiny_vlm_is_the_meta_models(fixture, request):
    """Each tiny fixture: the torch-free tower / projector / total (and the tower's and projector's linear weights,
    what bitsandbytes quantizes) equal the meta-device model's; the planner with the meta device agrees too."""
    from cockpit.plan.catalogue import resolve_model_config
    from cockpit.plan.params import count_params

    folder = request.getfixturevalue(fixture)
    expected = meta_parts(folder)
    assert expected["vision"] and expected["projector"], expected
    assert torch_free_parts(folder) == expected
    with_meta = count_params(resolve_model_config(str(folder))[0])
    assert (with_meta.total, with_meta.vision, with_meta.projector) == tuple(
        expected[k] for k in ("total", "vision", "projector")
    )


# the published models' parameters (total, vision tower, projector), as the meta-device model counts them (the
# totals are the model cards' 8.29B, 4.44B and 4.30B)
PUBLISHED_SIZES = {
    "Qwen2.5-VL-7B-Instruct": (8_292_166_656, 631_975_680, 44_574_464),
    "Qwen3-VL-4B-Instruct": (4_437_815_808, 388_076_032, 27_271_680),
    "gemma-3-4b-it": (4_300_079_472, 416_866_032, 2_950_272),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_torch_free_count_of_a_published_vlm_is_the_meta_models(name, tmp_path):
    """A published config.json (keys left out take their config class's defaults; Qwen2.5-VL's is flat): the
    torch-free count equals the meta-device model's, and the Setup form's line under the model says it."""
    from cockpit.models.vlm import COMPOSITE
    from cockpit.ui import forms

    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED[name]))
    expected = meta_parts(tmp_path)
    assert torch_free_parts(tmp_path) == expected
    assert (expected["total"], expected["vision"], expected["projector"]) == PUBLISHED_SIZES[name], expected
    kind = PUBLISHED[name]["model_type"]
    language = expected["total"] - expected["vision"] - expected["projector"]
    assert forms.vlm_note(str(tmp_path), COMPOSITE[kind].template) == (
        f"vision-language model ({kind}): vision tower {expected['vision'] / 1e6:.2f}M + projector "
        f"{expected['projector'] / 1e6:.2f}M + language model {language / 1e6:.2f}M; template "
        f"{COMPOSITE[kind].template}; image keys below"
    )
