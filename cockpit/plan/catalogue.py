"""Built-in config.json numbers of common architectures, so presets plan offline.

Numbers are the ones in each model's ``config.json`` on the Hugging Face hub (checked against
copies of those files: Llama 3/3.1, Qwen2.5, Mistral; SmolLM2 against the embedded model's
converted folder). Only the keys the planner reads are kept. Instruct variants share the base
architecture; where ``max_position_embeddings`` differs it is given per variant.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from cockpit.errors import InputError, Problem
from cockpit.plan.vlm_counts import language_part

_LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
}
_LLAMA3_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
}
# Qwen2 always has biases on q/k/v (not on o); transformers builds them from model_type.
_QWEN25 = {"model_type": "qwen2", "vocab_size": 152064, "tie_word_embeddings": False, "rope_theta": 1000000.0}
_QWEN25_7B = {
    **_QWEN25,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
}
_QWEN25_14B = {
    **_QWEN25,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
}
_QWEN25_32B = {
    **_QWEN25,
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_hidden_layers": 64,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
}
_QWEN25_72B = {
    **_QWEN25,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}
_MISTRAL_7B = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
}
SMOLLM2_135M = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
}

# Qwen3's mixture-of-experts models (128 routed experts, 8 a token, no shared experts, q/k norms)
_QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "head_dim": 128,
    "num_key_value_heads": 4,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
}
_QWEN3_30B_A3B = {
    **_QWEN3_MOE,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
}
_QWEN3_235B_A22B = {
    **_QWEN3_MOE,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
}

CATALOGUE: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-30B-A3B": dict(_QWEN3_30B_A3B),
    "Qwen/Qwen3-30B-A3B-Base": dict(_QWEN3_30B_A3B),
    "Qwen/Qwen3-235B-A22B": dict(_QWEN3_235B_A22B),
    "meta-llama/Meta-Llama-3-8B": {**_LLAMA3_8B, "max_position_embeddings": 8192},
    "meta-llama/Meta-Llama-3-8B-Instruct": {**_LLAMA3_8B, "max_position_embeddings": 8192},
    "meta-llama/Llama-3.1-8B": {**_LLAMA3_8B, "max_position_embeddings": 131072},
    "meta-llama/Llama-3.1-8B-Instruct": {**_LLAMA3_8B, "max_position_embeddings": 131072},
    "meta-llama/Meta-Llama-3-70B": {**_LLAMA3_70B, "max_position_embeddings": 8192},
    "meta-llama/Meta-Llama-3-70B-Instruct": {**_LLAMA3_70B, "max_position_embeddings": 8192},
    "meta-llama/Llama-3.1-70B": {**_LLAMA3_70B, "max_position_embeddings": 131072},
    "meta-llama/Llama-3.1-70B-Instruct": {**_LLAMA3_70B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-7B": {**_QWEN25_7B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-7B-Instruct": {**_QWEN25_7B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-14B": {**_QWEN25_14B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-14B-Instruct": {**_QWEN25_14B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-32B": {**_QWEN25_32B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-32B-Instruct": {**_QWEN25_32B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-72B": {**_QWEN25_72B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-72B-Instruct": {**_QWEN25_72B, "max_position_embeddings": 32768},
    "mistralai/Mistral-7B-v0.1": {**_MISTRAL_7B, "vocab_size": 32000, "rope_theta": 10000.0, "sliding_window": 4096},
    "mistralai/Mistral-7B-Instruct-v0.3": {
        **_MISTRAL_7B,
        "vocab_size": 32768,
        "rope_theta": 1000000.0,
        "sliding_window": None,
    },
    "HuggingFaceTB/SmolLM2-135M-Instruct": dict(SMOLLM2_135M),
    "smollm2-135m-instruct": dict(SMOLLM2_135M),
}

_BY_LOWER = {k.lower(): k for k in CATALOGUE}

REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def known_models() -> list[str]:
    return sorted(CATALOGUE)


def resolve_model_config(
    name_or_path: str, *, key: str = "model_name_or_path", revision: str | None = None
) -> tuple[dict[str, Any], str]:
    """config.json numbers for a local folder (with config.json), a hub id in this machine's HF
    cache (at ``revision``: the model the ranks will load), or a catalogue id.

    Returns ``(config, source)`` where source is the config.json path or ``"catalogue"``.
    Raises InputError naming ``key`` when neither works.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise InputError(Problem("must be a model folder or a hub id", key=key))
    name = name_or_path.strip()
    expanded = os.path.expanduser(name)
    from cockpit.models.embedded_vlm import embedded_vlm_dir, is_embedded_vlm

    if is_embedded_vlm(name):  # the embedded VLM: the folder the ranks load (built once, by check or train)
        expanded = str(embedded_vlm_dir())
        if not os.path.isdir(expanded):
            raise InputError(
                Problem(f"{name!r} is built on first use: `cockpit check` this config once, then plan it", key=key)
            )
    if not os.path.isdir(expanded) and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        from cockpit.models.weights import hub_snapshot

        snap = hub_snapshot(name, revision)
        if snap and os.path.isfile(os.path.join(snap, "config.json")):
            expanded = snap
    cfg_path = os.path.join(expanded, "config.json")
    if os.path.isdir(expanded):
        if not os.path.isfile(cfg_path):
            raise InputError(Problem(f"folder {name} has no config.json", key=key))
        try:
            with open(cfg_path, encoding="utf-8") as f:
                model_config = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError(Problem(f"cannot read {cfg_path}: {e}", key=key)) from e
        language = language_part(model_config)  # multimodal wrappers: plan the LM part (its class defaults in)
        if language is not None:
            # and a vision-language model's vision tower and projector (plan.params.vision_counts)
            model_config = {**language, **vision_part(model_config)}
        missing = [k for k in REQUIRED_KEYS if not isinstance(model_config.get(k), int)]
        if missing:
            raise InputError(Problem(f"{cfg_path} lacks {', '.join(missing)}", key=key))
        return model_config, cfg_path
    hit = _BY_LOWER.get(name.rstrip("/").lower())
    if hit is None:
        raise InputError(
            Problem(
                f"{name!r} is neither a local folder with config.json nor in the built-in catalogue "
                f"({', '.join(known_models())})",
                key=key,
            )
        )
    return dict(CATALOGUE[hit]), "catalogue"


def vision_part(model_config: Mapping[str, Any]) -> dict[str, Any]:
    """What the planner keeps of a vision-language model's own config beside its language model's: the
    vision tower's config and the wrapper's type (``_vision_config``, ``_vlm_type``: LLaVA); another composite
    model (cockpit.models.vlm.COMPOSITE: Qwen2-VL, ...) keeps its whole config (``_vlm_config``)."""
    from cockpit.models.vlm import COMPOSITE

    kind = model_config.get("model_type")
    if kind in COMPOSITE and kind != "llava":
        return {"_vlm_config": dict(model_config), "_vlm_type": kind}
    if kind != "llava" or not isinstance(model_config.get("vision_config"), dict):
        return {}
    layers = model_config.get("vision_feature_layer", -1)  # a list: the features of several layers side by side
    return {
        "_vision_config": model_config["vision_config"],
        "_vlm_type": "llava",
        "_vision_feature_layers": len(layers) if isinstance(layers, list) else 1,
    }
