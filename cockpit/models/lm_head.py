"""When the chunked language-model loss is exact, by what a model is (torch-free: the planner asks too).

Training's loss (:mod:`cockpit.train.chunked_loss`) runs the LM head and the cross-entropy a chunk of
:data:`CHUNK` positions at a time, never building the full logits. That gives the model's own loss
exactly only for a model whose forward goes straight from ``lm_head`` to ``loss_function``: the model
types in :data:`PLAIN`, with none of the :data:`SCALED` config keys set. The ranks check the loaded
model itself as well (a plain ``Linear`` head, not sharded, no hooks); the planner
(:mod:`cockpit.plan.estimate`) counts one chunk's logits where this says yes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CHUNK = 256  # positions per chunk: TRL measured its knee of memory vs throughput here (trl#5575)

# Causal LMs whose forward is `logits = self.lm_head(hidden_states)` then straight
# `loss = self.loss_function(logits, labels, vocab_size, **kwargs)` (an MoE's router loss added after
# is fine): read from transformers 5.23's modeling files. Not here: Cohere (logit_scale), Granite
# (logits_scaling), Falcon-H1 (lm_head_multiplier), Mamba / OPT / BLT (`.float()` / other steps),
# encoder-decoders. Gemma 2/3 softcap only when configured (see SCALED).
PLAIN = frozenset(
    {
        "apertus", "arcee", "cwm", "deepseek_v2", "deepseek_v3", "dots1", "ernie4_5", "ernie4_5_moe", "exaone4",
        "gemma", "gemma2", "gemma3_text", "glm", "glm4", "glm4_moe", "gpt_oss", "helium", "hunyuan_v1_dense",
        "hunyuan_v1_moe", "lfm2", "llama", "ministral", "ministral3", "mistral", "mixtral", "nemotron", "olmo",
        "olmo2", "olmo3", "olmoe", "phi", "phi3", "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
        "qwen3_next", "seed_oss", "smollm3", "stablelm", "starcoder2",
    }
)  # fmt: skip
# config keys that change the logits between the head and the loss (any model): set -> the logits stay
SCALED = ("final_logit_softcapping", "logit_scale", "logits_scaling", "lm_head_multiplier", "logits_soft_cap")


def scaled_by(config: Mapping[str, Any] | Any) -> str | None:
    """The first :data:`SCALED` key a model config (a mapping or a config object) sets, or None."""
    for key in SCALED:
        value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
        if value not in (None, 1, 1.0):
            return key
    return None


def model_why_not(model_type: str | None, scaled_key: str | None) -> str:
    """Why the chunked loss is not exact for this kind of model ("" when it is)."""
    if model_type not in PLAIN:
        return f"model type {model_type!r} is not known to go straight from lm_head to the loss"
    if scaled_key:
        return f"the config's {scaled_key} changes the logits before the loss"
    return ""
