"""A vision-language model's parts counted from its config.json alone (issue 63), torch-free: the Setup form
and the UI's planner (``use_meta=False``) read it, so it imports neither torch nor transformers.

Each family's numbers follow transformers 5.23's modules (tests/test_vlm_setup_sizes.py builds the real
classes on the meta device and compares, for tiny fixtures and published configs):

- Qwen2-VL (``Qwen2VisionTransformerPretrainedModel``): a bias-free Conv3d patch embedding, blocks of two
  LayerNorms, qkv and proj with biases and a GELU MLP ``mlp_ratio`` wide; the merger (the projector): a
  LayerNorm and two linears over ``spatial_merge_size²`` patches, out to the language model's width.
- Qwen2.5-VL: RMSNorms, a gated MLP with biases, the merger's RMSNorm; ``out_hidden_size`` out.
- Qwen3-VL: a Conv3d with bias, learned position embeddings, LayerNorm blocks with a plain MLP, the merger,
  and one more merger (post-shuffle norm) per ``deepstack_visual_indexes`` entry, which LLaMA-Factory counts
  as the tower.
- Gemma 3: a SigLIP tower (Conv2d with bias, position embeddings, LayerNorm blocks, post-layernorm, the
  attention-pooling head when ``vision_use_head``) and the projector's weight (vision width × text width) and
  RMSNorm.

A key a config.json leaves out takes its config class's default (the tables below: transformers 5.23's
``configuration_*.py``; gemma-3-4b-it's config.json, for one, names no head counts nor vocabulary size).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the language model's config class defaults, by its model_type (what config.json may leave out)
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_vl_text": dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8),
    "qwen2_5_vl_text": dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                            num_attention_heads=64, num_key_value_heads=8),
    "qwen3_vl_text": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=32, head_dim=128, attention_bias=False),
    "gemma3_text": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=256, attention_bias=False),
}  # fmt: skip
# the vision tower's config class defaults, by the wrapper's model_type
VISION_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_vl": dict(depth=32, embed_dim=1280, hidden_size=3584, mlp_ratio=4, in_channels=3, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2),
    "qwen2_5_vl": dict(depth=32, hidden_size=3584, intermediate_size=3420, in_channels=3, patch_size=14,
                       spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584),
    "qwen3_vl": dict(depth=27, hidden_size=1152, intermediate_size=4304, in_channels=3, patch_size=16,
                     spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584, num_position_embeddings=2304,
                     deepstack_visual_indexes=[8, 16, 24]),
    "gemma3": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_channels=3, image_size=224,
                   patch_size=16, vision_use_head=True),  # SiglipVisionConfig
}  # fmt: skip
TIED_BY_DEFAULT = {"gemma3": True}  # the wrapper's tie_word_embeddings default (Qwen's: False)
# what each decoder layer holds beyond the Llama layout: q/k/v biases (Qwen2's attention), RMSNorms over the head
# dim on q and k (Qwen3's, Gemma 3's), and Gemma 3's four RMSNorms around attention and MLP instead of two
QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_vl_text", "qwen2_5_vl_text"})
QK_NORM_TYPES = frozenset({"qwen3_vl_text", "gemma3_text"})
LAYER_NORMS = {"gemma3_text": 4}


def layer_norms(model_type: str, hidden: int, head_dim: int) -> int:
    """A decoder layer's norm weights (the analytic count, cockpit.plan.params): two RMSNorms over the width
    (Gemma 3: four), plus the q and k RMSNorms over the head dim of Qwen3-VL's and Gemma 3's attention."""
    return LAYER_NORMS.get(model_type, 2) * hidden + (2 * head_dim if model_type in QK_NORM_TYPES else 0)


def language_part(model_config: Mapping[str, Any]) -> dict[str, Any] | None:
    """A vision-language model's language model config as the planner counts it: its ``text_config`` (or, in
    a Qwen2-VL / Qwen2.5-VL config.json saved flat, the top-level keys), its class defaults filled in, and the
    wrapper's ``tie_word_embeddings`` (what transformers ties by); None for a config with neither."""
    from cockpit.models.vlm import COMPOSITE

    kind = str(model_config.get("model_type") or "")
    text = model_config.get("text_config")
    if isinstance(text, dict):
        text_type = text.get("model_type") or (f"{kind}_text" if kind in COMPOSITE and kind != "llava" else kind)
    elif kind in ("qwen2_vl", "qwen2_5_vl"):  # transformers' Qwen2VLConfig reads a flat config's text keys
        text, text_type = {k: v for k, v in model_config.items() if k != "vision_config"}, f"{kind}_text"
    else:
        return None
    found = {**TEXT_DEFAULTS.get(text_type, {}), **text, "model_type": text_type}
    if kind in COMPOSITE and kind != "llava":
        tied = bool(model_config.get("tie_word_embeddings", TIED_BY_DEFAULT.get(kind, False)))
        if kind in ("qwen2_vl", "qwen2_5_vl"):  # their configs' rule for pre-v5 saves: text_config's tie counts
            tied = tied or bool(text.get("tie_word_embeddings", False))
        found["tie_word_embeddings"] = tied
    return found


def composite_params(model_config: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(vision tower, projector, their nn.Linear weights) of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Gemma 3
    from its whole config.json, as LLaMA-Factory splits the parts (cockpit.models.vlm.COMPOSITE); None for
    another model."""
    kind = str(model_config.get("model_type") or "")
    counter = _COUNTERS.get(kind)
    if counter is None:
        return None
    vision = {**VISION_DEFAULTS[kind], **(model_config.get("vision_config") or {})}
    text = language_part(model_config) or {}
    return counter(vision, int(text.get("hidden_size", 0)))


def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _merger(width: int, merge: int, out: int, norm: int) -> tuple[int, int]:
    """(parameters, linear weights) of a Qwen patch merger: a norm of ``norm`` parameters, then two linears over
    ``merge²`` patches side by side, out to ``out``."""
    wide = width * merge * merge
    return norm + _linear(wide, wide) + _linear(wide, out), wide * wide + wide * out


def _patch_embed(v: Mapping[str, Any], width: int, bias: bool) -> int:
    """A Qwen Conv3d patch embedding: channels × temporal × patch² in, ``width`` out."""
    kernel = int(v["in_channels"]) * int(v["temporal_patch_size"]) * int(v["patch_size"]) ** 2
    return kernel * width + (width if bias else 0)


def _qwen2_vl(v: Mapping[str, Any], text_width: int) -> tuple[int, int, int]:
    e, depth = int(v["embed_dim"]), int(v["depth"])
    m = int(e * v["mlp_ratio"])
    block = 2 * 2 * e + _linear(e, 3 * e) + _linear(e, e) + _linear(e, m) + _linear(m, e)
    projector, projector_linear = _merger(e, int(v["spatial_merge_size"]), int(v["hidden_size"]), 2 * e)
    linear = depth * (3 * e * e + e * e + 2 * e * m) + projector_linear
    return _patch_embed(v, e, bias=False) + depth * block, projector, linear


def _qwen2_5_vl(v: Mapping[str, Any], text_width: int) -> tuple[int, int, int]:
    h, i, depth = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["depth"])
    block = 2 * h + _linear(h, 3 * h) + _linear(h, h) + 2 * _linear(h, i) + _linear(i, h)
    projector, projector_linear = _merger(h, int(v["spatial_merge_size"]), int(v["out_hidden_size"]), h)
    linear = depth * (3 * h * h + h * h + 3 * h * i) + projector_linear
    return _patch_embed(v, h, bias=False) + depth * block, projector, linear


def _qwen3_vl(v: Mapping[str, Any], text_width: int) -> tuple[int, int, int]:
    h, i, depth = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["depth"])
    merge, out, deep = int(v["spatial_merge_size"]), int(v["out_hidden_size"]), len(v["deepstack_visual_indexes"])
    block = 2 * 2 * h + _linear(h, 3 * h) + _linear(h, h) + _linear(h, i) + _linear(i, h)
    projector, projector_linear = _merger(h, merge, out, 2 * h)
    deepstack, deepstack_linear = _merger(h, merge, out, 2 * h * merge * merge)  # its norm after the shuffle
    tower = _patch_embed(v, h, bias=True) + int(v["num_position_embeddings"]) * h + depth * block + deep * deepstack
    linear = depth * (4 * h * h + 2 * h * i) + projector_linear + deep * deepstack_linear
    return tower, projector, linear


def _gemma3(v: Mapping[str, Any], text_width: int) -> tuple[int, int, int]:
    h, i, layers = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    patch, channels = int(v["patch_size"]), int(v["num_channels"])
    embeddings = _linear(channels * patch * patch, h) + (int(v["image_size"]) // patch) ** 2 * h
    layer = 2 * 2 * h + 4 * _linear(h, h) + _linear(h, i) + _linear(i, h)
    linear = layers * (4 * h * h + 2 * h * i)
    head = 0
    if v.get("vision_use_head", True):  # SigLIP's attention pooling: probe, in/out projections, norm, MLP
        head = h + 3 * h * h + 3 * h + _linear(h, h) + 2 * h + _linear(h, i) + _linear(i, h)
        linear += h * h + 2 * h * i  # its out_proj and MLP are nn.Linear (the in-projection is a bare weight)
    tower = embeddings + layers * layer + 2 * h + head
    return tower, h * text_width + h, linear  # the projector: a bare weight and an RMSNorm over the vision width


_COUNTERS = {"qwen2_vl": _qwen2_vl, "qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl, "gemma3": _gemma3}
